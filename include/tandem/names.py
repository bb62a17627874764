"""Names every layer shares, defined once: the roles of a node and the ids of Tandem's DAGs.

Pure constants and functions: no imports from the rest of the package, so anything may use them.
"""

from __future__ import annotations

ACTIVE, PASSIVE, BACKUP, WARM = "ACTIVE", "PASSIVE", "BACKUP", "WARM"
ROLES = (ACTIVE, PASSIVE, BACKUP, WARM)
"""A node's roles: the ACTIVE publishes; a PASSIVE (hot: its queries run) takes over first; a BACKUP only when no
PASSIVE can; a WARM standby has its Spark session built but no query running, and starts them from a cut of the
previous holder's checkpoint when it takes over."""
STANDBY_ROLES = (PASSIVE, BACKUP, WARM)

PLAN_DAG_PURPOSES = ("run", "supervise", "snapshot", "maintenance", "validate", "backfill", "reconcile")
"""Each plan has one DAG per purpose, ``tandem_<plan>_<purpose>``."""
OPS_DAG_ID = "tandem_ops"
RESTORE_DAG_ID = "tandem_restore"


def plan_dag_id(plan: str, purpose: str) -> str:
    """The id of ``plan``'s DAG for ``purpose`` (one of :data:`PLAN_DAG_PURPOSES`)."""
    if purpose not in PLAN_DAG_PURPOSES:
        raise ValueError(f"a plan has no {purpose!r} DAG; its DAGs are {', '.join(PLAN_DAG_PURPOSES)}")
    return f"tandem_{plan}_{purpose}"

RECONCILIATIONS = "reconciliations"
"""The Delta table ``delta/<plan>/reconciliations`` of a plan's reconcile runs (:mod:`tandem.batch.reconciliations`)."""
QUARANTINE = "quarantine"
"""The kind of a plan's quarantine output, its implicit name, and the name of the runtime's query that
fills it with the bad lines of every stream."""
QUARANTINE_QUERY = QUARANTINE


REPAIR_REQUESTED_BY = "reconcile {run_id}"
"""``requested_by`` of the backfill a reconcile job runs as its repair (``jobs/reconcile.py``); the reconcile DAG
finds the repair by it to emit its outputs' asset events (:class:`tandem.airflow.assets.RepairedOutputs`)."""
