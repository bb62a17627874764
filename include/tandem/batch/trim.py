"""A plan's PostgreSQL retention: old bookkeeping rows deleted by the maintenance DAG, as the plan declares.

``maintenance.retention`` (:class:`tandem.config.RetentionConfig`) says how long each kind of row is kept; the
deletes and what they always keep are :mod:`tandem.store.trim`'s. Ages are measured on PostgreSQL's clock.
Contribution ids are kept longer when a kept snapshot needs them: a restore replays the input after the
snapshot's cut, and each row the replay brings again must find its id to be applied once; so no id applied
later than an hour before a shard's oldest TAKING or GOOD snapshot goes (:func:`contributions_cutoff`).
Then the tables with many dead rows are vacuumed (:func:`tandem.store.trim.vacuum_bloated`): deleted rows only
free their space for new ones after a VACUUM, and autovacuum may be off.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from tandem.aggregation.spec import aggregation_outputs, spec_for
from tandem.config import PlanConfig
from tandem.store import Database
from tandem.store import snapshots as catalog
from tandem.store import trim

SNAPSHOT_MARGIN = timedelta(hours=1)
"""How much earlier than a kept snapshot's start contribution ids stay: a batch published before the cut
started but not committed in it is replayed after a restore."""


@dataclass(frozen=True)
class Trimmed:
    """Rows of one table (or one granularity of an aggregation's table) deleted by one retention run."""

    table: str
    rows: int
    before: datetime
    what: str = ""

    def describe(self) -> str:
        return (f"{self.table}{f' ({self.what})' if self.what else ''}: {self.rows} rows older than "
                f"{self.before.isoformat(timespec='seconds')} deleted")


@dataclass(frozen=True)
class Retention:
    """What one retention run of a plan did: rows deleted per table and granularity, tables vacuumed."""

    trimmed: list[Trimmed]
    vacuumed: list[str]

    def describe(self) -> list[str]:
        return [part.describe() for part in self.trimmed] + [
            f"vacuumed (dead rows made reusable): {', '.join(self.vacuumed) or 'none needed'}"]


def contributions_cutoff(now: datetime, retention_s: float, oldest_kept_snapshot: datetime | None) -> datetime:
    """Contribution ids applied before this instant may go: older than the retention, and than the shard's oldest
    kept snapshot less :data:`SNAPSHOT_MARGIN` (``None``: the shard has no kept snapshot)."""
    cutoff = now - timedelta(seconds=retention_s)
    if oldest_kept_snapshot is not None:
        cutoff = min(cutoff, oldest_kept_snapshot - SNAPSHOT_MARGIN)
    return cutoff


def trim_plan_rows(plan: PlanConfig, db: Database) -> Retention:
    """Delete ``plan``'s PostgreSQL rows older than its declared retention (what :mod:`tandem.store.trim` keeps
    stays; one :class:`Trimmed` per table and granularity), then vacuum the tables that need it."""
    retention = plan.maintenance.retention
    now = catalog.database_now(db)

    def ago(seconds: float) -> datetime:
        return now - timedelta(seconds=seconds)

    done = []
    for output in aggregation_outputs(plan):
        spec = spec_for(plan, output)
        for granularity, seconds in retention.partials_s.items():
            if granularity in spec.granularities:
                done.append(Trimmed(spec.table, trim.trim_partials(db, spec.table, plan.name, granularity,
                                                                   ago(seconds)),
                                    ago(seconds), f"{granularity} partials of {output}"))
    for table, seconds, delete in (("heartbeats", retention.heartbeats_s, trim.trim_heartbeats),
                                   ("publish_log", retention.publish_log_s, trim.trim_publish_log),
                                   ("failover_events", retention.failover_events_s, trim.trim_failover_events)):
        done.append(Trimmed(table, delete(db, plan.name, ago(seconds)), ago(seconds)))
    oldest: dict[str, datetime] = {}
    for snapshot in catalog.list_snapshots(db, plan.name, statuses=(catalog.TAKING, catalog.GOOD)):
        oldest[snapshot.shard_id] = min(snapshot.taken_at, oldest.get(snapshot.shard_id, snapshot.taken_at))
    for shard_id in plan.shards:
        before = contributions_cutoff(now, retention.contributions_s, oldest.get(shard_id))
        done.append(Trimmed("output_contributions", trim.trim_contributions(db, plan.name, shard_id, before), before,
                            f"instance {shard_id}"))
    return Retention(done, trim.vacuum_bloated(db, {part.table for part in done if part.rows}))
