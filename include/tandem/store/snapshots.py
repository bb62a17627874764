"""The snapshot catalog in PostgreSQL: one row per snapshot, from TAKING to GOOD / BAD to PRUNED.

Purpose
    The snapshot DAG, ``tandem snapshot``, ``tandem snapshots``, the restore and retention all
    need the same facts about each snapshot of a plan: which instance it was cut from, at which
    committed batch, where the copy lives, how big it is, the Delta versions of the plan's outputs
    at the cut, and whether it validated. This module reads and writes those rows (table
    ``tandem.snapshots``, migration ``003_snapshots.sql``).

How it works
    :func:`begin_snapshot` inserts a TAKING row before anything is copied, so a snapshot that dies
    half-way is visible (retention treats a stale TAKING row as failed). Its id is
    ``<plan>-<instance>-<UTC yyyymmddThhmmssZ>-<6 hex>`` and its ``taken_at`` is PostgreSQL's
    clock, like every age the supervisor compares. :func:`record_contents` fills in the cut's
    batch, sizes and output versions while the row is TAKING; :func:`mark_good` /
    :func:`mark_bad` store the validation result; :func:`mark_pruned` records that its files were
    deleted (the row stays as history). Each change is one transaction that locks the row and
    checks the status it comes from, so a retry after a lost commit acknowledgement is harmless
    and an impossible change (GOOD without a cut, anything after PRUNED) raises
    :class:`~tandem.errors.SnapshotError` naming the snapshot and its status.

What it does not do
    It copies, exports, validates and deletes nothing, and it decides nothing: which snapshots to
    prune or restore is decided by the pure functions in :mod:`tandem.snapshots.retention`.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tandem.errors import SnapshotError
from tandem.json_values import json_text
from tandem.store.db import Database
from tandem.store.registry import instance_id as make_instance_id

TAKING, GOOD, BAD, PRUNED = "TAKING", "GOOD", "BAD", "PRUNED"
STATUSES = (TAKING, GOOD, BAD, PRUNED)
_COLUMNS = ("id, plan, instance, instance_id, node, batch_id, taken_at, completed_at, checkpoint_path, state_rows, "
            "checkpoint_bytes, state_bytes, query_batches, output_versions, status, validation, reason, pruned_at, "
            "replay_from, taker_host, taker_host_id, taker_pid, taker_started_at, progress_at")


@dataclass(frozen=True)
class SnapshotRecord:
    """One row of the snapshot catalog."""

    id: str
    plan: str
    instance: str
    instance_id: str
    node: str
    taken_at: datetime
    checkpoint_path: str
    status: str = TAKING
    batch_id: int | None = None
    completed_at: datetime | None = None
    state_rows: int | None = None
    checkpoint_bytes: int | None = None
    state_bytes: int | None = None
    query_batches: Mapping[str, int] = field(default_factory=dict)
    output_versions: Mapping[str, int] = field(default_factory=dict)
    validation: Mapping[str, Any] | None = None
    reason: str | None = None
    pruned_at: datetime | None = None
    replay_from: datetime | None = None
    taker_host: str | None = None
    taker_host_id: str | None = None
    taker_pid: int | None = None
    taker_started_at: float | None = None
    progress_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> "SnapshotRecord":
        values = dict(row)
        for column in ("query_batches", "output_versions"):
            values[column] = {str(k): int(v) for k, v in (values.get(column) or {}).items()}
        return cls(**values)


def new_snapshot_id(plan: str, instance: str, at: datetime, token: str | None = None) -> str:
    """``<plan>-<instance>-<UTC yyyymmddThhmmssZ>-<token>``; ``token`` defaults to 6 random hex digits."""
    if at.tzinfo is None:
        raise ValueError(f"snapshot time must carry a time zone, got {at!r}")
    stamp = at.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{plan}-{instance}-{stamp}-{token or secrets.token_hex(3)}"


def database_now(db: Database) -> datetime:
    """PostgreSQL's current time: the clock ``taken_at`` uses, for comparing ages with it."""

    def work(cursor) -> datetime:
        cursor.execute("SELECT clock_timestamp() AS now")
        return cursor.fetchone()["now"]

    return db.run(work, attempts=3)


