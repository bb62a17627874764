"""PostgreSQL advisory locks: one helper, one table of what each lock protects.

A session-level advisory lock lives as long as the session that took it. PostgreSQL ends that
session when it restarts, when an administrator terminates the backend, or when the connection
breaks, and the lock is gone with it, silently: another supervisor may take it at once. So
:class:`AdvisoryLock` keeps the session and :meth:`AdvisoryLock.check` asks it, before each
action, whether it still holds the lock; when it does not, the holder must stop (:class:`LockLost`).
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import psycopg2

from tandem.errors import LockLost
from tandem.store.db import connect

log = logging.getLogger(__name__)

SCOPES = {"migrations": 1, "launch": 2, "supervise": 3, "backfill": 4, "plan": 5, "restore": 6}
"""The first key of every Tandem advisory lock: what it serialises (the second key names the thing)."""
_TRANSIENT = (psycopg2.OperationalError, psycopg2.InterfaceError)


def lock_key(scope: str, name: str) -> tuple[int, int]:
    """The two 32-bit keys of the lock on ``name`` in ``scope`` (``pg_advisory_lock(int, int)``)."""
    return SCOPES[scope], zlib.crc32(name.encode()) - 2**31


class AdvisoryLock:
    """A session-level advisory lock held on a connection of its own (a context manager).

    Args:
        scope: one of :data:`SCOPES`.
        name: what is locked, e.g. ``"trades/shard-1"``.
    """

    def __init__(self, database_url: str, scope: str, name: str) -> None:
        self.database_url = database_url
        self.scope = scope
        self.name = name
        self.keys = lock_key(scope, name)
        self._conn = None

    def __enter__(self) -> "AdvisoryLock":
        self._conn = connect(self.database_url, f"tandem-{self.scope}-lock")
        self._conn.autocommit = True
        with self._conn.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_lock(%s, %s)", self.keys)
            if not cursor.fetchone()[0]:
                log.info("waiting for the %s lock of %s (another process holds it)", self.scope, self.name)
                cursor.execute("SELECT pg_advisory_lock(%s, %s)", self.keys)
        return self

    def check(self) -> None:
        """Raise :class:`LockLost` unless this lock's session is alive and still holds the lock."""
        try:
            with self._conn.cursor() as cursor:
                cursor.execute(
                    """SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()
                       AND granted AND objsubid = 2 AND classid = %s::bigint::oid AND objid = %s::bigint::oid""",
                    (self.keys[0], self.keys[1] % 2**32))
                held = cursor.fetchone()[0] > 0
        except _TRANSIENT as exc:
            raise LockLost(f"the {self.scope} lock of {self.name} was lost: its PostgreSQL session ended "
                           f"({str(exc).strip() or type(exc).__name__})") from None
        if not held:
            raise LockLost(f"the {self.scope} lock of {self.name} is no longer held by this session")

    def __exit__(self, *exc: object) -> None:
        try:
            with self._conn.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s, %s)", self.keys)
        except Exception:  # noqa: BLE001 - closing the session releases the lock anyway
            log.debug("could not release the %s lock of %s cleanly", self.scope, self.name)
        finally:
            self._conn.close()


@contextmanager
def advisory_locks(database_url: str, locks: Iterable[tuple[str, str]]) -> Iterator[None]:
    """Hold several ``(scope, name)`` advisory locks (those :class:`AdvisoryLock` takes one by one) on one session of
    their own, taken in the order given, each waited for; all released together when the work ends or the session
    does. For one short operation that must keep many things still (a plan reset: every instance's supervision and
    launch): one connection, not one per lock."""
    conn = connect(database_url, "tandem-locks")
    conn.autocommit = True
    try:
        with conn.cursor() as cursor:
            for scope, name in locks:
                cursor.execute("SELECT pg_advisory_lock(%s, %s)", lock_key(scope, name))
        yield
    finally:
        conn.close()  # the session ends: every lock it holds goes with it


_PLAN_LOCKS = threading.local()


@contextmanager
def plan_lock(database_url: str, plan: str, what: str) -> Iterator[None]:
    """Hold ``plan``'s coordination lock while ``what`` changes what the plan keeps: a restore, snapshot pruning,
    Delta compaction and vacuum, landing retention, PostgreSQL retention, a backfill (a reconcile's repair is
    one) and a plan reset run one at a time per plan, whichever process runs them; each waits for the one before.

    Re-entrant within a thread (a restore that cleans landing takes it once); the lock is a session-level advisory
    lock (:class:`AdvisoryLock`), released when the work ends or its session does.
    """
    held: dict[tuple[str, str], int] = _PLAN_LOCKS.__dict__.setdefault("held", {})
    key = (database_url, plan)
    if held.get(key):
        held[key] += 1
        try:
            yield
        finally:
            held[key] -= 1
        return
    with AdvisoryLock(database_url, "plan", plan):
        log.debug("%s of plan %s holds the plan's lock", what, plan)
        held[key] = 1
        try:
            yield
        finally:
            held[key] = 0
