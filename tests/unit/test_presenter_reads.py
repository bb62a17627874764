"""Bounded reads of the presenter: cached summaries, capped ranges and rows, pooled connections with a timeout;
and why a lease is vacant.

The cache runs on a hand-written clock; the pool and the capped reads on a real PostgreSQL database (the
test's own), the quarantine summary on a real Delta table.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg2.errors
import pyarrow as pa
import pytest
from deltalake import write_deltalake
from tandem.config import load_cluster, load_plan
from tandem.layout import delta_table_dir
from tandem.presenter import configuration
from tandem.presenter.cache import VersionedCache
from tandem.presenter.connections import ConnectionPool, PresenterBusy
from tandem.presenter.models import NodeState, TimelineEvent
from tandem.presenter.views import (
    BadRequest, aggregate_rows, check_range, event_page, quarantine_report, shown_role, output_rows, vacancy,
)
from tandem.store import Database, migrate

UTC = timezone.utc


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_cached_value_is_reused_until_its_source_version_changes() -> None:
    clock, versions, looks = FakeClock(), {"v": 1}, []
    cache: VersionedCache[str] = VersionedCache(ttl_s=5.0, clock=clock)

    def version() -> int:
        looks.append(clock.now)
        return versions["v"]

    assert cache.get("q", version, lambda v: f"summary at {v}") == "summary at 1"
    clock.now += 4.9  # within the ttl: not even the version is read
    assert cache.get("q", version, lambda v: pytest.fail("recomputed within the ttl")) == "summary at 1"
    assert len(looks) == 1
    clock.now += 0.2  # past the ttl, same version: the version is read, the value kept
    assert cache.get("q", version, lambda v: pytest.fail("recomputed at the same version")) == "summary at 1"
    assert len(looks) == 2
    versions["v"] = 2
    clock.now += 1  # within the ttl of the last look: the new version is not seen yet
    assert cache.get("q", version, lambda v: f"summary at {v}") == "summary at 1"
    clock.now += 5
    assert cache.get("q", version, lambda v: f"summary at {v}") == "summary at 2"
    assert cache.computed == 2


def test_the_cache_keeps_at_most_its_entries_least_recently_used_out_first() -> None:
    cache: VersionedCache[int] = VersionedCache(ttl_s=60.0, max_entries=2, clock=FakeClock())
    for key in ("a", "b", "a", "c"):
        cache.get(key, lambda: 1, lambda v, key=key: ord(key))
    assert list(cache._entries) == ["a", "c"] and cache.computed == 3


def test_concurrent_readers_of_one_key_wait_for_one_computation() -> None:
    cache: VersionedCache[int] = VersionedCache(ttl_s=60.0)
    started = threading.Event()

    def slow(version) -> int:
        started.set()
        time.sleep(0.3)
        return 7

    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("k", lambda: 1, slow))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [7] * 8 and cache.computed == 1


def test_pooled_connections_are_reused_and_time_out_slow_statements(database_url: str) -> None:
    pool = ConnectionPool(database_url, size=2, statement_timeout_s=0.3, wait_s=0.2)
    try:
        backends = set()
        for _ in range(5):
            with pool.borrow() as db:
                backends.add(db.run(lambda c: (c.execute("SELECT pg_backend_pid() AS pid"), c.fetchone()["pid"])[1]))
                assert db.run(lambda c: (c.execute("SHOW statement_timeout"), c.fetchone())[1]) == \
                    {"statement_timeout": "300ms"}
        assert len(backends) == 1 and pool.opened == 1
        with pool.borrow() as db:
            with pytest.raises(psycopg2.errors.QueryCanceled, match="statement timeout"):
                db.run(lambda c: c.execute("SELECT pg_sleep(5)"))
            # the connection broke off the cancelled statement; the next request gets a new one, timed too
            assert db.run(lambda c: (c.execute("SHOW statement_timeout"), c.fetchone())[1])["statement_timeout"] == "300ms"
        with pool.borrow(), pool.borrow():
            with pytest.raises(PresenterBusy, match="all 2 PostgreSQL connections"):
                with pool.borrow():
                    pass
    finally:
        pool.close()


# ------------------------------------------------------------------------------------------------
# Capped ranges and rows (real PostgreSQL for the rows)


def test_an_aggregates_range_is_at_most_ten_thousand_buckets() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    check_range("second", start, start + timedelta(seconds=10_000))
    with pytest.raises(BadRequest, match=r"12,000 second buckets, at most 10,000 are served: narrow start/end to at "
                                         r"most 2:46:40 or ask a coarser granularity"):
        check_range("second", start, start + timedelta(seconds=12_000))
    check_range("year", datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC))
    with pytest.raises(BadRequest, match="month buckets"):
        check_range("month", datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC))
    with pytest.raises(BadRequest, match="within 1970-9999"):
        check_range("day", datetime(1969, 12, 31, tzinfo=UTC), start)
    with pytest.raises(BadRequest, match="start before end"):
        check_range("day", start, start)


@pytest.fixture
def pizza_and_trades(database_url: str, conf: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    cluster = load_cluster(conf / "cluster.yaml")
    with Database(database_url) as db:
        migrate(db)
        yield db, load_plan("pizza_shop", cluster), load_plan("trades", cluster)


def test_output_rows_beyond_the_limit_are_refused_with_how_to_narrow(pizza_and_trades) -> None:
    db, pizza, _ = pizza_and_trades
    db.run(lambda c: c.executemany(
        "INSERT INTO output_table_rows (plan, output, key, instance, value, version, node, epoch, batch_id) "
        "VALUES ('pizza_shop', 'delivered_orders', %s, 'shop-1', '{\"delivered\": 2}', 1, 'node-a', 1, 0)",
        [(json.dumps({"customer_name": name}),) for name in ("ann", "bob", "cy", "di", "ed")]))
    cluster = load_cluster()
    assert len(output_rows(cluster, db, pizza, "delivered_orders", limit=5).rows) == 5
    with pytest.raises(BadRequest, match=r"table delivered_orders has more than 4 rows \(limit=4\): filter with "
                                         r"key=customer_name:<value>, or raise limit \(at most 10,000\)"):
        output_rows(cluster, db, pizza, "delivered_orders", limit=4)
    assert [r["customer_name"] for r in output_rows(cluster, db, pizza, "delivered_orders",
                                                    {"customer_name": ["bob"]}, limit=1).rows] == ["bob"]
    # the latest kind through the same read: the latest row per key over instances, filtered, limited
    db.run(lambda c: c.executemany(
        "INSERT INTO output_latest (plan, output, key, instance, event_time, tiebreak, row, node, epoch, batch_id) "
        "VALUES ('pizza_shop', 'last_orders', %s, %s, to_timestamp(%s), 't', %s, 'node-a', 1, 0)",
        [(json.dumps({"customer_name": name}), instance, at,
          json.dumps({"customer_name": name, "order_no": f"{name}-{at}"}))
         for name in ("ann", "bob", "cy") for instance, at in (("shop-1", 10), ("shop-2", 20))]))
    latest = output_rows(cluster, db, pizza, "last_orders", {"customer_name": ["ann", "cy"]}, limit=2)
    assert (latest.kind, [(r["order_no"], r["instance"]) for r in latest.rows]) == (
        "latest", [("ann-20", "shop-2"), ("cy-20", "shop-2")])
    with pytest.raises(BadRequest, match=r"latest last_orders has more than 2 rows"):
        output_rows(cluster, db, pizza, "last_orders", limit=2)


def test_aggregate_rows_beyond_the_limit_are_refused_with_how_to_narrow(pizza_and_trades) -> None:
    db, pizza, trades = pizza_and_trades
    cluster = load_cluster()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [(start + timedelta(minutes=m), symbol) for m in range(3) for symbol in ("IBM", "ORCL", "WSO2", "MSFT")]
    db.run(lambda c: c.executemany(
        "INSERT INTO trade_aggregates (plan, granularity, bucket_start, symbol, instance, price_sum, trade_count, "
        "quantity_sum, price_min, price_max, epoch, batch_id) VALUES ('trades', 'minute', %s, %s, 'shard-1', 10, 2, 5, "
        "4, 6, 1, 0)", rows))
    end = start + timedelta(hours=1)
    found = aggregate_rows(cluster, db, trades, "trade_aggregates", "minute", start, end, limit=12).rows
    assert len(found) == 12 and found[0]["avg_price"] == 5.0
    with pytest.raises(BadRequest, match=r"more than 11 rows \(limit=11\): narrow start/end, ask a coarser "
                                         r"granularity or filter with key=symbol:<value>"):
        aggregate_rows(cluster, db, trades, "trade_aggregates", "minute", start, end, limit=11)
    assert len(aggregate_rows(cluster, db, trades, "trade_aggregates", "minute", start, end, {"symbol": ["IBM"]}, limit=3).rows) == 3
    # the endpoints ask the kind: a table has no buckets, an aggregation cannot be polled
    with pytest.raises(BadRequest, match=r"delivered_orders of plan pizza_shop is an output of kind table, kept in "
                                         r"no time buckets: read it at /plans/pizza_shop/outputs/delivered_orders/rows"):
        aggregate_rows(cluster, db, pizza, "delivered_orders", "minute", start, end)
    with pytest.raises(BadRequest, match=r"trade_aggregates is an output of kind aggregation: only an output whose "
                                         r"rows are appended can be polled"):
        event_page(db, trades, "trade_aggregates")


# ------------------------------------------------------------------------------------------------
# The quarantine summary: served from the cache while the Delta table's version is unchanged


def _quarantine_lines(times: list[int], instance: str) -> pa.Table:
    return pa.table({
        "quarantined_at": pa.array([datetime(2026, 1, 1, 0, 0, t, tzinfo=UTC) for t in times], pa.timestamp("us", "UTC")),
        "instance": [instance] * len(times), "node": ["node-a"] * len(times),
        "source_file": [f"f{t}.json" for t in times], "reason": ["bad json"] * len(times),
        "raw": [f"line {t}" for t in times]})


def test_the_quarantine_summary_is_read_again_only_when_the_table_changes(conf: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    monkeypatch.setenv("TANDEM_STORAGE_ROOT", str(tmp_path / "data"))
    cluster = load_cluster(conf / "cluster.yaml")
    plan = load_plan("trades", cluster)
    clock = FakeClock()
    cache: VersionedCache = VersionedCache(ttl_s=5.0, clock=clock)
    assert quarantine_report(cluster, plan, samples=2, cache=cache).total == 0
    path = delta_table_dir(cluster, "trades", "quarantine")
    write_deltalake(str(path), _quarantine_lines([1, 2, 3], "shard-1"))
    clock.now += 5
    report = quarantine_report(cluster, plan, samples=2, cache=cache)
    assert report.total == 3 and [s.raw for s in report.samples] == ["line 3", "line 2"]
    write_deltalake(str(path), _quarantine_lines([4, 5], "shard-2"), mode="append")
    clock.now += 1
    assert quarantine_report(cluster, plan, samples=2, cache=cache) is report  # within the ttl
    computed = cache.computed
    clock.now += 5
    newer = quarantine_report(cluster, plan, samples=2, cache=cache)
    assert newer.total == 5 and newer.by_instance == {"shard-1": 3, "shard-2": 2}
    assert [s.raw for s in newer.samples] == ["line 5", "line 4"] and cache.computed == computed + 1
    clock.now += 5
    assert quarantine_report(cluster, plan, samples=2, cache=cache) is newer  # same version: not read again


# ------------------------------------------------------------------------------------------------
# Why no node is ACTIVE


def _node(status: str | None, error: str | None = None, health: str = "STOPPED") -> NodeState:
    return NodeState(node="node-a", role="ACTIVE", epoch=3, status=status, error=error, health=health,
                     evidence="no liveness beat for 40.0s", drained=False, host=None, pid=None, beat_age_s=40.0,
                     last_batch_id=None, last_batch_age_s=None, lag_s=None, waiting_input_s=None)


def test_a_vacant_lease_says_its_state_since_when_and_why() -> None:
    expired = datetime(2026, 1, 1, 10, tzinfo=UTC)
    lease = {"holder": "node-a", "epoch": 3, "valid": False, "expires_at": expired}
    released = TimelineEvent(id=9, happened_at=expired - timedelta(minutes=1), instance="shard-1", kind="RELEASED",
                             node="node-a", previous_node=None, epoch=3, reason="instance stopped")
    # a clean stop: released at the lease's epoch by its holder, whose instance then recorded STOPPED
    assert vacancy(lease, released, _node("STOPPED")) == ("stopped", released.happened_at, "stopped: instance stopped")
    # released, but the instance failed: its cause, not the release's words
    assert vacancy(lease, released, _node("FAILED", "ValueError: boom")) == (
        "released", released.happened_at, "released: node-a is FAILED: ValueError: boom")
    assert vacancy(lease, released, _node("RUNNING", health="HEALTHY")) == (
        "released", released.happened_at, "released: instance stopped")
    older = released.model_copy(update={"epoch": 2})
    assert vacancy(lease, older, _node("STOPPED")) == ("expired", expired, "expired: node-a's instance stopped")
    assert vacancy(lease, None, _node("BLOCKED", "psycopg2.errors.DataError: bad value")) == (
        "expired", expired, "expired: node-a is BLOCKED: psycopg2.errors.DataError: bad value")
    assert vacancy(lease, None, _node("RUNNING", health="DEAD")) == (
        "expired", expired, "expired: node-a stopped renewing it (DEAD: no liveness beat for 40.0s)")
    assert vacancy({**lease, "valid": True}, None, _node("RUNNING")) == ("held", None, None)
    assert vacancy({**lease, "holder": None}, None, None) == ("free", None, "the lease was never taken")


@pytest.mark.parametrize(("recorded", "status", "holds_lease", "shown"), [
    ("ACTIVE", "RUNNING", True, "ACTIVE"),
    ("ACTIVE", "STOPPED", False, None),     # stopped: its recorded role is history (not a second ACTIVE)
    ("ACTIVE", "STOPPED", True, None),      # even while its lease has not expired yet
    ("PASSIVE", "FAILED", False, None),
    ("BACKUP", "BLOCKED", False, None),
    ("ACTIVE", "RUNNING", False, None),     # handed over or fenced: being demoted
    ("PASSIVE", "RUNNING", False, "PASSIVE"),
    ("PASSIVE", "RUNNING", True, "ACTIVE"),  # took the lease, its row not updated yet
    ("WARM", "RUNNING", False, "WARM"),
    ("ACTIVE", "RUNNING", True, "ACTIVE"),
    (None, None, False, None),
])
def test_a_node_is_shown_active_only_while_it_runs_and_holds_the_lease(recorded, status, holds_lease, shown) -> None:
    assert shown_role(recorded, status, holds_lease) == shown


def test_a_lease_line_says_stopped_since_when_after_a_clean_stop() -> None:
    from tandem.cli import lease_line
    from tandem.presenter.models import LeaseState

    now = datetime(2026, 1, 1, 10, 0, 12, tzinfo=UTC)
    base = {"holder": "node-a", "epoch": 3, "acquired_at": now - timedelta(hours=1), "expires_at": now}
    stopped = LeaseState(state="stopped", valid=False, expires_in_s=-3600.0, vacant_since=now - timedelta(seconds=12),
                         vacancy="stopped: instance stopped", **base)
    assert lease_line(stopped, now) == "lease: node-a at epoch 3, stopped 12.0s ago (instance stopped)"
    held = LeaseState(state="held", valid=True, expires_in_s=4.25, **base)
    assert lease_line(held, now) == "lease: node-a at epoch 3, expires in 4.2s"
    expired = LeaseState(state="expired", valid=False, expires_in_s=-300.0, vacant_since=now - timedelta(minutes=5),
                         vacancy="expired: node-a is FAILED: ValueError: boom", **base)
    assert lease_line(expired, now) == "lease: node-a at epoch 3, expired 5m ago (node-a is FAILED: ValueError: boom)"
    assert lease_line(None, now) == "lease: never taken"


def test_the_configuration_is_parsed_again_only_when_a_file_changes(conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    cluster, plans = configuration.current()
    assert set(plans) == {"hot_rooms", "pizza_shop", "temperatures", "trades"}
    assert configuration.current()[1] is plans  # within the second: not even looked at
    time.sleep(1.1)
    assert configuration.current()[1] is plans  # looked at: unchanged files, the same objects
    plan_file = conf / "plans" / "trades.yaml"
    plan_file.write_text(plan_file.read_text().replace("trigger_interval: 1 second", "trigger_interval: 2 seconds"))
    time.sleep(1.1)
    assert configuration.current()[1]["trades"].trigger_interval_s == 2.0
