"""Each output kind's restore, lake-read and validation rules, against a fake store and a fake lake (pure).

The real PostgreSQL and Delta behind them are tested in tests/integration (``test_output_kinds``,
``test_exact_keys``, ``test_delta_reads``, ``test_plan_snapshots``, ``test_quality``).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from tandem.config import load_plan
from tandem.lake.history import RolledBack
from tandem.outputs import OUTPUT_KINDS, aggregation, kind_of
from tandem.outputs.base import OutputKind
from tandem.outputs.base import Window
from tandem.outputs.events import first_per_event_id
from tandem.outputs.table import merge_table_rows

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


class UnusedDatabase:
    """A store that must not be touched."""

    def run(self, work, attempts: int = 1) -> Any:
        raise AssertionError("the store was used")


class RecordingCursor:
    """A cursor that records each statement's parameters and answers with canned rows."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self.params: list[Any] = []

    def execute(self, statement: Any, params: Any = None) -> None:
        self.params.append(params)

    def fetchone(self) -> dict[str, Any]:
        return {"present": True}

    def fetchall(self) -> list[dict[str, Any]]:
        return self.rows


def test_every_kind_module_keeps_the_contract() -> None:
    """Each kind is its module's ``KIND``, named as declared, and does every duty it has: sink and read always, a
    backfill's replace and a reconcile's compare when it is recomputed."""
    for name, kind in OUTPUT_KINDS.items():
        assert isinstance(kind, OutputKind) and kind.name == name
        duties = ("sink", "read", "replace", "compare") if kind.recomputed else ("sink", "read")
        missing = [duty for duty in duties if getattr(type(kind), duty) is getattr(OutputKind, duty)]
        assert not missing, f"{name} does not do {', '.join(missing)}"


# --- restore --------------------------------------------------------------------------------------------------


def test_a_restore_keeps_what_is_published_by_id_and_touches_nothing(tmp_path: Path) -> None:
    pizza = load_plan("pizza_shop")  # a table, events, an aggregation of facts (id), the quarantine by source file
    for output in ("delivered_orders", "overdue_orders", "order_stats", "quarantine"):
        assert kind_of(pizza, output).restore(UnusedDatabase(), pizza, output, tmp_path / "absent", "shop-1", 3) \
            is None, output
    assert not (tmp_path / "absent").exists()


def test_a_restore_rolls_spark_partials_back_and_rebuilds_the_changed_keys(monkeypatch: pytest.MonkeyPatch,
                                                                           tmp_path: Path) -> None:
    trades = load_plan("trades")
    changed, at_cut = pa.table({"symbol": ["IBM"]}), pa.table({"symbol": ["IBM", "SAP"]})
    rolled, rebuilt = [], []
    monkeypatch.setattr(aggregation, "roll_back_slice", lambda path, instance, version: rolled.append(
        (path, instance, version)) or RolledBack(version, changed, at_cut, 12))
    monkeypatch.setattr(aggregation, "rebuild_postgres_instance", lambda db, spec, plan, instance, rows, touched: rebuilt.append(
        (spec.name, plan, instance, rows, touched)) or 2)
    outcome = aggregation.KIND.restore(UnusedDatabase(), trades, "trade_aggregates", tmp_path, "shard-1", 7)
    assert rolled == [(tmp_path, "shard-1", 7)]
    assert rebuilt == [("trade_aggregates", "trades", "shard-1", at_cut, changed)]  # only the keys that changed
    assert outcome == {"snapshot_version": 7, "changed_rows": 1, "delta_rows": 2, "new_version": 12, "postgres_rows": 2}


def test_a_restore_with_nothing_changed_rewrites_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    trades = load_plan("trades")
    monkeypatch.setattr(aggregation, "roll_back_slice",
                        lambda path, instance, version: RolledBack(version, pa.table({}), None, 9))
    monkeypatch.setattr(aggregation, "rebuild_postgres_instance", lambda *args: pytest.fail("rebuilt"))
    assert aggregation.KIND.restore(UnusedDatabase(), trades, "trade_aggregates", tmp_path, "shard-1", 9) == {
        "snapshot_version": 9, "changed_rows": 0, "delta_rows": 0, "new_version": 9, "postgres_rows": 0}


# --- lake reads -----------------------------------------------------------------------------------------------


