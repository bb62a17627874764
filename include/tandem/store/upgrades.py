"""``plan_upgrades`` and ``upgrade_checks``: a blue/green upgrade's state and what its shadow standby verified.

The upgrade itself is :mod:`tandem.supervisor.upgrade`; the comparison is the shadow's
(:mod:`tandem.runtime.verification`). Each state change is also an event in ``failover_events``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg2.extras import Json

from tandem.json_values import json_text
from tandem.store.db import Database
from tandem.store.leases import record_event

SAMPLES_KEPT = 5
"""Differing rows kept per output, to show the operator."""

VERIFYING, HANDED_OVER, FINISHED, ROLLED_BACK, FAILED = "VERIFYING", "HANDED_OVER", "FINISHED", "ROLLED_BACK", "FAILED"
"""An upgrade's states: its shadow standby runs the new version and compares; the new version is ACTIVE (the old
one a standby, for a rollback); every node runs the new version; the old version is ACTIVE again; it stopped (the
detail says why)."""


@dataclass(frozen=True)
class Upgrade:
    """One instance's upgrade: from the version ``from_node`` (the ACTIVE when it started) ran to ``to_version``,
    run first by the shadow standby on ``shadow_node``."""

    plan: str
    instance: str
    state: str
    from_version: str | None
    to_version: str
    from_node: str
    shadow_node: str
    detail: str
    started_at: datetime | None = None
    updated_at: datetime | None = None


@dataclass(frozen=True)
class OutputCheck:
    """What a shadow compared of one output: rows checked, rows that differ, rows only it held (``unmatched``: the
    other version published rows of later batches but never one under their identity), a few of them described."""

    output: str
    checked: int
    differing: int
    samples: list[str]
    unmatched: int = 0

    def line(self) -> str:
        """``trade_aggregates 120 compared, 0 differ`` (and ``, 3 only in this version`` when some are)."""
        return (f"{self.output} {self.checked} compared, {self.differing} differ"
                + (f", {self.unmatched} only in this version" if self.unmatched else ""))


def begin(db: Database, upgrade: Upgrade) -> None:
    """Record an upgrade starting (replacing the instance's last one) and forget earlier checks of its shadow."""

    def work(cursor) -> None:
        cursor.execute(
            """INSERT INTO plan_upgrades (plan, instance, state, from_version, to_version, from_node, shadow_node,
                                          detail)
               VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
               ON CONFLICT (plan, instance) DO UPDATE SET
                   state = EXCLUDED.state, from_version = EXCLUDED.from_version, to_version = EXCLUDED.to_version,
                   from_node = EXCLUDED.from_node, shadow_node = EXCLUDED.shadow_node, detail = EXCLUDED.detail,
                   started_at = now(), updated_at = now()""",
            (upgrade.plan, upgrade.instance, upgrade.state, upgrade.from_version, upgrade.to_version,
             upgrade.from_node, upgrade.shadow_node, upgrade.detail))
        _forget_checks(cursor, upgrade.plan, upgrade.instance, upgrade.shadow_node, upgrade.to_version)
        record_event(cursor, upgrade.plan, upgrade.instance, f"UPGRADE_{upgrade.state}", upgrade.detail,
                     node=upgrade.shadow_node, previous_node=upgrade.from_node,
                     detail={"from_version": upgrade.from_version, "to_version": upgrade.to_version})

    db.run(work)


def set_state(db: Database, plan: str, instance: str, state: str, detail: str, *,
              event_detail: dict[str, Any] | None = None) -> None:
    """Move an instance's upgrade to ``state``, recording the event."""

    def work(cursor) -> None:
        cursor.execute("""UPDATE plan_upgrades SET state = %s, detail = %s, updated_at = now()
                          WHERE plan = %s AND instance = %s RETURNING shadow_node, from_node""",
                       (state, detail, plan, instance))
        row = cursor.fetchone()
        record_event(cursor, plan, instance, f"UPGRADE_{state}", detail, node=row and row["shadow_node"],
                     previous_node=row and row["from_node"], detail=event_detail)

    db.run(work)


def current(db: Database, plan: str, instance: str) -> Upgrade | None:
    """The instance's upgrade under way or its last one (``None``: never upgraded)."""

    def work(cursor) -> Upgrade | None:
        cursor.execute("SELECT * FROM plan_upgrades WHERE plan = %s AND instance = %s", (plan, instance))
        row = cursor.fetchone()
        return Upgrade(**row) if row else None

    return db.run(work, attempts=3)


def record_check(db: Database, plan: str, instance: str, node: str, to_version: str, output: str, checked: int,
                 differences: list[str], unmatched: list[str] = ()) -> None:
    """Add one comparison of a shadow's held rows to its output's counts (the first differences, then rows only it
    held, kept as samples)."""

    def work(cursor) -> None:
        cursor.execute(
            """INSERT INTO upgrade_checks AS c (plan, instance, node, to_version, output, checked, differing,
                                                unmatched, samples)
               VALUES (%(plan)s, %(instance)s, %(node)s, %(version)s, %(output)s, %(checked)s, %(differing)s,
                       %(unmatched)s, %(samples)s)
               ON CONFLICT (plan, instance, node, to_version, output) DO UPDATE SET
                   checked = c.checked + EXCLUDED.checked, differing = c.differing + EXCLUDED.differing,
                   unmatched = c.unmatched + EXCLUDED.unmatched,
                   samples = CASE WHEN jsonb_array_length(c.samples) >= %(kept)s THEN c.samples
                                  ELSE c.samples || EXCLUDED.samples END,
                   updated_at = now()""",
            {"plan": plan, "instance": instance, "node": node, "version": to_version, "output": output,
             "checked": checked, "differing": len(differences), "unmatched": len(unmatched), "kept": SAMPLES_KEPT,
             "samples": Json([*differences, *unmatched][:SAMPLES_KEPT], dumps=json_text)})

    db.run(work, attempts=1)


def checks(db: Database, plan: str, instance: str, node: str, to_version: str) -> list[OutputCheck]:
    """What the shadow on ``node`` compared so far, per output."""

    def work(cursor) -> list[OutputCheck]:
        cursor.execute("""SELECT output, checked, differing, unmatched, samples FROM upgrade_checks
                          WHERE plan = %s AND instance = %s AND node = %s AND to_version = %s ORDER BY output""",
                       (plan, instance, node, to_version))
        return [OutputCheck(r["output"], int(r["checked"]), int(r["differing"]), list(r["samples"])[:SAMPLES_KEPT],
                            int(r["unmatched"])) for r in cursor.fetchall()]

    return db.run(work, attempts=3)


def forget_checks(db: Database, plan: str, instance: str, node: str, version: str) -> None:
    """Forget what the standby on ``node`` running ``version`` compared (before it compares anew)."""
    db.run(lambda cursor: _forget_checks(cursor, plan, instance, node, version))


def _forget_checks(cursor, plan: str, instance: str, node: str, version: str) -> None:
    cursor.execute("DELETE FROM upgrade_checks WHERE plan = %s AND instance = %s AND node = %s AND to_version = %s",
                   (plan, instance, node, version))
