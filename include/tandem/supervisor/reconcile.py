"""Act on the decisions: the supervisor's reconcile loop and the operator's actions.

Purpose
    Bring a (plan, instance) to "one live ACTIVE, its standbys in their roles" after a failure, and
    carry out the operator's failover / drain / restart, with every decision written to
    ``tandem.failover_events`` and to the caller's log.

How it works
    :meth:`Supervisor.reconcile` repeats observe (:mod:`~tandem.supervisor.observe`) → decide
    (:func:`~tandem.supervisor.decisions.decide`) → act until the decision is empty, blocked, or
    an action failed. Each decision is recorded before it is carried out (its kind, the node,
    the reason), so the events tell what the supervisor meant to do even if it died meanwhile.
    Acting goes through the launcher (idempotent detached ``spark-submit``, ``stop_instance``)
    and :func:`~tandem.resync.resync_instance`; a launch waits until the instance
    reports RUNNING, so the next round sees the world it made. One PostgreSQL advisory lock per
    (plan, instance) serialises the supervision DAG and the ops DAG.

What it does not do
    It does not promote a hot standby (its role controller does); it only waits for it, and
    restarts it as ACTIVE when it did not take an expired lease in time. Stopping and
    re-syncing use local PIDs and paths: the supervisor runs where the nodes' processes and the
    checkpoint storage are visible.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import ConfigError, LockLost, TandemError
from tandem.names import ACTIVE, BACKUP
from tandem.ops import DRAIN_NODE, FAILOVER_NOW, SUPERVISOR_ACTIONS
from tandem.store.db import Database
from tandem.store.leases import read_lease
from tandem.store.locks import AdvisoryLock
from tandem.store.migrations import migrate
from tandem.store.registry import InstanceKey, block, clear_failures, register_nodes
from tandem.store.supervision import DRAINED, RESTARTED, UNDRAINED, hand_over, instance_role, mark
from tandem.supervisor.decisions import (
    Block,
    HOT,
    AwaitPromotion,
    Blocked,
    HandOver,
    Launch,
    Stop,
    decide,
    takeover_deadline_s,
)
from tandem.checkpoints import CheckpointError
from tandem.supervisor.launcher import LaunchError, wait_until_running
from tandem.supervisor.node_actions import NodeHost, ThisHost
from tandem.supervisor.observe import InstanceObservation, observe_instance



class OpsRefused(TandemError):
    """An operator's action cannot be carried out as asked (no live ACTIVE, no standby, unknown node)."""


@dataclass(frozen=True)
class StepResult:
    """One action carried out: whether it did what it should, and what happened."""

    action: Any
    ok: bool
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        return f"{'ok ' if self.ok else 'FAILED '}{self.action.describe()} -> {self.detail}"


@dataclass
class Report:
    """What one reconcile (or operator action) did for one (plan, instance)."""

    plan: str
    instance: str
    steps: list[StepResult] = field(default_factory=list)
    blocked: list[Blocked] = field(default_factory=list)
    converged: bool = False
    rounds: int = 0

    @property
    def failed(self) -> list[StepResult]:
        return [s for s in self.steps if not s.ok and not isinstance(s.action, AwaitPromotion)]

    def lines(self) -> list[str]:
        head = (f"{self.plan}/{self.instance}: {len(self.steps)} action(s) in {self.rounds} round(s), "
                f"{'converged' if self.converged else 'NOT converged'}")
        return [head, *("  " + s.line() for s in self.steps), *("  " + b.describe() for b in self.blocked)]


def instance_lock(database_url: str, plan: str, instance: str) -> AdvisoryLock:
    """The advisory lock that serialises supervision of one (plan, instance): reconcile, ops actions, restore.

    Whoever holds it calls ``check()`` before each action: the lock dies with its PostgreSQL session.
    """
    return AdvisoryLock(database_url, "supervise", f"{plan}/{instance}")


