"""``tandem_<plan>_run``: launch one instance of a plan on a node (triggered from the UI or REST).

One DAG per ``conf/plans/*.yaml``. Params: ``node``, ``shard_id``, ``trigger_interval``.
"""

from __future__ import annotations

from airflow.sdk import DAG

from tandem.airflow.dags import RUN_DEFAULT_ARGS, load_for_dags, run_doc, run_params
from tandem.airflow.operators import LaunchPlanInstanceOperator

cluster, plans = load_for_dags(__file__)

for plan in plans.values():
    with DAG(
        dag_id=f"tandem_{plan.name}_run",
        description=f"Launch an instance of plan {plan.name} on a node",
        schedule=None,
        catchup=False,
        max_active_runs=len(plan.nodes) * len(plan.shards),
        params=run_params(plan),
        default_args=RUN_DEFAULT_ARGS,
        tags=["tandem", plan.name],
        doc_md=run_doc(plan),
    ) as dag:
        LaunchPlanInstanceOperator(
            task_id="launch",
            plan=plan.name,
            node="{{ params.node }}",
            shard_id="{{ params.shard_id }}",
            trigger_interval="{{ params.trigger_interval }}",
            cluster_config=str(cluster.path),
        )
    globals()[dag.dag_id] = dag
