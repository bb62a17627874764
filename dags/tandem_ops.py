"""``tandem_ops``: an operator's action on a plan from the UI (failover now, drain a node, restart a node)."""

from __future__ import annotations

from airflow.sdk import DAG

from tandem.airflow.dags import OPS_DEFAULT_ARGS, OPS_DOC, load_all_for_dags, ops_params, with_broken_plans
from tandem.airflow.supervision_operators import PlanOpsOperator
from tandem.names import OPS_DAG_ID

cluster, plans, broken = load_all_for_dags(__file__)  # broken plans: listed in the docs, not offered

with DAG(
    dag_id=OPS_DAG_ID,
    description="Fail over, drain or restart a node of a plan",
    schedule=None,
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,  # on demand only (no schedule): a trigger from the Tandem page must run
    params=ops_params(cluster, plans),
    default_args=OPS_DEFAULT_ARGS,
    tags=["tandem", "ops"],
    doc_md=with_broken_plans(OPS_DOC, broken),
) as dag:
    PlanOpsOperator(
        task_id="act",
        action="{{ params.action }}",
        plan="{{ params.plan }}",
        instance="{{ params.instance }}",
        node="{{ params.node }}",
        cluster_config=str(cluster.path),
    )
