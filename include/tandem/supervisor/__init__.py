"""Supervision of plan instances: launching jobs on nodes, finding them again, stopping them.

Decisions (``decide_launch``) are pure functions; the functions around them observe the world
(PostgreSQL rows, local processes) and act (``spark-submit``, signals).
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

__all__ = ["LaunchDecision", "LaunchError", "LaunchRejected", "LaunchedJob", "StopResult", "build_submit_command",
           "decide_launch", "instance_key", "launch_instance", "stop_instance", "wait_until_running"]
