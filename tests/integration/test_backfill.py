"""Backfill (issue 27 §1) of the trades plan on real Spark, PostgreSQL and Delta, while its instances run.

Trades of the first 30 s are published by both instances; a trade a minute later moves their watermarks past them;
then late trades of those 30 s arrive and the stream drops them (asserted: the published aggregates are those of
the on-time trades only). A snapshot of each instance, then landing retention with ``keep_input`` moves every
processed file to ``retained/`` (out of the folders the streams list). With both instances running and trades still coming in, ``tandem backfill`` recomputes
the 30 s from the landing files: afterwards the merged aggregates of every granularity equal a plain-Python
reference over every trade, late ones included, in PostgreSQL and in Delta, and the report counts exactly the late
trades as added. Refusals: a range the stream still writes into, an empty range, an overlapping running backfill,
input that retention deleted.

The pizza shop's outputs are published once by id: orders (and their deliveries) arriving after the watermark
passed them are dropped by the stream; a backfill of their range, while both instances run, publishes their
overdue notifications, delivered counts and order statistics once each (every output then equals the plan's
reference over all orders, in PostgreSQL and Delta), and a second backfill of the same range publishes nothing.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from _references import PIZZA_T0, make_orders
from tandem.batch.backfill import instances_closed_until, run_backfill
from tandem.batch.reconcile import reconcile
from tandem.batch.reconciliations import reconciliation_rows, summary
from tandem.config import load_cluster, load_plan
from tandem.declarations import event_id
from tandem.declarations import partition_of as partition_of_key
from tandem.errors import BackfillRefused, SnapshotRefused
from tandem.layout import landing_dir, retained_dir
from tandem.producer import advance_watermark, partitioned
from tandem.sources.files import write_atomically
from tandem.runtime.node import run_instance
from tandem.snapshots.landing import clean_plan_landing
from tandem.snapshots.restore import restore_instance
from tandem.snapshots.take import take_snapshot
from tandem.store import Database, migrate
from tandem.store import backfills as catalog
from tandem.store import trim
from tandem.store.heartbeats import BatchProgress, record_progress
from tandem.store.leases import read_lease, try_acquire
from tandem.store.supervision import RESTORED, RESTORING, mark
from tandem.reading import read_output
from test_pizza_shop_plan import assert_outputs_equal_the_reference
from test_trades_plan import ALL_TIME, GRANULARITIES, assert_matches, expected_aggregates, make_events, write_events

pytestmark = pytest.mark.integration
UTC = timezone.utc
T0_MS = int(datetime(2024, 12, 31, 23, 59, 50, tzinfo=UTC).timestamp() * 1000)
START = datetime.fromtimestamp(T0_MS / 1000, UTC)
END = START + timedelta(seconds=30)


def partition_of(event: dict) -> int:
    return ["IBM", "WSO2", "ORCL"].index(event["symbol"]) % 2


def instance_of(event: dict) -> str:
    return f"shard-{partition_of(event) + 1}"


def land(cluster, events: list[dict], per_file: int = 50) -> None:
    for partition in (0, 1):
        mine = [e for e in events if partition_of(e) == partition]
        if mine:
            write_events(landing_dir(cluster, "trades", partition), mine, per_file)


def published_count(db: Database) -> int:
    return db.run(lambda cur: (cur.execute("SELECT COALESCE(sum(trade_count), 0) AS n FROM trade_aggregates "
                                           "WHERE granularity = 'second'"), cur.fetchone())[1])["n"]


def delta_count(cluster) -> int:
    return sum(row["trade_count"] for row in read_output(cluster, "trades", "second", *ALL_TIME, source="delta"))


def test_a_closed_range_is_recomputed_with_its_late_events_while_the_instances_run(project: Path, database_url: str,
                                                                                   spark) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    on_time = make_events(7, 300, 29_000)
    ahead = [{"symbol": s, "price": 10.0, "quantity": 1, "timestamp": T0_MS + 60_000} for s in ("IBM", "WSO2")]
    land(cluster, on_time)
    for instance in plan.instances:
        assert run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True).status == "STOPPED"
    land(cluster, ahead)
    for instance in plan.instances:
        assert run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True).status == "STOPPED"
    late = [{**e, "timestamp": e["timestamp"] % 29_000 + T0_MS} for e in make_events(8, 40, 29_000)]
    land(cluster, late, per_file=40)
    with Database(database_url) as db:
        migrate(db)
        # the stream drops them: its aggregates are those of the trades that came on time
        for instance in plan.instances:
            assert run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True).status == "STOPPED"
        assert_matches(read_output(cluster, "trades", "second", *ALL_TIME),
                       expected_aggregates(on_time + ahead, "second"), "late trades dropped by the stream")

        # landing retention moves what no restart or restore needs, but keep_input keeps, out of the streams'
        # folders: the reconcile and the backfill below recompute from retained/
        for instance in plan.instances:
            assert take_snapshot(cluster, plan, instance, spark, node="node-a", db=db).record.status == "GOOD"
        keeping = dataclasses.replace(plan, maintenance=plan.maintenance.model_copy(update={"keep_input_s": 3600.0}))
        landed = {p: sorted(f.name for f in landing_dir(cluster, "trades", p).glob("*.jsonl")) for p in (0, 1)}
        retention = clean_plan_landing(cluster, keeping, db=db)
        assert {p: sorted(f.name for f in retained_dir(cluster, "trades", p).glob("*.jsonl")) for p in (0, 1)} == landed
        assert not [*landing_dir(cluster, "trades", 0).glob("*.jsonl"), *landing_dir(cluster, "trades", 1).glob("*.jsonl")]
        assert sum(len(d.retire) for d in retention.values()) == len(landed[0]) + len(landed[1])

        # refusals before anything runs
        with pytest.raises(BackfillRefused, match="not closed"):
            run_backfill(cluster, plan, db, spark, START, START + timedelta(seconds=55))
        with pytest.raises(BackfillRefused, match="empty"):
            run_backfill(cluster, plan, db, spark, END, START)
        other = catalog.register(db, "trades", START + timedelta(seconds=20), END + timedelta(seconds=5),
                                 ["shard-1"], "test")
        with pytest.raises(BackfillRefused, match=f"backfill {other.id} .* overlaps"):
            run_backfill(cluster, plan, db, spark, START, END)
        catalog.finish(db, other.id, catalog.FAILED, {}, "test")
        # once retention deleted the seconds of the minute the range starts in, that minute cannot be rebuilt
        trim.record_horizon(db, "trades", "partials/trade_aggregates/second", START + timedelta(seconds=1))
        with pytest.raises(BackfillRefused, match="inside the minute bucket 2024-12-31T23:59:00"):
            run_backfill(cluster, plan, db, spark, START, END)
        db.run(lambda cursor: cursor.execute("DELETE FROM retention_horizons"))
        # registered while nothing was trimmed, run after maintenance trimmed (a queued task, a retry): the Spark
        # task checks again under the plan's lock, and the backfill fails with the reason
        queued = catalog.register(db, "trades", START, END, list(plan.instances), "test")
        trim.record_horizon(db, "trades", "partials/trade_aggregates/second", START + timedelta(seconds=1))
        with pytest.raises(BackfillRefused, match="inside the minute bucket 2024-12-31T23:59:00"):
            run_backfill(cluster, plan, db, spark, START, END, backfill_id=queued.id)
        failed = catalog.get_backfill(db, queued.id)
        assert (failed.status, failed.report) == (catalog.FAILED, {}), failed
        assert "inside the minute bucket 2024-12-31T23:59:00" in failed.error
        db.run(lambda cursor: cursor.execute("DELETE FROM retention_horizons"))

        # reconcile finds exactly the late trades' (second, symbol) keys, and nothing the watermark does not explain
        before = reconcile(cluster, plan, db, spark, START, END, run_id="before")
        late_keys = {instance: {(e["timestamp"] // 1000, e["symbol"]) for e in late if instance_of(e) == instance}
                     for instance in plan.instances}
        assert {o.instance: (o.counts["late"], o.real) for o in before} == {
            instance: (len(keys), 0) for instance, keys in late_keys.items()}
        assert reconciliation_rows(cluster, plan)[0]["run_id"] == "before"

        # the backfill, while both instances run and trades keep coming
        stop = threading.Event()
        results: dict[str, str] = {}

        def run(instance: str) -> None:
            results[instance] = run_instance(cluster, plan, "node-a", instance, spark=spark, stop=stop).status

        running = [threading.Thread(target=run, args=(instance,), daemon=True) for instance in plan.instances]
        for thread in running:
            thread.start()
        more: list[dict] = []

        def produce() -> None:
            for i in range(12):
                batch = [{**e, "timestamp": T0_MS + 61_000 + i * 500 + n} for n, e in
                         enumerate(make_events(100 + i, 20, 1))]
                land(cluster, batch, per_file=20)
                more.extend(batch)
                time.sleep(0.5)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        try:
            done = run_backfill(cluster, plan, db, spark, START, END, requested_by="test")
            after = reconcile(cluster, plan, db, spark, START, END, run_id="after")  # nothing left to find
            producer.join(60)
            everything = on_time + ahead + late + more
            # a batch's Delta append follows its PostgreSQL commit: wait for both before stopping
            deadline = time.monotonic() + 180
            while ((published_count(db), delta_count(cluster)) != (len(everything),) * 2
                   and time.monotonic() < deadline):
                time.sleep(1)
        finally:
            stop.set()
            for thread in running:
                thread.join(300)
        assert not producer.is_alive()
        assert not [t for t in running if t.is_alive()] and results == {s: "STOPPED" for s in plan.instances}, results

    assert done.status == catalog.DONE, done.error
    assert summary(after) == {"late": 0, "extra": 0, "different": 0}
    added = sum(o["events_after"] - o["events_before"] for outputs in done.report.values() for o in outputs.values()
                if o.get("recomputed"))
    assert added == len(late)
    for granularity in GRANULARITIES:
        expected = expected_aggregates(everything, granularity)
        assert_matches(read_output(cluster, "trades", granularity, *ALL_TIME), expected, f"postgres {granularity}")
        assert_matches(read_output(cluster, "trades", granularity, *ALL_TIME, source="delta"), expected,
                       f"delta {granularity}")

    # the snapshots were taken before the backfill: restoring one would undo it (nothing is stopped to say so); the
    # force that accepts a BAD snapshot does not say yes to that too
    for force in (False, True):
        with pytest.raises(SnapshotRefused, match=f"would undo backfill {done.id} .*pass --undo-backfills"):
            restore_instance(cluster, plan, "shard-1", start=False, force=force)

    # input that retention deleted is refused before anything is registered (NATS: test_nats_source.py)
    gone = min(retained_dir(cluster, "trades", 0).glob("*.jsonl"), key=lambda f: f.stat().st_mtime_ns)
    gone.unlink()
    with Database(database_url) as db:
        with pytest.raises(BackfillRefused, match=f"instance shard-1 .* no longer retained: "
                                                  f"{landing_dir(cluster, 'trades', 0) / gone.name}"):
            run_backfill(cluster, plan, db, spark, START, END)
        assert [b.id for b in catalog.list_backfills(db, "trades")] == [done.id, queued.id, other.id]


def test_a_pizza_shop_range_gains_the_outcomes_of_late_orders_each_once(project: Path, database_url: str,
                                                                         spark) -> None:
    cluster = load_cluster()
    plan = load_plan("pizza_shop", cluster)
    orders, deliveries = make_orders(4, 60)  # 0.7 s apart from PIZZA_T0: the last expires at T0 + 71.3 s
    late_numbers = {o["order_no"] for o in orders[::4]}
    on_time = {"orders": [o for o in orders if o["order_no"] not in late_numbers],
               "deliveries": [d for d in deliveries if d["order_no"] not in late_numbers]}
    late = {"orders": [o for o in orders if o["order_no"] in late_numbers],
            "deliveries": [d for d in deliveries if d["order_no"] in late_numbers]}
    write_streams(cluster, plan, on_time)
    advance_watermark(cluster, plan, PIZZA_T0 + 120_000)  # watermark T0 + 110 s: every order of T0 .. 72 s decided
    for instance in plan.instances:
        assert run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True).status == "STOPPED"
    write_streams(cluster, plan, late)
    for instance in plan.instances:  # the late orders and their deliveries are dropped
        assert run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True).status == "STOPPED"
    start = datetime.fromtimestamp(PIZZA_T0 / 1000, UTC)
    with Database(database_url) as db:
        stop = threading.Event()
        results: dict[str, str] = {}

        def run(instance: str) -> None:
            results[instance] = run_instance(cluster, plan, "node-a", instance, spark=spark, stop=stop).status

        running = [threading.Thread(target=run, args=(instance,), daemon=True) for instance in plan.instances]
        for thread in running:
            thread.start()
        try:
            deadline = time.monotonic() + 120  # the ACTIVE's lease: the backfill publishes under it
            while not all(holder(db, instance) for instance in plan.instances) and time.monotonic() < deadline:
                time.sleep(0.5)
            found = summary(reconcile(cluster, plan, db, spark, start, start + timedelta(seconds=90),
                                      run_id="pizza-before"))
            # ids of rows published once by id applied before the range started were deleted: refused
            trim.record_horizon(db, "pizza_shop", "contributions/shop-2", start)
            with pytest.raises(BackfillRefused, match="instance shop-2's ids of .* were deleted"):
                run_backfill(cluster, plan, db, spark, start, start + timedelta(seconds=90))
            db.run(lambda cursor: cursor.execute("DELETE FROM retention_horizons"))
            first = run_backfill(cluster, plan, db, spark, start, start + timedelta(seconds=90))
            again = run_backfill(cluster, plan, db, spark, start, start + timedelta(seconds=90), instances=["shop-1"])
        finally:
            stop.set()
            for thread in running:
                thread.join(120)

    assert first.status == again.status == catalog.DONE, (first.error, again.error)
    _, overdue = assert_outputs_equal_the_reference(cluster, plan, database_url, orders, deliveries)
    published = {output: sum(first.report[s][output]["published"] for s in plan.instances)
                 for output in ("overdue_orders", "order_stats", "delivered_orders", "last_orders")}
    late_overdue = late_numbers & overdue
    assert published == {"overdue_orders": len(late_overdue), "order_stats": len(late_numbers),
                         "delivered_orders": len(late_numbers - overdue),
                         "last_orders": latest_orders_that_came_late(plan, orders, late_numbers)}
    assert published["last_orders"] > 0, "some customer's last order must have come late"
    assert all(first.report[s]["overdue_orders"]["no_longer_produced"] == 0 for s in plan.instances)
    assert found == {"late": sum(published.values()), "extra": 0, "different": 0}
    assert [o["published"] for o in again.report["shop-1"].values() if o.get("recomputed")] == [0, 0, 0, 0]


def latest_orders_that_came_late(plan, orders: list[dict], late_numbers: set[str]) -> int:
    """How many (instance, customer) have a late order as their latest one (order time, then the id of its number):
    each instance keeps its own latest row per key, and the stream dropped the late orders."""
    partitions = plan.streams["orders"].partitions
    latest: dict[tuple[str, str], tuple] = {}
    for order in orders:
        where = (plan.instances[partition_of_key(order["order_no"], partitions) % len(plan.instances)],
                 order["customer_name"])
        rank = (order["time"], event_id("pizza_shop", "last_orders", {"order_no": order["order_no"]}))
        if where not in latest or rank > latest[where][0]:
            latest[where] = (rank, order["order_no"])
    return sum(number in late_numbers for _, number in latest.values())


def write_streams(cluster, plan, streams: dict[str, list[dict]]) -> None:
    for (stream, partition), lines in partitioned(plan, {name: [(e, json.dumps(e)) for e in events]
                                                         for name, events in streams.items()}).items():
        write_atomically(landing_dir(cluster, stream, partition), lines)


def holder(db: Database, instance: str) -> str | None:
    lease = read_lease(db, "pizza_shop", instance)
    return None if lease is None or lease.expired_for_s > 0 else lease.holder


def test_a_restored_instance_closes_no_range_until_it_records_a_watermark_again(project: Path,
                                                                                 database_url: str) -> None:
    """Issue 60: right after a restore, until the restored node records its first watermark, its newest watermark
    was the one from before the restore — later than the state it was taken back to, which replays into ranges
    that watermark called closed. Progress recorded before the instance's last restore began does not count."""
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    with Database(database_url) as db:
        migrate(db)
        try_acquire(db, "trades", "shard-1", "node-a", 60.0)

        def progress(watermark: datetime) -> None:
            record_progress(db, BatchProgress("trades/shard-1/node-a", "trades", "shard-1", "node-a", "aggregates",
                                              "00000000-0000-0000-0000-000000000001",
                                              "00000000-0000-0000-0000-000000000002", 7, 10, None, None, None,
                                              watermark, None, None, None))

        progress(END + timedelta(minutes=5))
        assert instances_closed_until(cluster, db, plan, ["shard-1"]) == {"shard-1": END + timedelta(minutes=5)}
        mark(db, "trades", "shard-1", RESTORING, "test: a restore to an earlier snapshot")
        mark(db, "trades", "shard-1", RESTORED, "test")
        assert instances_closed_until(cluster, db, plan, ["shard-1"]) == {"shard-1": None}
        with pytest.raises(BackfillRefused, match="instance shard-1 has no event-time watermark yet"):
            run_backfill(cluster, plan, db, None, START, END)
        progress(END)  # the restored instance's first batch
        assert instances_closed_until(cluster, db, plan, ["shard-1"]) == {"shard-1": END}
