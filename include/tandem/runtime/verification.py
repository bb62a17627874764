"""A standby's side of an upgrade's verification (issue 48 §2, issue 60).

A node launched as the shadow of an upgrade under way (:mod:`tandem.supervisor.upgrade`) — the upgrade names its
node and the version it runs — compares each row it trims with the row the ACTIVE (the old version) published for
it (:meth:`tandem.outputs.base.HeldUntilPublished.trim`), and reports the rows the ACTIVE never publishes under
their identity; the counts go to ``upgrade_checks``, where the upgrade reads them. After the hand-over the old
version, now a standby, does the same against the new ACTIVE (:class:`RollbackWatch`), so that a rollback that
would publish rows again under the old version's identities is refused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime

from tandem.store import upgrades
from tandem.store.db import Database
from tandem.store.publish_log import newest_publish
from tandem.store.snapshots import database_now
from tandem.store.registry import InstanceKey

log = logging.getLogger(__name__)


class ShadowVerification:
    """Records what this standby compared, per output, under ``to_version`` (the version it runs)."""

    def __init__(self, key: InstanceKey, database_url: str, to_version: str) -> None:
        self.key = key
        self.to_version = to_version
        self.db = Database(database_url, "tandem-verification")
        self._asked: tuple[float, datetime | None] | None = None

    def record(self, output: str, checked: int, differences: list[str], unmatched: list[str] = ()) -> None:
        upgrades.record_check(self.db, self.key.plan, self.key.instance, self.key.node, self.to_version, output,
                              checked, differences, list(unmatched))
        if differences:
            log.warning("%s: %d of %d rows differ from what the active published, e.g. %s", output,
                        len(differences), checked, differences[0][:300])
        if unmatched:
            log.warning("%s: %d rows held that the active never published under their identity, e.g. %s", output,
                        len(unmatched), unmatched[0][:300])

    def now(self) -> datetime:
        """PostgreSQL's clock (the publish log's)."""
        return database_now(self.db)

    def active_published_at(self) -> datetime | None:
        """When another node of the instance (the ACTIVE) last published (asked at most every
        :data:`ASKED_AGAIN_AFTER_S`)."""
        if self._asked is None or time.monotonic() - self._asked[0] > ASKED_AGAIN_AFTER_S:
            self._asked = (time.monotonic(), newest_publish(self.db, self.key.plan, self.key.instance, self.key.node))
        return self._asked[1]

    def for_query(self, query: str) -> QueryVerification:
        """What one query's sinks report through: its batches are numbered apart from the other queries'."""
        return QueryVerification(self, query)


class QueryVerification:
    """One query's part of a :class:`ShadowVerification` (:class:`tandem.outputs.base.Verification`): how far the
    active has got in the query's batches, as the rows it published show.

    A batch is *proven* once the active has published the rows this standby held in it, and then published again
    (any batch of the instance, after that was seen): the active had read the batch's input, and a row it emits a
    batch later (a timer its next batch fires, a window's end) has had its batch — whatever the two sides' batches
    held each.
    """

    def __init__(self, verification: ShadowVerification, query: str) -> None:
        self.verification = verification
        self.query = query
        self.proven: int | None = None
        self._seen: list[tuple[int, datetime]] = []  # (batch, when seen published), oldest first

    def record(self, output: str, checked: int, differences: list[str], unmatched: list[str] = ()) -> None:
        self.verification.record(output, checked, differences, unmatched)

    def published_through(self, batch_id: int) -> None:
        newest = self._seen[-1][0] if self._seen else self.proven
        if newest is None or batch_id > newest:
            self._seen.append((batch_id, self.verification.now()))

    def proven_batch(self) -> int | None:
        if self._seen:
            since = self.verification.active_published_at()
            while self._seen and since is not None and since > self._seen[0][1]:
                self.proven = self._seen.pop(0)[0]
        return self.proven


ASKED_AGAIN_AFTER_S = 0.5
"""How long :meth:`ShadowVerification.active_published_at`'s answer is reused (every sink of a query asks at a trim)."""


def shadow_verification(db: Database, key: InstanceKey, version: str, database_url: str) -> ShadowVerification | None:
    """The verification this node does, when it is the shadow of an upgrade to ``version`` under way."""
    upgrade = upgrades.current(db, key.plan, key.instance)
    if upgrade is None or upgrade.state != upgrades.VERIFYING or upgrade.shadow_node != key.node \
            or upgrade.to_version != version:
        return None
    log.info("%s: the shadow of the upgrade %s -> %s: comparing with what %s publishes", key.id,
             upgrade.from_version, version, upgrade.from_node)
    return ShadowVerification(key, database_url, version)


class RollbackWatch:
    """A heartbeat's work (:meth:`tandem.runtime.roles.RoleController.on_tick`) on a node that may be the old
    version of an upgrade: once it is a standby of an upgrade HANDED_OVER from its node and version, its sinks compare
    what they hold with what the new ACTIVE publishes (``attach`` gives them the verification), so that
    :meth:`tandem.supervisor.upgrade.Upgrader.rollback` can tell whether handing back would publish rows twice.
    Looks every ``every_s`` seconds, and no more once attached."""

    def __init__(self, key: InstanceKey, version: str, database_url: str, is_standby: Callable[[], bool],
                 attach: Callable[[ShadowVerification], None], every_s: float = 5.0) -> None:
        self.key = key
        self.version = version
        self.database_url = database_url
        self.is_standby = is_standby
        self.attach = attach
        self.every_s = every_s
        self.attached = False
        self._next = 0.0
        self._db: Database | None = None

    def __call__(self) -> None:
        if self.attached or not self.is_standby() or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.every_s
        if self._db is None:
            self._db = Database(self.database_url, "tandem-verification")
        upgrade = upgrades.current(self._db, self.key.plan, self.key.instance)
        if upgrade is None or upgrade.state != upgrades.HANDED_OVER or upgrade.from_node != self.key.node \
                or upgrade.from_version != self.version:
            return
        log.info("%s: the old version %s of an upgrade handed over to %s: comparing with what it publishes",
                 self.key.id, self.version, upgrade.shadow_node)
        self.attach(ShadowVerification(self.key, self.database_url, self.version))
        self.attached = True
        self._db.close()
        self._db = None