@dataclass(frozen=True)
class Taker:
    """The process taking a snapshot: its host (name and identity, :mod:`tandem.host_identity`), PID and start time
    (seconds from boot, :mod:`tandem.process_start`)."""

    host: str
    host_id: str | None
    pid: int
    started_at: float | None


def begin_snapshot(db: Database, *, plan: str, instance: str, node: str, snapshots_dir: Path | str,
                   instance_id: str | None = None, taken_at: datetime | None = None,
                   taker: Taker | None = None) -> SnapshotRecord:
    """Insert a TAKING row for a snapshot of the key_id ``<plan>/<instance>/<node>``, before copying.

    ``snapshots_dir`` is the plan's snapshot folder (``<storage_root>/snapshots/<plan>``, see
    :func:`tandem.layout.snapshots_dir`); the copy goes to ``<snapshots_dir>/<id>``. ``taken_at``
    defaults to PostgreSQL's clock. ``taker``: the process taking it, whose progress (:func:`record_progress`)
    starts at ``taken_at`` (not given: none is recorded, and only the snapshot's age tells it was abandoned).
    """
    taken_at = taken_at or database_now(db)
    snapshot_id = new_snapshot_id(plan, instance, taken_at)
    key_id = instance_id or make_instance_id(plan, instance, node)
    path = str(Path(snapshots_dir) / snapshot_id)

    def work(cursor) -> SnapshotRecord:
        cursor.execute(
            """INSERT INTO snapshots (id, plan, instance, instance_id, node, taken_at, checkpoint_path, status,
                                      taker_host, taker_host_id, taker_pid, taker_started_at, progress_at)
               VALUES (%s, %s, %s, %s, %s, %s, %s, 'TAKING', %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING""",
            (snapshot_id, plan, instance, key_id, node, taken_at, path,
             *((taker.host, taker.host_id, taker.pid, taker.started_at, taken_at) if taker else (None,) * 5)))
        cursor.execute(f"SELECT {_COLUMNS} FROM snapshots WHERE id = %s", (snapshot_id,))
        return SnapshotRecord.from_row(cursor.fetchone())

    record = db.run(work)
    if (record.plan, record.instance, record.instance_id) != (plan, instance, key_id):
        raise SnapshotError(f"snapshot id {snapshot_id} already names a snapshot of {record.instance_id}")
    return record


def record_contents(db: Database, snapshot_id: str, *, batch_id: int | None = None,
                    checkpoint_bytes: int | None = None, state_rows: int | None = None,
                    state_bytes: int | None = None, output_versions: Mapping[str, int] | None = None,
                    query_batches: Mapping[str, int] | None = None,
                    replay_from_age_s: float | None = None) -> SnapshotRecord:
    """Record what a TAKING snapshot holds so far: the cut's batch (per query too), sizes, Delta output versions,
    and how long ago (``replay_from_age_s``) its earliest commit was: ``replay_from`` is that long before now.

    Fields left ``None`` keep their value; ``output_versions`` and ``query_batches`` are merged into those recorded.
    The batch of the cut, once recorded, cannot change.
    """
    for name, value in (("batch_id", batch_id), ("checkpoint_bytes", checkpoint_bytes), ("state_rows", state_rows),
                        ("state_bytes", state_bytes)):
        _check_count(name, value)
    versions = dict(output_versions or {})
    for table, version in versions.items():
        _check_count(f"output_versions[{table!r}]", version)
    batches = dict(query_batches or {})
    for query, batch in batches.items():
        _check_count(f"query_batches[{query!r}]", batch)

    def work(cursor) -> SnapshotRecord:
        current = _lock(cursor, snapshot_id, (TAKING,), "record its contents")
        if batch_id is not None and current.batch_id is not None and current.batch_id != batch_id:
            raise SnapshotError(f"snapshot {snapshot_id} was cut at batch {current.batch_id}, not {batch_id}")
        cursor.execute(
            f"""UPDATE snapshots SET batch_id = COALESCE(%s, batch_id),
                       checkpoint_bytes = COALESCE(%s, checkpoint_bytes), state_rows = COALESCE(%s, state_rows),
                       state_bytes = COALESCE(%s, state_bytes), output_versions = output_versions || %s::jsonb,
                       query_batches = query_batches || %s::jsonb,
                       replay_from = COALESCE(now() - make_interval(secs => %s), replay_from)
                WHERE id = %s RETURNING {_COLUMNS}""",
            (batch_id, checkpoint_bytes, state_rows, state_bytes, json_text(versions), json_text(batches),
             replay_from_age_s, snapshot_id))
        return SnapshotRecord.from_row(cursor.fetchone())

    return db.run(work)


