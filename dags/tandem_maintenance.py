"""``tandem_<plan>_maintenance``: upkeep of a plan's storage (landing retention, Delta upkeep, PostgreSQL retention).

One DAG per ``conf/plans/*.yaml`` (``maintenance.schedule``: hourly unless declared, ``manual`` for none).
"""

from __future__ import annotations

from datetime import datetime, timezone

from airflow.sdk import DAG

from tandem.airflow.assets import outputs_alias
from tandem.airflow.dags import MAINTENANCE_DEFAULT_ARGS, load_for_dags, maintenance_doc
from tandem.airflow.snapshot_operators import CleanLandingOperator, DeltaUpkeepOperator, PostgresRetentionOperator
from tandem.names import plan_dag_id

cluster, plans = load_for_dags(__file__)

for plan in plans.values():
    with DAG(
        dag_id=plan_dag_id(plan.name, "maintenance"),
        description=f"Delete input of plan {plan.name} that no restart or restore needs; compact and vacuum its Delta "
                    "tables, delete its old PostgreSQL rows",
        schedule=plan.maintenance.dag_schedule,
        start_date=datetime(2025, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        default_args=MAINTENANCE_DEFAULT_ARGS,
        tags=["tandem", plan.name],
        doc_md=maintenance_doc(plan),
    ) as dag:
        CleanLandingOperator(task_id="landing_retention", plan=plan.name, cluster_config=str(cluster.path))
        DeltaUpkeepOperator(task_id="delta_upkeep", plan=plan.name, cluster_config=str(cluster.path),
                            outlets=[outputs_alias(plan.name)])  # an asset event per output it changed
        PostgresRetentionOperator(task_id="postgres_retention", plan=plan.name, cluster_config=str(cluster.path),
                                  outlets=[outputs_alias(plan.name)])
    globals()[dag.dag_id] = dag
