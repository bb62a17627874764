"""Suite files are optional: a plan that names none validates with the suites its declarations imply (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _conf import edit_yaml
from _project import without_suites
from tandem.config import load_cluster, load_plan
from tandem.errors import ConfigError
from tandem.outputs.aggregation import expectations as aggregation_expectations
from tandem.quality.implied import implied_output_suite, implied_state_suite, validated_outputs
from tandem.quality.suites import load_suite_definition, suite_for_output

PROJECT_CONF = Path(__file__).resolve().parents[2] / "conf"
PLANS = ("pizza_shop", "temperatures", "trades")


def shipped(suite: str) -> dict:
    return load_suite_definition(PROJECT_CONF / "expectations" / f"{suite}.json")


def checks(expectations: list[dict]) -> set[str]:
    """Each expectation as its type and arguments (what it checks, not why)."""
    return {json.dumps([e["type"], e["kwargs"]], sort_keys=True) for e in expectations}


def output_expectations(plan, output: str) -> list[dict]:
    """What the declaration of ``output`` implies, as its kind's validation policy says."""
    return validated_outputs(plan)[output].implied


def part_for(suite: dict, plan, output: str) -> list[dict]:
    """The expectations of ``suite`` that apply to ``output`` of ``plan``."""
    return suite_for_output(suite, output, validated_outputs(plan)[output].takes_unnamed)["expectations"]


def check(kind: str, **kwargs) -> str:
    return json.dumps([kind, kwargs], sort_keys=True)


def not_null(column: str) -> str:
    return check("expect_column_values_to_not_be_null", column=column)


def between(column: str, **bounds) -> str:
    return check("expect_column_values_to_be_between", column=column, **bounds)


def at_least(column_a: str, column_b: str, **more) -> str:
    return check("expect_column_pair_values_a_to_be_greater_than_b", column_A=column_a, column_B=column_b,
                 or_equal=True, **more)


@pytest.mark.parametrize("name", PLANS)
def test_every_validated_output_of_a_shipped_plan_has_its_part_of_the_implied_suite(name: str) -> None:
    plan = load_plan(name, load_cluster(PROJECT_CONF / "cluster.yaml"))
    suite = implied_output_suite(plan)
    assert suite["name"] == f"{name}_outputs (implied)"
    validated = [o for o, c in plan.outputs.items() if c.kind != "quarantine"]  # every kind is validated but that
    assert list(validated_outputs(plan)) == validated
    assert validated and {e["meta"]["output"] for e in suite["expectations"]} == set(validated)
    for output in validated:
        part = part_for(suite, plan, output)
        assert checks(part) == checks(output_expectations(plan, output)) and len(part) == len(checks(part))
        assert all(e["meta"]["why"] for e in part)
        assert check("expect_column_values_to_be_in_set", column="instance",
                     value_set={"$PARAMETER": "plan_instances"}) in checks(part)  # only the plan's instances


def test_the_trades_aggregation_implies_what_its_suite_file_checks_generically() -> None:
    plan = load_plan("trades", load_cluster(PROJECT_CONF / "cluster.yaml"))
    implied = checks(aggregation_expectations(plan, "trade_aggregates"))
    # every check of trades_aggregates.json follows from the declarations; the count's bound is
    # written as >= 1 (a partial exists once a trade fell into its bucket) instead of > 0
    assert checks(shipped("trades_aggregates")["expectations"]) - implied == {
        between("trade_count", min_value=0, strict_min=True)}
    assert implied - checks(shipped("trades_aggregates")["expectations"]) == {
        between("trade_count", min_value=1),
        between("price_sum", min_value=0, strict_min=True),     # price > 0 on the stream
        between("price_max", min_value=0, strict_min=True),
        at_least("price_max", "price_min")}


def test_an_aggregation_of_facts_keeps_its_granularities_and_a_count_of_at_least_one() -> None:
    plan = load_plan("pizza_shop", load_cluster(PROJECT_CONF / "cluster.yaml"))
    implied = checks(aggregation_expectations(plan, "order_stats"))
    assert check("expect_column_values_to_be_in_set", column="granularity",
                 value_set=["second", "minute", "hour", "day"]) in implied
    assert {not_null("granularity"), not_null("bucket_start"), not_null("instance"),
            between("orders", min_value=1)} <= implied
    assert not any("on_time" in c or '"customers"' in c for c in implied - {
        check("expect_table_columns_to_match_set", column_set=["granularity", "bucket_start", "instance", "orders",
                                                               "on_time", "customers"], exact_match=False)})
    # a sum of a computed field and a distinct count carry no bounds
    assert checks(part_for(shipped("pizza_shop_outputs"), plan, "order_stats")) & implied \
        == {between("orders", min_value=1)}  # the file's generic part


def test_events_and_tables_need_their_keys_values_and_time() -> None:
    cluster = load_cluster(PROJECT_CONF / "cluster.yaml")
    temperatures, pizza = load_plan("temperatures", cluster), load_plan("pizza_shop", cluster)
    avg = [e for e in output_expectations(temperatures, "avg_temps") if e["type"].endswith("not_be_null")]
    assert [e["kwargs"]["column"] for e in avg] == ["event_id", "room_no", "device_id", "time", "temp"]  # time once
    alerts = checks(output_expectations(temperatures, "temp_alerts"))
    assert {not_null(f) for f in ("room_no", "initial_device_id", "initial_time", "initial_temp", "final_time")} \
        <= alerts
    table = checks(output_expectations(pizza, "delivered_orders"))
    assert {not_null("customer_name"), not_null("delivered"), between("version", min_value=1),
            check("expect_compound_columns_to_be_unique", column_list=["customer_name", "instance"])} <= table
    overdue = checks(output_expectations(pizza, "overdue_orders"))
    assert {not_null("order_no"), not_null("expiry_time"),
            check("expect_column_values_to_be_unique", column="event_id")} <= overdue


