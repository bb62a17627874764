"""Outputs as Airflow Assets: names and URIs, which runs changed which output, the events a task adds, and the
DAG tasks that declare the plan's outputs alias."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tandem.airflow.assets import (
    backfill_changes,
    emit_output_events,
    outcome_changed,
    output_asset,
    outputs_alias,
    retention_changes,
    trimmed_output,
    upkeep_changes,
)

DAGS = Path(__file__).resolve().parents[2] / "dags"
START, END = datetime(2026, 12, 1, tzinfo=timezone.utc), datetime(2026, 12, 2, tzinfo=timezone.utc)


def test_an_output_is_an_asset_airflow_takes_as_written():
    asset = output_asset("pizza_shop", "orders_by_minute")
    assert (asset.name, asset.uri) == ("tandem.pizza_shop.orders_by_minute", "x-tandem://pizza_shop/orders_by_minute")
    assert outputs_alias("trades").name == "tandem.trades.outputs"


@pytest.mark.parametrize("outcome, changed", [
    ({"recomputed": True, "seconds_before": 3, "events_before": 9, "seconds_after": 3, "events_after": 9,
      "rows_written": 3}, True),  # an aggregation's range is rewritten
    ({"recomputed": True, "seconds_before": 2, "events_before": 5, "seconds_after": 0, "events_after": 0,
      "rows_written": 0}, True),  # emptied
    ({"recomputed": True, "seconds_before": 0, "events_before": 0, "seconds_after": 0, "events_after": 0,
      "rows_written": 0}, False),
    ({"recomputed": True, "rows": 4, "published": 1, "already_published": 3}, True),
    ({"recomputed": True, "rows": 4, "published": 0, "already_published": 4}, False),
    ({"recomputed": False, "why": "no time field"}, False),
])
def test_a_backfill_outcome_changed_the_output_when_it_wrote_or_published(outcome, changed):
    assert outcome_changed(outcome) is changed


def test_backfill_changes_gather_the_instances_that_changed_each_output():
    report = {"shard-1": {"trade_aggregates": {"recomputed": True, "rows_written": 2},
                          "quarantine": {"recomputed": False, "why": "not recomputed"}},
              "shard-2": {"trade_aggregates": {"recomputed": True, "rows_written": 0, "seconds_before": 0,
                                               "seconds_after": 0, "events_before": 0, "events_after": 0}}}
    assert backfill_changes(report, backfill_id="b-1", start=START, end=END) == {"trade_aggregates": {
        "changed_by": "backfill", "backfill_id": "b-1", "range_start": START.isoformat(), "range_end": END.isoformat(),
        "instances": {"shard-1": {"recomputed": True, "rows_written": 2}}}}


@dataclass
class FakeUpkeep:
    path: str
    files_compacted: int = 0
    files_written: int = 0
    rows_expired: int = 0
    version_after: int = 5


def test_upkeep_changes_are_compactions_and_expiries_of_output_tables():
    upkeeps = [FakeUpkeep("/d/delta/trades/trade_aggregates", files_compacted=40, files_written=1),
               FakeUpkeep("/d/delta/trades/quarantine", rows_expired=7),
               FakeUpkeep("/d/delta/trades/reconciliations", files_compacted=3),  # not an output
               FakeUpkeep("/d/delta/trades/alerts")]  # nothing done
    changes = upkeep_changes(["trade_aggregates", "quarantine", "alerts"], upkeeps)
    assert sorted(changes) == ["quarantine", "trade_aggregates"]
    assert changes["trade_aggregates"]["rows_changed"] is False and changes["quarantine"]["rows_expired"] == 7


@dataclass
class FakeTrimmed:
    table: str
    rows: int
    before: datetime
    what: str = ""


def test_retention_changes_name_the_output_of_each_part_and_skip_bookkeeping():
    outputs = ["trade_aggregates", "aggregates", "alerts", "latest"]
    assert trimmed_output(outputs, "second partials of trade_aggregates") == "trade_aggregates"
    assert trimmed_output(outputs, "alerts of instance shard-1") == "alerts"
    assert trimmed_output(outputs, "keys of latest") == "latest"
    assert trimmed_output(outputs, "instance shard-1") is None
    parts = [FakeTrimmed("heartbeats", 100, START), FakeTrimmed("output_contributions", 9, START, "instance shard-1"),
             FakeTrimmed("trade_aggregates", 30, START, "second partials of trade_aggregates"),
             FakeTrimmed("output_events", 2, START, "alerts of instance shard-1"),
             FakeTrimmed("output_events", 3, START, "alerts of instance shard-2"),
             FakeTrimmed("output_events", 0, START, "latest of instance shard-1")]
    changes = retention_changes(outputs, parts)
    assert sorted(changes) == ["alerts", "trade_aggregates"]
    assert changes["alerts"]["rows_deleted"] == 5 and len(changes["alerts"]["deleted"]) == 2


def test_emitted_events_go_through_the_plans_alias():
    from airflow.sdk.execution_time.context import OutletEventAccessors

    @dataclass
    class Task:
        outlets: list[Any]

    context = {"task": Task([outputs_alias("trades")]), "outlet_events": OutletEventAccessors()}
    uris = emit_output_events(context, "trades", {"trade_aggregates": {"changed_by": "backfill", "at": START}},
                              logging.getLogger("test"))
    assert uris == ["x-tandem://trades/trade_aggregates"]
    [added] = context["outlet_events"][outputs_alias("trades")].asset_alias_events
    assert (added.dest_asset_key.name, added.extra) == ("tandem.trades.trade_aggregates",
                                                       {"changed_by": "backfill", "at": START.isoformat()})
    assert emit_output_events(context, "trades", {}, logging.getLogger("test")) == []


@pytest.fixture(scope="module")
def dagbag():
    from airflow.dag_processing.dagbag import DagBag

    saved = {k: os.environ.pop(k) for k in ("TANDEM_HOME", "TANDEM_CONF_DIR", "TANDEM_NOTIFY_CONN_IDS")
             if k in os.environ}
    os.environ["TANDEM_NOTIFY_CONN_IDS"] = "ops_hook"
    try:
        return DagBag(dag_folder=str(DAGS), safe_mode=False)
    finally:
        os.environ.pop("TANDEM_NOTIFY_CONN_IDS")
        os.environ.update(saved)


def test_the_tasks_that_change_outputs_declare_the_alias_and_the_final_tasks_notify(dagbag):
    assert dagbag.import_errors == {}
    alias = outputs_alias("trades")
    for dag_id, task_id in (("tandem_trades_backfill", "report"), ("tandem_trades_reconcile", "reconcile"),
                            ("tandem_trades_maintenance", "delta_upkeep"),
                            ("tandem_trades_maintenance", "postgres_retention")):
        assert alias in dagbag.dags[dag_id].get_task(task_id).outlets, (dag_id, task_id)
    assert dagbag.dags["tandem_trades_reconcile"].get_task("reconcile")._post_execute_hook is not None
    callbacks = {(dag_id, task_id, kind): [n.event for n in getattr(dagbag.dags[dag_id].get_task(task_id), kind)]
                 for dag_id, task_id in (("tandem_trades_backfill", "register"), ("tandem_trades_backfill", "report"),
                                         ("tandem_trades_reconcile", "day"), ("tandem_trades_reconcile", "verdict"),
                                         ("tandem_trades_snapshot", "snapshot_shard-1_on_node-b"))
                 for kind in ("on_success_callback", "on_failure_callback")}
    assert {k: v for k, v in callbacks.items() if v} == {
        ("tandem_trades_backfill", "register", "on_failure_callback"): ["backfill_failed"],
        ("tandem_trades_backfill", "report", "on_success_callback"): ["backfill_done"],
        ("tandem_trades_backfill", "report", "on_failure_callback"): ["backfill_failed"],
        ("tandem_trades_reconcile", "day", "on_failure_callback"): ["reconcile_failed"],
        ("tandem_trades_reconcile", "verdict", "on_success_callback"): ["reconcile_done"],
        ("tandem_trades_reconcile", "verdict", "on_failure_callback"): ["reconcile_failed"],
        ("tandem_trades_snapshot", "snapshot_shard-1_on_node-b", "on_failure_callback"): ["snapshot_failed"]}
    supervise = dagbag.dags["tandem_trades_supervise"]
    assert [supervise.get_task(t).notify_conn_ids for t in ("ensure", "react")] == [["ops_hook"], ["ops_hook"]]
