"""Airflow operators for Tandem: launch a plan instance, validate a plan's serving table.

Both resolve the cluster configuration at run time (``cluster_config``, a path to
``cluster.yaml``, or the environment), so DAG files stay free of I/O beyond reading ``conf/``.
Errors a retry cannot fix (bad Params, unknown node or shard, failed validation) raise
``AirflowFailException``; anything else may be retried.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tandem.config import ClusterConfig, load_cluster, load_plan, parse_duration
from tandem.errors import ConfigError


def _cluster(path: str | None) -> ClusterConfig:
    return load_cluster(Path(path) if path else None)


class LaunchPlanInstanceOperator(BaseOperator):
    """Make sure one plan instance runs on a node, as a detached ``spark-submit`` job, and wait for RUNNING.

    Uses :func:`tandem.supervisor.launcher.launch_instance`, which returns the existing job when
    the instance is already alive, so a retry of this task (or a second run with the same
    Params) never submits a second job. Pushes ``instance_id``, ``pid``, ``submit_pid``,
    ``spark_app_id``, ``log_path`` and ``reused`` to XCom and returns them as a dict.

    Airflow 3.3's task SDK offers no call to set the note of the task's own DAG run (the
    Execution API takes a note only when a task triggers a new run), so the summary goes to the
    task log instead.

    :param plan: plan name (``conf/plans/<plan>.yaml``). Templated.
    :param node: node name from ``cluster.yaml``, one of the plan's nodes. Templated.
    :param shard_id: one of the plan's shards. Templated.
    :param trigger_interval: micro-batch interval such as ``"1 second"``; empty means the plan's. Templated.
    :param cluster_config: path of ``cluster.yaml`` (default: ``$TANDEM_CONF_DIR/cluster.yaml``).
    :param running_timeout_s: how long to wait for the instance to report RUNNING.
    """

    template_fields = ("plan", "node", "shard_id", "trigger_interval")
    ui_color = "#dcefe3"

    def __init__(self, *, plan: str, node: str, shard_id: str, trigger_interval: str | None = None,
                 cluster_config: str | None = None, running_timeout_s: float = 300.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.node = node
        self.shard_id = shard_id
        self.trigger_interval = trigger_interval
        self.cluster_config = cluster_config
        self.running_timeout_s = running_timeout_s

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem.supervisor.launcher import LaunchError, LaunchRejected, launch_instance, wait_until_running

        interval = self._checked_interval()
        cluster = _cluster(self.cluster_config)
        try:
            plan = load_plan(self.plan, cluster)
            cluster.node(self.node)
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None
        ti = context["ti"]
        launched_by = f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id} try {ti.try_number}"
        try:
            job = launch_instance(cluster, plan, self.shard_id, self.node, interval, launched_by=launched_by)
        except LaunchRejected as exc:
            raise AirflowFailException(str(exc)) from None
        except LaunchError as exc:
            raise AirflowException(str(exc)) from None
        verb = "found running" if job.reused else "launched"
        self.log.info("%s %s (%s); log %s", verb, job.instance_id, job.reason, job.log_path)
        if job.command:
            self.log.info("command: %s", " ".join(job.command))
        try:
            row = wait_until_running(cluster, plan, self.shard_id, self.node, timeout_s=self.running_timeout_s)
        except LaunchError as exc:
            raise AirflowException(str(exc)) from None
        result = {
            "instance_id": row["instance_id"],
            "pid": row["pid"],
            "submit_pid": row["submit_pid"],
            "spark_app_id": row["spark_app_id"],
            "log_path": row["log_path"],
            "host": row["host"],
            "reused": job.reused,
        }
        for key, value in result.items():
            ti.xcom_push(key=key, value=value)
        self.log.info("%s RUNNING on %s: pid %s, Spark application %s, log %s", row["instance_id"], row["host"],
                      row["pid"], row["spark_app_id"], row["log_path"])
        return result

    def _checked_interval(self) -> str | None:
        text = (self.trigger_interval or "").strip()
        if not text:
            return None
        try:
            parse_duration(text)
        except ValueError as exc:
            raise AirflowFailException(f"Param trigger_interval: {exc}") from None
        return text


class ValidateServingTableOperator(BaseOperator):
    """Validate a plan's serving table with its Great Expectations suite and log the merged hourly result.

    The window is ``lookback`` (default: the plan's ``validation.lookback``) up to the run's
    ``data_interval_end`` (now for runs without one). Fails the task (no retry) when an
    expectation fails; the log and the exception name each failed expectation with sample rows.
    Returns the report as a JSON-able dict.

    :param plan: plan name. Templated.
    :param lookback: window length such as ``"1 day"``.
    :param granularity: validate only this granularity (default: all).
    :param log_rows: how many merged hourly rows to write to the log at most.
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
        from tandem import aggregation
        from tandem.quality import validate_serving_table

        cluster = _cluster(self.cluster_config)
        plan = load_plan(self.plan, cluster)
        lookback_s = parse_duration(self.lookback) if self.lookback is not None else plan.validation.lookback_s
        interval_end = context.get("data_interval_end")
        end = datetime.fromtimestamp(interval_end.timestamp(), timezone.utc) if interval_end else datetime.now(timezone.utc)
        since = end - timedelta(seconds=lookback_s)

        report = validate_serving_table(cluster, plan, self.granularity, since, until=end)
        hourly = aggregation.query(cluster, plan.name, "hour", aggregation.bucket_start(since, "hour"), end)
        self.log.info("merged hourly %s aggregates %s .. %s: %d rows", plan.name, since.isoformat(),
                      end.isoformat(), len(hourly))
        for line in format_hourly(hourly, self.log_rows):
            self.log.info("%s", line)
        self.log.info("%s", report.summary())
        if report.row_count == 0:
            self.log.warning("no partial aggregates in the window: nothing was validated")
        if not report.success:
            raise AirflowFailException(report.summary())
        return {**report.to_dict(), "hourly_rows": len(hourly)}


def format_hourly(rows: list[dict[str, Any]], limit: int) -> list[str]:
    """Merged rows as aligned text lines: bucket, symbol, avg, sum quantity, count, min, max (pure)."""
    lines = [f"{'bucket':<20} {'symbol':<10} {'avg price':>12} {'sum qty':>10} {'count':>8} "
             f"{'min':>10} {'max':>10} {'shards':>6}"]
    for row in rows[:limit]:
        avg = "n/a" if row["avg_price"] is None else f"{row['avg_price']:.4f}"
        lines.append(f"{row['bucket_start']:%Y-%m-%d %H:%M:%S} {row['symbol']:<10} {avg:>12} "
                     f"{row['quantity_sum']:>10} {row['trade_count']:>8} {row['price_min']:>10.2f} "
                     f"{row['price_max']:>10.2f} {row['shards']:>6}")
    if len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more rows")
    return lines
