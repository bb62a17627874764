"""Hold, trim and flush of the events and table kinds, on real PostgreSQL and Delta (no Spark).

The active and the standby see the same rows cut into different micro-batches; whatever dies
where, PostgreSQL ends with one row per id and the merged values of the reference, and the Delta
copy reads the same.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from tandem.declarations import OutputConfig
from tandem.lake import tables
from tandem.outputs.base import BatchInfo
from tandem.outputs.events import EventsSink, read_events_lake
from tandem.outputs.table import TableSink, read_table_lake
from tandem.store import Database, migrate
from tandem.store.leases import try_acquire
from tandem.store.outputs import read_events, read_table_rows
from tandem.store.registry import InstanceKey

pytestmark = pytest.mark.integration
UTC = timezone.utc
T0 = datetime(2025, 1, 1, tzinfo=UTC)
ALERTS = OutputConfig(kind="events", key=["room_no", "time"], time="time")
COUNTS = OutputConfig(kind="table", key=["customer_name"], values=["delivered"], id=["order_no"])
ACTIVE, STANDBY = InstanceKey("p", "g-1", "node-a"), InstanceKey("p", "g-1", "node-b")


class Crash(Exception):
    pass


def alerts(rooms: range) -> pa.Table:
    return pa.table({"room_no": pa.array(list(rooms), pa.int64()),
                     "time": pa.array([T0 + timedelta(seconds=r) for r in rooms], pa.timestamp("us", tz="UTC")),
                     "temp": pa.array([40.0 + r for r in rooms])})


def orders(numbers: range) -> pa.Table:
    return pa.table({"order_no": [f"o{n}" for n in numbers], "customer_name": [f"c{n % 3}" for n in numbers],
                     "delivered": pa.array([1] * len(numbers), pa.int64())})


@pytest.fixture
def db(database_url: str):
    with Database(database_url) as database:
        migrate(database)
        yield database


def take(db: Database, key: InstanceKey) -> int:
    db.run(lambda cursor: cursor.execute("UPDATE leases SET expires_at = now() - interval '1 second'"))
    epoch = try_acquire(db, key.plan, key.instance, key.node, 30.0)
    assert epoch is not None
    return epoch


def batch(key: InstanceKey, batch_id: int, epoch: int) -> BatchInfo:
    return BatchInfo(key, batch_id, epoch, datetime.now(UTC))


def test_events_survive_a_crash_between_postgres_and_delta_without_a_duplicate(db, database_url, tmp_path: Path,
                                                                              monkeypatch) -> None:
    path = tmp_path / "alerts"
    active = EventsSink("p", "alerts", ALERTS, ACTIVE, database_url, path)
    standby = EventsSink("p", "alerts", ALERTS, STANDBY, database_url, path)
    epoch = take(db, ACTIVE)
    active.publish(alerts(range(0, 10)), batch(ACTIVE, 0, epoch))
    for part in (range(0, 4), range(4, 13), range(13, 20)):  # the standby's batches are cut elsewhere
        standby.hold(alerts(part), part.start)
    standby.trim()
    assert sorted(r["room_no"] for r in standby.held.values()) == list(range(10, 20)), "trimmed by what is in Delta"

    monkeypatch.setattr("tandem.outputs.base.append_once", lambda *a, **k: (_ for _ in ()).throw(Crash()))
    with pytest.raises(Crash):  # PostgreSQL commits 10..14, the Delta append never happens
        active.publish(alerts(range(10, 15)), batch(ACTIVE, 1, epoch))
    monkeypatch.undo()
    standby.trim()
    assert sorted(r["room_no"] for r in standby.held.values()) == list(range(10, 20)), \
        "rows in PostgreSQL but not in Delta are still held"

    standby.flush(batch(STANDBY, -1, take(db, STANDBY)))
    rows = db.run(lambda cursor: read_events(cursor, "p", "alerts", T0, T0 + timedelta(days=1)))
    assert [r["payload"]["room_no"] for r in rows] == list(range(20))
    assert {r["payload"]["room_no"]: r["instance"] for r in rows}.keys() == set(range(20))
    lake = read_events_lake(path)
    assert sorted(lake.column("room_no").to_pylist()) == list(range(20))
    assert sorted(lake.column("event_id").to_pylist()) == sorted(r["event_id"] for r in rows)


def test_a_paused_old_active_cannot_write_postgres_and_its_late_delta_append_is_read_once(
        db, database_url, tmp_path: Path) -> None:
    path = tmp_path / "alerts"
    old = EventsSink("p", "alerts", ALERTS, ACTIVE, database_url, path)
    new = EventsSink("p", "alerts", ALERTS, STANDBY, database_url, path)
    old_epoch = take(db, ACTIVE)
    new.hold(alerts(range(0, 6)), 0)
    new_epoch = take(db, STANDBY)  # the old active was paused past its lease
    new.flush(batch(STANDBY, -1, new_epoch))

    from tandem.errors import FencedError

    with pytest.raises(FencedError):
        old.publish(alerts(range(3, 9)), batch(ACTIVE, 0, old_epoch))
    # what the fence cannot stop: an append the old active had already decided before the epoch moved
    late = alerts(range(0, 6)).append_column("event_id", pa.array(
        [old.identities(alerts(range(i, i + 1))).popitem()[0] for i in range(6)]))
    for name, value, kind in (("instance", "g-1", pa.string()), ("node", "node-a", pa.string()),
                              ("epoch", old_epoch, pa.int64()), ("batch_id", 0, pa.int64())):
        late = late.append_column(name, pa.array([value] * 6, kind))
    late = late.append_column("published_at", pa.array([datetime.now(UTC)] * 6, pa.timestamp("us", tz="UTC")))
    tables.append_once(path, late, app_id="p/g-1/node-a/alerts", version=0)
    assert tables.read_table(path).num_rows == 12, "the Delta table holds both copies"
    assert sorted(read_events_lake(path).column("room_no").to_pylist()) == list(range(6)), "readers see one per id"
    count = db.run(lambda cursor: (cursor.execute("SELECT count(*) AS n FROM output_events"), cursor.fetchone())[1])
    assert count["n"] == 6


def test_table_contributions_count_once_whoever_publishes_them_and_merge_across_instances(
        db, database_url, tmp_path: Path) -> None:
    path = tmp_path / "counts"
    active = TableSink("p", "counts", COUNTS, ACTIVE, database_url, path)
    standby = TableSink("p", "counts", COUNTS, STANDBY, database_url, path)
    other = InstanceKey("p", "g-2", "node-a")
    elsewhere = TableSink("p", "counts", COUNTS, other, database_url, path)
    epoch = take(db, ACTIVE)
    active.publish(orders(range(0, 12)), batch(ACTIVE, 0, epoch))
    active.publish(orders(range(0, 12)), batch(ACTIVE, 0, epoch))  # a replayed batch changes nothing
    standby.hold(orders(range(0, 7)), 0)
    standby.hold(orders(range(7, 20)), 1)
    standby.trim()
    assert sorted(standby.held) == sorted(standby.identities(orders(range(12, 20))))
    standby.flush(batch(STANDBY, -1, take(db, STANDBY)))
    elsewhere.publish(orders(range(100, 103)), batch(other, 0, try_acquire(db, "p", "g-2", "node-a", 30.0)))

    expected: dict[str, int] = {}
    for n in [*range(20), *range(100, 103)]:
        expected[f"c{n % 3}"] = expected.get(f"c{n % 3}", 0) + 1
    merged = db.run(lambda cursor: read_table_rows(cursor, "p", "counts", ["delivered"]))
    assert {r["key"]["customer_name"]: int(r["delivered"]) for r in merged} == expected
    assert {r["key"]["customer_name"]: r["instances"] for r in merged} == {"c0": 2, "c1": 2, "c2": 2}
    lake = {r["customer_name"]: int(r["delivered"]) for r in read_table_lake(path, COUNTS)}
    assert lake == expected


def test_a_source_files_bad_lines_are_quarantined_once_per_instance_whoever_publishes_them(db, database_url,
                                                                                        tmp_path: Path) -> None:
    from tandem.outputs.quarantine import QuarantineSink

    path = tmp_path / "quarantine"
    epoch = take(db, ACTIVE)

    def bad(files: list[str]) -> pa.Table:
        return pa.table({"raw": [f"{f}:{i}" for f in files for i in range(2)],
                         "source_file": [f for f in files for _ in range(2)],
                         "reason": ["missing field 'time'"] * (2 * len(files))})

    sink = QuarantineSink(ACTIVE, database_url, path)
    assert sink.publish(bad(["a.jsonl", "b.jsonl"]), BatchInfo(ACTIVE, 3, epoch, T0, "lineage-1")) == 4
    # a replay after a restore (a new lineage, other batch ids) reads a.jsonl again, with a new file c.jsonl
    assert sink.publish(bad(["a.jsonl", "c.jsonl"]), BatchInfo(ACTIVE, 1, epoch, T0, "lineage-2")) == 2
    # another instance's file of the same name is its own
    other = InstanceKey("p", "g-2", "node-a")
    other_epoch = take(db, other)
    assert QuarantineSink(other, database_url, path).publish(bad(["a.jsonl"]),
                                                             BatchInfo(other, 1, other_epoch, T0, "x")) == 2
    rows = tables.read_table(path).to_pylist()
    assert sorted((r["instance"], r["raw"]) for r in rows) == sorted(
        [("g-1", f"{f}:{i}") for f in ("a.jsonl", "b.jsonl", "c.jsonl") for i in range(2)]
        + [("g-2", f"a.jsonl:{i}") for i in range(2)])


def test_events_keep_every_character_of_their_payload_through_the_copy(db: Database, tmp_path: Path) -> None:
    """Events go to PostgreSQL through COPY's text format: backslashes, tabs, newlines, quotes and
    non-ASCII text in a payload come back exactly as the query produced them."""
    awkward = ["C:\\temp\\new", "tab\there", "line\nbreak", 'say "hi"', "Zürich ☃", "\\N", "back\\\\slash", ""]
    rows = pa.table({"room_no": pa.array(range(len(awkward)), pa.int64()),
                     "time": pa.array([T0 + timedelta(seconds=i) for i in range(len(awkward))],
                                      pa.timestamp("us", tz="UTC")),
                     "device_id": awkward})
    sink = EventsSink("p", "alerts", ALERTS, ACTIVE, db.url, tmp_path / "alerts")
    epoch = take(db, ACTIVE)
    assert sink.publish(rows, BatchInfo(ACTIVE, 0, epoch, T0)) == len(awkward)
    stored = db.run(lambda cursor: read_events(cursor, "p", "alerts", T0, T0 + timedelta(hours=1)))
    assert [e["payload"]["device_id"] for e in stored] == awkward
    assert sorted(read_events_lake(tmp_path / "alerts").column("device_id").to_pylist()) == sorted(awkward)


def refuse(db: Database, table: str, condition: str, sqlstate: str = "22023") -> None:
    """Make PostgreSQL refuse rows of ``table`` matching ``condition`` (SQL on NEW) with ``sqlstate``: a value the
    store cannot take, for a reason nobody listed."""
    db.run(lambda cursor: cursor.execute(f"""
        CREATE FUNCTION refuse_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF {condition} THEN RAISE EXCEPTION 'refused by the test''s trigger' USING ERRCODE = '{sqlstate}'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_{table} BEFORE INSERT OR UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION refuse_{table}();
    """))


def quarantined_refusals(path: Path) -> list[dict]:
    rows = tables.read_table(path).to_pylist() if tables.table_exists(path) else []
    return sorted((r for r in rows if r["source_file"].startswith("output:")), key=lambda r: r["raw"])


def test_events_the_store_refuses_are_quarantined_once_and_the_rest_published_by_either_node(
        db: Database, database_url: str, tmp_path: Path) -> None:
    """A data error (SQLSTATE class 22) isolates the offending rows: quarantined with the store's error, the rest
    published; the standby that replays the same rows after a failover decides the same. A NaN (a legal double no
    JSON number can hold) is published, spelled "NaN" in PostgreSQL as every reader shows it, NaN in Delta."""
    from tandem.outputs.quarantine import QuarantineSink

    refuse(db, "output_events", "NEW.payload->>'temp' = '45.0'")
    path, quarantine_path = tmp_path / "alerts", tmp_path / "quarantine"
    rows = alerts(range(0, 12))
    rows = rows.set_column(2, "temp", pa.array([float("nan") if r == 7 else 40.0 + r for r in range(12)]))
    active = EventsSink("p", "alerts", ALERTS, ACTIVE, database_url, path,
                        QuarantineSink(ACTIVE, database_url, quarantine_path))
    standby = EventsSink("p", "alerts", ALERTS, STANDBY, database_url, path,
                         QuarantineSink(STANDBY, database_url, quarantine_path))
    epoch = take(db, ACTIVE)
    assert active.publish(rows, batch(ACTIVE, 0, epoch)) == 11
    assert active.publish(rows, batch(ACTIVE, 0, epoch)) == 0, "a replayed batch publishes nothing new"
    standby.hold(rows, 0)
    standby.flush(batch(STANDBY, -1, take(db, STANDBY)))  # the standby takes over and publishes what it held

    stored = db.run(lambda cursor: read_events(cursor, "p", "alerts", T0, T0 + timedelta(days=1)))
    assert sorted(r["payload"]["room_no"] for r in stored) == [r for r in range(12) if r != 5]
    assert [r["payload"]["temp"] for r in stored if r["payload"]["room_no"] == 7] == ["NaN"]
    lake = read_events_lake(path).to_pylist()
    assert sorted(r["room_no"] for r in lake) == [r for r in range(12) if r != 5]
    assert [math.isnan(r["temp"]) for r in lake if r["room_no"] == 7] == [True]
    refused = quarantined_refusals(quarantine_path)
    assert len(refused) == 1, "each refused row is quarantined once, whoever refused it"
    by_room = {json.loads(r["raw"])["room_no"]: r["reason"] for r in refused}
    assert "SQLSTATE 22023: refused by the test's trigger" in by_room[5], by_room
    assert all(r["reason"].startswith("output alerts: the store refused the row") for r in refused)


def test_aggregates_the_store_refuses_are_quarantined_and_the_rest_published_and_tables_keep_infinities(
        db: Database, database_url: str, tmp_path: Path) -> None:
    from tandem.outputs.aggregation import AggregateSink
    from tandem.outputs.quarantine import QuarantineSink
    from _project import TRADES

    quarantine = QuarantineSink(ACTIVE, database_url, tmp_path / "quarantine")
    epoch = take(db, ACTIVE)
    aggregates = AggregateSink(TRADES, ACTIVE, database_url, tmp_path / "trades", 1.0, quarantine)
    aggregates.publish(pa.table({"trade_count": [1]}).slice(0, 0), batch(ACTIVE, 0, epoch))
    db.run(lambda cursor: ensure_trades(cursor))
    refuse(db, "trade_aggregates", "NEW.symbol = 'POISON'")
    seconds = pa.table({"bucket_start": pa.array([T0, T0, T0 + timedelta(seconds=1)], pa.timestamp("us", tz="UTC")),
                        "symbol": ["IBM", "POISON", "IBM"], "price_sum": [10.0, 1.0, 20.0],
                        "trade_count": pa.array([1, 1, 2], pa.int64()), "quantity_sum": pa.array([5, 1, 6], pa.int64()),
                        "price_min": [10.0, 1.0, 9.0], "price_max": [10.0, 1.0, 11.0]})
    assert aggregates.publish(seconds, batch(ACTIVE, 1, epoch)) > 0
    counted = db.run(lambda cursor: (cursor.execute(
        "SELECT symbol, sum(trade_count) AS n FROM trade_aggregates WHERE granularity = 'second' GROUP BY symbol"),
        cursor.fetchall())[1])
    assert {r["symbol"]: int(r["n"]) for r in counted} == {"IBM": 3}

    counts = TableSink("p", "counts", COUNTS, ACTIVE, database_url, tmp_path / "counts", quarantine)
    orders_with_nan = orders(range(0, 4)).set_column(2, "delivered", pa.array([1.0, float("inf"), 1.0, 1.0]))
    counts.publish(orders_with_nan, batch(ACTIVE, 2, epoch))
    merged = db.run(lambda cursor: read_table_rows(cursor, "p", "counts", ["delivered"]))
    # an infinite value is a legal double: kept (spelled in jsonb), and its key's sum is infinite, as IEEE 754 says
    assert {r["key"]["customer_name"]: float(r["delivered"]) for r in merged} == {"c0": 2.0, "c1": math.inf, "c2": 1.0}
    reasons = sorted(r["reason"] for r in quarantined_refusals(tmp_path / "quarantine"))
    assert len(reasons) == 1 and "22023" in reasons[0], reasons


def ensure_trades(cursor) -> None:
    from tandem.store import aggregates
    from _project import TRADES

    aggregates.ensure_table(cursor, TRADES)


def test_a_shadow_compares_held_events_with_the_published_payloads_once_the_active_published_them(
        db, database_url, tmp_path: Path) -> None:
    """An upgrade's shadow (:mod:`tandem.supervisor.upgrade`) holding another version's events: each one the active
    published is compared with its stored payload; one whose temperature the new version computes otherwise is
    named with its old and new values, the others agree."""
    path = tmp_path / "alerts"
    active = EventsSink("p", "alerts", ALERTS, ACTIVE, database_url, path)
    shadow = EventsSink("p", "alerts", ALERTS, STANDBY, database_url, path)
    seen: list[tuple[str, int, list[str]]] = []

    class Recorded:  # what upgrade_checks would receive
        proven = None

        def record(self, output: str, checked: int, differences: list[str], unmatched: list[str] = ()) -> None:
            seen.append((output, checked, differences))

        def published_through(self, batch_id: int) -> None:
            self.proven = batch_id

        def proven_batch(self) -> int | None:
            return self.proven

    shadow.verify_with(Recorded())
    active.publish(alerts(range(0, 10)), batch(ACTIVE, 0, take(db, ACTIVE)))
    changed = alerts(range(0, 12))
    changed = changed.set_column(2, "temp", pa.array([99.5 if r == 3 else 40.0 + r for r in range(12)]))
    shadow.hold(changed, 0)
    shadow.trim()
    [(output, checked, differences)] = seen
    assert (output, checked, len(differences)) == ("alerts", 10, 1), seen
    assert "temp 43.0 (old) != 99.5 (new)" in differences[0], differences
    assert sorted(r["room_no"] for r in shadow.held.values()) == [10, 11], "not published yet: held, not compared"
