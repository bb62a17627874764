"""A plan's PostgreSQL retention: old bookkeeping rows deleted by the maintenance DAG, as the plan declares.

``maintenance.retention`` (:class:`tandem.config.RetentionConfig`) says how long each kind of row is kept; the
deletes and what they always keep are :mod:`tandem.store.trim`'s. Ages are measured on PostgreSQL's clock.
Contribution ids are kept longer when a kept snapshot needs them: a restore replays the input after the
snapshot's cut, and each row the replay brings again must find its id to be applied once; so no id applied
after the earliest commit of an instance's oldest TAKING or GOOD snapshot's cut (its ``replay_from``, less
:data:`CLOCK_MARGIN`) goes (:func:`replay_needs_since`, :func:`tandem.outputs.base.contributions_cutoff`); each
output kind trims its own rows (:meth:`tandem.outputs.base.OutputKind.trim`).
Then the tables with many dead rows are vacuumed (:func:`tandem.store.trim.vacuum_bloated`): deleted rows only
free their space for new ones after a VACUUM, and autovacuum may be off.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from tandem.config import PlanConfig
from tandem.outputs import kind_of
from tandem.outputs.base import RetentionRun, Trimmed
from tandem.snapshots.takers import abandon_stale
from tandem.store import Database
from tandem.store import snapshots as catalog
from tandem.store import trim
from tandem.store.locks import plan_lock

SNAPSHOT_MARGIN = timedelta(hours=1)
"""For a snapshot that recorded no ``replay_from`` (taken before it was): how much earlier than its start
contribution ids stay (a batch published before the cut started but not committed in it is replayed)."""
CLOCK_MARGIN = timedelta(minutes=5)
"""``replay_from`` comes from the checkpoint storage's clock (a commit file's age), ``applied_at`` from
PostgreSQL's: the ids stay this much longer, for clocks that disagree."""


@dataclass(frozen=True)
class Retention:
    """What one retention run of a plan did: rows deleted per table and granularity, tables vacuumed."""

    trimmed: list[Trimmed]
    vacuumed: list[str]

    def describe(self) -> list[str]:
        return [part.describe() for part in self.trimmed] + [
            f"vacuumed (dead rows made reusable): {', '.join(self.vacuumed) or 'none needed'}"]


def contributions_horizon(instance: str) -> str:
    """The name an instance's trimmed contribution ids are recorded under."""
    return f"contributions/{instance}"


def replay_needs_since(snapshot: catalog.SnapshotRecord) -> datetime:
    """The earliest ``applied_at`` of a contribution a restore from ``snapshot`` may bring again (pure)."""
    if snapshot.replay_from is None:
        return snapshot.taken_at - SNAPSHOT_MARGIN
    return min(snapshot.replay_from, snapshot.taken_at) - CLOCK_MARGIN


def trim_plan_rows(plan: PlanConfig, db: Database) -> Retention:
    """Delete ``plan``'s PostgreSQL rows older than its declared retention (what :mod:`tandem.store.trim` keeps
    stays; one :class:`Trimmed` per table and granularity), then vacuum the tables that need it."""
    with plan_lock(db.url, plan.name, "PostgreSQL retention"):
        retention = plan.maintenance.retention
        now = catalog.database_now(db)

        def ago(seconds: float) -> datetime:
            return now - timedelta(seconds=seconds)

        done = []
        for table, seconds, delete in (("heartbeats", retention.heartbeats_s, trim.trim_heartbeats),
                                       ("publish_log", retention.publish_log_s, trim.trim_publish_log),
                                       ("failover_events", retention.failover_events_s, trim.trim_failover_events)):
            done.append(Trimmed(table, delete(db, plan.name, ago(seconds)), ago(seconds)))
        needs: dict[str, datetime] = {}
        abandon_stale(db, plan.name)  # a TAKING snapshot whose taker is gone needs nothing
        for snapshot in catalog.list_snapshots(db, plan.name, statuses=(catalog.TAKING, catalog.GOOD)):
            since = replay_needs_since(snapshot)
            needs[snapshot.instance] = min(since, needs.get(snapshot.instance, since))
        run = RetentionRun(db, plan, now, needs)
        for instance in plan.instances:
            before = run.replay_cutoff(retention.contributions_s, instance)
            done.append(Trimmed("output_contributions", trim.trim_contributions(db, plan.name, instance, before),
                                before, f"instance {instance}"))
            if done[-1].rows:
                trim.record_horizon(db, plan.name, contributions_horizon(instance), before)
        for output in plan.outputs:
            done += kind_of(plan, output).trim(run, output)
        return Retention(done, trim.vacuum_bloated(db, {part.table for part in done if part.rows}))
