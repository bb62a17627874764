"""What the finite Spark jobs of ``jobs/`` share: logging, the plan, one Spark session and the database, and the
exit code (a refusal or any Tandem error is one logged line and exit code 1)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from pyspark.sql import SparkSession

from tandem.config import ClusterConfig, PlanConfig, load_cluster, load_plan
from tandem.errors import TandemError
from tandem.logs import configure_logging, log_context
from tandem.spark_session import build_session, lower_priority
from tandem.store import Database, migrate
from tandem.store.job_runs import recorded_run

Work = Callable[[ClusterConfig, PlanConfig, Database, SparkSession, logging.Logger], None]


def run_plan_job(purpose: str, plan_name: str, work: Work) -> int:
    """Run ``work`` for plan ``plan_name`` under ``spark-submit`` (the session takes its master from there); 0 when
    it returns, 1 after a :class:`TandemError` (logged). The run and its result are recorded as job ``purpose``
    (``job_runs``: the exporter's ``tandem_job_*`` metrics)."""
    configure_logging()
    log = logging.getLogger(f"tandem.{purpose}")
    cluster = load_cluster()
    plan = load_plan(plan_name, cluster)
    log_context(plan=plan.name)
    lower_priority()  # a recomputation beside the plan's live queries yields the CPU to them
    spark = build_session(f"tandem-{purpose}:{plan.name}", None, cluster.spark_defaults)
    try:
        with Database(cluster.database_url, f"tandem-{purpose}") as db:
            migrate(db)
            with recorded_run(db, plan.name, purpose):
                work(cluster, plan, db, spark, log)
        return 0
    except TandemError as exc:
        log.error("%s", exc)
        return 1
    finally:
        spark.stop()