def record_progress(db: Database, snapshot_id: str) -> bool:
    """The taker of a TAKING snapshot is still at work (its beat): ``progress_at`` is now. ``False`` once the
    snapshot is no longer TAKING (finished, or given up as abandoned: :func:`abandon`)."""

    def work(cursor) -> bool:
        cursor.execute("UPDATE snapshots SET progress_at = clock_timestamp() WHERE id = %s AND status = 'TAKING'",
                       (snapshot_id,))
        return cursor.rowcount == 1

    return db.run(work)


def abandon(db: Database, snapshot: SnapshotRecord, reason: str) -> bool:
    """Mark the TAKING ``snapshot`` (a :class:`SnapshotRecord` as read) BAD as abandoned, with ``reason``, unless it
    changed since it was read (finished, or its taker beat again): whether it was."""

    def work(cursor) -> bool:
        cursor.execute(
            """UPDATE snapshots SET status = 'BAD', reason = %s, completed_at = clock_timestamp()
               WHERE id = %s AND status = 'TAKING' AND progress_at IS NOT DISTINCT FROM %s""",
            (reason, snapshot.id, snapshot.progress_at))
        return cursor.rowcount == 1

    return db.run(work)


def mark_good(db: Database, snapshot_id: str, validation: Mapping[str, Any]) -> SnapshotRecord:
    """A TAKING snapshot passed validation: GOOD, with the validation result. Needs the cut's batch recorded."""

    def work(cursor) -> SnapshotRecord:
        current = _lock(cursor, snapshot_id, (TAKING, GOOD), "mark it GOOD")
        if current.batch_id is None:
            raise SnapshotError(f"snapshot {snapshot_id} has no recorded cut (batch_id): it cannot be GOOD")
        return _update(cursor, snapshot_id,
                       "status = 'GOOD', validation = %s::jsonb, reason = NULL, "
                       "completed_at = COALESCE(completed_at, clock_timestamp())",
                       (_json(validation),))

    return db.run(work)


def mark_bad(db: Database, snapshot_id: str, reason: str,
             validation: Mapping[str, Any] | None = None) -> SnapshotRecord:
    """The snapshot failed (while taking, at validation, or found broken later): BAD, with why.

    A GOOD snapshot may become BAD (e.g. a file of its copy went missing); a PRUNED one may not.
    """
    if not reason:
        raise ValueError("a BAD snapshot needs a reason")

    def work(cursor) -> SnapshotRecord:
        _lock(cursor, snapshot_id, (TAKING, GOOD, BAD), "mark it BAD")
        return _update(cursor, snapshot_id,
                       """status = 'BAD', reason = %s, validation = COALESCE(%s::jsonb, validation),
                          completed_at = COALESCE(completed_at, clock_timestamp())""",
                       (reason, None if validation is None else _json(validation)))

    return db.run(work)


