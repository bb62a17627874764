"""``tandem_<plan>_supervise``: one continuous supervision loop per plan (ensure → watch → react).

One DAG per ``conf/plans/*.yaml``. ``@continuous`` with one run at a time: each run is one
epoch of the plan's cluster and the next run starts when it ends.
"""

from __future__ import annotations

from datetime import datetime, timezone

from airflow.sdk import DAG

from tandem.airflow.dags import (
    SUPERVISE_DEFAULT_ARGS, SUPERVISE_MAX_WATCH, load_for_dags, supervise_doc,
)
from tandem.airflow.notifications import notify_conn_ids
from tandem.airflow.supervision_operators import ReconcilePlanOperator
from tandem.airflow.sensors import StreamHealthSensor
from tandem.names import plan_dag_id

cluster, plans = load_for_dags(__file__)

for plan in plans.values():
    with DAG(
        dag_id=plan_dag_id(plan.name, "supervise"),
        description=f"Keep plan {plan.name} running in its roles; fail over and repair",
        schedule="@continuous",
        # Airflow 3.3's ContinuousTimetable gives the first run of a DAG without a start_date the
        # zero-length interval (now, now); the next run starts at that run's end, so it gets the
        # same logical date and is never created ("run already exists"). A start date avoids it.
        start_date=datetime(2024, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        default_args=SUPERVISE_DEFAULT_ARGS,
        tags=["tandem", plan.name, "supervision"],
        doc_md=supervise_doc(plan),
    ) as dag:
        ensure = ReconcilePlanOperator(task_id="ensure", plan=plan.name, cluster_config=str(cluster.path),
                                       notify_conn_ids=notify_conn_ids())  # failovers and BLOCKED, once each
        watch = StreamHealthSensor(task_id="watch", plan=plan.name, max_watch=SUPERVISE_MAX_WATCH,
                                   cluster_config=str(cluster.path))
        react = ReconcilePlanOperator(task_id="react", plan=plan.name, watch_task_id="watch",
                                      cluster_config=str(cluster.path), notify_conn_ids=notify_conn_ids())
        ensure >> watch >> react
    globals()[dag.dag_id] = dag
