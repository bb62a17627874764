"""The operator actions of the ``tandem_ops`` DAG: one list for its Param, its operator and the supervisor."""

FAILOVER_NOW, DRAIN_NODE, RESTART_NODE, SNAPSHOT_NOW = "failover_now", "drain_node", "restart_node", "snapshot_now"
CUTOVER = "cutover"
UPGRADE, FINISH_UPGRADE, ROLLBACK = "upgrade", "finish_upgrade", "rollback"
SUPERVISOR_ACTIONS = (FAILOVER_NOW, DRAIN_NODE, RESTART_NODE)
"""Carried out by :func:`tandem.supervisor.reconcile.run_ops_action`."""
UPGRADE_ACTIONS = (UPGRADE, FINISH_UPGRADE, ROLLBACK)
"""Carried out by :mod:`tandem.supervisor.upgrade`."""
OPS_ACTIONS = (*SUPERVISOR_ACTIONS, SNAPSHOT_NOW, CUTOVER, *UPGRADE_ACTIONS)
"""Every action the ``tandem_ops`` DAG offers (``snapshot_now``: :mod:`tandem.snapshots.take`; ``cutover``:
:mod:`tandem.cutover`)."""
