"""The shared storage root's marker and each node's last check of it (tables ``storage_marker`` and
``storage_checks``); what they mean is :mod:`tandem.shared_storage`'s business."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tandem.store.db import Database


def lock_marker(cursor) -> None:
    """Take turns with every other check until this transaction ends (a transaction-level advisory lock)."""
    cursor.execute("SELECT pg_advisory_xact_lock(hashtext('tandem.storage_marker'))")


def read_marker(cursor) -> dict[str, Any] | None:
    """The marker's row (``token``, ``storage_root``), or ``None`` before the first check."""
    cursor.execute("SELECT token, storage_root FROM storage_marker")
    return cursor.fetchone()


def insert_marker(cursor, token: str, storage_root: str, created_by: str) -> None:
    cursor.execute(
        "INSERT INTO storage_marker (token, storage_root, created_by) VALUES (%s, %s, %s)",
        (token, storage_root, created_by))


def record_check(cursor, node: str, host: str, ok: bool, detail: str) -> None:
    """Keep ``node``'s newest check (one row a node)."""
    cursor.execute(
        """INSERT INTO storage_checks (node, host, ok, detail) VALUES (%s, %s, %s, %s)
           ON CONFLICT (node) DO UPDATE SET host = EXCLUDED.host, ok = EXCLUDED.ok,
               detail = EXCLUDED.detail, checked_at = now()""",
        (node, host, ok, detail))


def last_checks(db: Database, nodes: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Per node of ``nodes`` that was ever checked: its last check (``node``, ``host``, ``ok``, ``detail``)."""

    def work(cursor) -> dict[str, dict[str, Any]]:
        cursor.execute("SELECT node, host, ok, detail FROM storage_checks WHERE node = ANY(%s)", (list(nodes),))
        return {row["node"]: row for row in cursor.fetchall()}

    return db.run(work)
