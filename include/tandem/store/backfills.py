"""``backfills``: the catalog of recomputations of a closed range of a plan's outputs (migration 011)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from psycopg2.extras import Json

from tandem.errors import BackfillRefused
from tandem.store.db import Database
from tandem.store.locks import lock_key

RUNNING, DONE, FAILED = "RUNNING", "DONE", "FAILED"
ABANDONED_AFTER_S = 600.0
"""How long after its registration a RUNNING backfill whose job holds no run lock (:func:`run_lock_name`) counts as
abandoned (its job was killed or its host lost, or it never started): a registration it overlaps marks it FAILED
instead of being refused by it forever. Long enough for a queued ``spark-submit`` to start on a loaded machine."""


def run_lock_name(backfill_id: str) -> str:
    """The advisory lock (scope ``backfill``) a backfill's job holds while it runs; its session ends with the job."""
    return f"run/{backfill_id}"


@dataclass(frozen=True)
class BackfillRecord:
    """One row of the catalog."""

    id: str
    plan: str
    range_start: datetime
    range_end: datetime
    instances: tuple[str, ...]
    status: str
    requested_by: str
    started_at: datetime
    finished_at: datetime | None = None
    report: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


    def outcome(self) -> str:
        """What the backfill changed, in words (or its error)."""
        if self.error:
            return self.error
        outcomes = [o for outputs in self.report.values() for o in outputs.values() if o.get("recomputed")]
        if not outcomes:
            return "running" if self.status == RUNNING else "nothing recomputed"
        replaced = [o for o in outcomes if "events_after" in o]
        parts = []
        if replaced:
            parts.append(f"{sum(o['events_after'] - o['events_before'] for o in replaced):+d} events in "
                         f"{sum(o['seconds_after'] for o in replaced)} seconds")
        published = sum(o.get("published", 0) for o in outcomes)
        if published or len(replaced) < len(outcomes):
            parts.append(f"{published} rows published once by id")
        return ", ".join(parts)


def _record(row: dict[str, Any]) -> BackfillRecord:
    return BackfillRecord(**{**row, "instances": tuple(row["instances"])})


def register(db: Database, plan: str, start: datetime, end: datetime, instances: list[str],
             requested_by: str) -> BackfillRecord:
    """Insert a RUNNING backfill of ``[start, end)``, or :class:`BackfillRefused` naming a RUNNING one it overlaps.

    Checked and inserted under the plan's backfill lock (a transaction-level advisory lock), so two requests at
    once cannot both pass the check. An overlapping one registered over :data:`ABANDONED_AFTER_S` ago whose run
    lock is free is abandoned: it is marked FAILED, saying so, and does not refuse this one.
    """
    backfill_id = f"{plan}-{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"

    def work(cursor) -> BackfillRecord:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", lock_key("backfill", plan))
        cursor.execute("""SELECT id, range_start, range_end, instances, started_at,
                                 now() - started_at > make_interval(secs => %s) AS old FROM backfills
                          WHERE plan = %s AND status = 'RUNNING' AND range_start < %s AND %s < range_end
                            AND instances && %s
                          ORDER BY started_at""", (ABANDONED_AFTER_S, plan, end, start, instances))
        for other in cursor.fetchall():
            if other["old"]:
                cursor.execute("SELECT pg_try_advisory_xact_lock(%s, %s) AS free",
                               lock_key("backfill", run_lock_name(other["id"])))
                if cursor.fetchone()["free"]:
                    cursor.execute("""UPDATE backfills SET status = 'FAILED', finished_at = now(), error = %s
                                      WHERE id = %s""",
                                   (f"abandoned: registered at {other['started_at'].isoformat()}, its job no longer "
                                    f"runs (killed, its host lost, or never started); found by {backfill_id}",
                                    other["id"]))
                    continue
            raise BackfillRefused(f"backfill {other['id']} of plan {plan} is running over "
                                  f"[{other['range_start'].isoformat()}, {other['range_end'].isoformat()}) for "
                                  f"{', '.join(other['instances'])}: it overlaps; wait for it to end")
        cursor.execute("""INSERT INTO backfills (id, plan, range_start, range_end, instances, requested_by)
                          VALUES (%s, %s, %s, %s, %s, %s) RETURNING *""",
                       (backfill_id, plan, start, end, instances, requested_by))
        return _record(cursor.fetchone())

    return db.run(work, attempts=3)


def finish(db: Database, backfill_id: str, status: str, report: dict[str, Any], error: str | None = None) -> None:
    """Mark a RUNNING backfill DONE or FAILED with its report (and error)."""
    db.run(lambda cursor: cursor.execute(
        """UPDATE backfills SET status = %s, report = %s, error = %s, finished_at = now()
           WHERE id = %s AND status = 'RUNNING'""", (status, Json(report), error, backfill_id)), attempts=3)


def get_backfill(db: Database, backfill_id: str) -> BackfillRecord | None:
    def work(cursor) -> BackfillRecord | None:
        cursor.execute("SELECT * FROM backfills WHERE id = %s", (backfill_id,))
        row = cursor.fetchone()
        return None if row is None else _record(row)

    return db.run(work, attempts=3)


def list_backfills(db: Database, plan: str, limit: int = 20) -> list[BackfillRecord]:
    """A plan's backfills, newest first."""
    def work(cursor) -> list[BackfillRecord]:
        cursor.execute("SELECT * FROM backfills WHERE plan = %s ORDER BY started_at DESC, id LIMIT %s", (plan, limit))
        return [_record(row) for row in cursor.fetchall()]

    return db.run(work, attempts=3)


def done_since(db: Database, plan: str, since: datetime) -> list[BackfillRecord]:
    """A plan's DONE backfills that finished after ``since``, oldest first."""
    def work(cursor) -> list[BackfillRecord]:
        cursor.execute("SELECT * FROM backfills WHERE plan = %s AND status = 'DONE' AND finished_at > %s "
                       "ORDER BY finished_at, id", (plan, since))
        return [_record(row) for row in cursor.fetchall()]

    return db.run(work, attempts=3)
