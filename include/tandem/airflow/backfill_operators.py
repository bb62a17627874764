"""Airflow operators of a plan's backfill DAG: register the range, then (after the Spark job) report the outcome.

``tandem_<plan>_backfill`` is ``register`` (:class:`RegisterBackfillOperator`) -> ``recompute`` (the provider's
``SparkSubmitOperator`` running ``jobs/backfill.py --backfill-id``) -> ``report`` (:class:`BackfillReportOperator`,
whatever ``recompute`` did). The work itself is :mod:`tandem.batch.backfill`'s.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from tandem.airflow.operator_support import set_run_note
from tandem.airflow.snapshot_operators import PlanTaskOperator
from tandem.errors import BackfillRefused, ConfigError


def _moment(name: str, text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(str(text).strip())
    except ValueError:
        raise AirflowFailException(f"Param {name}: expected an ISO time such as 2026-11-26T10:00:00Z, got {text!r}") \
            from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


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
            shards = [plan.check_shard(self.instance)] if self.instance else list(plan.shards)
            with Database(cluster.database_url, "tandem-backfill") as db:
                check_backfill(cluster, plan, db, start, end, shards)
                ti = context["ti"]
                record = register(db, plan.name, start, end, shards, f"airflow {ti.dag_id}/{ti.run_id}")
        except (BackfillRefused, ConfigError) as exc:
            raise AirflowFailException(str(exc)) from None
        self.log.info("backfill %s registered: %s .. %s, instances %s", record.id, start.isoformat(),
                      end.isoformat(), ", ".join(shards))
        return record.id


class BackfillReportOperator(PlanTaskOperator):
    """Log a backfill's outcome and put it in the run's note; fail unless it is DONE (a backfill whose Spark job
    died before it could say so is marked FAILED here).

    :param backfill_id: the id ``register`` returned. Templated.
    """

    template_fields = ("plan", "backfill_id")
    ui_color = "#f5e6dc"

    def __init__(self, *, backfill_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.backfill_id = backfill_id

    def execute(self, context: Any) -> dict[str, Any]:
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
        for shard, outputs in record.report.items():
            for output, outcome in outputs.items():
                lines.append(f"{shard} {output}: " + ", ".join(f"{k} {v}" for k, v in outcome.items()))
        if record.error:
            lines.append(f"error: {record.error}")
        for line in lines:
            self.log.info("%s", line)
        set_run_note(self.log, context["ti"], "\n".join(lines))
        if record.status != catalog.DONE:
            raise AirflowFailException(lines[0] + (f": {record.error}" if record.error else ""))
        return {"id": record.id, "status": record.status, "report": record.report}
