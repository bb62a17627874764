"""Supervision of plan instances: launching jobs on nodes, health, role decisions, re-sync, failover.

Decisions (``decide_launch``, :func:`~tandem.supervisor.health.evaluate`,
:func:`~tandem.supervisor.decisions.decide`) are pure functions; the modules around them observe
the world (PostgreSQL rows, local processes, landing files: ``observe``) and act
(``spark-submit``, signals: ``launcher``, ``stopping``, ``reconcile``); checkpoint cuts are
:mod:`tandem.resync`'s, which a warm standby's driver uses too.
"""

from tandem.supervisor.launch_decision import LaunchDecision, decide_launch
from tandem.supervisor.launcher import (
    LaunchedJob,
    LaunchError,
    LaunchRejected,
    instance_key,
    launch_instance,
    wait_until_running,
)
from tandem.supervisor.stopping import StopResult, stop_instance
from tandem.supervisor.submit_command import build_submit_command
from tandem.checkpoints import CheckpointError, CutInfo, cut_checkpoint

__all__ = ["CheckpointError", "CutInfo", "LaunchDecision", "LaunchError", "LaunchRejected", "LaunchedJob", "StopResult",
           "build_submit_command", "cut_checkpoint", "decide_launch", "instance_key", "launch_instance",
           "stop_instance", "wait_until_running"]
