"""What the supervisor should do next for one (plan, instance), from what it observed (pure).

Purpose
    The supervision DAG, the ops DAG and ``tandem status`` all ask the same question: given the
    plan's nodes, its standby mode, the health of each instance and the lease, which actions bring
    the instance to "one ACTIVE, one PASSIVE, the rest BACKUP, all alive"? :func:`decide` answers it
    without touching the world, so every rule has a unit test with hand-written observations.

How it works
    Like the Flink Kubernetes operator's reconciler, :func:`decide` is called again after the
    actions of one round have run, with a fresh observation, until it returns nothing to do. One
    round does what is safe now and leaves the rest to the next round:

    1. DEAD and STALLED instances are stopped (a frozen or stuck process must not hold the lease or
       write to its checkpoint). A drained node hands its ACTIVE role over and is stopped.
       An instance that failed the same way at the same batch again is BLOCKED: recorded once, then
       never relaunched until an operator restarts its node (relaunching it would fail again).
    2. No live ACTIVE: with a live standby (hot, or warm), wait for it to take the expired lease by
       itself (failover never waits for Airflow); if it does not within two lease periods, restart
       it as ACTIVE (a warm one from a cut of the last holder's checkpoint). When nobody runs,
       start the plan as ACTIVE: warm and cold mode on the next node after the failed active, from
       a cut of the failed active's checkpoint; hot mode on the last holder's node (its own
       checkpoint is the newest) or, when that node is drained, elsewhere from a cut of it.
    3. A live ACTIVE: hot mode launches every missing standby after re-syncing it from the active
       (the first one as PASSIVE when no live PASSIVE exists, the others as BACKUP) and moves a
       BACKUP up to PASSIVE when no PASSIVE is left. Warm mode keeps one WARM standby running (its
       session built, no query: it cuts the checkpoint when it takes over), on the first node after
       the active. Cold mode runs no standby.

    The initial roles follow the plan's node order: first ACTIVE, second PASSIVE, rest BACKUP.
    After a failover the roles stay where they are; the supervisor never moves a healthy ACTIVE.

What it does not do
    It does not observe or act (see :mod:`tandem.supervisor.reconcile`), and it does not promote
    a hot standby itself: the standby's role controller takes an expired lease on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tandem.names import ACTIVE, BACKUP, PASSIVE
from tandem.names import WARM as WARM_ROLE  # the role; WARM below is the plan's standby mode
from tandem.supervisor.health import BLOCKED, DEAD, STALLED, InstanceHealth

HOT, WARM, COLD = "hot", "warm", "cold"

MAX_LAUNCHES = 5
"""Default: launches of one node's instance within the launch window before the supervisor gives up on it."""
DEAD_STOP_TIMEOUT_S = 5.0
"""A dead instance's process (if any is left, e.g. frozen by SIGSTOP) gets SIGKILL after this."""
STALLED_STOP_TIMEOUT_S = 15.0
GRACEFUL_STOP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class LeaseView:
    """The ACTIVE lease of the instance as observed."""

    holder: str | None
    epoch: int
    valid: bool
    expired_for_s: float | None = None  # seconds since it expired; None while valid


@dataclass(frozen=True)
class InstanceView:
    """Everything :func:`decide` needs about one (plan, instance).

    ``instances`` has an entry for every node in ``nodes`` (MISSING when never launched).
    ``recent_launches`` counts the supervisor's launches per node in the plan's launch window
    (since the node was last restarted by an operator); at ``max_launches`` the node is given up.
    """

    plan: str
    instance: str
    nodes: tuple[str, ...]
    standby: str
    lease_ttl_s: float
    instances: Mapping[str, InstanceHealth]
    lease: LeaseView | None = None
    drained: frozenset[str] = frozenset()
    recent_launches: Mapping[str, int] = field(default_factory=dict)
    max_launches: int = MAX_LAUNCHES

    def health(self, node: str) -> InstanceHealth:
        return self.instances[node]

    def alive(self, node: str) -> bool:
        return node in self.instances and self.instances[node].alive

    @property
    def candidates(self) -> list[str]:
        """Nodes that may run the plan, in the plan's order (neither drained nor BLOCKED)."""
        return [n for n in self.nodes if n not in self.drained and self.instances[n].state != BLOCKED]

    @property
    def active(self) -> str | None:
        """The node of the live ACTIVE instance: holder of a valid lease whose instance is alive."""
        lease = self.lease
        if lease and lease.valid and lease.holder in self.nodes and self.alive(lease.holder):
            return lease.holder
        return None


