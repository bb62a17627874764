"""Validate every output of a plan: aggregations, events and tables, with expectations generated from the plan.

Purpose
    The validation DAG checks what a plan published, whatever its outputs are. An aggregation is
    validated as a serving table (:func:`tandem.quality.serving.validate_serving_table`); an
    ``events`` output by its rows in ``output_events`` whose event time lies in the window; a
    ``table`` output by its per-instance rows in ``output_table_rows``.

How it works
    Each output gets the expectations its declaration implies (:func:`generated_expectations`:
    ids present and unique, key and time fields present, one row per key and instance, versions
    that count at least one contribution, instances of the plan only), plus the expectations of
    the plan's suite file (``conf/expectations/<validation.suite>.json``) whose ``meta.output``
    names it. An expectation without ``meta.output`` applies to the plan's aggregations (the
    trades suite predates other kinds). A plan without a suite file validates with the suite its
    declarations imply (:func:`tandem.quality.implied.implied_output_suite`). Event payloads and
    table keys and values are flattened into columns named after their fields.

What it does not do
    It does not read Delta (the PostgreSQL rows are the record of truth), and the quarantine is
    not validated (it holds bad input by design).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pandas as pd

from tandem.config import ClusterConfig, PlanConfig, load_plan
from tandem.quality.implied import VALIDATED_KINDS, generated_expectations
from tandem.quality.serving import (
    DEFAULT_MAX_ROWS,
    SHARDS_PARAMETER,
    ValidationError,
    ValidationReport,
    output_suite,
    run_suite,
    suite_for_output,
    validate_serving_table,
)
from tandem.store import outputs as store
from tandem.store.db import Database


def events_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows of ``output_events`` with the payload's fields as columns (pure)."""
    return pd.DataFrame([{**row["payload"], "event_id": row["event_id"], "shard_id": row["shard_id"],
                          "event_time": row["event_time"]} for row in rows],
                        columns=None if rows else ["event_id", "shard_id", "event_time"])


def table_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows of ``output_table_rows`` with the key's and the value's fields as columns (pure)."""
    return pd.DataFrame([{**row["key"], **row["value"], "shard_id": row["shard_id"], "version": row["version"]}
                         for row in rows], columns=None if rows else ["shard_id", "version"])


def _load(cluster: ClusterConfig, plan: str, output: str, kind: str, since: datetime, until: datetime,
          max_rows: int) -> list[dict[str, Any]]:
    def work(cursor) -> list[dict[str, Any]]:
        if kind == "events":
            return store.sample_events(cursor, plan, output, since, until, max_rows + 1)
        # a table is its current state: every row, whenever it was written
        return store.sample_table_rows(cursor, plan, output, max_rows + 1)

    with Database(cluster.database_url, "tandem-quality") as db:
        return db.run(work)


def validate_output(cluster: ClusterConfig, plan: PlanConfig, output: str, since: datetime,
                    until: datetime | None = None, *, granularity: str | None = None,
                    max_rows: int = DEFAULT_MAX_ROWS) -> ValidationReport:
    """Validate one output of ``plan`` over ``[since, until)`` (events by event time; a table whole).

    Raises:
        ValidationError: an unknown output, a kind that is not validated, or a bad suite.
    """
    if output not in plan.outputs or plan.outputs[output].kind not in VALIDATED_KINDS:
        raise ValidationError(f"plan {plan.name}: {output!r} is not a validated output "
                              f"({', '.join(o for o, c in plan.outputs.items() if c.kind in VALIDATED_KINDS)})")
    config = plan.outputs[output]
    if config.kind == "aggregation":
        report = validate_serving_table(cluster, plan, granularity, since, until=until, max_rows=max_rows,
                                        output=output)
        return replace(report, suite=f"{report.suite}:{output}")
    until = until or datetime.now(timezone.utc)
    suite, path = output_suite(cluster, plan)
    definition = suite_for_output(suite, plan, output)
    if plan.validation.suite is not None:  # an implied suite holds them already
        definition["expectations"] = [*generated_expectations(config), *definition["expectations"]]
    rows = _load(cluster, plan.name, output, config.kind, since, until, max_rows)
    truncated = len(rows) > max_rows
    rows = rows[:max_rows]
    if config.kind == "events":
        frame, key_columns, table = events_frame(rows), ["event_id"], "tandem.output_events"
    else:
        frame, key_columns, table = table_frame(rows), [*config.key, "shard_id"], "tandem.output_table_rows"
    outcomes = run_suite(definition, frame, {SHARDS_PARAMETER: list(plan.shards)}, key_columns, path,
                         asset=output) if rows else []
    return ValidationReport(plan=plan.name, suite=f"{definition['name']}:{output}", table=table, since=since,
                            until=until, granularity=None, row_count=len(frame), truncated=truncated,
                            success=all(o.success for o in outcomes), outcomes=outcomes)


def validate_plan_outputs(cluster: ClusterConfig, plan: PlanConfig | str, since: datetime,
                          until: datetime | None = None, *, granularity: str | None = None) -> list[ValidationReport]:
    """Validate every aggregation, events and table output of ``plan`` (one report each)."""
    plan = plan if isinstance(plan, PlanConfig) else load_plan(plan, cluster)
    return [validate_output(cluster, plan, output, since, until, granularity=granularity)
            for output, config in plan.outputs.items() if config.kind in VALIDATED_KINDS]
