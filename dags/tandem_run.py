"""``tandem_<plan>_run``: launch (or relaunch, or stop) one instance of a plan, on its node's host.

One DAG per ``conf/plans/*.yaml``. Params: ``action``, ``node``, ``instance``, ``trigger_interval``,
``role``, ``resync_from``, ``expires_at``, ``stop_timeout``, ``launched_at``. ``route`` picks the chosen node's
launch or stop task; each node's tasks run on the node's Airflow queue (``airflow_queue`` in
``cluster.yaml``), served by a worker on its host.
"""

from __future__ import annotations

from airflow.sdk import DAG, task

from tandem.airflow.dags import (INSTANCE_TEMPLATE, RUN_DEFAULT_ARGS, STOP, launch_task_id, load_for_dags,
                                 node_task_args, run_doc, run_params, stop_task_id)
from tandem.airflow.instance_operators import LaunchPlanInstanceOperator, StopPlanInstanceOperator
from tandem.names import plan_dag_id

cluster, plans = load_for_dags(__file__)

for plan in plans.values():
    with DAG(
        dag_id=plan_dag_id(plan.name, "run"),
        description=f"Launch, relaunch or stop an instance of plan {plan.name} on its node's host",
        schedule=None,
        catchup=False,
        max_active_runs=len(plan.nodes) * len(plan.instances),
        is_paused_upon_creation=False,  # on demand only: the supervisor's launches must run
        params=run_params(plan),
        default_args=RUN_DEFAULT_ARGS,
        tags=["tandem", plan.name],
        doc_md=run_doc(plan),
    ) as dag:

        @task.branch(task_id="route")
        def route(params: dict | None = None) -> str:
            return (stop_task_id if params["action"] == STOP else launch_task_id)(params["node"])

        routed = route()
        for node in plan.nodes:
            on_node = dict(plan=plan.name, node=node, instance=INSTANCE_TEMPLATE,
                           expires_at="{{ params.expires_at }}", cluster_config=str(cluster.path),
                           **node_task_args(cluster, node))
            routed >> [
                LaunchPlanInstanceOperator(
                    task_id=launch_task_id(node),
                    action="{{ params.action }}",
                    trigger_interval="{{ params.trigger_interval }}",
                    role="{{ params.role }}",
                    resync_from="{{ params.resync_from }}",
                    **on_node,
                ),
                StopPlanInstanceOperator(task_id=stop_task_id(node), stop_timeout="{{ params.stop_timeout }}",
                                         launched_at="{{ params.launched_at }}", **on_node),
            ]
    globals()[dag.dag_id] = dag