@dataclass(frozen=True)
class Stop:
    """Stop the node's instance: SIGTERM (it releases the lease), SIGKILL after ``timeout_s``."""

    node: str
    reason: str
    timeout_s: float = GRACEFUL_STOP_TIMEOUT_S
    kind = "STOP"

    def describe(self) -> str:
        return f"stop {self.node}: {self.reason}"


@dataclass(frozen=True)
class Launch:
    """Launch the node's instance in ``role``; first copy a checkpoint cut of ``resync_from``'s instance."""

    node: str
    role: str
    reason: str
    resync_from: str | None = None
    kind = "LAUNCH"

    def describe(self) -> str:
        sync = f" after re-sync from {self.resync_from}" if self.resync_from else ""
        return f"launch {self.node} as {self.role}{sync}: {self.reason}"


@dataclass(frozen=True)
class HandOver:
    """Give the ACTIVE lease of ``from_node`` (at ``epoch``) to the live standby on ``to_node``."""

    from_node: str
    to_node: str
    epoch: int
    reason: str
    kind = "HANDOVER"

    @property
    def node(self) -> str:
        return self.to_node

    def describe(self) -> str:
        return f"hand the ACTIVE role from {self.from_node} (epoch {self.epoch}) to {self.to_node}: {self.reason}"


@dataclass(frozen=True)
class AwaitPromotion:
    """Wait (up to ``timeout_s``) for a standby to take the lease from ``previous_holder``."""

    previous_holder: str | None
    previous_epoch: int
    timeout_s: float
    reason: str
    kind = "AWAIT"

    @property
    def node(self) -> str | None:
        return self.previous_holder

    def describe(self) -> str:
        return f"wait up to {self.timeout_s:g}s for a standby to take over from {self.previous_holder}: {self.reason}"


@dataclass(frozen=True)
class Block:
    """Record the node's FAILED instance as BLOCKED: it failed the same way at the same batch again."""

    node: str
    reason: str
    kind = "BLOCK"

    def describe(self) -> str:
        return f"block {self.node} (no relaunch until an operator restarts it): {self.reason}"


@dataclass(frozen=True)
class Blocked:
    """Nothing safe can be done about ``node`` (or the instance); an operator must look."""

    node: str | None
    reason: str
    kind = "BLOCKED"

    def describe(self) -> str:
        return f"blocked{' on ' + self.node if self.node else ''}: {self.reason}"


Action = Stop | Launch | HandOver | AwaitPromotion | Block | Blocked


def takeover_deadline_s(lease_ttl_s: float) -> float:
    """How long past expiry a running standby may take to pick the lease up (a BACKUP waits one ttl)."""
    return 2 * lease_ttl_s + 10.0


def actionable(actions: list[Action]) -> bool:
    """Whether the actions change anything (waiting and being blocked do not)."""
    return any(isinstance(a, (Stop, Launch, HandOver, Block)) for a in actions)


def initial_role(position: int) -> str:
    """The role of the node at ``position`` in the plan's node order: ACTIVE, PASSIVE, then BACKUP."""
    return ACTIVE if position == 0 else PASSIVE if position == 1 else BACKUP


def _over_budget(view: InstanceView, node: str) -> bool:
    return view.recent_launches.get(node, 0) >= view.max_launches


