"""The plan API's rules without Spark: declared queries against the YAML, the implicit quarantine, the
generator drawn from declarations, and ``tandem plan new``."""

from __future__ import annotations

import random
import types
from pathlib import Path

import pytest

from tandem.config import load_cluster, load_plan, quarantine_output
from tandem.errors import ConfigError, PlanError, TandemError
from tandem.producer import DeclaredGenerator, generator_for, numeric_range
from tandem.runtime.plan_api import (check_plan_module, declared_queries, load_plan_module, partial_aggregations,
                                     query, query_problems)
from tests.unit._conf import edit_yaml


def fake_module(name: str = "tandem.plans.fake", **functions) -> types.ModuleType:
    module = types.ModuleType(name)
    for attribute, value in functions.items():
        setattr(module, attribute, value)
    return module


def declared(function_name: str, writes=None, **options):
    """A query function ``function_name`` declared with @query (it is never called here)."""
    def function(ctx):
        raise AssertionError("not called without Spark")
    function.__name__ = function_name
    return query(writes, **options)(function)


@pytest.fixture
def cluster(conf: Path):
    return load_cluster(conf / "cluster.yaml")


def test_the_shipped_plans_modules_fit_their_yaml(cluster):
    for name, queries in {"trades": ["aggregates", "quarantine"], "pizza_shop": ["orders", "quarantine"],
                          "temperatures": ["avg_temps", "temp_alerts", "high_temps", "quarantine"]}.items():
        plan = load_plan(name, cluster)
        assert list(check_plan_module(plan, load_plan_module(plan))) == queries


def test_every_mismatch_between_yaml_and_module_is_named(cluster):
    plan = load_plan("temperatures", cluster)  # groups: [avg_temps, temp_alerts, quarantine], [high_temps]
    module = fake_module(
        avg_temps=declared("avg_temps", "avg_temps"),
        temp_alerts=declared("temp_alerts", "no_such_output"),
        stray=declared("stray", "high_temps"),
        quarantine=declared("quarantine", "avg_temps"),
    )
    problems = query_problems(plan, module.__name__, declared_queries(module))
    text = "\n".join(problems)
    assert "groups.group-2.queries[0]: tandem.plans.fake declares no query 'high_temps'" in text
    assert "temp_alerts(): writes 'no_such_output', which" in text and "does not declare" in text
    assert "stray(): query 'stray' runs in no group" in text
    assert "the query name 'quarantine' is the runtime's" in text
    assert not any("outputs.high_temps" in p for p in problems)  # stray writes it
    with pytest.raises(PlanError) as raised:
        check_plan_module(plan, module)
    assert str(raised.value).splitlines() == problems


def test_an_output_no_query_writes_is_named(cluster):
    plan = load_plan("temperatures", cluster)
    module = fake_module(avg_temps=declared("avg_temps", "avg_temps"),
                         temp_alerts=declared("temp_alerts", "avg_temps"),
                         high_temps=declared("high_temps", "high_temps"))
    problems = query_problems(plan, module.__name__, declared_queries(module))
    assert problems == [f"{plan.path}: outputs.temp_alerts: no query writes it"]


def test_routes_name_every_output_they_write(cluster):
    plan = load_plan("pizza_shop", cluster)
    orders = declared("orders", route_by="outcome", routes={
        "delivered": "delivered_orders", "overdue": "overdue_orders", "*": ["order_stats", "last_orders"]})
    spec = declared_queries(fake_module(orders=orders))["orders"]
    assert spec.outputs == ("delivered_orders", "overdue_orders", "order_stats", "last_orders")
    assert spec.routes["*"] == ("order_stats", "last_orders"), "a value may go to several outputs"
    assert query_problems(plan, "m", {"orders": spec}) == []
    one = declared_queries(fake_module(orders=declared("orders", route_by="outcome", routes={"*": "order_stats"})))
    assert any("outputs.last_orders: no query writes it" in p for p in query_problems(plan, "m", one))
    assert partial_aggregations(plan, spec) == []  # order_stats has id: facts, appended
    trades = load_plan("trades", cluster)
    assert partial_aggregations(trades, declared_queries(fake_module(a=declared("a", "trade_aggregates")))["a"]) == [
        "trade_aggregates"]


