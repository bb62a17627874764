"""Airflow operator that validates a plan's outputs with Great Expectations (the validation DAG's task).

See :mod:`tandem.airflow.operator_support` for the cluster configuration and which errors are retried.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from tandem.airflow.operator_support import task_cluster
from tandem.config import load_plan
from tandem.declarations import parse_duration
from tandem.reading import read_output


class ValidateServingTableOperator(BaseOperator):
    """Validate every output of a plan with Great Expectations and log a sample of each one's merged rows (by the
    hour where it is kept in time buckets).

    Aggregations as serving tables, events by event time, tables whole (:mod:`tandem.quality.outputs`).
    The window is ``lookback`` (default: the plan's ``validation.lookback``) up to the run's
    ``data_interval_end`` (now for runs without one). Fails the task (no retry) when an
    expectation fails; the log and the exception name each failed expectation with sample rows.
    Returns the reports as a JSON-able dict.

    :param plan: plan name. Templated.
    :param lookback: window length such as ``"1 day"``.
    :param granularity: validate only this granularity (default: all).
    :param log_rows: how many merged rows of each output to write to the log at most.
    """

    template_fields = ("plan",)
    ui_color = "#e6e0f5"

    def __init__(self, *, plan: str, lookback: str | float | None = None, granularity: str | None = None,
                 cluster_config: str | None = None, log_rows: int = 200, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.lookback = lookback
        self.granularity = granularity
        self.cluster_config = cluster_config
        self.log_rows = log_rows

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem.aggregation import bucket_start
        from tandem.errors import NothingPublished
        from tandem.quality.implied import validated_outputs
        from tandem.quality.outputs import validate_plan_outputs

        cluster = task_cluster(self.cluster_config)
        plan = load_plan(self.plan, cluster)
        lookback_s = parse_duration(self.lookback) if self.lookback is not None else plan.validation.lookback_s
        interval_end = context.get("data_interval_end")
        end = (datetime.fromtimestamp(interval_end.timestamp(), timezone.utc) if interval_end
               else datetime.now(timezone.utc))
        since = end - timedelta(seconds=lookback_s)

        reports = validate_plan_outputs(cluster, plan, since, end, granularity=self.granularity)
        merged_rows = {}
        for output, policy in validated_outputs(plan).items():
            hourly = "hour" in policy.granularities  # outputs kept in buckets are logged by the hour
            start = bucket_start(since, "hour") if hourly else since
            try:
                rows = read_output(cluster, plan, "hour" if hourly else None, start, end, output=output,
                                   limit=self.log_rows + 1)
            except NothingPublished:
                rows = []
            merged_rows[output] = len(rows)
            self.log.info("merged %srows of %s %s, %s .. %s: %s%d", "hourly " if hourly else "", plan.name, output,
                          since.isoformat(), end.isoformat(), "more than " if len(rows) > self.log_rows else "",
                          min(len(rows), self.log_rows))
            for line in format_rows(rows[:self.log_rows], self.log_rows):
                self.log.info("%s", line)
        for report in reports:
            self.log.info("%s", report.summary())
            if report.row_count == 0:
                self.log.warning("%s: no rows in the window: nothing was validated", report.suite)
        failed = [r for r in reports if not r.success]
        if failed:
            raise AirflowFailException("\n".join(r.summary() for r in failed))
        return {"plan": plan.name, "success": True, "row_count": sum(r.row_count for r in reports),
                "merged_rows": merged_rows, "reports": [r.to_dict() for r in reports]}


def format_rows(rows: list[dict[str, Any]], limit: int) -> list[str]:
    """Merged aggregate rows as text lines, one ``column=value`` pair per column (pure)."""
    def shown(value: Any) -> str:
        if isinstance(value, datetime):
            return f"{value:%Y-%m-%d %H:%M:%S}"
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = [" ".join(f"{column}={shown(value)}" for column, value in row.items()) for row in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more rows")
    return lines