def _budget_block(view: InstanceView, node: str) -> Blocked:
    return Blocked(node, f"{view.recent_launches.get(node, 0)} launches within the launch window "
                         f"(limit {view.max_launches}): restart the node from tandem_ops once the cause is fixed")


def standby_role(health: InstanceHealth) -> str:
    """The standby role of an instance that does not hold the lease (one launched as ACTIVE waits as PASSIVE)."""
    return health.role if health.role in (BACKUP, WARM_ROLE) else PASSIVE


def _standby_preference(view: InstanceView, exclude: str | None) -> list[str]:
    """Live standbys that may take the ACTIVE role: PASSIVE first, then BACKUP, in node order."""
    live = [n for n in view.candidates if n != exclude and view.alive(n)]
    return sorted(live, key=lambda n: 0 if standby_role(view.health(n)) == PASSIVE else 1)


def snapshot_node(view: InstanceView) -> str | None:
    """The node whose host takes the instance's snapshot, or ``None`` when no node holds the ACTIVE lease.

    The snapshot always cuts the ACTIVE instance's checkpoint (shared storage), whose Delta
    transactions pair the cut with the outputs; where it runs is a separate choice. A live standby's
    host, PASSIVE before BACKUP, keeps the snapshot's Spark session off the ACTIVE's CPUs (its host
    is up: its instance beats); the ACTIVE's own host when no standby lives.
    """
    lease = view.lease
    if lease is None or not lease.valid or lease.holder not in view.nodes:
        return None
    standbys = _standby_preference(view, exclude=lease.holder)
    return standbys[0] if standbys else lease.holder


def _after(nodes: list[str], source: str | None) -> list[str]:
    """``nodes`` rotated to start after ``source`` (the warm failover order), ``source`` last."""
    if source not in nodes:
        return nodes
    i = nodes.index(source)
    return nodes[i + 1:] + nodes[:i] + [source]


def decide(view: InstanceView) -> list[Action]:
    """The next actions for one (plan, instance); an empty list when everything is where it belongs."""
    actions: list[Action] = []
    for node in view.nodes:
        health = view.health(node)
        if health.state == DEAD:
            actions.append(Stop(node, f"DEAD: {health.evidence}", DEAD_STOP_TIMEOUT_S))
        elif health.state == STALLED:
            actions.append(Stop(node, f"STALLED: {health.evidence}", STALLED_STOP_TIMEOUT_S))
        elif health.state == BLOCKED and health.status != BLOCKED:
            actions.append(Block(node, health.evidence))
        elif health.state == BLOCKED:
            actions.append(Blocked(node, f"BLOCKED: {health.evidence}; restart the node from tandem_ops once "
                                         "the cause is fixed"))

    active = view.active
    if active is not None and active in view.drained:
        return actions + _drain_active(view, active)
    for node in view.nodes:
        if node in view.drained and node != active and view.alive(node):
            actions.append(Stop(node, "node drained"))
    if active is None:
        return actions + _start_active(view)
    if view.standby == COLD:
        return actions
    if view.standby == WARM:
        return actions + _warm_standby(view, active)
    return actions + _hot_standbys(view, active)


def _drain_active(view: InstanceView, active: str) -> list[Action]:
    epoch = view.lease.epoch if view.lease else 0
    takers = _standby_preference(view, exclude=active)
    if view.standby == HOT and takers:
        return [HandOver(active, takers[0], epoch, f"{active} is drained"),
                AwaitPromotion(active, epoch, takeover_deadline_s(view.lease_ttl_s), f"{active} is drained")]
    if not [n for n in view.candidates if not _over_budget(view, n)]:
        return [Blocked(active, f"cannot drain {active}: no other node may run plan {view.plan} "
                                f"instance {view.instance}")]
    # warm (or no live standby): stop it, which releases the lease; the next round starts the plan elsewhere
    return [Stop(active, f"{active} is drained: stopping it hands the ACTIVE role to another node")]


