"""Delete a plan's old bookkeeping rows from PostgreSQL, keeping the newest row of each kind something reads.

Each function deletes the rows of one table older than a cutoff, in chunks of :data:`CHUNK` rows, one short
transaction each (a running plan writes to these tables all the time and must not wait on a long delete), and
returns how many rows went. What stays whatever its age, and who reads it:

- ``heartbeats``: each (instance, query)'s newest row (the page's and the supervisor's last progress);
- ``publish_log``: each (instance, output)'s newest batch, and the row holding the furthest published position
  of each (plan, instance, output) (a hot standby trims its held outputs by it);
- ``failover_events``: each (instance, node, kind)'s newest event (drain marks, the page's last role change);
- ``output_contributions``: those not in the lake yet (a standby copies them after a failover);
- aggregation partials: only the named granularity's rows go; coarser buckets stay.

Deleted and updated rows leave dead row versions that only VACUUM makes reusable; :func:`vacuum_bloated` runs it
on the tables that need it (autovacuum's own rule), so the tables stay bounded where autovacuum is off or behind.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import Any

from psycopg2 import sql

from tandem.store.db import Database

CHUNK = 20_000
"""Rows deleted per transaction."""
VACUUM_BASE_ROWS = 50
VACUUM_SCALE = 0.2
"""A table needs VACUUM once its dead rows pass ``VACUUM_BASE_ROWS + VACUUM_SCALE * live rows`` (PostgreSQL's
defaults for autovacuum)."""


def _delete_in_chunks(db: Database, table: str | sql.Composable, where: str, params: dict[str, Any]) -> int:
    """Delete the rows of ``table`` matching ``where`` (SQL over alias ``t`` and ``params``), chunk by chunk."""
    statement = sql.SQL("DELETE FROM {table} WHERE ctid = ANY(ARRAY(SELECT t.ctid FROM {table} t WHERE {where} "
                        "LIMIT %(chunk)s))").format(
        table=sql.Identifier(table) if isinstance(table, str) else table, where=sql.SQL(where))
    deleted = 0
    while True:
        def work(cursor) -> int:
            cursor.execute(statement, {**params, "chunk": CHUNK})
            return cursor.rowcount

        count = db.run(work, attempts=3)
        deleted += count
        if count < CHUNK:
            return deleted


def trim_heartbeats(db: Database, plan: str, before: datetime) -> int:
    """Delete ``plan``'s progress rows recorded before ``before``, but each (instance, query)'s newest."""
    return _delete_in_chunks(db, "heartbeats", """t.plan = %(plan)s AND t.recorded_at < %(before)s
        AND EXISTS (SELECT 1 FROM heartbeats n WHERE n.instance_id = t.instance_id AND n.query_name = t.query_name
                    AND (n.recorded_at, n.id) > (t.recorded_at, t.id))""", {"plan": plan, "before": before})


def trim_publish_log(db: Database, plan: str, before: datetime) -> int:
    """Delete ``plan``'s published positions logged before ``before``, but each (instance, output)'s newest batch
    and each (instance, output)'s furthest position."""
    return _delete_in_chunks(db, "publish_log", """t.plan = %(plan)s AND t.published_at < %(before)s
        AND EXISTS (SELECT 1 FROM publish_log n WHERE n.instance_id = t.instance_id AND n.output = t.output
                    AND n.batch_id > t.batch_id)
        AND (t.watermark IS NULL OR EXISTS (
            SELECT 1 FROM publish_log w WHERE w.plan = t.plan AND w.instance = t.instance AND w.output = t.output
            AND (w.watermark, w.batch_id, w.instance_id) > (t.watermark, t.batch_id, t.instance_id)))""",
                             {"plan": plan, "before": before})


def trim_failover_events(db: Database, plan: str, before: datetime) -> int:
    """Delete ``plan``'s supervision events before ``before``, but each (instance, node, kind)'s newest."""
    return _delete_in_chunks(db, "failover_events", """t.plan = %(plan)s AND t.happened_at < %(before)s
        AND EXISTS (SELECT 1 FROM failover_events n WHERE n.plan = t.plan AND n.instance = t.instance
                    AND n.node IS NOT DISTINCT FROM t.node AND n.kind = t.kind
                    AND (n.happened_at, n.id) > (t.happened_at, t.id))""", {"plan": plan, "before": before})


def trim_contributions(db: Database, plan: str, instance: str, before: datetime) -> int:
    """Delete the contribution ids of ``plan``'s instance ``instance`` applied before ``before`` and in the lake."""
    return _delete_in_chunks(db, "output_contributions", """t.plan = %(plan)s AND t.applied_at < %(before)s
        AND t.instance = %(instance)s AND t.in_lake""", {"plan": plan, "instance": instance, "before": before})


