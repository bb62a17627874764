"""What ``tandem exporter`` reads besides a plan's status (:mod:`tandem.monitoring`): every plan's published
batches, role changes, engine figures, snapshots, relays and batch job runs. Ages are in seconds by PostgreSQL's
clock, so they do not depend on the exporter's host clock."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from tandem.store.db import Database
from tandem.store.leases import ROLE_CHANGES

RECENT = timedelta(minutes=10)
"""How far back a counter's first reading collects the rows it has seen (:mod:`tandem.monitoring.tally`): longer
than any publishing transaction stays open."""
PENDING_CAP = 1_000_000
"""A relay's pending events are counted up to this many (a count of a bigger backlog would cost a scan)."""


def _repeatable(cursor) -> None:
    """The reads of this transaction see one snapshot (a total and the rows after it agree)."""
    cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")


Reading = tuple[list[dict[str, Any]], list[dict[str, Any]], datetime]


def _since(cursor, since: datetime | None) -> datetime:
    """``since``, or (a first reading) PostgreSQL's now less :data:`RECENT`."""
    if since is not None:
        return since
    cursor.execute("SELECT now() - %s AS since", (RECENT,))
    return cursor.fetchone()["since"]


def published_rows(db: Database, since: datetime | None) -> Reading:
    """``(totals, recent, since)``: with ``since`` None, the rows published so far per (plan, instance, output);
    the published batches recorded at or after ``since`` (:data:`RECENT` back from now when None), each with its
    key (``instance_id``, ``output``, ``batch_id``), ``rows`` and ``at``; and that ``since``. One snapshot."""

    def work(cursor):
        _repeatable(cursor)
        start = _since(cursor, since)
        totals = []
        if since is None:
            cursor.execute("""SELECT plan, instance, output, sum(rows)::bigint AS value FROM publish_log
                              GROUP BY plan, instance, output""")
            totals = [dict(row) for row in cursor.fetchall()]
        cursor.execute(
            """SELECT plan, instance, output, instance_id, batch_id, rows AS value, published_at AS at
               FROM publish_log WHERE published_at >= %s""", (start,))
        return totals, [dict(row) for row in cursor.fetchall()], start

    return db.run(work, attempts=3)


def role_changes(db: Database, since: datetime | None) -> Reading:
    """``(totals, recent, since)`` as :func:`published_rows` says, for the role changes of ``failover_events``
    (``value`` 1 each): totals per (plan, instance, kind, ``moved``: whether the node changed)."""
    changed = "previous_node IS NOT NULL AND previous_node IS DISTINCT FROM node"

    def work(cursor):
        _repeatable(cursor)
        start = _since(cursor, since)
        totals = []
        if since is None:
            cursor.execute(f"""SELECT plan, instance, kind, ({changed}) AS moved, count(*)::bigint AS value
                               FROM failover_events WHERE kind = ANY(%s) GROUP BY 1, 2, 3, 4""", (list(ROLE_CHANGES),))
            totals = [dict(row) for row in cursor.fetchall()]
        cursor.execute(
            f"""SELECT id, plan, instance, kind, ({changed}) AS moved, 1 AS value, happened_at AS at
                FROM failover_events
                WHERE kind = ANY(%s) AND happened_at >= %s""", (list(ROLE_CHANGES), start))
        return totals, [dict(row) for row in cursor.fetchall()], start

    return db.run(work, attempts=3)


def engine_figures(db: Database) -> list[dict[str, Any]]:
    """Per instance row (plan, instance, node) and query: the figures of its newest batch (rates, duration, state
    rows and memory) and the batch's age."""

    def work(cursor):
        cursor.execute(
            """SELECT i.plan, i.instance, i.node, h.query_name, h.batch_id, h.input_rows_per_s, h.processed_rows_per_s,
                      h.batch_duration_ms, h.state_rows, h.state_memory_bytes
               FROM plan_instances i CROSS JOIN LATERAL (
                   SELECT DISTINCT ON (query_name) * FROM heartbeats
                   WHERE instance_id = i.instance_id
                   ORDER BY query_name, recorded_at DESC) h""")
        return [dict(row) for row in cursor.fetchall()]

    return db.run(work, attempts=3)


def snapshot_ages(db: Database) -> list[dict[str, Any]]:
    """Per (plan, instance) with a snapshot: the age of its newest GOOD one (null: none) and the status and age of its
    newest completed one (GOOD or BAD)."""

    def work(cursor):
        cursor.execute(
            """SELECT plan, instance,
                      EXTRACT(EPOCH FROM clock_timestamp()
                              - max(completed_at) FILTER (WHERE status = 'GOOD'))::float8 AS good_age_s,
                      (array_agg(status ORDER BY completed_at DESC) FILTER (WHERE status IN ('GOOD', 'BAD')))[1]
                          AS last_status
               FROM snapshots WHERE completed_at IS NOT NULL GROUP BY plan, instance""")
        return [dict(row) for row in cursor.fetchall()]

    return db.run(work, attempts=3)


def relay_positions(db: Database) -> list[dict[str, Any]]:
    """Per (plan, output) an events relay has published to NATS: the stream's last sequence the relay recorded, the
    seconds since it moved, and the events the outbox holds after it (counted up to :data:`PENDING_CAP`)."""

    def work(cursor):
        cursor.execute(
            """SELECT s.plan, s.output, s.stream_seq, EXTRACT(EPOCH FROM now() - s.updated_at)::float8 AS age_s,
                      (SELECT count(*) FROM (SELECT 1 FROM output_events e
                                             WHERE e.plan = s.plan AND e.output = s.output
                                               AND (e.xid, e.event_id) > (s.xid::text::xid8, s.event_id)
                                             LIMIT %s) pending) AS pending
               FROM output_streams s""", (PENDING_CAP,))
        return [dict(row) for row in cursor.fetchall()]

    return db.run(work, attempts=3)


def job_runs(db: Database) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(counts, last)``: finished runs per (plan, job, result); and per (plan, job) its newest finished run: result,
    duration and age in seconds."""

    def work(cursor):
        cursor.execute("""SELECT plan, job, result, count(*)::bigint AS runs FROM job_runs
                          WHERE result <> 'RUNNING' GROUP BY plan, job, result""")
        counts = [dict(row) for row in cursor.fetchall()]
        cursor.execute(
            """SELECT DISTINCT ON (plan, job) plan, job, result,
                      EXTRACT(EPOCH FROM finished_at - started_at)::float8 AS duration_s,
                      EXTRACT(EPOCH FROM clock_timestamp() - finished_at)::float8 AS age_s
               FROM job_runs WHERE result <> 'RUNNING' ORDER BY plan, job, finished_at DESC""")
        return counts, [dict(row) for row in cursor.fetchall()]

    return db.run(work, attempts=3)
