"""Pure pieces of snapshots: newest row per key, Spark's value names, the validation frame and verdict."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from _conf import edit_yaml
from _project import TRADES
from tandem.quality.suites import ExpectationOutcome
from tandem.outputs.aggregation import newest_per_key
from tandem.snapshots.state_export import STATE_SCHEMA, TIMERS, StateOperator, _unique, state_variables
from tandem.snapshots.validation import SnapshotValidation, state_frame

UTC = timezone.utc
T = [datetime(2025, 3, 1, 12, 0, s, tzinfo=UTC) for s in range(3)]


def partials(rows: list[tuple]) -> pa.Table:
    names = ["granularity", "bucket_start", "symbol", "instance", "epoch", "batch_id", "trade_count"]
    return pa.Table.from_pylist([dict(zip(names, r)) for r in rows])


def test_newest_per_key_takes_the_highest_epoch_then_batch_of_each_key() -> None:
    rows = partials([
        ("second", T[0], "IBM", "s1", 1, 4, 10),
        ("second", T[0], "IBM", "s1", 2, 1, 12),   # newer epoch wins over a higher batch
        ("second", T[0], "IBM", "s1", 1, 7, 11),
        ("second", T[1], "IBM", "s1", 1, 3, 5),
        ("second", T[1], "IBM", "s1", 1, 9, 6),
        ("minute", T[0], "IBM", "s1", 1, 2, 20),
        ("second", T[0], "ORCL", "s1", 1, 2, 1),
        ("second", T[0], "IBM", "s2", 1, 1, 3),    # another instance is another key
    ])
    newest = {(r["granularity"], r["bucket_start"], r["symbol"], r["instance"]): r["trade_count"]
              for r in newest_per_key(rows, TRADES).to_pylist()}
    assert newest == {("second", T[0], "IBM", "s1"): 12, ("second", T[1], "IBM", "s1"): 6,
                      ("minute", T[0], "IBM", "s1"): 20, ("second", T[0], "ORCL", "s1"): 1,
                      ("second", T[0], "IBM", "s2"): 3}


def test_of_two_versions_of_one_batch_the_later_published_wins() -> None:
    """A backfill's rows carry the last published (epoch, batch) and a later publish time."""
    rows = partials([("minute", T[0], "IBM", "s1", 1, 4, 10), ("minute", T[0], "IBM", "s1", 1, 4, 13)])
    rows = rows.append_column("published_at", pa.array([T[1], T[0]], pa.timestamp("us", tz="UTC")))
    assert newest_per_key(rows, TRADES).column("trade_count").to_pylist() == [10]


@pytest.mark.parametrize("count", [0, 1])
def test_newest_per_key_of_no_or_one_row(count: int) -> None:
    rows = partials([("second", T[0], "IBM", "s1", 1, 1, 1)][:count])
    assert newest_per_key(rows, TRADES).num_rows == count


def test_spark_value_names_are_made_unique_in_order() -> None:
    assert _unique(["sum", "count", "sum", "min", "max", "sum"]) == ["sum", "count", "sum_2", "min", "max", "sum_3"]


def state_rows(values: list[dict], batch: int = 7, query: str = "aggregates") -> tuple[pa.Table, pa.Table]:
    keys = [{"window": {"start": T[0]}, "symbol": f"S{i}"} for i in range(len(values))]
    rows = pa.Table.from_pylist([{
        "snapshot_id": "s", "plan": "trades", "instance": "shard-1", "instance_id": "trades/shard-1/node-a",
        "query": query, "operator_id": 0, "operator_name": "stateStoreSave", "store_name": "default",
        "partition_id": i % 2, "batch_id": batch, "key": json.dumps(key, default=str), "value": json.dumps(value)}
        for i, (key, value) in enumerate(zip(keys, values))], schema=STATE_SCHEMA)
    fields = pa.table({"key.window.start": [k["window"]["start"] for k in keys],
                       "key.symbol": [k["symbol"] for k in keys],
                       **{f"value.{name}": [v[name] for v in values] for name in values[0]}})
    return rows, fields


def test_state_frame_joins_rows_and_fields_and_adds_the_cut_and_metadata_batches() -> None:
    operators = {"aggregates": [StateOperator(0, "stateStoreSave", "default", 2, 0, 7)]}
    rows, fields = state_rows([{"trade_count": 3, "price_min": 1.5}, {"trade_count": 1, "price_min": 2.0}])
    frame = state_frame(rows, fields, {"aggregates": 7}, operators)
    assert list(frame["key.symbol"]) == ["S0", "S1"] and list(frame["partition_id"]) == [0, 1]
    assert list(frame["value.trade_count"]) == [3, 1]
    assert list(frame["cut_batch_id"]) == [7, 7] and list(frame["metadata_max_batch_id"]) == [7, 7]


