"""A plan's own rows in the coordination tables: whether any instance of it runs, how many rows it has, and deleting
them all when the plan is reset (:mod:`tandem.plan_reset`). Its outputs' rows are each output kind's
(:meth:`tandem.outputs.base.OutputKind.reset`)."""

from __future__ import annotations

from typing import Any

from psycopg2 import sql

from tandem.store.db import Database

PLAN_TABLES = ("plan_instances", "heartbeats", "publish_log", "leases", "failover_events", "snapshots", "backfills",
               "retention_horizons", "job_runs")
"""Tandem's tables with a ``plan`` column: the instances (their ``liveness`` rows go with them), their progress and
published positions, the leases, the supervision events, the snapshot catalog, the backfills, the retention
horizons and the batch jobs' runs."""


def instances_and_leases(db: Database, plan: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The plan's instance rows (with their liveness beat's and launch's ages, in seconds by PostgreSQL's clock) and
    its lease rows (with ``valid`` and the seconds left, negative once expired)."""

    def work(cursor) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        cursor.execute(
            """SELECT i.*, EXTRACT(EPOCH FROM now() - l.beat_at)::float8 AS beat_age_s,
                      EXTRACT(EPOCH FROM now() - i.launched_at)::float8 AS launched_age_s
               FROM plan_instances i LEFT JOIN liveness l USING (instance_id)
               WHERE i.plan = %s ORDER BY i.instance, i.node""", (plan,))
        instances = [dict(row) for row in cursor.fetchall()]
        cursor.execute(
            """SELECT instance, holder, epoch, holder IS NOT NULL AND expires_at > now() AS valid,
                      EXTRACT(EPOCH FROM expires_at - now())::float8 AS left_s
               FROM leases WHERE plan = %s ORDER BY instance""", (plan,))
        return instances, [dict(row) for row in cursor.fetchall()]

    return db.run(work, attempts=3)


def count_plan_rows(db: Database, plan: str) -> dict[str, int]:
    """How many rows of ``plan`` each of :data:`PLAN_TABLES` holds (only those with some)."""

    def work(cursor) -> dict[str, int]:
        counts = {}
        for table in PLAN_TABLES:
            cursor.execute(sql.SQL("SELECT count(*) AS n FROM {} WHERE plan = %s").format(sql.Identifier(table)),
                           (plan,))
            counts[table] = int(cursor.fetchone()["n"])
        return {table: n for table, n in counts.items() if n}

    return db.run(work, attempts=3)


def delete_plan_rows(db: Database, plan: str) -> dict[str, int]:
    """Delete every row of ``plan`` from :data:`PLAN_TABLES` in one transaction; how many went from each (only those
    with some). The instances' ``liveness`` rows go with them (``ON DELETE CASCADE``)."""

    def work(cursor) -> dict[str, int]:
        deleted = {}
        for table in PLAN_TABLES:
            cursor.execute(sql.SQL("DELETE FROM {} WHERE plan = %s").format(sql.Identifier(table)), (plan,))
            deleted[table] = cursor.rowcount
        return {table: n for table, n in deleted.items() if n}

    return db.run(work, attempts=3)
