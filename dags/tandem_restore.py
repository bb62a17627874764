"""``tandem_restore``: restore a plan's instances from a snapshot and start them, from the UI (Params)."""

from __future__ import annotations

from airflow.sdk import DAG

from tandem.airflow.dags import (RESTORE_DEFAULT_ARGS, RESTORE_DOC, load_all_for_dags, restore_params,
                                 with_broken_plans)
from tandem.airflow.snapshot_operators import RestoreSnapshotOperator
from tandem.names import RESTORE_DAG_ID

cluster, plans, broken = load_all_for_dags(__file__)  # broken plans: listed in the docs, not offered

with DAG(
    dag_id=RESTORE_DAG_ID,
    description="Restore a plan from a snapshot (checkpoint cut, Delta and PostgreSQL outputs) and start it",
    schedule=None,
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,  # on demand only (no schedule): a trigger from the Tandem page must run
    params=restore_params(cluster, plans),
    default_args=RESTORE_DEFAULT_ARGS,
    tags=["tandem", "ops", "snapshots"],
    doc_md=with_broken_plans(RESTORE_DOC, broken),
) as dag:
    RestoreSnapshotOperator(
        task_id="restore",
        plan="{{ params.plan }}",
        instance="{{ params.instance }}",
        snapshot_id="{{ params.snapshot_id }}",
        node="{{ params.node }}",
        force="{{ params.force }}",
        undo_backfills="{{ params.get('undo_backfills', False) }}",
        confirm="{{ params.confirm }}",
        cluster_config=str(cluster.path),
    )