@pytest.mark.parametrize("options, message", [
    ({}, "either writes=OUTPUT or route_by"),
    ({"writes": "a", "routes": {"x": "b"}, "route_by": "c"}, "either writes=OUTPUT or route_by"),
    ({"routes": {"x": "b"}}, "go together"),
    ({"writes": "a", "state_store": "memory"}, "state_store must be one of"),
])
def test_a_bad_declaration_is_refused_where_it_is_made(options, message):
    with pytest.raises(PlanError, match=message):
        query(**options)


def test_the_quarantine_is_implicit(conf: Path, cluster):
    def without_quarantine(data: dict) -> None:
        del data["outputs"]["quarantine"]
        data["groups"]["shard"]["queries"] = ["aggregates"]

    edit_yaml(conf / "plans" / "trades.yaml", without_quarantine)
    plan = load_plan("trades", cluster)
    assert plan.outputs["quarantine"].kind == "quarantine" and quarantine_output(plan) == "quarantine"
    assert plan.groups["shard"].queries == ["aggregates", "quarantine"]
    assert list(check_plan_module(plan, load_plan_module(plan))) == ["aggregates", "quarantine"]


def test_a_renamed_quarantine_output_is_the_plans_quarantine(conf: Path, cluster):
    def renamed(data: dict) -> None:
        data["outputs"]["bad_lines"] = data["outputs"].pop("quarantine")

    edit_yaml(conf / "plans" / "trades.yaml", renamed)
    plan = load_plan("trades", cluster)
    assert quarantine_output(plan) == "bad_lines" and "quarantine" not in plan.outputs


@pytest.mark.parametrize("change, field", [
    (lambda d: d["outputs"].update(quarantine={"kind": "events", "key": ["symbol"], "time": "timestamp"}),
     "outputs.quarantine"),
    (lambda d: d["outputs"].update(your_bad_lines={"kind": "quarantine"}), "outputs.your_bad_lines"),
])
def test_quarantine_outputs_that_cannot_be_are_refused(conf: Path, cluster, change, field):
    edit_yaml(conf / "plans" / "trades.yaml", change)
    with pytest.raises(ConfigError) as raised:
        load_plan("trades", cluster)
    assert raised.value.field == field


# --- sample events from the declarations ------------------------------------------------------------------------


def passes(value, checks) -> bool:
    """Whether ``value`` passes every declared check (a plain-Python reading of FieldConfig.checks)."""
    for operator, bound, _ in checks:
        ok = {"not_empty": lambda: value.strip() != "", "no_nul": lambda: "\0" not in value,
              "max_length": lambda: len(value) <= bound,
              "finite": lambda: value == value and abs(value) != float("inf"),
              ">": lambda: value > bound, ">=": lambda: value >= bound, "<": lambda: value < bound,
              "<=": lambda: value <= bound, "between": lambda: bound[0] <= value <= bound[1]}[operator]()
        if not ok:
            return False
    return True


def test_declared_events_pass_every_check_of_every_shipped_stream(cluster):
    for name in ("trades", "pizza_shop", "temperatures"):
        plan = load_plan(name, cluster)
        events = DeclaredGenerator(plan, seed=7).events(1_700_000_000_000, 200)
        assert set(events) == set(plan.streams)
        for stream, rows in events.items():
            declared = plan.streams[stream]
            assert len(rows) == 200
            for row in rows:
                assert set(row) == set(declared.fields)
                for field_name, value in row.items():
                    assert passes(value, declared.fields[field_name].checks()), (stream, field_name, value)
            assert len({row[declared.key] for row in rows}) <= 16  # keys repeat: state and tables see them again


def test_declared_events_repeat_with_the_seed(cluster):
    plan = load_plan("temperatures", cluster)
    assert DeclaredGenerator(plan, 3).events(5, 20) == DeclaredGenerator(plan, 3).events(5, 20)
    assert DeclaredGenerator(plan, 3).events(5, 20) != DeclaredGenerator(plan, 4).events(5, 20)