def test_declared_field_bounds_carry_to_sums_minimums_and_maximums(conf: Path) -> None:
    def change(plan: dict) -> None:
        fields = plan["streams"]["trades"]["fields"]
        fields["quantity"] = {"type": "long", "at_least": 1, "less_than": 1000}
        fields["delta"] = {"type": "double", "greater_than": -5, "at_most": 5}
        plan["outputs"]["trade_aggregates"]["measures"].update({
            "quantity_max": {"max": "quantity"}, "delta_sum": {"sum": "delta"}, "delta_min": {"min": "delta"},
            "price_sum_long": {"sum": "price", "type": "long"}, "first_trade": {"min": "timestamp"}})

    edit_yaml(conf / "plans" / "trades.yaml", change)
    implied = checks(aggregation_expectations(load_plan("trades", load_cluster(conf / "cluster.yaml")),
                                              "trade_aggregates"))
    assert between("quantity_max", min_value=1, max_value=1000, strict_max=True) in implied
    assert between("quantity_sum", min_value=1) in implied           # every partial adds one quantity >= 1 at least
    assert between("delta_min", min_value=-5, strict_min=True, max_value=5) in implied
    assert between("first_trade", min_value=0, max_value=253402300799999) in implied  # epoch millis
    bounded = {json.loads(c)[1].get("column") for c in implied if "to_be_between" in c}
    assert "delta_sum" not in bounded          # a sum of values that may be negative or positive: unbounded
    assert "price_sum_long" not in bounded     # a sum of doubles stored as long may round to 0
    # two minimums: the average is not snapped to a bound, so it is not checked against them
    assert not any('"avg_price"' in c and "greater_than_b" in c for c in implied)


def test_the_implied_state_suite_is_what_every_shipped_state_suite_checks_generically() -> None:
    plan = load_plan("trades", load_cluster(PROJECT_CONF / "cluster.yaml"))
    suite = implied_state_suite(plan)
    assert suite["name"] == "trades_state (implied)"
    implied = checks(suite["expectations"])
    unique = check("expect_compound_columns_to_be_unique",
                   column_list=["query", "operator_id", "store_name", "key", "value"])
    assert implied == {
        check("expect_table_row_count_to_equal", value={"$PARAMETER": "expected_state_rows"}),
        not_null("key"),
        unique,
        check("expect_column_pair_values_to_be_equal", column_A="batch_id", column_B="cut_batch_id"),
        check("expect_column_pair_values_to_be_equal", column_A="metadata_max_batch_id", column_B="cut_batch_id"),
        between("partition_id", min_value=0, max_value={"$PARAMETER": "max_partition_id"})}
    assert implied <= checks(shipped("pizza_shop_state")["expectations"])
    assert implied <= checks(shipped("temperatures_state")["expectations"])
    trades = checks(shipped("trades_state")["expectations"])  # one row per key: a stronger uniqueness
    assert implied - trades == {unique}


# --- which suite a plan validates with ---------------------------------------------------------------------


def test_a_plan_without_suite_files_loads_with_the_implied_suites(conf: Path) -> None:
    without_suites(conf, "pizza_shop")
    plan = load_plan("pizza_shop", load_cluster(conf / "cluster.yaml"))
    assert plan.validation.suite is None and plan.snapshot.suite is None
    assert plan.validation.schedule == "@hourly" and plan.snapshot.keep == 3  # the rest keeps its defaults


def test_an_unnamed_suite_is_the_plans_default_file_when_there_is_one(conf: Path) -> None:
    edit_yaml(conf / "plans" / "trades.yaml", lambda d: (d["validation"].pop("suite"), d["snapshot"].pop("suite")))
    cluster = load_cluster(conf / "cluster.yaml")
    plan = load_plan("trades", cluster)
    assert (plan.validation.suite, plan.snapshot.suite) == ("trades_aggregates", "trades_state")
    (conf / "expectations" / "trades_outputs.json").write_text("{}")
    assert load_plan("trades", cluster).validation.suite == "trades_outputs"  # <plan>_outputs first
    for name in ("trades_outputs", "trades_aggregates", "trades_state"):
        (conf / "expectations" / f"{name}.json").unlink()
    plan = load_plan("trades", cluster)
    assert (plan.validation.suite, plan.snapshot.suite) == (None, None)


@pytest.mark.parametrize("field", ["validation", "snapshot"])
def test_a_named_suite_must_still_exist(conf: Path, field: str) -> None:
    (conf / "expectations" / f"trades_{'aggregates' if field == 'validation' else 'state'}.json").unlink()
    with pytest.raises(ConfigError, match=rf"trades\.yaml: {field}\.suite: no suite 'trades_\w+': .* does not exist"):
        load_plan("trades", load_cluster(conf / "cluster.yaml"))


def test_config_check_says_which_suites_are_implied(conf: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    from tandem.cli import main

    edit_yaml(conf / "plans" / "trades.yaml", lambda d: d.pop("snapshot"))
    (conf / "expectations" / "trades_state.json").unlink()
    without_suites(conf, "pizza_shop")
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    assert main(["config", "check"]) == 0
    out = capsys.readouterr().out
    assert "suites trades_aggregates and implied (declarations)" in out
    assert "suites implied (declarations) and implied (declarations)" in out
    assert "suites temperatures_outputs and temperatures_state" in out
