"""``tandem_<plan>_backfill``: recompute a closed range of a plan's outputs (late events included), from the UI.

One DAG per ``conf/plans/*.yaml``; triggered with Params ``start``, ``end`` and optionally ``instance``.
"""

from __future__ import annotations

from datetime import datetime, timezone

from airflow.sdk import DAG

from tandem.airflow.assets import outputs_alias
from tandem.airflow.batch_operators import BackfillReportOperator, RegisterBackfillOperator, plan_spark_job
from tandem.airflow.dags import BATCH_DEFAULT_ARGS, backfill_doc, backfill_params, load_for_dags, notify_callbacks
from tandem.airflow.notifications import BACKFILL_DONE, BACKFILL_FAILED
from tandem.names import plan_dag_id

cluster, plans = load_for_dags(__file__)

for plan in plans.values():
    with DAG(
        dag_id=plan_dag_id(plan.name, "backfill"),
        description=f"Recompute a closed event-time range of plan {plan.name}'s outputs from its retained input",
        schedule=None,
        start_date=datetime(2025, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        is_paused_upon_creation=False,  # on demand only: a trigger must run
        params=backfill_params(plan),
        default_args=BATCH_DEFAULT_ARGS,
        tags=["tandem", plan.name, "batch"],
        doc_md=backfill_doc(plan),
    ) as dag:
        register = RegisterBackfillOperator(task_id="register", plan=plan.name, cluster_config=str(cluster.path),
                                            start="{{ params.start }}", end="{{ params.end }}",
                                            instance="{{ params.instance }}",
                                            **notify_callbacks(plan.name, failure=BACKFILL_FAILED))
        recompute = plan_spark_job("recompute", cluster, plan, "backfill.py",
                                   ["--backfill-id", "{{ ti.xcom_pull(task_ids='register') }}"])
        report = BackfillReportOperator(task_id="report", plan=plan.name, cluster_config=str(cluster.path),
                                        backfill_id="{{ ti.xcom_pull(task_ids='register') }}",
                                        trigger_rule="all_done", outlets=[outputs_alias(plan.name)],
                                        **notify_callbacks(plan.name, success=BACKFILL_DONE, failure=BACKFILL_FAILED))
        register >> recompute >> report
    globals()[dag.dag_id] = dag