def test_an_events_lake_read_keeps_the_first_published_row_of_each_id() -> None:
    rows = pa.Table.from_pylist([
        {"event_id": "b", "v": 1, "published_at": T0},
        {"event_id": "a", "v": 2, "published_at": T0.replace(minute=5)},
        {"event_id": "a", "v": 3, "published_at": T0},  # an old active's late append of the same event
    ])
    assert first_per_event_id(rows).to_pylist() == [
        {"event_id": "a", "v": 3, "published_at": T0}, {"event_id": "b", "v": 1, "published_at": T0}]
    assert first_per_event_id(pa.table({})).num_rows == 0


def test_a_table_lake_read_sums_each_instances_newest_version() -> None:
    config = load_plan("pizza_shop").outputs["delivered_orders"]  # key customer_name, value delivered
    rows = pa.Table.from_pylist([
        {"customer_name": "ann", "delivered": 1.0, "instance": "s-1", "version": 1},
        {"customer_name": "ann", "delivered": 3.0, "instance": "s-1", "version": 3},
        {"customer_name": "ann", "delivered": 2.0, "instance": "s-2", "version": 2},
        {"customer_name": "bob", "delivered": 5.0, "instance": "s-2", "version": 5},
    ])
    assert sorted(merge_table_rows(rows, config), key=lambda r: r["customer_name"]) == [
        {"customer_name": "ann", "delivered": 5.0, "instances": 2},
        {"customer_name": "bob", "delivered": 5.0, "instances": 1}]


# --- validation -----------------------------------------------------------------------------------------------


def test_the_quarantine_is_not_validated() -> None:
    pizza = load_plan("pizza_shop")
    assert kind_of(pizza, "quarantine").validation(pizza, "quarantine") is None


def test_events_are_validated_by_event_time_up_to_now_by_default() -> None:
    pizza = load_plan("pizza_shop")
    policy = kind_of(pizza, "overdue_orders").validation(pizza, "overdue_orders")
    cursor = RecordingCursor([{"event_id": "e", "instance": "shop-1", "event_time": T0, "payload": {"order_no": 1}}])
    assert policy.read(cursor, Window(T0), 10) == cursor.rows
    [(plan, output, since, until, limit)] = cursor.params
    assert (plan, output, since, limit) == ("pizza_shop", "overdue_orders", T0, 10)
    assert until > T0 and until.tzinfo is not None
    assert policy.key_columns == ["event_id"] and not policy.takes_unnamed and policy.granularities == ()
    assert list(policy.frame(cursor.rows).columns) == ["order_no", "event_id", "instance", "event_time"]


def test_a_table_is_validated_whole_whatever_the_window() -> None:
    pizza = load_plan("pizza_shop")
    policy = kind_of(pizza, "delivered_orders").validation(pizza, "delivered_orders")
    cursor = RecordingCursor([])
    policy.read(cursor, Window(T0, T0, "minute"), 5)
    assert cursor.params == [("pizza_shop", "delivered_orders", 5)]
    assert policy.key_columns == ["customer_name", "instance"] and policy.required == policy.implied


def test_an_aggregation_is_validated_by_buckets_overlapping_the_window_with_its_ratios(
        monkeypatch: pytest.MonkeyPatch) -> None:
    trades = load_plan("trades")
    policy = kind_of(trades, "trade_aggregates").validation(trades, "trade_aggregates")
    rows = [{"granularity": "minute", "bucket_start": T0, "symbol": "IBM", "instance": "shard-1", "trade_count": 2,
             "price_sum": 3.0, "price_min": 1.0, "price_max": 2.0}]
    asked = []
    monkeypatch.setattr(aggregation.aggregates, "serving_rows",
                        lambda cursor, spec, *window: asked.append((spec.name, *window)) or rows)
    assert policy.read(RecordingCursor([]), Window(T0, None, "minute"), 5) == rows
    assert asked == [("trade_aggregates", "trades", T0, None, "minute", 5)]
    assert policy.takes_unnamed and "minute" in policy.granularities and policy.table == "tandem.trade_aggregates"
    assert policy.frame(rows)["avg_price"].tolist() == [1.5]
    assert [e["kwargs"]["column"] for e in policy.required] == ["instance"]  # a suite file gets the instances only
