"""Validate a plan's outputs with Great Expectations, each as its output kind says.

Purpose
    The validation DAG checks what a plan published, whatever its outputs are: aggregations (their
    serving tables' partial rows), events, tables; the quarantine is not validated (it holds bad
    input by design).

How it works
    Each kind module gives the validation policy of an output (:class:`tandem.outputs.base.Validation`):
    which rows it reads from PostgreSQL for a window and as which columns, what identifies a row, and
    what the declaration implies. The suite is the plan's suite file (``validation.suite``): its
    expectations whose ``meta.output`` names the output (and, for the aggregations, those naming no
    output: the trades suite predates other kinds), plus what the kind requires and the file does
    not already have. A plan without a suite file validates with the suite its declarations imply
    (:func:`tandem.quality.implied.implied_output_suite`).

What it does not do
    It does not read Delta (the PostgreSQL rows are the record of truth).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from tandem.config import ClusterConfig, PlanConfig, load_plan
from tandem.cutover import retired_labels
from tandem.outputs.base import Validation, Window
from tandem.outputs.expectations import suite_parameters
from tandem.quality.implied import validated_outputs
from tandem.quality.suites import (
    ValidationError,
    ValidationReport,
    output_suite,
    run_suite,
    suite_for_output,
)
from tandem.store.db import Database

log = logging.getLogger(__name__)
DEFAULT_MAX_ROWS = 2_000_000


def with_required(definition: dict[str, Any], required: list[dict[str, Any]]) -> dict[str, Any]:
    """A suite file's expectations for one output, after what its kind requires that the file does not have
    (an expectation of the same type and kwargs) (pure)."""
    present = {(e.get("type"), repr(e.get("kwargs"))) for e in definition["expectations"]}
    missing = [e for e in required if (e["type"], repr(e["kwargs"])) not in present]
    return {**definition, "expectations": [*missing, *definition["expectations"]]}


def validate_output(cluster: ClusterConfig, plan: PlanConfig | str, output: str, since: datetime | None = None,
                    until: datetime | None = None, *, granularity: str | None = None,
                    max_rows: int = DEFAULT_MAX_ROWS) -> ValidationReport:
    """Validate one output of ``plan`` over ``[since, until)`` (what the window means is the kind's: event
    time, overlapping buckets, or the whole table).

    Args:
        since: default ``validation.lookback`` ago.
        granularity: only buckets of this granularity (outputs without buckets ignore it).
        max_rows: read at most this many rows (the report says ``truncated`` when there were more).

    Raises:
        ValidationError: an unknown or unvalidated output, a granularity the output does not keep, naive
            times, or a missing or invalid suite.
    """
    plan = plan if isinstance(plan, PlanConfig) else load_plan(plan, cluster)
    validated = validated_outputs(plan)
    if output not in validated:
        raise ValidationError(f"plan {plan.name}: {output!r} is not a validated output ({', '.join(validated)})")
    policy = validated[output]
    if granularity is not None and policy.granularities and granularity not in policy.granularities:
        raise ValidationError(f"unknown granularity {granularity!r}: {output} keeps {', '.join(policy.granularities)}")
    since = since or datetime.fromtimestamp(datetime.now(timezone.utc).timestamp() - plan.validation.lookback_s,
                                            timezone.utc)
    if since.tzinfo is None or (until is not None and until.tzinfo is None):
        raise ValidationError("since and until must be timezone-aware")
    suite, path = output_suite(cluster, plan)
    definition = suite_for_output(suite, output, policy.takes_unnamed)
    if plan.validation.suite is not None:  # an implied suite holds them already
        definition = with_required(definition, policy.required)
    rows = _read(cluster, policy, Window(since, until, granularity), max_rows)
    truncated = len(rows) > max_rows
    if truncated:
        log.warning("%s: more than %d rows in the window; validating the first %d", policy.table, max_rows, max_rows)
        rows = rows[:max_rows]
    frame = policy.frame(rows)
    instances = [*plan.instances, *retired_labels(cluster, plan)]  # rows of instances a cut-over retired stay
    outcomes = run_suite(definition, frame, suite_parameters(instances), policy.key_columns, path,
                         asset=output) if rows else []
    return ValidationReport(plan=plan.name, suite=f"{definition['name']}:{output}", table=policy.table, since=since,
                            until=until, granularity=granularity if policy.granularities else None,
                            row_count=len(frame), truncated=truncated, success=all(o.success for o in outcomes),
                            outcomes=outcomes)


def _read(cluster: ClusterConfig, policy: Validation, window: Window, max_rows: int) -> list[dict[str, Any]]:
    with Database(cluster.database_url, "tandem-quality") as db:
        return db.run(lambda cursor: policy.read(cursor, window, max_rows + 1))


def validate_serving_table(cluster: ClusterConfig, plan: PlanConfig | str, granularity: str | None = None,
                           since: datetime | None = None, *, until: datetime | None = None,
                           max_rows: int = DEFAULT_MAX_ROWS, output: str | None = None) -> ValidationReport:
    """:func:`validate_output` of an output kept in time buckets (an aggregation's serving table; default: the
    plan's first), the report named after its suite.

    Raises:
        ValidationError: the plan has no such output, or as :func:`validate_output`.
    """
    plan = plan if isinstance(plan, PlanConfig) else load_plan(plan, cluster)
    bucketed = [name for name, policy in validated_outputs(plan).items() if policy.granularities]
    if not bucketed:
        raise ValidationError(f"plan {plan.name} has no output kept in time buckets to validate (its outputs: "
                              f"{', '.join(plan.outputs)})")
    if output is not None and output not in bucketed:
        raise ValidationError(f"plan {plan.name}: {output!r} is not an output kept in time buckets "
                              f"({', '.join(bucketed)})")
    output = output or bucketed[0]
    report = validate_output(cluster, plan, output, since, until, granularity=granularity, max_rows=max_rows)
    return replace(report, suite=report.suite.removesuffix(f":{output}"))


def validate_plan_outputs(cluster: ClusterConfig, plan: PlanConfig | str, since: datetime | None = None,
                          until: datetime | None = None, *, granularity: str | None = None) -> list[ValidationReport]:
    """Validate every validated output of ``plan`` (one report each)."""
    plan = plan if isinstance(plan, PlanConfig) else load_plan(plan, cluster)
    return [validate_output(cluster, plan, output, since, until, granularity=granularity)
            for output in validated_outputs(plan)]
