"""Whether a plan instance's job is still there to reuse, or a new one must be launched (pure).

:func:`decide_launch` weighs what :func:`~tandem.supervisor.launcher.launch_instance` observed: the
instance row's status, whether its processes are alive on this host
(:func:`~tandem.supervisor.processes.instance_process_alive`) and the age of its liveness beat. The
statuses here say which rows name a job that may still run and which a job that ended.
"""

from __future__ import annotations

from dataclasses import dataclass

ACTIVE_STATUSES = ("LAUNCHING", "STARTING", "RUNNING")
ENDED_STATUSES = ("STOPPED", "FAILED", "BLOCKED")
DIED = "DEAD: killed or crashed"
"""How the error a stop records begins when it found the run's processes gone while its row said it ran: the run
died (``kill -9``, a crash, an OOM kill) without a clean stop; the stop recorded STOPPED in its place
(:func:`tandem.supervisor.stopping.stop_instance`)."""
KILLED = "killed with SIGKILL"
"""How the error a stop records begins when it had to kill the run (still alive after SIGTERM)."""


@dataclass(frozen=True)
class LaunchDecision:
    """What :func:`decide_launch` chose: ``reuse`` the existing job or ``launch`` a new one, and why."""

    action: str  # reuse | launch
    reason: str

    @property
    def reuse(self) -> bool:
        return self.action == "reuse"


def previous_run(status: str, error: str | None) -> str:
    """How the previous run ended, in the words of a launch's reason (pure): ``status`` and ``error`` are what its
    instance row recorded. A run a stop found dead, or had to kill, is said to be so, not merely STOPPED."""
    cause = " ".join((error or "").split()).removeprefix("stop_instance: ")
    if status == "STOPPED" and cause.startswith(DIED):
        return f"previous run was DEAD ({cause.removeprefix('DEAD: ')}; no clean stop)"
    if status == "STOPPED" and cause.startswith(KILLED):
        return f"previous run was {cause} (no clean stop)"
    if not cause:
        return f"previous run ended ({status})"
    return f"previous run ended ({status}: {cause[:200]}{'...' if len(cause) > 200 else ''})"


def decide_launch(status: str | None, process_alive: bool, beat_age_s: float | None,
                  heartbeat_timeout_s: float, *, recorded_here: bool, error: str | None = None) -> LaunchDecision:
    """Reuse the recorded job when it is still alive, otherwise launch (pure).

    Args:
        status: the instance row's status, ``None`` when the instance was never recorded.
        process_alive: whether the recorded ``spark-submit`` or driver process is still alive on this
            host (same PID, same start time, a command line that runs this instance).
        beat_age_s: seconds since the driver's last liveness beat, ``None`` when it never beat.
        heartbeat_timeout_s: the plan's heartbeat timeout (interval × max missed beats).
        recorded_here: the job was recorded on this host, so ``process_alive`` is the whole truth; a
            recent beat then only means the job died a moment ago (e.g. ``kill -9``), not that it lives.
        error: the error (or how it stopped) the row recorded, which says how an ended run ended.
    """
    if status is None:
        return LaunchDecision("launch", "no instance recorded yet")
    if status not in ACTIVE_STATUSES:
        return LaunchDecision("launch", previous_run(status, error))
    if process_alive:
        return LaunchDecision("reuse", f"{status} and its process is alive")
    beat = "it never beat" if beat_age_s is None else f"its last beat is {beat_age_s:.1f}s old"
    if recorded_here:
        return LaunchDecision("launch", f"{status} but its process is gone from this host ({beat})")
    if beat_age_s is not None and beat_age_s < heartbeat_timeout_s:
        return LaunchDecision(
            "reuse", f"{status} and its liveness beat is {beat_age_s:.1f}s old (< {heartbeat_timeout_s:g}s timeout)")
    return LaunchDecision("launch", f"{status} but its process is gone and {beat} (>= {heartbeat_timeout_s:g}s)")

