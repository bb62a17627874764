"""The ACTIVE role as a lease with a fencing epoch, and the failover-events log.

One row per (plan, instance). The holder renews it every heartbeat interval; it expires after
``ttl_s`` (heartbeat interval × max missed). Taking it is a compare-and-set that succeeds only
when the lease is free or expired, and increments the epoch. Every write of an output checks, in
its own transaction, that the writer still holds the lease at its epoch (``check_fence``).

Row locks: the fence check holds the row ``FOR KEY SHARE`` until its write commits. Everything that
changes the holder (a take-over, a hand-over) first locks the row ``FOR UPDATE``, which waits for
those writes, so no take-over lands in the middle of one. A renewal changes neither holder nor
epoch and is a plain ``UPDATE`` (``FOR NO KEY UPDATE``), which a ``KEY SHARE`` lock does not block:
the active's renewals never wait for its own publishing, however long that takes. (With
``FOR SHARE`` they did; a publish longer than the ttl let the standby's queued take-over win.)
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tandem.errors import FencedError
from tandem.json_values import json_text
from tandem.store.db import Database, storable_text


@dataclass(frozen=True)
class LeaseState:
    plan: str
    instance: str
    holder: str | None
    epoch: int
    expires_at: datetime
    expired_for_s: float  # seconds since expiry (negative while valid)


ROLE_CHANGES = ("PROMOTED", "HANDOVER", "RESTORED")
"""Events after which a node is ACTIVE at a new epoch (a failover when it is not the node before): the page's last
role change and the exporter's failover counter."""

def _ensure_row(cursor, plan: str, instance: str, ttl_s: float) -> None:
    cursor.execute(
        """INSERT INTO leases (plan, instance, holder, epoch, ttl_s, expires_at)
           VALUES (%s, %s, NULL, 0, %s, now()) ON CONFLICT (plan, instance) DO NOTHING""",
        (plan, instance, ttl_s),
    )


def record_event(cursor, plan: str, instance: str, kind: str, reason: str, *, node: str | None = None,
                 previous_node: str | None = None, epoch: int | None = None,
                 detail: dict[str, Any] | None = None) -> None:
    """Append one role change or supervision decision to ``failover_events``."""
    cursor.execute(
        """INSERT INTO failover_events (plan, instance, kind, node, previous_node, epoch, reason, detail)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s)""",
        (plan, instance, kind, node, previous_node, epoch, storable_text(reason), json_text(detail or {})),
    )


def takeover_detail(previous_holder: str | None, since_renewal_s: float | None) -> dict[str, float]:
    """The detail of a PROMOTED event (pure): ``took_over_s``, the seconds from the previous holder's last renewal
    (its last sign of life as the ACTIVE) to this take-over, when the lease had a holder that lost it without giving
    it up (killed, frozen, cut off: the lease expired; or a relaunch of its node superseded it). ``since_renewal_s``
    is ``None`` for a lease given up (:func:`release`: a clean stop, a drain, a failed instance): its next holder
    starts the instance again, it takes nothing over."""
    if previous_holder is None or since_renewal_s is None:
        return {}
    return {"took_over_s": round(max(0.0, float(since_renewal_s)), 3)}


def try_acquire(db: Database, plan: str, instance: str, node: str, ttl_s: float, *,
                grace_s: float = 0.0, reason: str = "lease free or expired", same_node: bool = False) -> int | None:
    """Take the lease if it is free or expired for more than ``grace_s``; return the new epoch.

    One compare-and-set: concurrent callers cannot both succeed, and each success increments
    the epoch. ``same_node`` also takes a live lease held by this node: a restarted instance
    supersedes its previous process, which the new epoch fences. The PROMOTED event is written
    in the same transaction, with the take-over time (:func:`takeover_detail`).
    """

    def work(cursor) -> int | None:
        _ensure_row(cursor, plan, instance, ttl_s)
        params = {"node": node, "ttl": ttl_s, "plan": plan, "instance": instance, "grace": grace_s,
                  "same_node": same_node}
        cursor.execute(
            """SELECT holder,
                      CASE WHEN expires_at >= renewed_at  -- not given up (a release backdates expires_at)
                           THEN EXTRACT(EPOCH FROM clock_timestamp() - renewed_at)::float8 END AS since_renewal_s
               FROM leases
               WHERE plan = %(plan)s AND instance = %(instance)s
                 AND (holder IS NULL OR expires_at + make_interval(secs => %(grace)s) < now()
                      OR (%(same_node)s AND holder = %(node)s))
               FOR UPDATE""", params)
        taken = cursor.fetchone()  # the condition is checked again on the row as it is once locked
        if taken is None:
            return None
        cursor.execute(
            """UPDATE leases SET holder = %(node)s, epoch = epoch + 1, ttl_s = %(ttl)s,
                   expires_at = now() + make_interval(secs => %(ttl)s), acquired_at = now(), renewed_at = now()
               WHERE plan = %(plan)s AND instance = %(instance)s
               RETURNING epoch""", params)
        epoch = int(cursor.fetchone()["epoch"])
        record_event(cursor, plan, instance, "PROMOTED", reason, node=node, previous_node=taken["holder"],
                     epoch=epoch, detail=takeover_detail(taken["holder"], taken["since_renewal_s"]))
        return epoch

    return db.run(work)


