"""What the supervisor reads and writes in PostgreSQL: one instance's nodes, progress, lease and marks.

Every age is computed by PostgreSQL (``now() - …``), so the observer's clock does not matter;
times that are compared with file modification times (batch starts) are returned as epoch seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem.store.db import Database
from tandem.store.leases import record_event
from tandem.store.locks import AdvisoryLock

DRAINED, UNDRAINED = "DRAINED", "UNDRAINED"
"""Events that mark a node of a (plan, instance) as drained (kept down) or back in service."""
LAUNCH_EVENT = "LAUNCH"
"""A launch decision: the supervisor's launch budget counts these."""
RESTARTED = "RESTARTED"
RESET_EVENTS = (RESTARTED, UNDRAINED)
"""After one of these, the supervisor's launch budget of the node starts again."""
RESTORING, RESTORED = "RESTORING", "RESTORED"
"""A restore of a (plan, instance) began rolling its checkpoints and outputs back to a snapshot's cut; it ended."""


@dataclass(frozen=True)
class InstanceRows:
    """The raw rows of one (plan, instance) at one moment."""

    now_epoch: float
    instances: dict[str, dict[str, Any]]  # by node: plan_instances + liveness ages
    last_batch_start_epoch: dict[str, float]  # by node: oldest of each query's latest batch start in the window
    lease: dict[str, Any] | None
    drained: frozenset[str]
    recent_launches: dict[str, int]


def read_instance(db: Database, plan: str, instance: str, *, progress_window_s: float,
               launch_window_s: float) -> InstanceRows:
    """Read everything the observer needs about one (plan, instance) in one transaction."""

    def work(cursor) -> InstanceRows:
        params = {"plan": plan, "instance": instance, "window": progress_window_s, "launch_window": launch_window_s,
                  "drain_marks": [DRAINED, UNDRAINED], "launch": LAUNCH_EVENT, "resets": list(RESET_EVENTS)}
        cursor.execute("SELECT EXTRACT(EPOCH FROM now())::float8 AS now", params)
        now = cursor.fetchone()["now"]
        cursor.execute(
            """SELECT i.*, EXTRACT(EPOCH FROM now() - l.beat_at)::float8 AS beat_age_s,
                      EXTRACT(EPOCH FROM now() - i.launched_at)::float8 AS launched_age_s,
                      EXTRACT(EPOCH FROM now() - i.started_at)::float8 AS started_age_s,
                      EXTRACT(EPOCH FROM i.started_at)::float8 AS started_epoch, l.beat_at,
                      EXTRACT(EPOCH FROM now() - l.work_at)::float8 AS work_age_s
               FROM plan_instances i LEFT JOIN liveness l USING (instance_id)
               WHERE i.plan = %(plan)s AND i.instance = %(instance)s""", params)
        instances = {row["node"]: dict(row) for row in cursor.fetchall()}
        # Only the last `window` seconds of progress rows are read (an index range scan): older
        # progress is as good as none for deciding whether an instance stalled.
        cursor.execute(
            """SELECT p.node, min(q.batch_start)::float8 AS batch_start FROM (
                   SELECT h.instance_id, h.query_name,
                          max(EXTRACT(EPOCH FROM h.recorded_at) - COALESCE(h.batch_duration_ms, 0) / 1000.0)
                              AS batch_start
                   FROM heartbeats h JOIN plan_instances i USING (instance_id)
                   WHERE i.plan = %(plan)s AND i.instance = %(instance)s
                     AND h.recorded_at >= now() - make_interval(secs => %(window)s)
                     AND h.recorded_at >= i.started_at
                   GROUP BY h.instance_id, h.query_name) q
               JOIN plan_instances p USING (instance_id) GROUP BY p.node""", params)
        batch_starts = {row["node"]: row["batch_start"] for row in cursor.fetchall()}
        cursor.execute(
            """SELECT holder, epoch, ttl_s, expires_at, acquired_at, expires_at > now() AS valid,
                      EXTRACT(EPOCH FROM now() - expires_at)::float8 AS expired_for_s
               FROM leases WHERE plan = %(plan)s AND instance = %(instance)s""", params)
        lease = cursor.fetchone()
        cursor.execute(
            """SELECT DISTINCT ON (node) node, kind FROM failover_events
               WHERE plan = %(plan)s AND instance = %(instance)s AND kind = ANY(%(drain_marks)s)
               ORDER BY node, happened_at DESC, id DESC""", params)
        drained = frozenset(row["node"] for row in cursor.fetchall() if row["kind"] == DRAINED)
        cursor.execute(
            """SELECT e.node, count(*) AS launches FROM failover_events e
               WHERE e.plan = %(plan)s AND e.instance = %(instance)s AND e.kind = %(launch)s
                 AND e.happened_at > now() - make_interval(secs => %(launch_window)s)
                 AND e.happened_at > COALESCE((
                     SELECT max(r.happened_at) FROM failover_events r
                     WHERE r.plan = e.plan AND r.instance = e.instance AND r.node = e.node
                       AND r.kind = ANY(%(resets)s)), '-infinity')
               GROUP BY e.node""", params)
        launches = {row["node"]: int(row["launches"]) for row in cursor.fetchall()}
        return InstanceRows(now, instances, batch_starts, dict(lease) if lease else None, drained, launches)

    return db.run(work, attempts=3)