def trim_events(db: Database, plan: str, instance: str, before: datetime, relayed_outputs: list[str],
                output: str | None = None) -> int:
    """Delete the events ``plan``'s instance ``instance`` published before ``before`` (of ``output``, or of every
    output) that are in the lake and, for an output in ``relayed_outputs`` (published to a NATS stream), at or
    before the position its relay recorded."""
    return _delete_in_chunks(db, "output_events", """t.plan = %(plan)s AND t.instance = %(instance)s
        AND (%(output)s::text IS NULL OR t.output = %(output)s)
        AND t.published_at < %(before)s AND t.in_lake
        AND (t.output <> ALL(%(relayed)s) OR EXISTS (
            SELECT 1 FROM output_streams s WHERE s.plan = t.plan AND s.output = t.output
            AND (t.xid, t.event_id) <= (s.xid::text::xid8, s.event_id)))""",
                             {"plan": plan, "instance": instance, "before": before, "relayed": relayed_outputs,
                              "output": output})


def trim_table_rows(db: Database, plan: str, output: str, before: datetime) -> int:
    """Delete the keys of ``plan``'s table output ``output`` last updated before ``before``."""
    return _delete_in_chunks(db, "output_table_rows", "t.plan = %(plan)s AND t.output = %(output)s "
                                                      "AND t.updated_at < %(before)s",
                             {"plan": plan, "output": output, "before": before})


def trim_partials(db: Database, table: str, plan: str, granularity: str, before: datetime) -> int:
    """Delete ``plan``'s aggregation partials of ``granularity`` whose bucket starts before ``before``."""
    def exists(cursor) -> bool:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL AS found", (sql.Identifier(table).as_string(cursor),))
        return cursor.fetchone()["found"]

    if not db.run(exists, attempts=3):  # created by the first publish
        return 0
    return _delete_in_chunks(db, table, "t.plan = %(plan)s AND t.granularity = %(granularity)s "
                                        "AND t.bucket_start < %(before)s",
                             {"plan": plan, "granularity": granularity, "before": before})


def needs_vacuum(live_rows: int, dead_rows: int) -> bool:
    """Whether a table's dead row versions pass autovacuum's default threshold (pure)."""
    return dead_rows > VACUUM_BASE_ROWS + VACUUM_SCALE * live_rows


def vacuum_bloated(db: Database, trimmed: AbstractSet[str] = frozenset()) -> list[str]:
    """``VACUUM (ANALYZE)`` the tables of Tandem's schema that :func:`needs_vacuum` by PostgreSQL's statistics, and
    those in ``trimmed`` (rows just deleted: the statistics may not count them yet); returns the tables vacuumed.

    A table another VACUUM holds is skipped (``SKIP_LOCKED``); VACUUM does not block the plans' reads and writes."""
    def tables(cursor) -> list[str]:
        cursor.execute("SELECT relname, n_live_tup, n_dead_tup FROM pg_stat_user_tables "
                       "WHERE schemaname = current_schema() ORDER BY relname")
        return [row["relname"] for row in cursor.fetchall()
                if row["relname"] in trimmed or needs_vacuum(row["n_live_tup"], row["n_dead_tup"])]

    due = db.run(tables, attempts=3)
    conn = db.connection()
    conn.autocommit = True  # VACUUM cannot run inside a transaction
    try:
        with conn.cursor() as cursor:
            for table in due:
                cursor.execute(sql.SQL("VACUUM (ANALYZE, SKIP_LOCKED) {}").format(sql.Identifier(table)))
    finally:
        if not conn.closed:  # a lost connection raises its own error; Database opens a new one next time
            conn.autocommit = False
    return due


def record_horizon(db: Database, plan: str, what: str, before: datetime) -> None:
    """Record that ``plan``'s rows of kind ``what`` older than ``before`` may be gone (the newest such instant
    stays)."""
    db.run(lambda cursor: cursor.execute(
        """INSERT INTO retention_horizons (plan, what, before) VALUES (%s, %s, %s)
           ON CONFLICT (plan, what) DO UPDATE SET before = GREATEST(retention_horizons.before, EXCLUDED.before),
                                                  updated_at = now()""", (plan, what, before)), attempts=3)


def horizons(db: Database, plan: str) -> dict[str, datetime]:
    """Per kind of row of ``plan`` the retention deleted some of: rows older than this may be gone."""
    def work(cursor) -> dict[str, datetime]:
        cursor.execute("SELECT what, before FROM retention_horizons WHERE plan = %s", (plan,))
        return {row["what"]: row["before"] for row in cursor.fetchall()}
    return db.run(work, attempts=3)
