"""Airflow operators of a plan's batch DAGs, around the provider's ``SparkSubmitOperator`` that does the work.

``tandem_<plan>_backfill`` is ``register`` (:class:`RegisterBackfillOperator`) -> ``recompute`` (``jobs/backfill.py
--backfill-id``) -> ``report`` (:class:`BackfillReportOperator`, whatever ``recompute`` did);
``tandem_<plan>_reconcile`` is ``day`` (:class:`ReconcileDayOperator`) -> ``reconcile`` (``jobs/reconcile.py``) ->
``verdict`` (:class:`ReconcileVerdictOperator`). The work itself is :mod:`tandem.batch.backfill`'s and
:mod:`tandem.batch.reconcile`'s.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from tandem.airflow.operator_support import set_run_note
from tandem.airflow.snapshot_operators import PlanTaskOperator
from tandem.config import ClusterConfig, PlanConfig
from tandem.declarations import parse_instant
from tandem.errors import BackfillRefused, ConfigError


def plan_spark_job(task_id: str, cluster: ClusterConfig, plan: PlanConfig, script: str, application_args: list[str],
                   **kwargs: Any):
    """The provider's ``SparkSubmitOperator`` running ``jobs/<script>`` for ``plan`` on its first node's Spark
    connection (the finite jobs it is made for); the driver inherits the worker's environment, no secret goes on
    the command line. ``kwargs``: more operator arguments (outlets, callbacks, hooks)."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    node = cluster.node(plan.nodes[0])
    return SparkSubmitOperator(
        task_id=task_id,
        conn_id=node.airflow_conn_id,
        application=str(cluster.project_root / "jobs" / script),
        py_files=str(cluster.project_root / "dist" / "tandem.zip"),
        properties_file=str(cluster.spark_defaults),
        driver_memory=node.driver_memory,
        name=f"tandem-{task_id}:{plan.name}",
        application_args=["--plan", plan.name, *application_args],
        **kwargs,
    )


def _moment(name: str, text: str) -> datetime:
    try:
        return parse_instant(text)
    except ValueError as exc:
        raise AirflowFailException(f"Param {name}: {exc}") from None