def _start_active(view: InstanceView) -> list[Action]:
    lease = view.lease
    standbys = _standby_preference(view, exclude=None)
    expired_for = lease.expired_for_s if lease else None
    overdue = expired_for is not None and expired_for > takeover_deadline_s(view.lease_ttl_s)
    if standbys and not overdue:
        holder = lease.holder if lease else None
        return [AwaitPromotion(holder, lease.epoch if lease else 0, takeover_deadline_s(view.lease_ttl_s),
                               f"no live ACTIVE; {', '.join(standbys)} will take the lease when it expires")]
    if standbys:  # a running standby that does not take an expired lease is broken: restart it as ACTIVE
        node = standbys[0]
        if _over_budget(view, node):
            return [_budget_block(view, node)]
        why = f"the lease expired {expired_for:.0f}s ago and standby {node} did not take it"
        holder = lease.holder if lease else None
        stale = view.health(node).role == WARM_ROLE and holder not in (None, node)  # a WARM standby ran no query
        return [Stop(node, why), Launch(node, ACTIVE, why, resync_from=holder if stale else None)]

    source = lease.holder if lease else None
    candidates = [n for n in view.candidates if not _over_budget(view, n)]
    if not candidates:
        blocked = [n for n in view.candidates if _over_budget(view, n)]
        if blocked:
            return [_budget_block(view, n) for n in blocked]
        if any(view.health(n).state == BLOCKED for n in view.nodes):
            return [Blocked(None, f"no node may run plan {view.plan} instance {view.instance}: each is BLOCKED or "
                                  "drained")]
        return [Blocked(None, f"every node of plan {view.plan} instance {view.instance} is drained")]
    if view.standby in (WARM, COLD):
        target = _after(candidates, source)[0]
        why = (f"warm failover: {source} is {view.health(source).state}" if source in view.instances
               and source != target else "no ACTIVE instance runs")
    else:
        target = source if source in candidates else candidates[0]
        why = "no node runs the instance"
    resync = source if source is not None and source != target and source in view.nodes else None
    return [Launch(target, ACTIVE, why, resync_from=resync)]


def _warm_standby(view: InstanceView, active: str) -> list[Action]:
    """Warm mode: one standby runs, WARM, on the first node after the active that may run it."""
    standbys = [n for n in _after(view.candidates, active) if n != active]
    if any(view.alive(n) for n in standbys):
        return []
    for node in standbys:
        if not _over_budget(view, node):
            health = view.health(node)
            return [Launch(node, WARM_ROLE, f"no warm standby runs ({node}: {health.state}: {health.evidence})")]
    return [_budget_block(view, standbys[0])] if standbys else []


def _hot_standbys(view: InstanceView, active: str) -> list[Action]:
    actions: list[Action] = []
    standbys = [n for n in view.candidates if n != active]
    has_passive = any(view.alive(n) and standby_role(view.health(n)) == PASSIVE for n in standbys)
    for node in standbys:
        if view.alive(node):
            continue
        if _over_budget(view, node):
            actions.append(_budget_block(view, node))
            continue
        role = BACKUP if has_passive else PASSIVE
        has_passive = True
        health = view.health(node)
        actions.append(Launch(node, role, f"{health.state}: {health.evidence}", resync_from=active))
    if not has_passive:
        backups = sorted((n for n in standbys if view.alive(n) and standby_role(view.health(n)) in (BACKUP, WARM_ROLE)),
                         key=lambda n: standby_role(view.health(n)) == WARM_ROLE)
        if backups:
            node = backups[0]
            warm = standby_role(view.health(node)) == WARM_ROLE  # left from warm mode: it ran no query
            why = f"no PASSIVE is left: move the {'WARM standby' if warm else 'BACKUP'} up"
            actions += [Stop(node, why), Launch(node, PASSIVE, why, resync_from=active if warm else None)]
    return actions
