"""Which expectations each output of a plan is validated with (pure)."""

from __future__ import annotations

from datetime import datetime, timezone

from tandem.airflow.validation_operators import format_rows
from tandem.config import load_plan
from tandem.quality.outputs import events_frame, generated_expectations, table_frame
from tandem.quality.serving import load_suite_definition, suite_for_output


def columns(expectations: list[dict]) -> set[tuple[str, str]]:
    return {(e["type"], e["kwargs"].get("column") or ",".join(e["kwargs"].get("column_list", [])))
            for e in expectations}


def test_an_events_output_is_checked_for_its_ids_keys_and_time() -> None:
    plan = load_plan("temperatures")
    got = columns(generated_expectations(plan.outputs["temp_alerts"]))
    assert ("expect_column_values_to_be_unique", "event_id") in got
    assert {("expect_column_values_to_not_be_null", f) for f in
            ("room_no", "initial_device_id", "initial_time", "initial_temp", "final_time")} <= got


def test_a_table_output_has_one_row_per_key_and_instance() -> None:
    got = columns(generated_expectations(load_plan("pizza_shop").outputs["delivered_orders"]))
    assert ("expect_compound_columns_to_be_unique", "customer_name,shard_id") in got
    assert ("expect_column_values_to_be_between", "version") in got


def test_a_suite_expectation_applies_to_the_output_it_names_or_else_to_the_aggregations() -> None:
    pizza, trades = load_plan("pizza_shop"), load_plan("trades")
    suite = {"name": "s", "expectations": [
        {"type": "a", "kwargs": {}, "meta": {"output": "overdue_orders"}},
        {"type": "b", "kwargs": {}, "meta": {}}]}
    assert [e["type"] for e in suite_for_output(suite, pizza, "overdue_orders")["expectations"]] == ["a"]
    assert [e["type"] for e in suite_for_output(suite, pizza, "order_stats")["expectations"]] == ["b"]
    assert [e["type"] for e in suite_for_output(suite, pizza, "delivered_orders")["expectations"]] == []
    shipped = load_suite_definition(trades.path.parent.parent / "expectations" / "trades_aggregates.json")
    assert suite_for_output(shipped, trades, "trade_aggregates")["expectations"] == shipped["expectations"]


def test_payloads_keys_and_values_become_columns() -> None:
    at = datetime(2025, 1, 1, tzinfo=timezone.utc)
    frame = events_frame([{"event_id": "e1", "shard_id": "g-1", "event_time": at, "payload": {"room_no": 101}}])
    assert frame.to_dict("records") == [{"room_no": 101, "event_id": "e1", "shard_id": "g-1", "event_time": at}]
    frame = table_frame([{"key": {"customer_name": "ann"}, "value": {"delivered": 3}, "shard_id": "s-1", "version": 3}])
    assert frame.to_dict("records") == [{"customer_name": "ann", "delivered": 3, "shard_id": "s-1", "version": 3}]
    assert list(events_frame([]).columns) == ["event_id", "shard_id", "event_time"]


def test_merged_rows_are_logged_column_by_column() -> None:
    rows = [{"bucket_start": datetime(2025, 1, 1, 10, tzinfo=timezone.utc), "orders": 3, "on_time": 0.5}] * 3
    assert format_rows(rows, 2) == ["bucket_start=2025-01-01 10:00:00 orders=3 on_time=0.5000"] * 2 + ["... 1 more rows"]
