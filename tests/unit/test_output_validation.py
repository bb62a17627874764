"""Which expectations each output of a plan is validated with, and as which columns: the kinds' validation
policies (pure)."""

from __future__ import annotations

from datetime import datetime, timezone

from tandem.airflow.validation_operators import format_rows
from tandem.config import load_plan
from tandem.outputs import events, table
from tandem.outputs.events import events_frame
from tandem.outputs.table import table_frame
from tandem.quality.implied import validated_outputs
from tandem.quality.outputs import with_required
from tandem.quality.suites import load_suite_definition, suite_for_output


def columns(expectations: list[dict]) -> set[tuple[str, str]]:
    return {(e["type"], e["kwargs"].get("column") or ",".join(e["kwargs"].get("column_list", [])))
            for e in expectations}


def test_an_events_output_is_checked_for_its_ids_keys_and_time() -> None:
    plan = load_plan("temperatures")
    got = columns(events.expectations(plan.outputs["temp_alerts"]))
    assert ("expect_column_values_to_be_unique", "event_id") in got
    assert {("expect_column_values_to_not_be_null", f) for f in
            ("room_no", "initial_device_id", "initial_time", "initial_temp", "final_time")} <= got


def test_a_table_output_has_one_row_per_key_and_instance() -> None:
    got = columns(table.expectations(load_plan("pizza_shop").outputs["delivered_orders"]))
    assert ("expect_compound_columns_to_be_unique", "customer_name,instance") in got
    assert ("expect_column_values_to_be_between", "version") in got


def test_a_suite_expectation_applies_to_the_output_it_names_or_else_to_the_aggregations() -> None:
    pizza, trades = load_plan("pizza_shop"), load_plan("trades")
    suite = {"name": "s", "expectations": [
        {"type": "a", "kwargs": {}, "meta": {"output": "overdue_orders"}},
        {"type": "b", "kwargs": {}, "meta": {}}]}

    def types(plan, output: str) -> list[str]:
        takes_unnamed = validated_outputs(plan)[output].takes_unnamed
        return [e["type"] for e in suite_for_output(suite, output, takes_unnamed)["expectations"]]

    assert types(pizza, "overdue_orders") == ["a"]
    assert types(pizza, "order_stats") == ["b"]
    assert types(pizza, "delivered_orders") == []
    shipped = load_suite_definition(trades.path.parent.parent / "expectations" / "trades_aggregates.json")
    assert suite_for_output(shipped, "trade_aggregates", True)["expectations"] == shipped["expectations"]


def test_a_suite_file_gets_what_the_kind_requires_unless_it_has_it() -> None:
    pizza = load_plan("pizza_shop")
    required = validated_outputs(pizza)["overdue_orders"].required
    assert required == events.expectations(pizza.outputs["overdue_orders"])
    own = {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "event_id"}, "meta": {"why": "mine"}}
    suite = with_required({"name": "s", "expectations": [own]}, required)
    assert suite["expectations"].count(own) == 1 and suite["expectations"][-1] is own
    assert len(suite["expectations"]) == len(required)  # the file's unique-id check stands for the kind's
    # an aggregation requires only the plan's instances of a suite file (which the trades file has)
    trades = load_plan("trades")
    shipped = load_suite_definition(trades.path.parent.parent / "expectations" / "trades_aggregates.json")
    [instances] = validated_outputs(trades)["trade_aggregates"].required
    assert with_required(shipped, [instances]) == shipped
    assert with_required({"name": "s", "expectations": []}, [instances])["expectations"] == [instances]


def test_payloads_keys_and_values_become_columns() -> None:
    at = datetime(2025, 1, 1, tzinfo=timezone.utc)
    frame = events_frame([{"event_id": "e1", "instance": "g-1", "event_time": at, "payload": {"room_no": 101}}])
    assert frame.to_dict("records") == [{"room_no": 101, "event_id": "e1", "instance": "g-1", "event_time": at}]
    frame = table_frame([{"key": {"customer_name": "ann"}, "value": {"delivered": 3}, "instance": "s-1", "version": 3}])
    assert frame.to_dict("records") == [{"customer_name": "ann", "delivered": 3, "instance": "s-1", "version": 3}]
    assert list(events_frame([]).columns) == ["event_id", "instance", "event_time"]


def test_merged_rows_are_logged_column_by_column() -> None:
    rows = [{"bucket_start": datetime(2025, 1, 1, 10, tzinfo=timezone.utc), "orders": 3, "on_time": 0.5}] * 3
    assert format_rows(rows, 2) == ["bucket_start=2025-01-01 10:00:00 orders=3 on_time=0.5000"] * 2 + ["... 1 more rows"]
