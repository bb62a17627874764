"""This instance's role (ACTIVE / PASSIVE / BACKUP / WARM) and fencing epoch, kept by the heartbeat thread.

Purpose
    Only the ACTIVE instance of a (plan, instance) publishes. A hot standby processes everything,
    holds back what it would have published, and takes over by itself when the active's lease
    expires, so failover does not wait for Airflow.

How it works
    Every heartbeat interval :meth:`RoleController.tick` renews the lease (ACTIVE) or tries to
    take it (a PASSIVE or WARM standby takes an expired lease at once, a BACKUP only after one more
    lease period, so a live passive wins; each takes a lease handed over to its node at once). On
    taking it, the controller first publishes every held output with the new epoch
    (``promote``), then lets live batches through. A refused renewal or a
    publish refused by the fence demotes the instance; its outputs are held again.

What it does not do
    It does not start or stop Spark queries (a WARM standby's run loop starts them once it is
    ACTIVE), and it does not move BACKUP to PASSIVE: the supervisor does that.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tandem.errors import FencedError, StoreError
from tandem.logs import set_epoch
from tandem.names import ACTIVE, BACKUP, PASSIVE, STANDBY_ROLES, WARM
from tandem.store.db import Database
from tandem.store.leases import record_event, release, renew, try_acquire
from tandem.store.registry import InstanceKey

log = logging.getLogger(__name__)


def takeover_grace_s(standby_role: str, ttl_s: float) -> float:
    """How long past expiry a standby waits before taking the lease (pure)."""
    return ttl_s if standby_role == BACKUP else 0.0


LAUNCHED_ACTIVE = "launched as ACTIVE"
TAKEN_OVER = "lease expired or handed over"


def take_reason(node: str, role: str, why: str) -> str:
    """The reason a PROMOTED event gives (pure): the node, how it came to take the lease, and, for a standby, its
    role: ``node-a took the lease: launched as ACTIVE``, ``node-b (PASSIVE standby) took the lease: lease expired
    or handed over``. (An instance launched ACTIVE was said to be a ``PASSIVE`` that took it: the role it had
    before it held a lease.)"""
    if why == LAUNCHED_ACTIVE:
        return f"{node} took the lease: {why}"
    return f"{node} ({role} standby) took the lease: {why}"


def idle_transaction_limit(ttl_s: float) -> dict[str, str]:
    """The session setting that ends a transaction left idle longer than the lease ttl (pure)."""
    return {"idle_in_transaction_session_timeout": f"{math.ceil(ttl_s * 1000)}ms"}


class RoleController:
    """Holds the role and epoch of one instance; ``lock`` serialises publishing and role changes.

    Its one connection is used from the liveness thread (renewals, take-overs) and from the query
    threads (a fenced publish demotes): ``_db_lock`` lets one thread at a time use it. (Without it a
    demotion during a renewal that hangs on a cut-off network raised "connection cannot be
    re-entered recursively" and failed the query.) Lock order: ``lock`` before ``_db_lock``.

    The connection's transactions lock the lease row (a renewal, a take-over). One cut off by a network
    partition between its ``UPDATE`` and its ``COMMIT`` would hold that lock until the server notices,
    and every standby's take-over would wait for it: PostgreSQL ends a session idle in a transaction
    longer than the lease ttl (:func:`idle_transaction_limit`), which releases the lock.
    """

    def __init__(self, instance: InstanceKey, database_url: str, ttl_s: float, standby_role: str = PASSIVE) -> None:
        if standby_role not in STANDBY_ROLES:
            raise ValueError(f"standby role must be one of {', '.join(STANDBY_ROLES)}, got {standby_role!r}")
        self.instance = instance
        self.ttl_s = ttl_s
        self.standby_role = standby_role
        self.epoch: int | None = None
        self.lock = threading.RLock()
        self._db_lock = threading.Lock()
        self.db = Database(database_url, "tandem-roles", settings=idle_transaction_limit(ttl_s))
        self._on_promote: list[Callable[[int], None]] = []
        self._on_tick: list[Callable[[], None]] = []
        self.failure: str | None = None
        """Why a promotion could not publish what was held (the instance then ends FAILED)."""

    @property
    def role(self) -> str:
        return ACTIVE if self.epoch is not None else self.standby_role

    def on_promote(self, flush: Callable[[int], None]) -> None:
        """Run ``flush(epoch)`` under the lock right after the lease is taken (publish held outputs)."""
        self._on_promote.append(flush)

    def queries_run(self) -> None:
        """A WARM standby's queries now run: demoted, it waits as a PASSIVE (hot) standby."""
        with self.lock:
            if self.standby_role == WARM:
                self.standby_role = PASSIVE
                if self.epoch is None:  # demoted before its queries started: its recorded role was WARM
                    self._record_role()

    def on_tick(self, work: Callable[[], None]) -> None:
        """Run ``work()`` every heartbeat (e.g. trim held outputs by the active's position); a beat that finds
        a publish holding the lock skips it."""
        self._on_tick.append(work)

    def start(self, wants_active: bool) -> None:
        """At start: an instance launched as ACTIVE takes the lease if free, expired, or its own node's."""
        self._record_role()
        if wants_active:
            self._try_take(grace_s=0.0, reason=LAUNCHED_ACTIVE, same_node=True)

    def tick(self) -> None:
        """One heartbeat: renew, or take an expired lease; then the periodic work."""
        try:
            epoch = self.epoch
            if epoch is not None:
                if not self._renew(epoch):
                    self.demote("lease renewal refused: another node holds the lease")
            else:
                # same_node: a lease that names this node was handed over to it (drain, failover now)
                # or held by this node's previous process; either way this instance supersedes it
                self._try_take(takeover_grace_s(self.standby_role, self.ttl_s), TAKEN_OVER, same_node=True)
            for work in self._on_tick:
                # a publish holds the lock for as long as it writes: skip to the next beat rather than wait,
                # so a slow publish never holds up the renewals and beats of this thread
                if self.lock.acquire(blocking=False):
                    try:
                        work()
                    finally:
                        self.lock.release()
        except StoreError as exc:  # PostgreSQL unreachable: nobody can publish; try again next beat
            log.warning("role tick skipped: %s", exc)

    def _try_take(self, grace_s: float, reason: str, same_node: bool = False) -> None:
        with self._db_lock:
            epoch = try_acquire(self.db, self.instance.plan, self.instance.instance, self.instance.node, self.ttl_s,
                                grace_s=grace_s, reason=take_reason(self.instance.node, self.role, reason),
                                same_node=same_node)
        if epoch is None:
            return
        with self.lock:
            try:
                with self._renewed_meanwhile(epoch):  # ended before a failure gives the lease back
                    for flush in self._on_promote:
                        flush(epoch)
            except FencedError as exc:
                log.warning("lost the lease while publishing held outputs: %s", exc)
                return
            except StoreError:  # PostgreSQL unreachable: the next beat takes the lease again and publishes
                raise
            except Exception as exc:  # noqa: BLE001 - the instance ends FAILED with it; the lease goes back
                self.failure = f"publishing the held outputs failed: {' '.join(str(exc).split())[:500]}"
                log.error("%s: %s", self.instance.id, self.failure)
                with self._db_lock:
                    release(self.db, self.instance.plan, self.instance.instance, self.instance.node, epoch,
                            self.failure)
                return
            self.epoch = epoch
            set_epoch(epoch)
            self._record_role()
        log.info("%s is ACTIVE at epoch %d", self.instance.id, epoch)

    def _renew(self, epoch: int) -> bool:
        """Extend the lease held at ``epoch``; ``False`` when another node holds it now."""
        with self._db_lock:
            return renew(self.db, self.instance.plan, self.instance.instance, self.instance.node, epoch, self.ttl_s)

    @contextmanager
    def _renewed_meanwhile(self, epoch: int) -> Iterator[None]:
        """Renew the lease taken at ``epoch`` from another thread while this one publishes what was held,
        which can take longer than the ttl on a busy machine (this thread renews only once it is done)."""
        done = threading.Event()

        def renew_until_done() -> None:
            while not done.wait(self.ttl_s / 3):
                try:
                    self._renew(epoch)
                except StoreError as exc:
                    log.warning("renewal during the promotion failed: %s", exc)

        renewing = threading.Thread(target=renew_until_done, name="tandem-promotion-renewal", daemon=True)
        renewing.start()
        try:
            yield
        finally:
            done.set()
            renewing.join()

    def demote(self, reason: str) -> None:
        """Stop publishing (called on a refused renewal or a fenced write)."""
        with self.lock:
            if self.epoch is None:
                return
            epoch, self.epoch = self.epoch, None
            set_epoch(None)
            self._record_role(event=("DEMOTED", reason, epoch))
        log.warning("%s demoted to %s: %s", self.instance.id, self.standby_role, reason)

    def stop(self, reason: str = "instance stopped") -> None:
        """On a clean stop: give the lease up so a standby takes over at once."""
        with self.lock:
            if self.epoch is not None:
                try:
                    with self._db_lock:
                        release(self.db, self.instance.plan, self.instance.instance, self.instance.node, self.epoch,
                                reason)
                except StoreError as exc:
                    log.warning("could not release the lease: %s", exc)
                self.epoch = None
                set_epoch(None)
        with self._db_lock:
            self.db.close()

    def _record_role(self, event: tuple[str, str, int] | None = None) -> None:
        key = self.instance

        def work(cursor) -> None:
            cursor.execute("UPDATE plan_instances SET role = %s, epoch = %s, updated_at = now() WHERE instance_id = %s",
                           (self.role, self.epoch or 0, key.id))
            if event:
                kind, reason, epoch = event
                record_event(cursor, key.plan, key.instance, kind, reason, node=key.node, epoch=epoch)

        try:
            with self._db_lock:
                self.db.run(work, attempts=3)
        except StoreError as exc:
            log.warning("could not record role %s: %s", self.role, exc)
