"""A blue/green upgrade of a running plan's instances (issue 48 §2): the new version beside the old, verified,
then handed the ACTIVE role through the lease, without stopping.

Purpose
    Take a change of a plan's code (or a change its checkpoints carry: ``tandem plan diff``) while it runs,
    and check the new version against the old one's live output before it publishes anything.

How it works, per instance (:meth:`Upgrader.upgrade`)
    1. The upgrade is recorded (``plan_upgrades``, state VERIFYING) naming the *shadow*: a live hot standby.
    2. The shadow is restarted as the operator's ``restart_node`` does: re-synced from the ACTIVE's checkpoint
       and launched as PASSIVE, from the plan's files as they are now, so it runs the new version. It finds the
       upgrade naming it and compares each row it trims with the row the ACTIVE (the old version) published
       (:mod:`tandem.runtime.verification`); the counts go to ``upgrade_checks``.
    3. After ``verify_s`` with at least ``min_rows`` rows compared, once the shadow has caught up (no more than two
       micro-batches behind the ACTIVE: :func:`verdict`), when no row differs, or the operator confirms the
       differences of a change of semantics, the lease is handed to the shadow
       (``failover_now``'s hand-over: the old version's next renewal is refused, it holds its outputs from there;
       the shadow publishes what it held, then every batch). Nothing is published twice or lost: that is the
       hot failover's guarantee. State HANDED_OVER; the publishing pause is recorded.
    4. The old version runs on as a standby: :meth:`Upgrader.rollback` hands the ACTIVE role back to it,
       :meth:`Upgrader.finish` restarts every other node on the new version.

A warm plan (its WARM standby runs no query, so there is nothing to compare) is upgraded by restarting the WARM
standby on the new version and failing over to it; not verified, and with no rollback.

What it refuses
    A cold plan, an instance without a live ACTIVE and a live standby, a change the checkpoints cannot carry
    (:func:`tandem.plan_shape.check_unchanged`'s words: a group's parallelism or an aggregation's measures go
    through ``tandem plan cutover``), and an instance whose nodes all run the files' version already.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime

from tandem.config import PlanConfig
from tandem.errors import PlanChanged
from tandem.names import BACKUP
from tandem.plan_shape import check_unchanged
from tandem.plan_version import plan_version
from tandem.store import upgrades
from tandem.store.db import Database
from tandem.store.heartbeats import newest_watermarks
from tandem.store.publish_log import first_publish_after, last_publish_until
from tandem.store.registry import get_instance, instance_id
from tandem.store.upgrades import FAILED, FINISHED, HANDED_OVER, ROLLED_BACK, VERIFYING, OutputCheck, Upgrade
from tandem.supervisor.decisions import HOT, WARM, InstanceView
from tandem.supervisor.reconcile import OpsRefused, Report, Supervisor

WAIT, PASS, DIFFER = "wait", "pass", "differ"


@dataclass(frozen=True)
class Verdict:
    """Where a verification stands: ``wait`` (not enough compared yet), ``pass`` or ``differ``, and why."""

    outcome: str
    line: str


def verdict(checks: list[OutputCheck], elapsed_s: float, *, verify_s: float, min_rows: int, behind_s: float | None,
            max_behind_s: float) -> Verdict:
    """What the shadow's comparisons so far say (pure): ``differ`` at the first differing row; ``pass`` once
    ``verify_s`` passed with at least ``min_rows`` rows compared, none differing, and the shadow no more than
    ``max_behind_s`` behind the ACTIVE (``behind_s``: the largest gap of their queries' event-time watermarks;
    ``None``: not known yet), so that it has everything to publish from the next batch on; else ``wait``."""
    checked = sum(c.checked for c in checks)
    differing = sum(c.differing for c in checks)
    counts = ", ".join(c.line() for c in checks) or "nothing compared"
    unmatched = twice_published(checks)
    if unmatched:
        return Verdict(DIFFER, unmatched)
    if differing:
        return Verdict(DIFFER, f"{differing} of {checked} rows differ from the old version's ({counts})")
    behind = "how far behind not known yet" if behind_s is None else f"{max(behind_s, 0.0):.1f}s behind"
    if elapsed_s >= verify_s and checked >= min_rows and behind_s is not None and behind_s <= max_behind_s:
        return Verdict(PASS, f"{checked} rows equal to the old version's over {elapsed_s:.0f}s, {behind} ({counts})")
    return Verdict(WAIT, f"{checked} rows compared in {elapsed_s:.0f}s of {verify_s:g}s, none differ, {behind} "
                         f"({counts})")


def twice_published(checks: list[OutputCheck]) -> str | None:
    """Why handing the ACTIVE role to the version that compared ``checks`` would publish events a second time, or
    ``None`` (pure): it held rows the other version never published under their identities, though it published
    rows held later — the two versions identify rows differently (a key field computed another way), and what one
    published under its ids the other would publish again under its own. No confirmation takes it: declare a new
    output (or reset the plan) for such a change."""
    unmatched = [c for c in checks if c.unmatched]
    if not unmatched:
        return None
    samples = [s for c in unmatched for s in c.samples if "only in this version" in s][:2]
    return (f"{sum(c.unmatched for c in unmatched)} rows of {', '.join(c.output for c in unmatched)} only in this "
            f"version: the other version published rows held later, never these under their identities (it "
            f"identifies rows otherwise: a key or id field computed another way); handing over would publish their "
            f"events again under new ids{': e.g. ' + ' | '.join(samples) if samples else ''}")


def behind_by(active: dict[str, datetime], shadow: dict[str, datetime]) -> float | None:
    """How many seconds of event time the shadow's queries are behind the ACTIVE's, at most (pure; each a watermark
    per query): ``None`` while the shadow has not recorded one the ACTIVE has."""
    if any(query not in shadow for query in active):
        return None
    return max([(active[query] - shadow[query]).total_seconds() for query in active], default=0.0)


def shadow_of(view: InstanceView, active: str) -> str | None:
    """The standby that runs the new version first: a live PASSIVE before a BACKUP, in the plan's order (pure)."""
    standbys = [n for n in view.candidates if n != active and view.alive(n)]
    standbys.sort(key=lambda n: view.health(n).role == BACKUP)
    return standbys[0] if standbys else None


