"""``tandem_<plan>_reconcile``: every day, the previous UTC day of a plan's outputs compared with a batch recomputation.

One DAG per ``conf/plans/*.yaml``. Runs are partitioned by day (``CronPartitionTimetable``: the run at 01:00 UTC
reconciles the day before), so Airflow's own backfill (the UI, or ``airflow backfill create``) runs it over a
month. Paused when created: it needs the day's input retained (``maintenance.keep_input`` of a day or more).
"""

from __future__ import annotations

from datetime import datetime, timezone

from airflow.sdk import DAG, Asset, CronPartitionTimetable

from tandem.airflow.assets import RepairedOutputs, outputs_alias
from tandem.airflow.batch_operators import ReconcileDayOperator, ReconcileVerdictOperator, plan_spark_job
from tandem.airflow.dags import BATCH_DEFAULT_ARGS, load_for_dags, notify_callbacks, reconcile_doc, reconcile_params
from tandem.airflow.notifications import RECONCILE_DONE, RECONCILE_FAILED
from tandem.layout import delta_table_dir
from tandem.names import RECONCILIATIONS, plan_dag_id

cluster, plans = load_for_dags(__file__)

for plan in plans.values():
    with DAG(
        dag_id=plan_dag_id(plan.name, "reconcile"),
        description=f"Compare the previous day of plan {plan.name}'s outputs with a batch recomputation",
        schedule=CronPartitionTimetable("0 1 * * *", timezone="UTC", run_offset=-1, key_format="%Y-%m-%d"),
        start_date=datetime(2025, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        is_paused_upon_creation=True,
        params=reconcile_params(),
        default_args={**BATCH_DEFAULT_ARGS, **notify_callbacks(plan.name, failure=RECONCILE_FAILED)},
        tags=["tandem", plan.name, "batch"],
        doc_md=reconcile_doc(plan),
    ) as dag:
        day = ReconcileDayOperator(task_id="day", plan=plan.name, cluster_config=str(cluster.path),
                                   day="{{ params.day }}")
        compare = plan_spark_job("reconcile", cluster, plan, "reconcile.py",
                                 ["--day", "{{ ti.xcom_pull(task_ids='day') }}", "--run-id", "{{ run_id }}"],
                                 outlets=[outputs_alias(plan.name)],  # the outputs its repair changed
                                 post_execute=RepairedOutputs(plan.name, str(cluster.path)))
        verdict = ReconcileVerdictOperator(
            task_id="verdict", plan=plan.name, cluster_config=str(cluster.path), run_id="{{ run_id }}",
            outlets=[Asset(name=f"tandem_{plan.name}_reconciliations",
                           uri=delta_table_dir(cluster, plan.name, RECONCILIATIONS).as_uri())],
            **notify_callbacks(plan.name, success=RECONCILE_DONE))
        day >> compare >> verdict
    globals()[dag.dag_id] = dag
