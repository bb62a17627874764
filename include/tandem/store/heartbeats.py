"""Heartbeats: per-batch progress rows and the per-instance liveness beat."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime

from tandem.store.db import Database, storable_text


@dataclass(frozen=True)
class BatchProgress:
    """What one completed micro-batch reported (from ``StreamingQueryProgress``)."""

    instance_id: str
    plan: str
    instance: str
    node: str
    query_name: str
    query_id: str
    run_id: str
    batch_id: int
    input_rows: int
    input_rows_per_s: float | None
    processed_rows_per_s: float | None
    batch_duration_ms: int | None
    watermark: datetime | None
    state_rows: int | None
    late_rows: int | None
    quarantined_rows: int | None
    state_memory_bytes: int | None = None


def record_progress(db: Database, progress: BatchProgress) -> None:
    row = asdict(progress)
    columns = ", ".join(row)
    placeholders = ", ".join(f"%({name})s" for name in row)
    db.run(lambda cursor: cursor.execute(f"INSERT INTO heartbeats ({columns}) VALUES ({placeholders})", row))


def beat(db: Database, instance_id: str, host: str, pid: int, started_at: datetime,
         work_advanced: bool = False) -> str | None:
    """Record one liveness beat (independent of micro-batches); ``work_advanced``: the driver saw Spark work of
    the instance advance since its previous beat (``work_at`` becomes now; a new run starts with none).

    Returns who asked this instance to stop (:func:`tandem.store.registry.request_stop`), ``None``
    when nobody did.
    """
    def work(cursor) -> str | None:
        cursor.execute(
            """INSERT INTO liveness (instance_id, host, pid, beat_at, beats, started_at, work_at)
               VALUES (%(id)s, %(host)s, %(pid)s, now(), 1, %(started)s, CASE WHEN %(advanced)s THEN now() END)
               ON CONFLICT (instance_id) DO UPDATE
               SET host = EXCLUDED.host, pid = EXCLUDED.pid, beat_at = now(),
                   beats = CASE WHEN liveness.started_at = EXCLUDED.started_at THEN liveness.beats + 1 ELSE 1 END,
                   work_at = CASE WHEN %(advanced)s THEN now()
                                  WHEN liveness.started_at = EXCLUDED.started_at THEN liveness.work_at END,
                   started_at = EXCLUDED.started_at""",
            {"id": instance_id, "host": host, "pid": pid, "started": started_at, "advanced": work_advanced})
        cursor.execute(
            """SELECT stop_requested_by FROM plan_instances
               WHERE instance_id = %s AND stop_requested_at IS NOT NULL""", (instance_id,))
        row = cursor.fetchone()
        return row["stop_requested_by"] if row else None

    return db.run(work, attempts=1)


def record_relay_error(db: Database, instance_id: str, error: str | None) -> None:
    """Record why the instance's relay of its events outputs to NATS fails (``None``: it goes through again);
    ``tandem status`` and the Tandem page show it beside the instance (migration 017)."""
    db.run(lambda cursor: cursor.execute(
        """UPDATE plan_instances SET relay_error = %(error)s,
                  relay_error_at = CASE WHEN %(error)s::text IS NULL THEN NULL
                                        WHEN relay_error IS NOT DISTINCT FROM %(error)s THEN relay_error_at
                                        ELSE now() END
           WHERE instance_id = %(id)s""", {"id": instance_id, "error": storable_text(error)}), attempts=1)


def input_rows_since(db: Database, plan: str, query_name: str, since: datetime) -> int:
    """Input lines read by ``query_name`` of every instance of ``plan`` in batches recorded since ``since``."""

    def work(cursor):
        cursor.execute(
            """SELECT COALESCE(SUM(input_rows), 0) AS rows FROM heartbeats
               WHERE plan = %s AND query_name = %s AND recorded_at >= %s""",
            (plan, query_name, since),
        )
        return int(cursor.fetchone()["rows"])

    return db.run(work)



def query_positions(db: Database, plan: str, since: datetime) -> dict[tuple[str, str], tuple[datetime | None, datetime]]:
    """Per (instance, query) of ``plan`` with batches recorded since ``since``: the newest event-time watermark
    (``None`` for a query without one) and when its last batch was recorded."""

    def work(cursor):
        cursor.execute(
            """SELECT instance_id, query_name, max(watermark) AS watermark, max(recorded_at) AS recorded_at
               FROM heartbeats WHERE plan = %s AND recorded_at >= %s GROUP BY instance_id, query_name""",
            (plan, since))
        return {(row["instance_id"], row["query_name"]): (row["watermark"], row["recorded_at"])
                for row in cursor.fetchall()}

    return db.run(work)


def state_rows_after(db: Database, instance_id: str, query: str, query_id: str | None, batch_id: int) -> int | None:
    """The state rows Spark counted after ``batch_id`` of ``query`` (of run ``query_id`` if given), as the
    listener recorded them (the newest record), or ``None`` if none is recorded (yet)."""

    def work(cursor) -> int | None:
        cursor.execute(
            """SELECT state_rows FROM heartbeats
               WHERE instance_id = %s AND query_name = %s AND batch_id = %s
                 AND (%s::uuid IS NULL OR query_id = %s::uuid)
               ORDER BY recorded_at DESC LIMIT 1""", (instance_id, query, batch_id, query_id, query_id))
        row = cursor.fetchone()
        return None if row is None else row["state_rows"]

    return db.run(work, attempts=3)


def newest_watermarks(db: Database, plan: str) -> dict[tuple[str, str], datetime]:
    """Per (instance, query) of ``plan``: its newest recorded event-time watermark (not the highest ever: a restore
    takes an instance back to an earlier one), of those recorded since the instance's last restore began (until a
    restored instance records one, the watermark of the state it left is not its own: it has none)."""

    def work(cursor):
        cursor.execute(
            """SELECT DISTINCT ON (instance_id, query_name) instance_id, query_name, watermark FROM heartbeats h
               WHERE plan = %s AND watermark IS NOT NULL
                 AND NOT EXISTS (SELECT 1 FROM failover_events f WHERE f.plan = h.plan AND f.instance = h.instance
                                 AND f.kind = 'RESTORING' AND f.happened_at > h.recorded_at)
               ORDER BY instance_id, query_name, recorded_at DESC""",
            (plan,))
        return {(row["instance_id"], row["query_name"]): row["watermark"] for row in cursor.fetchall()}

    return db.run(work)


def current_run_totals(db: Database, instance_id: str) -> tuple[list[dict], list[dict]]:
    """What the instance's current (or last) run did, since its driver recorded its start
    (``plan_instances.started_at``): per query the batches, rows read and lines quarantined its progress rows say
    (``query_name``, ``batches``, ``input_rows``, ``quarantined_rows``: null when the query counts none); per output
    the batches and rows it published (``output``, ``batches``, ``rows``). Both sorted by name; empty when the
    instance never started."""

    def work(cursor) -> tuple[list[dict], list[dict]]:
        cursor.execute(
            """SELECT h.query_name, count(*)::int AS batches, sum(h.input_rows)::bigint AS input_rows,
                      sum(h.quarantined_rows)::bigint AS quarantined_rows
               FROM heartbeats h JOIN plan_instances i USING (instance_id)
               WHERE h.instance_id = %s AND h.recorded_at >= i.started_at
               GROUP BY h.query_name ORDER BY h.query_name""", (instance_id,))
        queries = [dict(row) for row in cursor.fetchall()]
        cursor.execute(
            """SELECT p.output, count(*)::int AS batches, sum(p.rows)::bigint AS rows
               FROM publish_log p JOIN plan_instances i USING (instance_id)
               WHERE p.instance_id = %s AND p.published_at >= i.started_at
               GROUP BY p.output ORDER BY p.output""", (instance_id,))
        return queries, [dict(row) for row in cursor.fetchall()]

    return db.run(work, attempts=3)
