"""``tandem_<plan>_validate``: Great Expectations over a plan's serving table, on the plan's schedule.

One DAG per ``conf/plans/*.yaml`` (``validation.schedule``, ``validation.lookback``, ``validation.suite``).
"""

from __future__ import annotations

from airflow.sdk import DAG

from tandem.airflow.dags import VALIDATE_DEFAULT_ARGS, load_for_dags, validate_doc
from tandem.airflow.validation_operators import ValidateServingTableOperator
from tandem.names import plan_dag_id

cluster, plans = load_for_dags(__file__)

for plan in plans.values():
    with DAG(
        dag_id=plan_dag_id(plan.name, "validate"),
        description=f"Validate the serving table of plan {plan.name}",
        schedule=plan.validation.schedule,
        catchup=False,
        max_active_runs=1,
        default_args=VALIDATE_DEFAULT_ARGS,
        tags=["tandem", plan.name],
        doc_md=validate_doc(plan),
    ) as dag:
        ValidateServingTableOperator(
            task_id="validate",
            plan=plan.name,
            lookback=plan.validation.lookback_s,
            cluster_config=str(cluster.path),
        )
    globals()[dag.dag_id] = dag
