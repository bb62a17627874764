"""Health of one plan instance from what was observed about it (pure: no I/O, no clock).

An observation is a handful of numbers the observer read from PostgreSQL and the landing
directory at one moment; :func:`evaluate` turns it into one of:

======== ==================================================================================
HEALTHY  running: liveness beat fresh, and no input waiting longer than the stall timeout (a WARM
         standby runs no query: its fresh beat is enough)
STARTING launched or starting, still within the launch timeout
DEAD     no liveness beat within the heartbeat timeout (killed, frozen, host lost)
FAILED   the instance ended with an error (a query stopped with an exception)
BLOCKED  it failed the same way at the same batch :data:`REPEATS_TO_BLOCK` runs in a row (a
         deterministic failure, not a crash): relaunching it would fail again; an operator must look
STALLED  beating, but neither a micro-batch nor any Spark work (a task completing) for ``stall_timeout``
         (before a run's first micro-batch: ``launch_timeout``) while unprocessed input waits
STOPPED  ended cleanly (stopped by an operator or a supervisor)
MISSING  never launched on this node
======== ==================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem.errors import cause_of
from tandem.names import WARM

HEALTHY = "HEALTHY"
STARTING = "STARTING"
DEAD = "DEAD"
FAILED = "FAILED"
BLOCKED = "BLOCKED"
STALLED = "STALLED"
STOPPED = "STOPPED"
MISSING = "MISSING"

REPEATS_TO_BLOCK = 2
"""Runs in a row that end with the same failure (the same batch, the same error) before an instance is BLOCKED."""

ALIVE = frozenset({HEALTHY, STARTING})
"""States of an instance whose process is taken to be running and doing its job."""
FAILING = frozenset({DEAD, FAILED, STALLED})
"""States the supervision sensor fires on."""


@dataclass(frozen=True)
class Thresholds:
    """When a silent instance counts as dead, a launched one as lost, a slow one as stalled."""

    heartbeat_timeout_s: float
    stall_timeout_s: float
    launch_timeout_s: float


@dataclass(frozen=True)
class NodeObservation:
    """What the observer saw of an instance on one node (ages in seconds at the moment of observation).

    Attributes:
        node: the node the instance runs on.
        status: ``plan_instances.status`` (``None`` when the instance was never recorded).
        role: the role the instance last recorded (ACTIVE / PASSIVE / BACKUP / WARM).
        epoch: the fencing epoch it last recorded (0 while a standby).
        error: the recorded error of a FAILED or killed instance.
        failure: the recorded failure of its last FAILED run (query, batch, error's first line).
        failure_repeats: runs in a row that ended with that same failure.
        beat_age_s: since its last liveness beat (``None``: never beat).
        launched_age_s: since a launcher started ``spark-submit`` for it (``None``: never).
        started_age_s: since the driver announced itself (STARTING) in its current run.
        last_batch_age_s: since the start of the latest micro-batch of its current run, taking
            for each query its latest batch and the oldest of those (``None``: no batch recently).
        waiting_input_age_s: age of the oldest input file that arrived after that batch started
            (``None``: nothing waits).
        work_age_s: since the driver last saw its Spark work advance (a stage started, a task completed)
            in its current run (``None``: not yet, or a driver that does not say).
    """

    node: str
    status: str | None
    role: str | None = None
    epoch: int = 0
    error: str | None = None
    failure: str | None = None
    failure_repeats: int = 0
    beat_age_s: float | None = None
    launched_age_s: float | None = None
    started_age_s: float | None = None
    last_batch_age_s: float | None = None
    waiting_input_age_s: float | None = None
    work_age_s: float | None = None


@dataclass(frozen=True)
class InstanceHealth:
    """The verdict on one instance and the evidence for it, in words an operator can act on."""

    node: str
    state: str
    evidence: str
    role: str | None = None
    epoch: int = 0
    status: str | None = None

    @property
    def alive(self) -> bool:
        return self.state in ALIVE

    @property
    def failing(self) -> bool:
        return self.state in FAILING


def _age(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.1f}s ago"


def evaluate(obs: NodeObservation, limits: Thresholds) -> InstanceHealth:
    """Decide the health of one instance from one observation (pure)."""

    def verdict(state: str, evidence: str) -> InstanceHealth:
        return InstanceHealth(obs.node, state, evidence, obs.role, obs.epoch, obs.status)

    if obs.status is None:
        return verdict(MISSING, "never launched on this node")
    error = cause_of(obs.error)  # the line that says why, not the top of a traceback
    if obs.status == "BLOCKED" or (obs.status == "FAILED" and obs.failure_repeats >= REPEATS_TO_BLOCK):
        return verdict(BLOCKED, f"failed {obs.failure_repeats} runs in a row at the same batch: "
                                f"{obs.failure or error or 'no error recorded'}")
    if obs.status == "FAILED":
        return verdict(FAILED, f"ended with an error: {error or 'no error recorded'}")
    if obs.status == "STOPPED":
        return verdict(STOPPED, f"stopped{': ' + error if error else ''}")

    beat_fresh = obs.beat_age_s is not None and obs.beat_age_s < limits.heartbeat_timeout_s
    if obs.status == "LAUNCHING":
        # A liveness row may survive from the previous run: only a beat after the launch counts.
        beat_since_launch = beat_fresh and (obs.launched_age_s is None or obs.beat_age_s <= obs.launched_age_s)
        if beat_since_launch or (obs.launched_age_s is not None and obs.launched_age_s < limits.launch_timeout_s):
            return verdict(STARTING, f"launched {_age(obs.launched_age_s)}, waiting for the driver")
        return verdict(DEAD, f"launched {_age(obs.launched_age_s)} but no liveness beat since "
                             f"(launch timeout {limits.launch_timeout_s:g}s)")
    if not beat_fresh:
        return verdict(DEAD, f"{obs.status}, last liveness beat {_age(obs.beat_age_s)} "
                             f"(heartbeat timeout {limits.heartbeat_timeout_s:g}s)")
    if obs.status == "STARTING":
        return verdict(STARTING, f"starting its queries, liveness beat {_age(obs.beat_age_s)}")
    if obs.role == WARM:
        return verdict(HEALTHY, f"WARM standby (session built, queries start when it takes over), liveness beat "
                                f"{_age(obs.beat_age_s)}")

    waiting = obs.waiting_input_age_s
    quiet_for = obs.last_batch_age_s if obs.last_batch_age_s is not None else obs.started_age_s
    if quiet_for is not None and obs.work_age_s is not None:
        quiet_for = min(quiet_for, obs.work_age_s)  # a long micro-batch whose tasks complete is slow, not stuck
    # A run's first micro-batch is still starting (state loaded, Python workers started, the input that waited
    # during a failover caught up): judged by the launch timeout, or a loaded machine fails each new ACTIVE over in
    # turn as STALLED, every relaunch adding a JVM start to the load (the soak's flapping loop).
    first = obs.last_batch_age_s is None
    limit, named = ((max(limits.stall_timeout_s, limits.launch_timeout_s), "launch timeout, before its first "
                     "micro-batch") if first else (limits.stall_timeout_s, "stall timeout"))
    if waiting is not None and waiting >= limit and (quiet_for is None or quiet_for >= limit):
        last = ("no micro-batch since it started " + _age(obs.started_age_s) if first
                else f"last micro-batch started {_age(obs.last_batch_age_s)}")
        work = "" if obs.work_age_s is None else f", Spark work last advanced {_age(obs.work_age_s)}"
        return verdict(STALLED, f"input has waited {waiting:.1f}s and {last}{work} "
                                f"({named} {limit:g}s); liveness beat {_age(obs.beat_age_s)}")
    backlog = "" if waiting is None else f", input waiting {waiting:.1f}s"
    if waiting is not None and obs.work_age_s is not None and (obs.last_batch_age_s or 0.0) >= limits.stall_timeout_s:
        backlog += f", in a long micro-batch (Spark work advanced {_age(obs.work_age_s)})"
    return verdict(HEALTHY, f"liveness beat {_age(obs.beat_age_s)}{backlog}")