def test_state_frame_of_no_rows_still_has_the_columns_the_suite_needs() -> None:
    frame = state_frame(STATE_SCHEMA.empty_table(), pa.table({}), {"aggregates": 3}, {})
    assert frame.empty and {"batch_id", "cut_batch_id", "metadata_max_batch_id", "key"} <= set(frame.columns)


def test_a_bad_verdict_names_the_broken_files_and_the_failed_expectations() -> None:
    failed = ExpectationOutcome("expect_table_row_count_to_equal", {"value": 10}, False, 9, None)
    column = ExpectationOutcome("expect_column_values_to_be_between", {"column": "value.trade_count"}, False, 9, 2)
    passed = ExpectationOutcome("expect_column_values_to_not_be_null", {"column": "key"}, True, 9, 0)
    verdict = SnapshotValidation("snap-1", False, ["aggregates: state 0/1 version 8 is missing"],
                                 [failed, column, passed], "trades_state", 9)
    assert verdict.reason == ("files: aggregates: state 0/1 version 8 is missing; "
                              "trades_state: expect_table_row_count_to_equal(): failed; "
                              "trades_state: expect_column_values_to_be_between(column=value.trade_count): "
                              "2 of 9 rows unexpected")
    assert "BAD" in verdict.summary() and "1/3 expectations on 9 state rows" in verdict.summary()
    assert SnapshotValidation("snap-2", True, [], [passed], "trades_state", 9).reason == ""


TWS_PROPERTIES = json.dumps({"timeMode": "EventTime", "outputMode": "Append", "stateVariables": [
    {"stateName": "readings", "stateVariableType": "ListState", "ttlEnabled": False},
    {"stateName": "$eventTimers_keyToTimestamp", "stateVariableType": "TimerState", "ttlEnabled": False},
    {"stateName": "progress", "stateVariableType": "ValueState", "ttlEnabled": False}]})


def test_a_transform_with_state_operator_exports_each_user_variable_and_its_timers() -> None:
    assert state_variables(TWS_PROPERTIES) == ("readings", "progress")  # Spark's own $-variables left out
    tws = StateOperator(0, "transformWithStateInPandasExec", "default", 2, 0, 4, state_variables(TWS_PROPERTIES))
    assert tws.stores == ("readings", "progress", TIMERS)
    assert StateOperator(0, "stateStoreSave", "default", 2, 0, 7, state_variables(None)).stores == ("default",)
    assert state_variables("not json") == () and state_variables("{}") == ()


def test_the_cut_batch_of_every_store_of_a_transform_with_state_operator_is_known() -> None:
    tws = StateOperator(0, "transformWithStateInPandasExec", "default", 2, 0, 4, ("order",))
    rows = pa.Table.from_pylist([
        {"snapshot_id": "s", "plan": "p", "instance": "g-1", "instance_id": "p/g-1/a", "query": "orders",
         "operator_id": 0, "operator_name": tws.operator_name, "store_name": store, "partition_id": 0,
         "batch_id": 4, "key": '{"order_no": "o-1"}', "value": "{}"} for store in ("order", TIMERS)],
        schema=STATE_SCHEMA)
    frame = state_frame(rows, pa.table({}), {"orders": 4}, {"orders": [tws]})
    assert list(frame["metadata_max_batch_id"]) == [4, 4]


def test_every_sink_is_named_after_its_output_also_when_its_table_is_not(conf: Path) -> None:
    """A snapshot records each output's version under its sink's name and a restore looks it up by the output's
    Delta folder (``delta/<plan>/<output>``): both must be the declared output's name. An aggregation without
    ``table:`` is stored in ``<plan>_<output>``; its sink is still named ``<output>``."""
    from tandem.config import load_cluster, load_plans
    from tandem.outputs import sink_for
    from tandem.store.registry import InstanceKey

    edit_yaml(conf / "plans" / "trades.yaml", lambda plan: plan["outputs"]["trade_aggregates"].pop("table"))
    plans = load_plans(load_cluster(conf / "cluster.yaml"))
    assert set(plans) == {"hot_rooms", "pizza_shop", "temperatures", "trades"}
    for plan in plans.values():
        instance = InstanceKey(plan.name, plan.instances[0], plan.nodes[0])
        names = {output: sink_for(plan, output, instance, "postgresql://unused", Path("unused")).output
                 for output in plan.outputs}
        assert names == {output: output for output in plan.outputs}, plan.name