def hand_over(db: Database, plan: str, instance: str, from_node: str, epoch: int, to_node: str,
              reason: str) -> int | None:
    """Give the lease held by ``from_node`` at ``epoch`` to ``to_node`` (compare-and-set, epoch + 1).

    ``from_node`` finds its next renewal refused and demotes itself; the standby on ``to_node``
    takes the lease that names its node on its next beat (with another epoch). Returns the
    handed-over epoch, or ``None`` when ``from_node`` no longer held the lease at ``epoch``.
    """

    def work(cursor) -> int | None:
        # FOR UPDATE waits for a publish in progress (its fence check holds the row FOR KEY SHARE)
        cursor.execute("""SELECT 1 FROM leases WHERE plan = %s AND instance = %s AND holder = %s AND epoch = %s
                          FOR UPDATE""", (plan, instance, from_node, epoch))
        if cursor.fetchone() is None:
            return None
        cursor.execute(
            """UPDATE leases SET holder = %s, epoch = epoch + 1, acquired_at = now(), renewed_at = now(),
                                 expires_at = now() + make_interval(secs => ttl_s)
               WHERE plan = %s AND instance = %s AND holder = %s AND epoch = %s RETURNING epoch""",
            (to_node, plan, instance, from_node, epoch))
        row = cursor.fetchone()
        if row is None:
            return None
        record_event(cursor, plan, instance, "HANDOVER", reason, node=to_node, previous_node=from_node,
                     epoch=row["epoch"])
        return int(row["epoch"])

    return db.run(work)


def mark(db: Database, plan: str, instance: str, kind: str, reason: str, *, node: str | None = None,
         previous_node: str | None = None, epoch: int | None = None, detail: dict[str, Any] | None = None) -> None:
    """Record one supervision event (a decision, an action and its outcome, a drain mark)."""
    db.run(lambda cursor: record_event(cursor, plan, instance, kind, reason, node=node, previous_node=previous_node,
                                       epoch=epoch, detail=detail))


def instance_role(db: Database, plan: str, instance: str, node: str) -> dict[str, Any] | None:
    """The role and epoch an instance last recorded, with its status."""

    def work(cursor):
        cursor.execute("""SELECT role, epoch, status FROM plan_instances
                          WHERE plan = %s AND instance = %s AND node = %s""", (plan, instance, node))
        return cursor.fetchone()

    return db.run(work, attempts=3)


def latest_progress(db: Database, plan: str) -> dict[str, dict[str, Any]]:
    """Per instance of ``plan``: its newest progress row that carries a watermark, with ages."""

    def work(cursor):
        cursor.execute(
            """SELECT i.instance_id, h.batch_id, h.watermark,
                      EXTRACT(EPOCH FROM now() - h.recorded_at)::float8 AS batch_age_s,
                      EXTRACT(EPOCH FROM now() - h.watermark)::float8 AS lag_s
               FROM plan_instances i CROSS JOIN LATERAL (
                   SELECT batch_id, watermark, recorded_at FROM heartbeats
                   WHERE instance_id = i.instance_id AND watermark IS NOT NULL
                   ORDER BY recorded_at DESC LIMIT 1) h
               WHERE i.plan = %s""", (plan,))
        return {row["instance_id"]: dict(row) for row in cursor.fetchall()}

    return db.run(work, attempts=3)


def restore_lock(database_url: str, plan: str, instance: str) -> AdvisoryLock:
    """Held by a restore of (plan, instance) while it puts a snapshot's cut into the checkpoints and rolls the
    outputs back: a node it launched meanwhile (so that its JVM starts in parallel) waits for it at start."""
    return AdvisoryLock(database_url, "restore", f"{plan}/{instance}")


def unfinished_restore(db: Database, plan: str, instance: str) -> dict[str, Any] | None:
    """The newest RESTORING event of (plan, instance) when no RESTORED event followed it: a restore that stopped
    half-way (its checkpoints and outputs may be neither at the cut nor as they were); ``None`` otherwise."""

    def work(cursor):
        cursor.execute("""SELECT kind, happened_at, reason FROM failover_events
                          WHERE plan = %s AND instance = %s AND kind IN (%s, %s)
                          ORDER BY happened_at DESC, id DESC LIMIT 1""", (plan, instance, RESTORING, RESTORED))
        row = cursor.fetchone()
        return dict(row) if row and row["kind"] == RESTORING else None

    return db.run(work, attempts=3)
