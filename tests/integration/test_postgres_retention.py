"""PostgreSQL retention of a plan's rows (issue 27 §3) against a real PostgreSQL, through the maintenance DAG's task.

Rows of every trimmed table are written with known ages around the trades plan's declared retention; the
maintenance DAG's ``postgres_retention`` operator runs (in chunks of three rows, to go through the chunk loop);
the rows left are compared with a plain-Python reference of the rules, and everything the running system reads
from these tables (furthest published position, drain marks, newest role events, last progress, coarse
aggregates) reads the same before and after.
"""

from __future__ import annotations

import itertools
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from tandem import cli
from tandem.airflow.snapshot_operators import PostgresRetentionOperator
from tandem.config import load_plan
from tandem.store import Database, migrate, trim
from tandem.store import snapshots as catalog
from tandem.store.leases import newest_of_kinds
from tandem.store.publish_log import published_watermark
from tandem.store.supervision import latest_progress

pytestmark = pytest.mark.integration
DAY, HOUR = timedelta(days=1), timedelta(hours=1)
NODES = ("node-a", "node-b")


@pytest.fixture
def db(project: Path, database_url: str):
    with Database(database_url) as database:
        migrate(database)
        for node in NODES:
            database.run(lambda c, n=node: c.execute(
                "INSERT INTO nodes (name, spark_master, airflow_conn_id) VALUES (%s, 'local[1]', 'spark_default')",
                (n,)))
            for instance in ("shard-1", "shard-2"):
                database.run(lambda c, n=node, s=instance: c.execute(
                    "INSERT INTO plan_instances (instance_id, plan, instance, node) VALUES (%s, 'trades', %s, %s)",
                    (f"trades/{s}/{n}", s, n)))
        yield database


def rows(db: Database, query: str, *params) -> list[dict]:
    def work(cursor):
        cursor.execute(query, params)
        return [dict(r) for r in cursor.fetchall()]

    return db.run(work)


def insert(db: Database, table: str, values: dict) -> None:
    columns = ", ".join(values)
    db.run(lambda c: c.execute(f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(values))})",
                               list(values.values())))