class Supervisor:
    """Observe → decide → act for the instances of one plan.

    Args:
        launched_by: recorded on instances launched here (the default ``node_host``).
        log: where decisions and outcomes are written (an Airflow task's logger, or this module's).
        py_files: the ``tandem`` package for ``spark-submit`` of the default ``node_host`` (default
            ``<project>/dist/tandem.zip``).
        running_timeout_s: how long a launch may take to reach RUNNING.
        node_host: carries out launches (with their re-sync) and stops on each node's own host; by
            default :class:`~tandem.supervisor.node_actions.ThisHost`, inside Airflow the nodes'
            queues (:class:`~tandem.airflow.node_launch.NodeQueue`).
    """

    def __init__(self, cluster: ClusterConfig, plan: PlanConfig, *, launched_by: str = "tandem supervisor",
                 log: logging.Logger | logging.LoggerAdapter | None = None, py_files: Path | None = None,
                 running_timeout_s: float = 300.0, poll_s: float = 0.5,
                 node_host: NodeHost | None = None) -> None:
        self.log = log or logging.getLogger(__name__)
        self.node_host = node_host or ThisHost(cluster, plan, launched_by, py_files, self.log)
        self.cluster = cluster
        self.plan = plan
        self.running_timeout_s = running_timeout_s
        self.poll_s = poll_s
        self.db = Database(cluster.database_url, "tandem-supervisor")
        self._lock: AdvisoryLock | None = None
        migrate(self.db)
        register_nodes(self.db, cluster)

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- observe / decide --------------------------------------------------------------------

    def observe(self, instance: str) -> InstanceObservation:
        return observe_instance(self.db, self.cluster, self.plan, instance)

    @contextmanager
    def holding_lock(self, instance: str) -> Iterator[AdvisoryLock]:
        """Hold the instance's supervision lock; :meth:`execute` checks it before every action."""
        with instance_lock(self.cluster.database_url, self.plan.name, instance) as lock:
            self._lock = lock
            try:
                yield lock
            finally:
                self._lock = None

    def reconcile(self, instance: str, *, cause: str = "", max_rounds: int = 8) -> Report:
        """Act until the instance needs nothing more (or is blocked, or an action failed)."""
        with self.holding_lock(instance):
            return self._reconcile(instance, cause, max_rounds)

    def _reconcile(self, instance: str, cause: str, max_rounds: int, report: Report | None = None) -> Report:
        report = report or Report(self.plan.name, instance)
        seen_blocked: set[str] = set()
        for _ in range(max_rounds):
            report.rounds += 1
            observation = self.observe(instance)
            actions = decide(observation.view)
            for health in observation.view.instances.values():
                self.log.info("%s/%s %s: %s (%s)", self.plan.name, instance, health.node, health.state, health.evidence)
            for blocked in (a for a in actions if isinstance(a, Blocked)):
                if blocked.describe() not in seen_blocked:
                    seen_blocked.add(blocked.describe())
                    report.blocked.append(blocked)
                    self._record(instance, blocked, cause)
            todo = [a for a in actions if not isinstance(a, Blocked)]
            if not todo:
                report.converged = not report.blocked
                return report
            for action in todo:
                result = self.execute(instance, action, cause=cause)
                report.steps.append(result)
                if not result.ok and not isinstance(action, AwaitPromotion):
                    return report
        return report

    # -- act ---------------------------------------------------------------------------------

    def execute(self, instance: str, action: Any, *, cause: str = "") -> StepResult:
        """Carry out one action; record the decision first, then log the outcome (and record a failure).

        Raises:
            LockLost: the instance's supervision lock is gone (another supervisor may act now): nothing was done.
        """
        self._check_lock(instance, action)
        self._record(instance, action, cause)
        self.log.info("%s/%s decision: %s", self.plan.name, instance, action.describe())
        try:
            if isinstance(action, Stop):
                result = self._stop(instance, action)
            elif isinstance(action, Launch):
                result = self._launch(instance, action)
            elif isinstance(action, HandOver):
                result = self._hand_over(instance, action)
            elif isinstance(action, AwaitPromotion):
                result = self._await(instance, action)
            elif isinstance(action, Block):
                result = self._block(instance, action)
            else:
                raise TypeError(f"unknown action {action!r}")
        except (LaunchError, CheckpointError, TandemError) as exc:
            result = StepResult(action, False, f"{type(exc).__name__}: {exc}")
        log = self.log.info if result.ok else self.log.warning
        log("%s/%s %s", self.plan.name, instance, result.line())
        if not result.ok:
            mark(self.db, self.plan.name, instance, "ACTION_FAILED", result.detail[:2000], node=action.node,
                 detail={"decision": action.describe(), **result.data})
        return result

    def _check_lock(self, instance: str, action: Any) -> None:
        if self._lock is None:
            return
        try:
            self._lock.check()
        except LockLost as exc:
            self.log.error("%s/%s: %s; not carrying out: %s", self.plan.name, instance, exc, action.describe())
            try:
                mark(self.db, self.plan.name, instance, "LOCK_LOST", f"{exc}; stopped before: {action.describe()}",
                     node=action.node)
            except TandemError:  # PostgreSQL itself may be gone: the log line above is the record
                pass
            raise

    def _record(self, instance: str, action: Any, cause: str) -> None:
        detail = {"decision": action.describe()}
        if cause:
            detail["cause"] = cause
        if isinstance(action, Launch):
            detail.update(role=action.role, resync_from=action.resync_from)
        mark(self.db, self.plan.name, instance, action.kind, action.reason, node=action.node, detail=detail)

    def _stop(self, instance: str, action: Stop) -> StepResult:
        stopped = self.node_host.stop(instance, action.node, action.timeout_s)
        return StepResult(action, True, f"{stopped.detail} ({stopped.status})",
                          {"status": stopped.status, "graceful": stopped.graceful})

    def _launch(self, instance: str, action: Launch) -> StepResult:
        launched = self.node_host.launch(instance, action.node, action.role, action.resync_from)
        data: dict[str, Any] = {"role": action.role, **launched.data()}
        row = wait_until_running(self.cluster, self.plan, instance, action.node, timeout_s=self.running_timeout_s)
        data.update(pid=row["pid"], spark_app_id=row["spark_app_id"])
        return StepResult(action, True, f"RUNNING as {action.role}: pid {row['pid']}, log {row['log_path']}", data)

    def _block(self, instance: str, action: Block) -> StepResult:
        key = InstanceKey(self.plan.name, instance, action.node)
        if not block(self.db, key, action.reason[:2000]):
            return StepResult(action, False, f"{key.id} is no longer FAILED: left as it is")
        return StepResult(action, True, f"{key.id} is BLOCKED")

    def _hand_over(self, instance: str, action: HandOver) -> StepResult:
        epoch = hand_over(self.db, self.plan.name, instance, action.from_node, action.epoch, action.to_node,
                          action.reason)
        if epoch is None:
            return StepResult(action, False, f"{action.from_node} no longer holds the lease at epoch {action.epoch}")
        return StepResult(action, True, f"lease names {action.to_node} at epoch {epoch}", {"epoch": epoch})

    def _await(self, instance: str, action: AwaitPromotion) -> StepResult:
        start = time.monotonic()
        while True:
            lease = read_lease(self.db, self.plan.name, instance)
            if lease and lease.holder and lease.expired_for_s < 0 and (
                    lease.holder != action.previous_holder or lease.epoch > action.previous_epoch):
                row = instance_role(self.db, self.plan.name, instance, lease.holder)
                if row and row["role"] == ACTIVE and int(row["epoch"]) == lease.epoch:
                    waited = time.monotonic() - start
                    return StepResult(action, True, f"{lease.holder} is ACTIVE at epoch {lease.epoch} "
                                                    f"after {waited:.1f}s", {"holder": lease.holder,
                                                                             "epoch": lease.epoch})
            if time.monotonic() - start > action.timeout_s:
                holder = f"{lease.holder} at epoch {lease.epoch}" if lease else "nobody"
                return StepResult(action, False, f"no standby took over within {action.timeout_s:g}s "
                                                 f"(lease: {holder})")
            time.sleep(self.poll_s)

    # -- operator actions --------------------------------------------------------------------

    def fail_over_now(self, instance: str, to_node: str | None = None, reason: str = "operator: failover now") -> Report:
        """Move the ACTIVE role off its node now: hand it to a live hot standby (``to_node`` preferred),
        or (warm) stop it and start the plan on another node from a cut of its checkpoint."""
        with self.holding_lock(instance):
            report = Report(self.plan.name, instance)
            view = self.observe(instance).view
            active = view.active
            if active is None:
                raise OpsRefused(f"{self.plan.name}/{instance} has no live ACTIVE instance to fail over from")
            mark(self.db, self.plan.name, instance, "FAILOVER_NOW", reason, node=active)
            epoch = view.lease.epoch
            takers = [n for n in view.candidates if n != active and view.alive(n)]
            if view.standby == HOT:
                if not takers:
                    raise OpsRefused(f"{self.plan.name}/{instance}: no live standby to fail over to")
                takers.sort(key=lambda n: (n != to_node, view.health(n).role == BACKUP))
                for action in (HandOver(active, takers[0], epoch, reason),
                               AwaitPromotion(active, epoch, takeover_deadline_s(view.lease_ttl_s), reason)):
                    result = self.execute(instance, action, cause=reason)
                    report.steps.append(result)
                    if not result.ok:
                        return report
                report.rounds = 1
                return self._reconcile(instance, reason, 8, report)
            if not [n for n in view.candidates if n != active]:
                raise OpsRefused(f"{self.plan.name}/{instance}: no other node to fail over to")
            report.steps.append(self.execute(instance, Stop(active, reason), cause=reason))
            return self._reconcile(instance, reason, 8, report)

    def drain(self, instance: str, node: str, reason: str = "operator: drain node") -> Report:
        """Keep ``node`` out of the instance: hand its ACTIVE role to another node, then stop its instance."""
        self._check_node(node)
        with self.holding_lock(instance):
            mark(self.db, self.plan.name, instance, DRAINED, reason, node=node)
            return self._reconcile(instance, reason, 8)

    def restart(self, instance: str, node: str, reason: str = "operator: restart node") -> Report:
        """Stop ``node``'s instance (failing over first if it is ACTIVE) and bring it back as a standby, re-synced."""
        self._check_node(node)
        with self.holding_lock(instance):
            report = Report(self.plan.name, instance)
            view = self.observe(instance).view
            if node in view.drained:
                mark(self.db, self.plan.name, instance, UNDRAINED, reason, node=node)
            mark(self.db, self.plan.name, instance, RESTARTED, reason, node=node)
            clear_failures(self.db, InstanceKey(self.plan.name, instance, node))
            takers = [n for n in view.candidates if n != node and view.alive(n)]
            if view.active == node and view.standby == HOT and takers:
                takers.sort(key=lambda n: 0 if view.health(n).role != BACKUP else 1)
                for action in (HandOver(node, takers[0], view.lease.epoch, reason),
                               AwaitPromotion(node, view.lease.epoch, takeover_deadline_s(view.lease_ttl_s), reason)):
                    result = self.execute(instance, action, cause=reason)
                    report.steps.append(result)
                    if not result.ok:
                        return report
            report.steps.append(self.execute(instance, Stop(node, reason), cause=reason))
            return self._reconcile(instance, reason, 8, report)

    def _check_node(self, node: str) -> None:
        try:
            self.plan.check_node(node)
        except ConfigError as exc:
            raise OpsRefused(str(exc)) from None