def renew(db: Database, plan: str, instance: str, node: str, epoch: int, ttl_s: float) -> bool:
    """Extend the lease; ``False`` when ``node`` no longer holds it at ``epoch`` (it was taken)."""

    def work(cursor) -> bool:
        cursor.execute(
            """UPDATE leases SET expires_at = now() + make_interval(secs => %s), renewed_at = now()
               WHERE plan = %s AND instance = %s AND holder = %s AND epoch = %s RETURNING epoch""",
            (ttl_s, plan, instance, node, epoch),
        )
        return cursor.fetchone() is not None

    return db.run(work, attempts=1)


def release(db: Database, plan: str, instance: str, node: str, epoch: int, reason: str) -> bool:
    """Give the lease up at once (drain): it expires now, so a standby can take it without waiting."""

    def work(cursor) -> bool:
        cursor.execute(
            """UPDATE leases SET expires_at = now() - interval '1 hour'
               WHERE plan = %s AND instance = %s AND holder = %s AND epoch = %s RETURNING epoch""",
            (plan, instance, node, epoch),
        )
        released = cursor.fetchone() is not None
        if released:
            record_event(cursor, plan, instance, "RELEASED", reason, node=node, epoch=epoch)
        return released

    return db.run(work)


def check_fence(cursor, plan: str, instance: str, node: str, epoch: int) -> None:
    """Inside a publishing transaction: raise :class:`FencedError` unless ``node`` holds ``epoch``.

    The ``FOR KEY SHARE`` lock makes a take-over wait for this transaction (not a renewal). So that a publisher
    frozen inside it (SIGSTOP, a stalled VM) cannot block the take-over for as long as it is
    frozen, the transaction also sets ``idle_in_transaction_session_timeout`` to the lease ttl:
    PostgreSQL ends a session that sits idle in this transaction longer than that, which rolls it
    back and releases the lock; a live publisher's retry then finds itself fenced. A session frozen in
    the middle of a ``COPY … FROM STDIN`` is not idle but "active" and is never ended that way: stream
    data to the server (e.g. the aggregates' ``COPY`` into a temporary table) before this check.
    """
    cursor.execute(
        """SELECT holder, epoch,
                  set_config('idle_in_transaction_session_timeout', ceil(ttl_s * 1000)::bigint || 'ms', true)
           FROM leases WHERE plan = %s AND instance = %s FOR KEY SHARE""",
        (plan, instance))
    row = cursor.fetchone()
    if row is None or row["holder"] != node or row["epoch"] != epoch:
        current = f"{row['holder']} at epoch {row['epoch']}" if row else "nobody"
        raise FencedError(f"{plan}/{instance}: {node} publishes with epoch {epoch} but the lease is held by {current}")


def promoted_from(db: Database, plan: str, instance: str, epoch: int) -> str | None:
    """The node that held the lease before ``epoch`` was taken (its PROMOTED event), or ``None``."""
    def work(cursor) -> str | None:
        cursor.execute("""SELECT previous_node FROM failover_events
                          WHERE plan = %s AND instance = %s AND kind = 'PROMOTED' AND epoch = %s
                          ORDER BY happened_at DESC LIMIT 1""", (plan, instance, epoch))
        row = cursor.fetchone()
        return row["previous_node"] if row else None

    return db.run(work)


def read_lease(db: Database, plan: str, instance: str) -> LeaseState | None:
    def work(cursor) -> LeaseState | None:
        cursor.execute(
            """SELECT plan, instance, holder, epoch, expires_at, EXTRACT(EPOCH FROM now() - expires_at) AS expired_for_s
               FROM leases WHERE plan = %s AND instance = %s""",
            (plan, instance),
        )
        row = cursor.fetchone()
        return None if row is None else LeaseState(**{**row, "expired_for_s": float(row["expired_for_s"])})

    return db.run(work)


def newest_of_kinds(db: Database, plan: str, kinds: list[str], apart: str) -> list[dict[str, Any]]:
    """Per instance of ``plan``: its newest ``failover_events`` row of kind ``apart`` and its newest of the other
    ``kinds`` (each if any)."""

    def work(cursor) -> list[dict[str, Any]]:
        cursor.execute("""SELECT DISTINCT ON (instance, kind = %s) * FROM failover_events
                          WHERE plan = %s AND kind = ANY(%s)
                          ORDER BY instance, kind = %s, happened_at DESC, id DESC""",
                       (apart, plan, kinds, apart))
        return cursor.fetchall()

    return db.run(work, attempts=3)


def recent_events(db: Database, plan: str, instance: str | None, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` ``failover_events`` rows of ``plan`` (of one instance if ``instance``), newest first."""

    def work(cursor) -> list[dict[str, Any]]:
        cursor.execute("""SELECT * FROM failover_events WHERE plan = %s AND (%s::text IS NULL OR instance = %s)
                          ORDER BY happened_at DESC, id DESC LIMIT %s""", (plan, instance, instance, limit))
        return cursor.fetchall()

    return db.run(work, attempts=3)