def publishing_pause(db: Database, plan: str, instance: str, epoch: int, timeout_s: float = 60.0) -> float | None:
    """Seconds from the last publish of ``(plan, instance)`` at ``epoch`` or before (the lease holder before a
    hand-over) to the first at a later epoch; ``None`` when nothing is published within ``timeout_s`` (no input)."""
    last = last_publish_until(db, plan, instance, epoch)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        first = first_publish_after(db, plan, instance, epoch)
        if first is not None:
            return None if last is None else max(0.0, (first["published_at"] - last).total_seconds())
        time.sleep(0.2)
    return None


@dataclass(frozen=True)
class UpgradeResult:
    """What one instance's upgrade step did: its state afterwards, in one line, and the figures."""

    instance: str
    state: str
    line: str
    checks: tuple[OutputCheck, ...] = ()
    pause_s: float | None = None
    catch_up_s: float | None = None
    """From the upgrade's start to its shadow first being no more than two micro-batches behind the ACTIVE."""

    @property
    def ok(self) -> bool:
        return self.state != FAILED

    def summary(self, plan: str) -> str:
        """The step's outcome in one line, for the CLI and the task log."""
        return f"{plan}/{self.instance}: {self.state}: {self.line}{self.figures()}"

    def figures(self) -> str:
        """`` (caught up in 18.2s, publishing paused 1.30s)``, or what of it is known ('' for nothing)."""
        parts = ([] if self.catch_up_s is None else [f"caught up in {self.catch_up_s:.1f}s"]) + \
            ([] if self.pause_s is None else [f"publishing paused {self.pause_s:.2f}s"])
        return f" ({', '.join(parts)})" if parts else ""


@dataclass(frozen=True)
class _Verified:
    """What the verification compared, and the upgrade's end when it ended there."""

    checks: list[OutputCheck]
    state: UpgradeResult | None = None
    caught_up_at: float | None = None  # time.monotonic() when the shadow first was close enough to the ACTIVE


