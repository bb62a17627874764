"""Snapshots of the transformWithState plans: readable state, validation, and a restore that loses and repeats nothing.

For pizza_shop and temperatures, with real Spark, RocksDB state, PostgreSQL and Delta: the input
arrives in three parts. After part 1 every instance is snapshotted (the export is checked against
the events the test wrote, the suite marks it GOOD); part 2 is processed and published; then every
instance is restored to its snapshot (part 2 is processed again from the cut) and part 3 follows.
The outputs must equal the plain-Python reference of all the input, each row once, in PostgreSQL
and Delta: the rows the replay emits again have the ids of rows already published.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from _references import PIZZA_T0, arrival_order, make_orders
from tandem.config import load_cluster, load_plan
from tandem.declarations import partition_of
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir, landing_dir
from tandem.producer import advance_watermark, partitioned, write_atomically
from tandem.runtime.node import run_instance
from tandem.snapshots.landing import clean_plan_landing
from tandem.snapshots.restore import restore_shard
from tandem.snapshots.state_export import STATE_TABLE, TIMERS, read_state
from tandem.snapshots.take import take_snapshot
from test_pizza_shop_plan import assert_outputs_equal_the_reference as assert_pizza_outputs
from test_temperatures_plan import T0 as TEMPS_T0
from test_temperatures_plan import assert_outputs_equal_the_reference as assert_temperature_outputs
from test_temperatures_plan import make_readings

pytestmark = pytest.mark.integration


def write(cluster, plan, streams: dict[str, list[dict]]) -> None:
    lines = {name: [(e, json.dumps(e)) for e in events] for name, events in streams.items()}
    for (stream, partition), chunk in partitioned(plan, lines).items():
        write_atomically(landing_dir(cluster, stream, partition), chunk)


def thirds(events: list[dict]) -> list[list[dict]]:
    n = len(events)
    return [events[:n // 3], events[n // 3:2 * n // 3], events[2 * n // 3:]]


def run_all(cluster, plan, spark) -> None:
    for shard in plan.shards:  # available-now ends with a no-data batch: the watermark fires the timers
        result = run_instance(cluster, plan, "node-a", shard, spark=spark, available_now=True)
        assert result.status == "STOPPED", result.error


def snapshot_all(cluster, plan, spark) -> dict[str, str]:
    """Snapshot every instance of node-a; each must be GOOD. Returns the snapshot id per instance."""
    taken = {}
    for shard in plan.shards:
        snapshot = take_snapshot(cluster, plan, shard, spark, node="node-a")
        assert snapshot.good, snapshot.summary()
        taken[shard] = snapshot.record.id
    return taken


def restore_all(cluster, plan, taken: dict[str, str]) -> list[str]:
    lines = []
    for shard, snapshot_id in taken.items():
        lines += restore_shard(cluster, plan, shard, snapshot_id=snapshot_id, start=False).lines()
    return lines


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
    run_all(cluster, plan, spark)
    taken = snapshot_all(cluster, plan, spark)
    before_the_cut = landing_files(cluster, plan)

    # the export: every pending order of an instance with its customer, time and expiry timer
    by_order = {o["order_no"]: o for o in orders}
    state_path = delta_table_dir(cluster, plan.name, STATE_TABLE)
    pending = 0
    for shard, snapshot_id in taken.items():
        rows = read_state(state_path, snapshot_id)
        assert {r["store_name"] for r in rows} == {"order", TIMERS}, shard
        timers = {(r["key"]["order_no"], r["value"]["expiration_timestamp_ms"]) for r in rows
                  if r["store_name"] == TIMERS}
        mine = set(plan.partitions(shard, "orders"))
        for row in (r for r in rows if r["store_name"] == "order"):
            order_no, value = row["key"]["order_no"], row["value"]
            assert partition_of(order_no, 4) in mine, f"{order_no} in {shard}, not its partition"
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
    lines = restore_all(cluster, plan, taken)
    assert any("overdue_orders: kept" in line for line in lines), lines

    write(cluster, plan, parts[2])
    advance_watermark(cluster, plan, PIZZA_T0 + 3_600_000)
    run_all(cluster, plan, spark)

    assert_pizza_outputs(cluster, plan, database_url, orders, deliveries)
    reasons = read_table(delta_table_dir(cluster, plan.name, "quarantine")).column("reason").to_pylist()
    assert sorted(reasons) == ["field 'order_no' must not be empty (got )", "missing field 'time'"], \
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

    write(cluster, plan, {"temps": parts[0]})
    run_all(cluster, plan, spark)
    taken = snapshot_all(cluster, plan, spark)  # group-2 is stateless: its snapshot is the input it processed

    written = {(r["room_no"], r["time"], r["device_id"], r["temp"]) for r in readings}
    rows = read_state(delta_table_dir(cluster, plan.name, STATE_TABLE), taken["group-1-1"])
    stores = {(r["query"], r["store_name"]) for r in rows}
    assert {("avg_temps", "readings"), ("avg_temps", "progress"), ("temp_alerts", "alerted")} <= stores, stores
    kept = [(r["key"]["room_no"], e["time"], e["device_id"], e["temp"])
            for r in rows if r["store_name"] == "readings" for e in r["value"]]
    assert kept and set(kept) <= written, "every reading in the state is one the test wrote, of its room"
    for shard in ("group-2-1", "group-2-2"):
        assert read_state(delta_table_dir(cluster, plan.name, STATE_TABLE), taken[shard]) == []

    write(cluster, plan, {"temps": parts[1]})
    run_all(cluster, plan, spark)
    restore_all(cluster, plan, taken)
    write(cluster, plan, {"temps": parts[2]})
    advance_watermark(cluster, plan, TEMPS_T0 + 3_600_000)
    run_all(cluster, plan, spark)

    assert_temperature_outputs(cluster, plan, database_url, readings)