class RegisterBackfillOperator(PlanTaskOperator):
    """Check a backfill's range (closed, input retained, no overlap) and record it RUNNING; returns its id.

    :param start: first instant of the range (ISO). Templated.
    :param end: end of the range, excluded (ISO). Templated.
    :param instance: one instance, or empty for every instance. Templated.
    """

    template_fields = ("plan", "start", "end", "instance")
    ui_color = "#f5e6dc"

    def __init__(self, *, start: str, end: str, instance: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.start, self.end, self.instance = start, end, instance

    def execute(self, context: Any) -> str:
        from tandem.batch.backfill import check_backfill
        from tandem.store import Database
        from tandem.store.backfills import register

        cluster, plan = self.loaded()
        start, end = _moment("start", self.start), _moment("end", self.end)
        try:
            instances = [plan.check_instance(self.instance)] if self.instance else list(plan.instances)
            with Database(cluster.database_url, "tandem-backfill") as db:
                check_backfill(cluster, plan, db, start, end, instances)
                ti = context["ti"]
                record = register(db, plan.name, start, end, instances, f"airflow {ti.dag_id}/{ti.run_id}")
        except (BackfillRefused, ConfigError) as exc:
            raise AirflowFailException(str(exc)) from None
        self.log.info("backfill %s registered: %s .. %s, instances %s", record.id, start.isoformat(),
                      end.isoformat(), ", ".join(instances))
        return record.id


class BackfillReportOperator(PlanTaskOperator):
    """Log a backfill's outcome and put it in the run's note; fail unless it is DONE (a backfill whose Spark job
    died before it could say so is marked FAILED here). A DONE backfill emits an asset event per output it changed,
    through the plan's outputs alias when the task declares it (:mod:`tandem.airflow.assets`).

    :param backfill_id: the id ``register`` returned. Templated.
    """

    template_fields = ("plan", "backfill_id")
    ui_color = "#f5e6dc"

    def __init__(self, *, backfill_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.backfill_id = backfill_id

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem.airflow.assets import backfill_changes, emit_output_events
        from tandem.store import Database
        from tandem.store import backfills as catalog

        cluster, plan = self.loaded()
        if not self.backfill_id or self.backfill_id == "None":
            raise AirflowFailException("no backfill was registered (see the register task's log)")
        with Database(cluster.database_url, "tandem-backfill") as db:
            record = catalog.get_backfill(db, self.backfill_id)
            if record is not None and record.status == catalog.RUNNING:
                catalog.finish(db, record.id, catalog.FAILED, record.report,
                               "the recompute task ended before the backfill did (see its log)")
                record = catalog.get_backfill(db, self.backfill_id)
        if record is None:
            raise AirflowFailException(f"no backfill {self.backfill_id!r} of plan {plan.name}")
        lines = [f"backfill {record.id} of {plan.name}: {record.status} "
                 f"({record.range_start.isoformat()} .. {record.range_end.isoformat()})"]
        for instance, outputs in record.report.items():
            for output, outcome in outputs.items():
                lines.append(f"{instance} {output}: " + ", ".join(f"{k} {v}" for k, v in outcome.items()))
        if record.error:
            lines.append(f"error: {record.error}")
        for line in lines:
            self.log.info("%s", line)
        set_run_note(self.log, context["ti"], "\n".join(lines))
        if record.status != catalog.DONE:
            raise AirflowFailException(lines[0] + (f": {record.error}" if record.error else ""))
        emit_output_events(context, plan.name, backfill_changes(record.report, backfill_id=record.id,
                                                                start=record.range_start, end=record.range_end),
                           self.log)
        return {"id": record.id, "status": record.status, "report": record.report,
                "start": record.range_start.isoformat(), "end": record.range_end.isoformat()}


class ReconcileDayOperator(PlanTaskOperator):
    """The UTC day a reconcile run covers (``YYYY-MM-DD``): Param ``day``, else the run's partition key (the
    schedule's: the previous day), else yesterday."""

    template_fields = ("plan", "day")
    ui_color = "#f5e6dc"

    def __init__(self, *, day: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.day = day

    def execute(self, context: Any) -> str:
        chosen = (self.day or context.get("partition_key") or
                  f"{datetime.now(timezone.utc) - timedelta(days=1):%Y-%m-%d}").strip()
        try:
            datetime.strptime(chosen, "%Y-%m-%d")
        except ValueError:
            raise AirflowFailException(f"day: expected YYYY-MM-DD, got {chosen!r}") from None
        self.log.info("reconciling plan %s over %s (UTC)", self.plan, chosen)
        return chosen


class ReconcileVerdictOperator(PlanTaskOperator):
    """Read what the run's reconcile stored, log it, put it in the run's note and the asset event; fail when the
    extra and different keys exceed ``reconcile.tolerance`` (late events dropped by design never fail it).

    :param run_id: the run id the reconcile job stored its rows under. Templated.
    """

    template_fields = ("plan", "run_id")
    ui_color = "#f5e6dc"

    def __init__(self, *, run_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id = run_id

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem.batch.reconciliations import DIFFERENCES, reconciliation_rows, summary

        cluster, plan = self.loaded()
        rows = reconciliation_rows(cluster, plan, self.run_id)
        if not rows:
            raise AirflowFailException(f"the reconcile of run {self.run_id} stored nothing (see its log)")
        counts = summary(rows)
        lines = [f"reconcile of {plan.name} {rows[0]['range_start']:%Y-%m-%d}: "
                 + ", ".join(f"{counts[k]} {k}" for k in DIFFERENCES)]
        for row in rows:
            lines.append(f"{row['instance']} {row['output']}: {row['compared']} compared, "
                         + ", ".join(f"{row[k]} {k}" for k in DIFFERENCES)
                         + (f" (skipped: {row['skipped']})" if row["skipped"] else f"; examples {row['examples']}"))
        for line in lines:
            self.log.info("%s", line)
        set_run_note(self.log, context["ti"], "\n".join(lines))
        for asset in self.outlets:
            context["outlet_events"][asset].extra = {"run_id": self.run_id, **counts}
        real = counts["extra"] + counts["different"]
        if real > plan.reconcile.tolerance:
            raise AirflowFailException(f"{lines[0]}: {real} real differences, more than reconcile.tolerance "
                                       f"{plan.reconcile.tolerance}")
        return {"run_id": self.run_id, "day": f"{rows[0]['range_start']:%Y-%m-%d}", **counts}
