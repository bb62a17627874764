"""Supervision of plan instances: launching jobs on nodes, health, role decisions, re-sync, failover.

Decisions (``decide_launch``, :func:`~tandem.supervisor.health.evaluate`,
:func:`~tandem.supervisor.decisions.decide`) are pure functions; the modules around them observe
the world (PostgreSQL rows, local processes, landing files: ``observe``) and act
(``spark-submit``, signals, checkpoint cuts: ``launcher``, ``resync``, ``reconcile``).
"""

from tandem.supervisor.launcher import (
    LaunchDecision,
    LaunchedJob,
    LaunchError,
    LaunchRejected,
    StopResult,
    build_submit_command,
    decide_launch,
    instance_key,
    launch_instance,
    stop_instance,
    wait_until_running,
)
from tandem.supervisor.resync import CheckpointError, CutInfo, cut_checkpoint, resync_instance

__all__ = ["CheckpointError", "CutInfo", "LaunchDecision", "LaunchError", "LaunchRejected", "LaunchedJob", "StopResult",
           "build_submit_command", "cut_checkpoint", "decide_launch", "instance_key", "launch_instance",
           "resync_instance", "stop_instance", "wait_until_running"]