def run_ops_action(cluster: ClusterConfig, plan: PlanConfig, action: str, node: str | None, instances: list[str], *,
                   launched_by: str, log: logging.Logger | logging.LoggerAdapter | None = None,
                   py_files: Path | None = None,
                   node_host: NodeHost | None = None) -> list[Report]:
    """Carry out one operator action on the given instances of a plan; one report per instance."""
    if action not in SUPERVISOR_ACTIONS:
        raise OpsRefused(f"unknown action {action!r} (expected one of {', '.join(SUPERVISOR_ACTIONS)})")
    if action != FAILOVER_NOW and not node:
        raise OpsRefused(f"{action} needs a node")
    try:
        for instance in instances:
            plan.check_instance(instance)
        if node:
            plan.check_node(node)
    except ConfigError as exc:
        raise OpsRefused(str(exc)) from None
    reports = []
    with Supervisor(cluster, plan, launched_by=launched_by, log=log, py_files=py_files,
                    node_host=node_host) as supervisor:
        for instance in instances:
            if action == FAILOVER_NOW:
                reports.append(supervisor.fail_over_now(instance, to_node=node))
            elif action == DRAIN_NODE:
                reports.append(supervisor.drain(instance, node))
            else:
                reports.append(supervisor.restart(instance, node))
    return reports