def mark_pruned(db: Database, snapshot_id: str, reason: str) -> SnapshotRecord:
    """The snapshot's files were deleted: PRUNED, with why. The row stays; pruning twice changes nothing."""
    if not reason:
        raise ValueError("a PRUNED snapshot needs a reason")

    def work(cursor) -> SnapshotRecord:
        current = _lock(cursor, snapshot_id, STATUSES, "mark it PRUNED")
        if current.status == PRUNED:
            return current
        return _update(cursor, snapshot_id, "status = 'PRUNED', reason = %s, pruned_at = clock_timestamp()",
                       (reason,))

    return db.run(work)


def get_snapshot(db: Database, snapshot_id: str) -> SnapshotRecord | None:
    """One snapshot by id, or ``None``."""

    def work(cursor) -> SnapshotRecord | None:
        cursor.execute(f"SELECT {_COLUMNS} FROM snapshots WHERE id = %s", (snapshot_id,))
        row = cursor.fetchone()
        return SnapshotRecord.from_row(row) if row else None

    return db.run(work, attempts=3)


def list_snapshots(db: Database, plan: str, *, instance: str | None = None,
                   statuses: tuple[str, ...] | None = None, limit: int | None = None) -> list[SnapshotRecord]:
    """The snapshots of a plan (optionally one instance, some statuses), newest first."""
    unknown = set(statuses or ()) - set(STATUSES)
    if unknown:
        raise ValueError(f"unknown snapshot status {', '.join(sorted(unknown))} (known: {', '.join(STATUSES)})")

    def work(cursor) -> list[SnapshotRecord]:
        cursor.execute(
            f"""SELECT {_COLUMNS} FROM snapshots
                WHERE plan = %(plan)s AND (%(instance)s::text IS NULL OR instance = %(instance)s)
                  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
                ORDER BY taken_at DESC, id DESC LIMIT %(limit)s""",
            {"plan": plan, "instance": instance, "statuses": list(statuses) if statuses else None, "limit": limit})
        return [SnapshotRecord.from_row(row) for row in cursor.fetchall()]

    return db.run(work, attempts=3)


def latest_good(db: Database, plan: str, instance: str) -> SnapshotRecord | None:
    """The newest GOOD snapshot of one (plan, instance), or ``None`` (served by the partial index)."""

    def work(cursor) -> SnapshotRecord | None:
        cursor.execute(
            f"""SELECT {_COLUMNS} FROM snapshots WHERE plan = %s AND instance = %s AND status = 'GOOD'
                ORDER BY taken_at DESC, id DESC LIMIT 1""", (plan, instance))
        row = cursor.fetchone()
        return SnapshotRecord.from_row(row) if row else None

    return db.run(work, attempts=3)


def _lock(cursor, snapshot_id: str, allowed: tuple[str, ...], doing: str) -> SnapshotRecord:
    cursor.execute(f"SELECT {_COLUMNS} FROM snapshots WHERE id = %s FOR UPDATE", (snapshot_id,))
    row = cursor.fetchone()
    if row is None:
        raise SnapshotError(f"no snapshot {snapshot_id!r} in the catalog")
    current = SnapshotRecord.from_row(row)
    if current.status not in allowed:
        raise SnapshotError(f"snapshot {snapshot_id} is {current.status}: cannot {doing} "
                            f"(only when {' or '.join(allowed)})")
    return current


def _update(cursor, snapshot_id: str, assignments: str, params: tuple[Any, ...]) -> SnapshotRecord:
    cursor.execute(f"UPDATE snapshots SET {assignments} WHERE id = %s RETURNING {_COLUMNS}", (*params, snapshot_id))
    return SnapshotRecord.from_row(cursor.fetchone())


def _check_count(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def _json(value: Mapping[str, Any]) -> str:
    return json_text(dict(value), sort_keys=True)
