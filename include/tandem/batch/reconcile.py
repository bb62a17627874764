"""Reconcile: compare what the stream published for a closed range with a batch recomputation of it, key by key.

Purpose
    Knowing the stream is right. The daily ``tandem_<plan>_reconcile`` DAG (one run per day, partitioned by day,
    so Airflow's own backfill runs it over a month) recomputes the previous day of each instance exactly as a
    backfill does (:func:`tandem.batch.backfill.recompute`) and compares it with the published outputs.

How it works
    Per instance and output, as its kind compares (:meth:`tandem.outputs.base.OutputKind.compare`), each
    difference is one of:

    - ``late``: the recomputation counts more than was published (a key missing from the output, or a second
      with fewer events): events that came after the watermark, which the stream drops by design;
    - ``extra``: published, but the recomputation does not produce it;
    - ``different``: both have it, with other values, and the stream did not merely miss events.

    The counts and a few examples are appended to the Delta table ``delta/<plan>/reconciliations``
    (:mod:`tandem.batch.reconciliations`, one row per instance and output), returned for the DAG's asset event,
    and shown by ``tandem status``. A run fails when its extra and different keys exceed
    ``reconcile.tolerance``; ``reconcile.repair: true`` hands the range to a backfill (which adds the late
    events and replaces the aggregations).
"""

from __future__ import annotations

import shutil
from datetime import datetime

from pyspark.sql import SparkSession

from tandem.batch.backfill import check_backfill, recompute
from tandem.batch.reconciliations import store_outcomes
from tandem.config import ClusterConfig, PlanConfig
from tandem.layout import backfill_dir
from tandem.outputs import kind_of
from tandem.outputs.recompute import Outcome, Recomputed
from tandem.store import Database


def reconcile(cluster: ClusterConfig, plan: PlanConfig, db: Database, spark: SparkSession, start: datetime,
              end: datetime, *, run_id: str, instances: list[str] | None = None) -> list[Outcome]:
    """Recompute ``[start, end)`` of every instance (or ``instances``), compare it with the published outputs, append
    the outcomes to ``delta/<plan>/reconciliations`` (once per ``run_id``) and return them. Refused as a backfill
    would be (range not closed, input gone)."""
    instances = [plan.check_instance(s) for s in instances] if instances else list(plan.instances)
    check_backfill(cluster, plan, db, start, end, instances)
    scratch = backfill_dir(cluster, plan.name, f"reconcile-{run_id}".replace("/", "_").replace(":", "_"))
    outcomes = []
    try:
        for instance in instances:
            recomputed = recompute(spark, cluster, plan, instance, scratch / instance)
            outcomes += [kind_of(plan, output).compare(Recomputed(cluster, plan, db, instance, output,
                                                                  recomputed.get(output), start, end))
                         for output in plan.outputs if kind_of(plan, output).recomputed]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    store_outcomes(cluster, plan, [o.row() for o in outcomes], start, end, run_id)
    return outcomes