def test_retention_deletes_old_rows_and_keeps_what_is_read(project: Path, db: Database,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    plan = load_plan("trades")
    retention = plan.maintenance.retention
    now = catalog.database_now(db)

    # aggregation partials: seconds and minutes of two days' ages either side of the seconds' retention
    for instance, granularity, age in itertools.product(("shard-1", "shard-2"), ("second", "minute"),
                                                     (3 * DAY, 2 * DAY + HOUR, 2 * DAY - HOUR, HOUR)):
        bucket = (now - age).replace(second=0, microsecond=0)
        insert(db, "trade_aggregates", {"plan": "trades", "granularity": granularity, "bucket_start": bucket,
                                        "symbol": "IBM", "instance": instance, "price_sum": 10.0, "trade_count": 2,
                                        "quantity_sum": 3, "price_min": 4.0, "price_max": 6.0, "epoch": 1,
                                        "batch_id": 1})
    # progress: one (instance, query) only has old rows (a stopped instance); others old and new
    heartbeat_ages = {("trades/shard-1/node-a", "aggregates"): (3 * DAY, 2 * DAY, 25 * HOUR, HOUR),
                      ("trades/shard-1/node-a", "quarantine"): (3 * DAY, 2 * DAY),
                      ("trades/shard-1/node-b", "aggregates"): (30 * HOUR, 26 * HOUR)}
    for (instance, query), ages in heartbeat_ages.items():
        for batch_id, age in enumerate(sorted(ages, reverse=True)):
            insert(db, "heartbeats", {"instance_id": instance, "plan": "trades", "instance": "shard-1",
                                      "node": instance.rsplit("/", 1)[1], "query_name": query,
                                      "query_id": str(uuid.uuid4()), "run_id": str(uuid.uuid4()),
                                      "batch_id": batch_id, "input_rows": 1, "recorded_at": now - age,
                                      "watermark": now - age})
    # published positions: node-a published the furthest position in an old batch and a newer batch without
    # one; node-b (its successor) lags behind it
    published = [("node-a", 1, 4 * DAY, 10), ("node-a", 2, 3.9 * DAY, 30), ("node-a", 3, 3.8 * DAY, None),
                 ("node-b", 1, 3 * DAY, 5), ("node-b", 2, 2.9 * DAY, 25), ("node-b", 3, HOUR, None)]
    base = now - 10 * DAY
    for node, batch_id, age, watermark in published:
        insert(db, "publish_log", {"instance_id": f"trades/shard-1/{node}", "plan": "trades", "instance": "shard-1",
                                   "node": node, "output": "trade_aggregates", "batch_id": batch_id, "epoch": 1,
                                   "rows": 1, "published_at": now - age,
                                   "watermark": None if watermark is None else base + timedelta(seconds=watermark)})
    # supervision events: old drain marks with nothing newer, promotions old and new, node-less events
    events = [("shard-1", "node-b", "DRAINED", 40), ("shard-1", "node-a", "PROMOTED", 40),
              ("shard-1", "node-a", "PROMOTED", 35), ("shard-1", "node-a", "PROMOTED", 1),
              ("shard-1", "node-b", "PROMOTED", 33), ("shard-2", None, "DETECTED", 50),
              ("shard-2", None, "DETECTED", 45), ("shard-2", "node-a", "RELEASED", 31)]
    for instance, node, kind, days in events:
        insert(db, "failover_events", {"plan": "trades", "instance": instance, "node": node, "kind": kind,
                                       "epoch": 1, "reason": "test", "happened_at": now - days * DAY})
    # contribution ids: shard-2 has a GOOD snapshot 39 days old; ids not in the lake stay whatever their age
    snapshot = catalog.begin_snapshot(db, plan="trades", instance="shard-2", node="node-a",
                                      snapshots_dir=project / "data" / "snapshots", taken_at=now - 39 * DAY)
    catalog.record_contents(db, snapshot.id, batch_id=3, checkpoint_bytes=1)
    catalog.mark_good(db, snapshot.id, {"success": True})
    contributions = [("shard-1", 40 * DAY, True), ("shard-1", 40 * DAY, False), ("shard-1", 31 * DAY, True),
                     ("shard-1", 29 * DAY, True), ("shard-2", 40 * DAY, True), ("shard-2", 39 * DAY - HOUR / 2, True),
                     ("shard-2", 35 * DAY, True)]
    for index, (instance, age, in_lake) in enumerate(contributions):
        insert(db, "output_contributions", {"plan": "trades", "output": "orders", "contribution_id": f"c{index}",
                                            "instance": instance, "key": "{}", "in_lake": in_lake,
                                            "applied_at": now - age})

    before = snapshot_of_reads(db)
    stored = {table: rows(db, f"SELECT * FROM {table}") for table in
              ("trade_aggregates", "heartbeats", "publish_log", "failover_events", "output_contributions")}
    monkeypatch.setattr(trim, "CHUNK", 3)
    totals = PostgresRetentionOperator(task_id="postgres_retention", plan="trades").execute({})

    expected = reference_kept(stored, now, retention, oldest_snapshot={"shard-2": now - 39 * DAY})
    for table, kept in expected.items():
        left = rows(db, f"SELECT * FROM {table}")
        assert sorted(map(identity(table), left)) == sorted(map(identity(table), kept)), table
        assert totals[table] == len(stored[table]) - len(kept), table
    assert snapshot_of_reads(db) == before
    assert totals["trade_aggregates"] == 4  # the reference is not vacuous: every table lost rows
    assert all(totals[t] > 0 for t in expected)
    # what went is recorded, for a backfill to refuse a range that needs it (minutes are kept for good)
    horizons = trim.horizons(db, "trades")
    wanted = {"partials/trade_aggregates/second": now - timedelta(seconds=retention.partials_s["second"]),
              "contributions/shard-1": now - timedelta(seconds=retention.contributions_s),
              "contributions/shard-2": now - 39 * DAY - HOUR}  # its snapshot's replay needs (taken_at less 1 h)
    assert set(horizons) == set(wanted)
    assert all(abs(horizons[what] - at) < timedelta(seconds=30) for what, at in wanted.items()), horizons


def test_tandem_maintain_migrates_a_fresh_database_trims_and_says_what_it_did(project: Path, database_url: str,
                                                                             capsys: pytest.CaptureFixture) -> None:
    """``tandem maintain`` runs the maintenance DAG's steps from the CLI, also on a database no plan has run on yet
    (it used to fail there reading the snapshot catalog)."""
    assert cli.main(["maintain", "trades"]) == 0
    first = " ".join(capsys.readouterr().out.split())
    assert "trade_aggregates (second partials of trade_aggregates): 0 rows older than" in first, first
    assert "vacuumed (dead rows made reusable):" in first

    with Database(database_url) as db:
        now = catalog.database_now(db)
        for granularity, age in (("second", 3 * DAY), ("second", HOUR), ("minute", 3 * DAY)):
            insert(db, "trade_aggregates", {
                "plan": "trades", "granularity": granularity, "bucket_start": (now - age).replace(microsecond=0),
                "symbol": "IBM", "instance": "shard-1", "price_sum": 1.0, "trade_count": 1, "quantity_sum": 1,
                "price_min": 1.0, "price_max": 1.0, "epoch": 1, "batch_id": 1})
        assert cli.main(["maintain", "trades"]) == 0
        second = " ".join(capsys.readouterr().out.split())
        assert "trade_aggregates (second partials of trade_aggregates): 1 rows older than" in second, second
        left = rows(db, "SELECT granularity, bucket_start FROM trade_aggregates ORDER BY granularity")
        assert [(r["granularity"], now - r["bucket_start"] < DAY) for r in left] == [("minute", False),
                                                                                    ("second", True)]


def test_after_a_retention_run_new_rows_reuse_the_space_of_the_deleted_ones(db: Database) -> None:
    """The retention run vacuums what it trimmed: this server runs with autovacuum off, so without it the
    deleted rows' space is never reused and the table grows by what is written, whatever the retention."""
    def write_seconds(start: datetime, count: int) -> None:
        db.run(lambda c: c.execute(
            "INSERT INTO trade_aggregates (plan, granularity, bucket_start, symbol, instance, price_sum, trade_count, "
            "quantity_sum, price_min, price_max, epoch, batch_id) SELECT 'trades', 'second', %s + make_interval("
            "secs => n), 'IBM', 'shard-1', 1.0, 1, 1, 1.0, 1.0, 1, 1 FROM generate_series(1, %s) n", (start, count)))

    def heap_bytes() -> int:
        return rows(db, "SELECT pg_relation_size('trade_aggregates') AS b")[0]["b"]

    retention_s = load_plan("trades").maintenance.retention.partials_s["second"]
    now = catalog.database_now(db)
    write_seconds(now - timedelta(seconds=retention_s) - 2 * DAY, 20_000)  # all older than the retention
    written = heap_bytes()
    totals = PostgresRetentionOperator(task_id="postgres_retention", plan="trades").execute({})
    assert totals["trade_aggregates"] == 20_000
    write_seconds(now - HOUR, 20_000)  # as many new rows: they fit where the deleted ones were
    assert heap_bytes() <= written * 1.1, (written, heap_bytes())
    [stats] = rows(db, "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'trade_aggregates'")
    assert stats["vacuum_count"] >= 1


def identity(table: str):
    keys = {"trade_aggregates": ("granularity", "bucket_start", "instance"), "heartbeats": ("id",),
            "publish_log": ("instance_id", "batch_id"), "failover_events": ("id",),
            "output_contributions": ("contribution_id",)}[table]
    return lambda row: tuple(str(row[k]) for k in keys)


def reference_kept(stored: dict[str, list[dict]], now: datetime, retention, *,
                   oldest_snapshot: dict[str, datetime]) -> dict[str, list[dict]]:
    """The rows the declared retention keeps, by the rules in words: old rows go unless they are the newest of
    their kind that something reads."""
    def older(row: dict, column: str, seconds: float) -> bool:
        return row[column] < now - timedelta(seconds=seconds)

    def grouped(table: str, key) -> dict:
        groups: dict = {}
        for row in stored[table]:
            groups.setdefault(key(row), []).append(row)
        return groups

    kept: dict[str, list[dict]] = {}
    kept["trade_aggregates"] = [r for r in stored["trade_aggregates"]
                                if r["granularity"] not in retention.partials_s
                                or not older(r, "bucket_start", retention.partials_s[r["granularity"]])]
    newest_beats = [max(g, key=lambda r: r["recorded_at"])["id"]
                    for g in grouped("heartbeats", lambda r: (r["instance_id"], r["query_name"])).values()]
    kept["heartbeats"] = [r for r in stored["heartbeats"]
                          if r["id"] in newest_beats or not older(r, "recorded_at", retention.heartbeats_s)]
    newest_batches = [(g[-1]["instance_id"], g[-1]["batch_id"]) for g in
                      (sorted(g, key=lambda r: r["batch_id"]) for g in
                       grouped("publish_log", lambda r: (r["instance_id"], r["output"])).values())]
    furthest = [(r["instance_id"], r["batch_id"]) for g in
                grouped("publish_log", lambda r: (r["instance"], r["output"])).values()
                for r in [max((r for r in g if r["watermark"]), key=lambda r: r["watermark"])]]
    kept["publish_log"] = [r for r in stored["publish_log"]
                           if (r["instance_id"], r["batch_id"]) in newest_batches + furthest
                           or not older(r, "published_at", retention.publish_log_s)]
    newest_events = [max(g, key=lambda r: r["happened_at"])["id"] for g in
                     grouped("failover_events", lambda r: (r["instance"], r["node"], r["kind"])).values()]
    kept["failover_events"] = [r for r in stored["failover_events"]
                               if r["id"] in newest_events or not older(r, "happened_at", retention.failover_events_s)]
    kept["output_contributions"] = [
        r for r in stored["output_contributions"]
        if not r["in_lake"] or not older(r, "applied_at", retention.contributions_s)
        or (r["instance"] in oldest_snapshot and r["applied_at"] >= oldest_snapshot[r["instance"]] - HOUR)]
    return kept


def snapshot_of_reads(db: Database) -> dict:
    """What the running system reads from the trimmed tables."""
    return {"published": published_watermark(db, "trades", "shard-1", "trade_aggregates"),
            "events": sorted((r["instance"], r["kind"], r["node"], str(r["happened_at"])) for r in
                             newest_of_kinds(db, "trades", ["PROMOTED", "RELEASED", "DRAINED"], "RELEASED")),
            "progress": {instance: {k: v for k, v in row.items() if not k.endswith("_s")}  # ages and lags grow
                         for instance, row in latest_progress(db, "trades").items()},
            "minutes": rows(db, "SELECT * FROM trade_aggregates WHERE granularity = 'minute' ORDER BY 2, 3, 4")}


def test_events_and_table_rows_past_their_retention_go_and_what_is_still_needed_stays(project: Path,
                                                                                       db: Database) -> None:
    """Issue 46 §4: an events output's rows go once published over ``retention.events`` ago and in the lake (and,
    published to a NATS stream, relayed); a table's keys once not updated for ``retention.table_rows``."""
    import yaml

    path = project / "conf" / "plans" / "pizza_shop.yaml"
    declared = yaml.safe_load(path.read_text())
    declared.setdefault("maintenance", {}).setdefault("retention", {})["table_rows"] = "60 days"
    path.write_text(yaml.safe_dump(declared))
    plan = load_plan("pizza_shop")
    now = catalog.database_now(db)
    events = [("old-in-lake", 40 * DAY, True), ("old-not-in-lake", 40 * DAY, False), ("new", DAY, True)]
    for event_id, age, in_lake in events:
        insert(db, "output_events", {"plan": "pizza_shop", "output": "overdue_orders", "event_id": event_id,
                                     "instance": "shop-1", "event_time": now - age, "payload": "{}", "node": "node-a",
                                     "epoch": 1, "batch_id": 1, "in_lake": in_lake, "published_at": now - age})
    for key, age in (("gone", 90 * DAY), ("kept", 10 * DAY)):
        insert(db, "output_table_rows", {"plan": "pizza_shop", "output": "delivered_orders", "key": f'"{key}"',
                                         "instance": "shop-1", "value": "{}", "version": 1, "node": "node-a",
                                         "epoch": 1, "batch_id": 1, "updated_at": now - age})
    from tandem.batch.trim import trim_plan_rows

    trim_plan_rows(plan, db)
    assert sorted(r["event_id"] for r in rows(db, "SELECT event_id FROM output_events")) == ["new", "old-not-in-lake"]
    assert [r["key"] for r in rows(db, "SELECT key FROM output_table_rows")] == ["kept"]

    # an output published to a NATS stream: only what its relay recorded as stored goes
    for event_id in ("relayed", "not-yet-relayed"):
        insert(db, "output_events", {"plan": "pizza_shop", "output": "hot", "event_id": event_id,
                                     "instance": "shop-1", "event_time": now - 40 * DAY, "payload": "{}",
                                     "node": "node-a", "epoch": 1, "batch_id": 1, "in_lake": True,
                                     "published_at": now - 40 * DAY})
    [position] = rows(db, "SELECT xid::text::bigint AS xid FROM output_events WHERE event_id = 'relayed'")
    insert(db, "output_streams", {"plan": "pizza_shop", "output": "hot", "stream": "hot", "stream_seq": 1,
                                  "xid": position["xid"], "event_id": "relayed"})
    assert trim.trim_events(db, "pizza_shop", "shop-1", now - 30 * DAY, ["hot"]) == 1
    assert "not-yet-relayed" in {r["event_id"] for r in rows(db, "SELECT event_id FROM output_events")}
    assert "relayed" not in {r["event_id"] for r in rows(db, "SELECT event_id FROM output_events")}