def each_instance(step: Callable[[str], UpgradeResult],
                  instances: list[str]) -> Iterator[tuple[str, UpgradeResult | None, OpsRefused | None]]:
    """``step`` (an upgrade, a finish or a rollback) of each instance in turn: its result, or why it was refused."""
    for instance in instances:
        try:
            yield instance, step(instance), None
        except OpsRefused as exc:
            yield instance, None, exc


class Upgrader:
    """Upgrade, roll back or finish the instances of one plan through a :class:`Supervisor` (its lock per instance
    keeps the supervision DAG out while a step runs).

    Args:
        verify_s: how long the shadow compares before the hand-over (0: no verification).
        min_rows: rows compared, at least, before the hand-over (with ``verify_s`` > 0).
        timeout_s: how long the verification may take to see ``min_rows`` rows.
        confirm: asked with the differences of a change of semantics; ``True`` hands over anyway. ``None``:
            a difference stops the upgrade.
        progress: told each step and the verification's state as it goes.
    """

    def __init__(self, supervisor: Supervisor, *, verify_s: float = 30.0, min_rows: int = 1,
                 timeout_s: float = 300.0, confirm: Callable[[list[OutputCheck]], bool] | None = None,
                 progress: Callable[[str], None] | None = None, poll_s: float = 1.0) -> None:
        self.supervisor = supervisor
        self.plan: PlanConfig = supervisor.plan
        self.db = supervisor.db
        self.verify_s = verify_s
        self.min_rows = min_rows
        self.timeout_s = timeout_s
        self.confirm = confirm
        self.progress = progress or (lambda line: supervisor.log.info("%s", line))
        self.poll_s = poll_s
        self.max_behind_s = max(2.0, 2 * self.plan.trigger_interval_s)
        """How far behind the ACTIVE the shadow may be at the hand-over: two micro-batches."""

    # -- upgrade -----------------------------------------------------------------------------

    def upgrade(self, instance: str) -> UpgradeResult:
        """Run the files' version of the plan beside the ACTIVE, verify it, hand it the ACTIVE role."""
        started = time.monotonic()
        to_version = plan_version(self.plan)
        view = self.supervisor.observe(instance).view
        active = view.active
        if active is None:
            raise OpsRefused(f"{self.plan.name}/{instance} has no live ACTIVE instance to upgrade beside")
        if view.standby not in (HOT, WARM):
            raise OpsRefused(f"{self.plan.name}/{instance}: an upgrade needs a standby running beside the ACTIVE "
                             f"(the plan's standby is {view.standby}): a cold plan takes a change at a restart")
        from_version = self._version(instance, active)
        if from_version == to_version and all(self._version(instance, n) == to_version
                                              for n in self.plan.nodes if view.alive(n)):
            raise OpsRefused(f"{self.plan.name}/{instance}: every node runs version {to_version} already")
        shadow = shadow_of(view, active)
        if shadow is None:
            raise OpsRefused(f"{self.plan.name}/{instance}: no live standby to run version {to_version} beside "
                             f"the ACTIVE on {active}")
        try:
            check_unchanged(self.supervisor.cluster, self.plan, instance, shadow)
        except PlanChanged as exc:
            raise OpsRefused(str(exc)) from None
        if view.standby == WARM:
            return self._warm(instance, active, shadow, from_version, to_version, started)
        upgrades.begin(self.db, Upgrade(self.plan.name, instance, VERIFYING, from_version, to_version, active, shadow,
                                        f"version {to_version} starts on {shadow} beside {from_version} on {active}"))
        self.progress(f"{self.plan.name}/{instance}: restarting {shadow} on version {to_version}, re-synced from "
                      f"{active} (version {from_version})")
        report = self.supervisor.restart(instance, shadow, reason=f"upgrade: {shadow} runs version {to_version}")
        if report.failed or not report.converged:
            return self._fail(instance, f"{shadow} did not start on version {to_version}: "
                                        f"{'; '.join(report.lines())}")
        running = self._version(instance, shadow)
        if running != to_version:  # the files changed again meanwhile
            return self._fail(instance, f"{shadow} started version {running}, not {to_version}: the plan's files "
                                        f"changed during the upgrade; run it again")
        outcome = self._verify(instance, active, shadow, to_version)
        if outcome.state is not None:
            return outcome.state
        result = self._hand_over(instance, active, shadow, to_version, outcome.checks)
        caught_up = None if outcome.caught_up_at is None else round(outcome.caught_up_at - started, 3)
        return replace(result, catch_up_s=caught_up)

    def _warm(self, instance: str, active: str, standby: str, from_version: str | None, to_version: str,
              started: float) -> UpgradeResult:
        """A warm plan: its WARM standby runs no query, so nothing is compared and nothing stays behind to roll back
        to. The standby is restarted on the new version, then takes over by the warm failover of ``failover_now``
        (from a cut of the ACTIVE's checkpoint); the old node comes back as the WARM standby, on the new version."""
        upgrades.begin(self.db, Upgrade(self.plan.name, instance, VERIFYING, from_version, to_version, active, standby,
                                        f"warm: version {to_version} starts on {standby} (not verified: a WARM "
                                        f"standby runs no query)"))
        self.progress(f"{self.plan.name}/{instance}: restarting the WARM standby {standby} on version {to_version}")
        report = self.supervisor.restart(instance, standby, reason=f"upgrade: {standby} runs version {to_version}")
        if report.failed or not report.converged or self._version(instance, standby) != to_version:
            return self._fail(instance, f"{standby} did not start on version {to_version}: "
                                        f"{'; '.join(report.lines())}")
        self.progress(f"{self.plan.name}/{instance}: failing over to {standby}")
        holder, pause, report = self._move_active(instance, standby, f"upgrade: version {to_version} takes over (warm)")
        if holder is None or self._version(instance, holder) != to_version:
            return self._fail(instance, f"after the warm failover the ACTIVE is {holder}, not version {to_version}: "
                                        f"{'; '.join(report.lines())}")
        detail = (f"warm: version {to_version} is ACTIVE on {holder} after a warm failover, not verified (a WARM "
                  f"standby runs no query to compare); the other node is the WARM standby on it: no rollback (no node "
                  f"runs version {from_version} any more)")
        upgrades.set_state(self.db, self.plan.name, instance, FINISHED, detail, event_detail={"pause_s": pause})
        return UpgradeResult(instance, FINISHED, detail, pause_s=pause,
                             catch_up_s=round(time.monotonic() - started, 3))

    def _verify(self, instance: str, active: str, shadow: str, to_version: str) -> "_Verified":
        verifying = self.verify_s > 0  # without a verification, the hand-over still waits for the shadow to catch up
        start = time.monotonic()
        caught_up_at, confirmed = None, None
        while True:
            checks = upgrades.checks(self.db, self.plan.name, instance, shadow, to_version) if verifying else []
            elapsed = time.monotonic() - start
            marks = newest_watermarks(self.db, self.plan.name)
            behind = behind_by(*({query: mark for (iid, query), mark in marks.items()
                                  if iid == instance_id(self.plan.name, instance, node)} for node in (active, shadow)))
            state = verdict(checks, elapsed, verify_s=self.verify_s, min_rows=self.min_rows if verifying else 0,
                            behind_s=behind, max_behind_s=self.max_behind_s)
            if caught_up_at is None and behind is not None and behind <= self.max_behind_s:
                caught_up_at = time.monotonic()
            self.progress(f"{self.plan.name}/{instance}: verifying {shadow}: {state.line}")
            if state.outcome == PASS:
                return _Verified(confirmed or checks, caught_up_at=caught_up_at)
            if state.outcome == DIFFER:
                samples = [f"{c.output}: {s}" for c in checks for s in c.samples]
                twice = twice_published(checks)
                if twice:
                    return _Verified(checks, self._fail(
                        instance, f"version {to_version} on {shadow}: {twice}. Nothing was handed over: an upgrade "
                                  f"cannot carry a change of how rows are identified (declare a new output for it, or "
                                  f"reset the plan); revert the plan's files and run `tandem upgrade "
                                  f"{self.plan.name}` to put the old version back on {shadow}", checks))
                if self.confirm is not None and self.confirm(checks):
                    self.progress(f"{self.plan.name}/{instance}: the differences are confirmed as meant")
                    verifying, confirmed = False, checks  # from here on only the catch-up is waited for
                    continue
                return _Verified(checks, self._fail(
                    instance, f"version {to_version} on {shadow}: {state.line}; e.g. {' | '.join(samples[:3])}. "
                              f"Nothing was handed over: version {to_version} runs on {shadow} as a standby "
                              f"(a failover would make it ACTIVE). Revert the plan's files and run `tandem upgrade "
                              f"{self.plan.name}` to put the old version back on it, or, for a change of semantics, "
                              f"run it with --expect-changes", checks))
            view = self.supervisor.observe(instance).view
            if view.active == shadow:
                return _Verified(checks, self._finished_by_failover(instance, active, shadow, to_version, checks))
            if not view.alive(shadow):
                return _Verified(checks, self._fail(instance, f"{shadow} stopped while verifying "
                                                                   f"({view.health(shadow).evidence})", checks))
            if elapsed > self.timeout_s:
                return _Verified(checks, self._fail(
                    instance, f"in {self.timeout_s:g}s the verification saw too few rows or the shadow did not catch "
                              f"up ({state.line}): is input arriving? Run it again, or with --verify-seconds 0 to "
                              f"hand over unverified",
                    checks))
            time.sleep(self.poll_s)

    def _hand_over(self, instance: str, active: str, shadow: str, to_version: str,
                   checks: list[OutputCheck]) -> UpgradeResult:
        # the old version compares afresh from here, for a rollback (tandem.runtime.verification.RollbackWatch)
        upgrades.forget_checks(self.db, self.plan.name, instance, active, self._version(instance, active) or "")
        holder, pause, report = self._move_active(instance, shadow, f"upgrade: version {to_version} takes over")
        if holder != shadow:
            return self._fail(instance, f"the hand-over to {shadow} did not happen (ACTIVE: {holder}): "
                                        f"{'; '.join(report.lines())}", checks)
        detail = (f"version {to_version} is ACTIVE on {shadow}; the old version runs on {active} as a standby: "
                  f"`tandem rollback {self.plan.name}` hands back to it, `tandem upgrade {self.plan.name} --finish` "
                  f"restarts it on the new version")
        upgrades.set_state(self.db, self.plan.name, instance, HANDED_OVER, detail,
                           event_detail={"pause_s": pause, "checked": sum(c.checked for c in checks)})
        return UpgradeResult(instance, HANDED_OVER, detail, tuple(checks), pause)

    def _finished_by_failover(self, instance: str, active: str, shadow: str, to_version: str,
                              checks: list[OutputCheck]) -> UpgradeResult:
        detail = (f"{active} (the old version) went down while {shadow} verified: version {to_version} took over "
                  f"by failover, verified only as far as it got; `tandem upgrade {self.plan.name} --finish` "
                  f"restarts the other nodes on it")
        upgrades.set_state(self.db, self.plan.name, instance, HANDED_OVER, detail)
        return UpgradeResult(instance, HANDED_OVER, detail, tuple(checks))

    # -- after the hand-over -----------------------------------------------------------------

    def rollback(self, instance: str) -> UpgradeResult:
        """Hand the ACTIVE role back to the node that still runs the version before the upgrade."""
        upgrade = self._handed_over(instance, "roll back")
        view = self.supervisor.observe(instance).view
        if not view.alive(upgrade.from_node) or self._version(instance, upgrade.from_node) != upgrade.from_version:
            raise OpsRefused(f"{self.plan.name}/{instance}: {upgrade.from_node} no longer runs version "
                             f"{upgrade.from_version}: nothing to hand back to. Revert the plan's files and run "
                             f"`tandem upgrade {self.plan.name}`")
        twice = twice_published(upgrades.checks(self.db, self.plan.name, instance, upgrade.from_node,
                                                upgrade.from_version or ""))
        if twice:
            raise OpsRefused(f"{self.plan.name}/{instance}: not rolled back: version {upgrade.from_version} on "
                             f"{upgrade.from_node} holds {twice[0].lower()}{twice[1:]}. Revert the plan's files and "
                             f"run `tandem upgrade {self.plan.name}` instead")
        holder, pause, report = self._move_active(instance, upgrade.from_node,
                                                  f"rollback: version {upgrade.from_version} takes over again")
        if holder != upgrade.from_node:
            return self._fail(instance, f"the hand-back to {upgrade.from_node} did not happen: "
                                        f"{'; '.join(report.lines())}")
        detail = (f"version {upgrade.from_version} is ACTIVE again on {upgrade.from_node}; {upgrade.shadow_node} "
                  f"runs version {upgrade.to_version} as a standby: revert the plan's files, then `tandem upgrade "
                  f"{self.plan.name}` puts the old version back on it")
        upgrades.set_state(self.db, self.plan.name, instance, ROLLED_BACK, detail, event_detail={"pause_s": pause})
        return UpgradeResult(instance, ROLLED_BACK, detail, pause_s=pause)

    def finish(self, instance: str) -> UpgradeResult:
        """End the rollback window: restart every other node of the instance on the new version, re-synced."""
        upgrade = self._handed_over(instance, "finish")
        view = self.supervisor.observe(instance).view
        restarted = []
        for node in self.plan.nodes:
            if node == view.active or node in view.drained or not view.alive(node):
                continue  # a node that is down comes back on the files' version when supervision relaunches it
            if self._version(instance, node) == upgrade.to_version:
                continue
            self.progress(f"{self.plan.name}/{instance}: restarting {node} on version {upgrade.to_version}")
            report: Report = self.supervisor.restart(instance, node, reason=f"upgrade finished: {node} runs "
                                                                            f"version {upgrade.to_version}")
            if report.failed or not report.converged:
                return self._fail(instance, f"{node} did not restart on version {upgrade.to_version}: "
                                            f"{'; '.join(report.lines())}")
            restarted.append(node)
        detail = (f"every node runs version {upgrade.to_version}"
                  f"{' (restarted: ' + ', '.join(restarted) + ')' if restarted else ''}")
        upgrades.set_state(self.db, self.plan.name, instance, FINISHED, detail)
        return UpgradeResult(instance, FINISHED, detail)

    # -- helpers -----------------------------------------------------------------------------

    def _move_active(self, instance: str, node: str, reason: str) -> tuple[str | None, float | None, Report]:
        """``failover_now`` to ``node``: the ACTIVE node after it, the publishing pause (``None``: no ACTIVE, or
        nothing published) and the supervisor's report."""
        epoch = self.supervisor.observe(instance).view.lease.epoch
        report = self.supervisor.fail_over_now(instance, to_node=node, reason=reason)
        holder = self.supervisor.observe(instance).view.active
        pause = None if holder is None else publishing_pause(self.db, self.plan.name, instance, epoch)
        return holder, pause, report

    def _handed_over(self, instance: str, verb: str) -> Upgrade:
        upgrade = upgrades.current(self.db, self.plan.name, instance)
        if upgrade is None or upgrade.state != HANDED_OVER:
            state = upgrade.state if upgrade else "no upgrade"
            raise OpsRefused(f"{self.plan.name}/{instance}: nothing to {verb}: its last upgrade is {state}, "
                             f"not {HANDED_OVER}")
        return upgrade

    def _version(self, instance: str, node: str) -> str | None:
        row = get_instance(self.db, instance_id(self.plan.name, instance, node))
        return row.get("plan_version") if row else None

    def _fail(self, instance: str, detail: str, checks: list[OutputCheck] | None = None) -> UpgradeResult:
        upgrades.set_state(self.db, self.plan.name, instance, FAILED, detail[:4000])
        return UpgradeResult(instance, FAILED, detail, tuple(checks or ()))
