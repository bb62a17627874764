"""Snapshots of every plan: readable state, validation, and a restore that loses and repeats nothing.

For pizza_shop and temperatures, with real Spark, RocksDB state, PostgreSQL and Delta: the input
arrives in three parts. After part 1 every instance is snapshotted (the export is checked against
the events the test wrote, the suite marks it GOOD) and every output must equal the plain-Python
reference at the cut: of the input read, with what each instance's watermark has made final. Part 2
is processed and published; then every instance is restored to its snapshot. Their outputs are all
published by id, so the restore keeps them: they still equal the reference of parts 1 and 2. Part 2
is processed again from the cut and part 3 follows: the outputs must equal the reference of all the
input, each row once, in PostgreSQL and Delta (the rows the replay emits again have the ids of rows
already published).

For trades, whose aggregation a restore rolls back, with the table under its default name (not the
output's): after the restore the aggregation is the reference at the cut for the restored instance.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from _ha import mismatches
from _references import PIZZA_T0, arrival_order, decided_orders, make_orders, temperature_reference_at
from tandem.aggregation.spec import spec_for
from tandem.airflow.snapshot_operators import DeltaUpkeepOperator
from tandem.batch.upkeep import maintain_plan_tables
from tandem.checkpoints import committed_batch
from tandem.config import load_cluster, load_plan
from tandem.declarations import partition_of
from tandem.lake.tables import read_table
from tandem.layout import checkpoint_dir, delta_table_dir, instance_landing_dir, landing_dir, snapshot_dir
from tandem.producer import advance_watermark, partitioned
from tandem.sources.files import write_atomically
from tandem.runtime.node import run_instance
from tandem.snapshots.landing import clean_plan_landing
from tandem.snapshots.restore import restore_instance
from tandem.snapshots.state_export import STATE_TABLE, TIMERS, read_state
from tandem.snapshots.take import take_snapshot
from tandem.store import Database
from test_pizza_shop_plan import assert_outputs_equal_the_reference as assert_pizza_outputs
from test_temperatures_plan import T0 as TEMPS_T0
from test_temperatures_plan import assert_outputs_equal_the_reference as assert_temperature_outputs
from test_temperatures_plan import assert_outputs_hold as assert_temperature_outputs_hold
from test_temperatures_plan import make_readings
from test_trades_plan import T0 as TRADES_T0
from test_trades_plan import make_events as make_trades
from test_trades_plan import write_events as write_trades

pytestmark = pytest.mark.integration


def write(cluster, plan, streams: dict[str, list[dict]]) -> None:
    lines = {name: [(e, json.dumps(e)) for e in events] for name, events in streams.items()}
    for (stream, partition), chunk in partitioned(plan, lines).items():
        write_atomically(landing_dir(cluster, stream, partition), chunk)


def thirds(events: list[dict]) -> list[list[dict]]:
    n = len(events)
    return [events[:n // 3], events[n // 3:2 * n // 3], events[2 * n // 3:]]


def run_one(cluster, plan, instance: str, spark) -> None:
    """Run node-a's instance of ``instance`` until it has processed every input file (it must stop cleanly)."""
    result = run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True)
    assert result.status == "STOPPED", result.error


def run_all(cluster, plan, spark) -> None:
    for instance in plan.instances:  # available-now ends with a no-data batch: the watermark fires the timers
        run_one(cluster, plan, instance, spark)


def snapshot_all(cluster, plan, spark) -> dict[str, str]:
    """Snapshot every instance of node-a; each must be GOOD. Returns the snapshot id per instance."""
    taken = {}
    for instance in plan.instances:
        snapshot = take_snapshot(cluster, plan, instance, spark, node="node-a")
        assert snapshot.good, snapshot.summary()
        taken[instance] = snapshot.record.id
    return taken


def restore_all(cluster, plan, taken: dict[str, str]) -> list[str]:
    lines = []
    for instance, snapshot_id in taken.items():
        lines += restore_instance(cluster, plan, instance, snapshot_id=snapshot_id, start=False).lines()
    return lines


def quarantine_reasons(cluster, plan) -> list[str]:
    """The reasons of every quarantined line of the plan, sorted (a line quarantined twice shows twice)."""
    return sorted(read_table(delta_table_dir(cluster, plan.name, "quarantine")).column("reason").to_pylist())


def watermark(query_dir: Path) -> int:
    """The event-time watermark (epoch ms) of the last batch a query checkpoint (live, or a snapshot's cut) has
    committed, as Spark logged it: what a transformWithState query has emitted is final up to it."""
    batch = committed_batch(query_dir)
    return json.loads((query_dir / "offsets" / str(batch)).read_text().splitlines()[1])["batchWatermarkMs"]