@pytest.mark.parametrize("bounds, integer, expected", [
    ((None, None, None, None), True, (0, 1000)),
    ((0, None, None, None), True, (1, 1001)),
    ((None, 5, 10, None), True, (5, 9)),
    ((-273.15, None, None, None), False, (-273.149, 726.851)),
    ((None, None, None, -5), True, (-1005, -5)),
])
def test_numeric_ranges_lie_inside_the_bounds(bounds, integer, expected):
    low, high = numeric_range(*bounds, integer=integer)
    assert low == pytest.approx(expected[0]) and high == pytest.approx(expected[1])


def test_bounds_nothing_fits_are_an_error():
    with pytest.raises(TandemError, match="no value fits"):
        numeric_range(10, None, 10.5, None, integer=True)


def test_a_plan_module_brings_its_own_generator(cluster):
    from tandem.plans.trades import TradeGenerator

    plan = load_plan("trades", cluster)
    generator = generator_for(plan, 5)
    assert isinstance(generator, TradeGenerator) and isinstance(generator.random, random.Random)


# --- tandem plan new ---------------------------------------------------------------------------------------------


def test_a_new_plan_loads_fits_its_module_and_draws_events(cluster, conf: Path):
    from tandem.scaffold import new_plan

    yaml_path, module_path = new_plan(cluster, "fraud_alerts")
    assert (yaml_path, module_path) == (conf / "plans" / "fraud_alerts.yaml", conf / "plans" / "fraud_alerts.py")
    plan = load_plan("fraud_alerts", cluster)
    module = load_plan_module(plan)
    assert module.__file__ == str(module_path) and module.__name__ == "tandem.plans.fraud_alerts"
    assert list(check_plan_module(plan, module)) == ["high_values", "quarantine"]
    events = generator_for(plan, 1).events(1_700_000_000_000, 50)["fraud_alerts_events"]
    assert sum(e["value"] >= module.THRESHOLD for e in events) > 10
    with pytest.raises(TandemError, match="already exists"):
        new_plan(cluster, "fraud_alerts")
    with pytest.raises(TandemError, match="cannot name a new plan"):
        new_plan(cluster, "Fraud-Alerts")


def test_a_plan_module_beside_the_yaml_and_a_module_field_are_refused_together(cluster, conf: Path):
    from tandem.scaffold import new_plan

    new_plan(cluster, "twice")
    edit_yaml(conf / "plans" / "twice.yaml", lambda d: d.update(module="tandem.plans.trades"))
    with pytest.raises(ConfigError) as raised:
        load_plan("twice", cluster)
    assert raised.value.field == "module" and "twice.py beside the plan" in str(raised.value)


def test_a_plan_module_that_fails_to_import_names_its_file(cluster, conf: Path):
    from tandem.scaffold import new_plan

    _, module_path = new_plan(cluster, "broken")
    module_path.write_text("import no_such_module_here\n")
    with pytest.raises(PlanError, match=r"broken\.py: cannot import the plan's module: ModuleNotFoundError"):
        load_plan_module(load_plan("broken", cluster))


def test_every_declarable_source_kind_has_a_reader_and_every_reader_is_declarable():
    from typing import get_args

    from tandem.declarations import StreamConfig
    from tandem.sources import SOURCE_KINDS

    assert set(get_args(StreamConfig.model_fields["source"].annotation)) == set(SOURCE_KINDS) == {"files", "nats"}


def test_every_declarable_output_kind_has_a_module_and_every_module_is_declarable():
    from typing import get_args

    from tandem.declarations import OUTPUT_RULES, OutputConfig
    from tandem.outputs import OUTPUT_KINDS

    assert set(get_args(OutputConfig.model_fields["kind"].annotation)) == set(OUTPUT_KINDS) == set(OUTPUT_RULES)
    assert all(kind.rules is OUTPUT_RULES[name] for name, kind in OUTPUT_KINDS.items())
