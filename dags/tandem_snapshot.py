"""``tandem_<plan>_snapshot``: scheduled persistence snapshots of a plan, validated and pruned.

One DAG per ``conf/plans/*.yaml``, every ``snapshot.interval``. Per instance, ``choose_host_<instance>``
picks the host that takes the snapshot (a live standby's, else the ACTIVE's) and follows that
node's ``snapshot_<instance>_on_<node>`` task, which runs on the node's queue (a run triggered with
the Param ``instance``, as ``tandem_ops`` snapshot_now does, snapshots that instance only). Then retention
(``snapshot.keep``) whatever the snapshots' outcome, and ``all_snapshots_good``, which fails the
run when a snapshot failed (a run's state follows its last tasks, and retention succeeds).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

from tandem.airflow.dags import (
    INSTANCE_TEMPLATE,
    SNAPSHOT_DEFAULT_ARGS,
    load_for_dags,
    node_task_args,
    notify_callbacks,
    snapshot_doc,
    snapshot_params,
    snapshot_task_id,
)
from tandem.airflow.notifications import SNAPSHOT_FAILED
from tandem.airflow.snapshot_operators import ChooseSnapshotHostOperator, PruneSnapshotsOperator, TakeSnapshotOperator
from tandem.names import plan_dag_id

cluster, plans = load_for_dags(__file__)

for plan in plans.values():
    with DAG(
        dag_id=plan_dag_id(plan.name, "snapshot"),
        description=f"Snapshot, validate and prune plan {plan.name} every snapshot.interval",
        schedule=timedelta(seconds=plan.snapshot.interval_s),
        start_date=datetime(2025, 1, 1, tzinfo=timezone.utc),
        catchup=False,
        max_active_runs=1,
        default_args=SNAPSHOT_DEFAULT_ARGS,
        tags=["tandem", plan.name, "snapshots"],
        doc_md=snapshot_doc(plan),
        params=snapshot_params(plan),
    ) as dag:
        prune = PruneSnapshotsOperator(task_id="prune", plan=plan.name, cluster_config=str(cluster.path),
                                       trigger_rule="all_done")
        verdict = EmptyOperator(task_id="all_snapshots_good", trigger_rule="none_failed")
        notify = notify_callbacks(plan.name, failure=SNAPSHOT_FAILED)  # a BAD or failed snapshot
        for instance in plan.instances:
            choose = ChooseSnapshotHostOperator(task_id=f"choose_host_{instance}", plan=plan.name, instance=instance,
                                                selected_instance=INSTANCE_TEMPLATE,
                                                cluster_config=str(cluster.path))
            for node in plan.nodes:
                choose >> TakeSnapshotOperator(task_id=snapshot_task_id(instance, node), plan=plan.name, instance=instance,
                                               cluster_config=str(cluster.path),
                                               **node_task_args(cluster, node), **notify) >> [prune, verdict]
    globals()[dag.dag_id] = dag