def joined(*parts: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Parts of the input, stream by stream, as one."""
    return {name: [e for part in parts for e in part[name]] for name in parts[0]}


def assert_pizza_outputs_at(cluster, plan, database_url: str, streams: dict[str, list[dict]],
                            watermarks: dict[str, int]) -> None:
    """Every pizza output is the reference of the orders and deliveries read, with each instance's orders decided
    up to its watermark (``watermarks``, by instance)."""
    partitions = plan.streams["orders"].partitions
    decided = []
    for instance, at in watermarks.items():
        mine = set(plan.partitions(instance, "orders"))
        decided += decided_orders([o for o in streams["orders"] if partition_of(o["order_no"], partitions) in mine], at)
    assert_pizza_outputs(cluster, plan, database_url, decided, streams["deliveries"])


def test_pizza_shop_snapshots_export_the_orders_and_restore_exactly_once(project, database_url, spark) -> None:
    cluster = load_cluster()
    plan = load_plan("pizza_shop", cluster)
    orders, deliveries = make_orders(5, 300)
    # one arrival sequence cut in three: an event comes at most 3 s out of time order, well within the
    # 10 s watermark, so no order expires before a delivery of its window has come
    arrival = arrival_order([{**o, "stream": "orders"} for o in orders]
                            + [{**d, "stream": "deliveries"} for d in deliveries], random.Random(13))
    parts = [{name: [{k: v for k, v in e.items() if k != "stream"} for e in part if e["stream"] == name]
              for name in ("orders", "deliveries")} for part in thirds(arrival)]

    write(cluster, plan, parts[0])
    write_atomically(landing_dir(cluster, "orders", 2), ['{"order_no": "o-x", "time": 5}'])
    run_all(cluster, plan, spark)
    taken = snapshot_all(cluster, plan, spark)
    before_the_cut = landing_files(cluster, plan)

    # at the cut, every output is the reference of part 1 with the orders decided by each instance's watermark
    assert_pizza_outputs_at(cluster, plan, database_url, parts[0], {
        instance: watermark(snapshot_dir(cluster, plan.name, snapshot_id) / "orders")
        for instance, snapshot_id in taken.items()})
    assert quarantine_reasons(cluster, plan) == ["missing field 'customer_name'"]

    # the export: every pending order of an instance with its customer, time and expiry timer
    by_order = {o["order_no"]: o for o in orders}
    state_path = delta_table_dir(cluster, plan.name, STATE_TABLE)
    pending = 0
    for instance, snapshot_id in taken.items():
        rows = read_state(state_path, snapshot_id)
        assert {r["store_name"] for r in rows} == {"order", TIMERS}, instance
        timers = {(r["key"]["order_no"], r["value"]["expiration_timestamp_ms"]) for r in rows
                  if r["store_name"] == TIMERS}
        mine = set(plan.partitions(instance, "orders"))
        for row in (r for r in rows if r["store_name"] == "order"):
            order_no, value = row["key"]["order_no"], row["value"]
            assert partition_of(order_no, 4) in mine, f"{order_no} in {instance}, not its partition"
            if value.get("time") is not None:  # to_json leaves out null fields: no order yet, only deliveries
                order = by_order[order_no]
                assert (value.get("customer_name"), value["time"]) == (order["customer_name"], order["time"])
                assert (order_no, order["time"] + 30_000) in timers, f"{order_no}: no expiry timer"
                pending += 1
    assert pending > 0, "the snapshot must hold orders that are not decided yet"

    # part 2 (with bad lines) is published, then undone by the restore and processed again
    write(cluster, plan, parts[1])
    write_atomically(landing_dir(cluster, "deliveries", 1), ['{"order_no": "o-1"}', '{"order_no": "", "time": 5}'])
    run_all(cluster, plan, spark)
    published = {instance: watermark(checkpoint_dir(cluster, plan.name, instance, "node-a", "orders"))
                 for instance in plan.instances}
    lines = restore_all(cluster, plan, taken)
    for output in plan.outputs:
        assert any(f"{output}: kept" in line for line in lines), (output, lines)
    # the restore keeps every output (all are published by id): they still hold what parts 1 and 2 published
    assert_pizza_outputs_at(cluster, plan, database_url, joined(parts[0], parts[1]), published)
    reasons = ["field 'order_no' must not be empty (got \"\")", "missing field 'customer_name'",
               "missing field 'time'"]
    assert quarantine_reasons(cluster, plan) == reasons

    write(cluster, plan, parts[2])
    advance_watermark(cluster, plan, PIZZA_T0 + 3_600_000)
    run_all(cluster, plan, spark)

    assert_pizza_outputs(cluster, plan, database_url, orders, deliveries)
    assert quarantine_reasons(cluster, plan) == reasons, \
        "the bad lines of part 2 are quarantined once, although the replay after the restore read them again"

    # landing retention: the files of both streams behind the snapshots' cuts go, nothing after them
    deleted = {path for decision in clean_plan_landing(cluster, plan).values() for path in decision.delete}
    assert deleted == before_the_cut, (len(deleted), len(before_the_cut))
    assert {Path(p).parent.parent.name for p in deleted} == {"orders", "deliveries"}
    assert landing_files(cluster, plan) and not landing_files(cluster, plan) & before_the_cut


def landing_files(cluster, plan) -> set[str]:
    return {str(path) for stream in plan.streams for p in range(plan.streams[stream].partitions)
            for path in landing_dir(cluster, stream, p).glob("*") if path.is_file()}


def test_temperature_snapshots_export_the_readings_and_restore_exactly_once(project, database_url, spark) -> None:
    cluster = load_cluster()
    plan = load_plan("temperatures", cluster)
    readings = make_readings(17, 600)
    parts = thirds(readings)

    bad_lines = [('{"room_no": 101, "device_id": "x", "temp": 20.0}', "missing field 'time'"),
                 ('{"room_no": 101, "device_id": "", "temp": 20.0, "time": %d}' % TEMPS_T0,
                  "field 'device_id' must not be empty (got \"\")")]  # one before the cut, one after
    write(cluster, plan, {"temps": parts[0]})
    write_atomically(landing_dir(cluster, "temps", 0), [bad_lines[0][0]])
    run_all(cluster, plan, spark)
    taken = snapshot_all(cluster, plan, spark)  # group-2 is stateless: its snapshot is the input it processed

    # at the cut, every output is the reference of part 1 with what group-1's watermarks have made final
    cut = snapshot_dir(cluster, plan.name, taken["group-1-1"])
    assert_temperature_outputs_hold(cluster, plan, database_url, temperature_reference_at(
        parts[0], {query: watermark(cut / query) for query in ("avg_temps", "temp_alerts")}))
    assert quarantine_reasons(cluster, plan) == [bad_lines[0][1]]

    written = {(r["room_no"], r["time"], r["device_id"], r["temp"]) for r in readings}
    rows = read_state(delta_table_dir(cluster, plan.name, STATE_TABLE), taken["group-1-1"])
    stores = {(r["query"], r["store_name"]) for r in rows}
    assert {("avg_temps", "readings"), ("avg_temps", "progress"), ("temp_alerts", "alerted")} <= stores, stores
    kept = [(r["key"]["room_no"], e["time"], e["device_id"], e["temp"])
            for r in rows if r["store_name"] == "readings" for e in r["value"]]
    assert kept and set(kept) <= written, "every reading in the state is one the test wrote, of its room"
    for instance in ("group-2-1", "group-2-2"):
        assert read_state(delta_table_dir(cluster, plan.name, STATE_TABLE), taken[instance]) == []

    write(cluster, plan, {"temps": parts[1]})
    write_atomically(landing_dir(cluster, "temps", 0), [bad_lines[1][0]])
    run_all(cluster, plan, spark)
    published = {query: watermark(checkpoint_dir(cluster, plan.name, "group-1-1", "node-a", query))
                 for query in ("avg_temps", "temp_alerts")}
    restore_all(cluster, plan, taken)
    # the restore keeps every output (all are published by id): they still hold what parts 1 and 2 published
    assert_temperature_outputs_hold(cluster, plan, database_url,
                                    temperature_reference_at(parts[0] + parts[1], published))
    reasons = sorted(reason for _, reason in bad_lines)
    assert quarantine_reasons(cluster, plan) == reasons

    write(cluster, plan, {"temps": parts[2]})
    advance_watermark(cluster, plan, TEMPS_T0 + 3_600_000)
    run_all(cluster, plan, spark)

    assert_temperature_outputs(cluster, plan, database_url, readings)
    assert quarantine_reasons(cluster, plan) == reasons, "each bad line once, although the replay read one again"


def declare_the_default_table(project: Path) -> None:
    """The temp project's trades aggregation without ``table:``: stored as ``trades_trade_aggregates``."""
    path = project / "conf" / "plans" / "trades.yaml"
    declared = yaml.safe_load(path.read_text())
    del declared["outputs"]["trade_aggregates"]["table"]
    path.write_text(yaml.safe_dump(declared))


def as_trades(events: list[dict]) -> list[tuple[int, str, float, int]]:
    """Trades as ``_ha.mismatches`` takes them: (timestamp ms, symbol, price, quantity)."""
    return [(e["timestamp"], e["symbol"], e["price"], e["quantity"]) for e in events]


def test_trades_restore_rolls_an_aggregation_with_the_default_table_back_to_the_cut(project, database_url,
                                                                                  spark) -> None:
    """Its table is not named after its output: restoring shard-1 still puts shard-1's slice back at the cut
    (PostgreSQL and Delta) and leaves shard-2's alone, also after the Delta tables were compacted, vacuumed and
    their logs cleaned before and since the cut; the quarantine is kept; the replay adds up exactly."""
    declare_the_default_table(project)
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    assert spec_for(plan, "trade_aggregates").table == "trades_trade_aggregates"
    landing = {instance: instance_landing_dir(cluster, plan, instance) for instance in plan.instances}
    trades = sorted(make_trades(31, 400, 40_000), key=lambda e: e["timestamp"])
    before, after = trades[:200], trades[200:]  # shard-1's, in time order: before the cut and after it
    other = make_trades(32, 200, 40_000)  # shard-2's, the same symbols and seconds
    bad_lines = [(json.dumps({"symbol": "IBM", "quantity": 1, "timestamp": TRADES_T0}), "missing field 'price'"),
                 (json.dumps({"symbol": "IBM", "price": 10.0, "quantity": -4, "timestamp": TRADES_T0}),
                  "field 'quantity' must be > 0 (got -4)")]  # one before the cut, one after
    reasons = sorted(reason for _, reason in bad_lines)

    for part in (before[:100], before[100:]):  # two micro-batches: two commits per table
        write_trades(landing["shard-1"], part, per_file=100)
        run_one(cluster, plan, "shard-1", spark)
    write_atomically(landing["shard-1"], [bad_lines[0][0]])
    run_one(cluster, plan, "shard-1", spark)
    # the maintenance DAG's Delta upkeep with no retention (issue 27 §3), before the cut and between it and the
    # restore: only the versions the snapshot records keep their files and the commits from a checkpoint before them
    no_retention = replace(plan, maintenance=plan.maintenance.model_copy(update={"vacuum_retention_s": 0.0}))
    with Database(database_url) as db:  # the cut's bisection and the restore's time travel start at its checkpoint
        assert any(u.log_entries_removed for u in maintain_plan_tables(cluster, no_retention, db))
    snapshot = take_snapshot(cluster, plan, "shard-1", spark, node="node-a")
    assert snapshot.good, snapshot.summary()
    assert mismatches(cluster, as_trades(before)) == [], "at the cut"
    assert quarantine_reasons(cluster, plan) == [bad_lines[0][1]]

    # shard-2 publishes only after shard-1's cut: restoring the whole table to the cut would undo it too
    write_trades(landing["shard-1"], after, per_file=100)
    write_atomically(landing["shard-1"], [bad_lines[1][0]])
    write_trades(landing["shard-2"], other, per_file=100)
    run_all(cluster, plan, spark)
    with Database(database_url) as db:
        upkeeps = maintain_plan_tables(cluster, no_retention, db)
    assert any(u.files_compacted and u.files_vacuumed and u.kept_versions for u in upkeeps), \
        [u.describe() for u in upkeeps]
    done = DeltaUpkeepOperator(task_id="delta_upkeep", plan="trades").execute({})  # the DAG's task: the YAML's week
    assert {Path(u["table"]).name for u in done} == {"quarantine", "trade_aggregates"}, done
    assert mismatches(cluster, as_trades(trades + other)) == [], "the upkeep changed what the tables hold"
    report = restore_instance(cluster, plan, "shard-1", snapshot_id=snapshot.record.id, start=False)
    assert mismatches(cluster, as_trades(before + other)) == [], \
        "shard-1 is not back at its cut, or shard-2 is not as it was:\n" + "\n".join(report.lines())
    assert quarantine_reasons(cluster, plan) == reasons, "the quarantine is kept"

    run_one(cluster, plan, "shard-1", spark)
    assert mismatches(cluster, as_trades(trades + other)) == []
    assert quarantine_reasons(cluster, plan) == reasons, "each bad line once, although the replay read one again"
