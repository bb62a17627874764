"""A plan's PostgreSQL retention: old bookkeeping rows deleted by the maintenance DAG, as the plan declares.

``maintenance.retention`` (:class:`tandem.config.RetentionConfig`) says how long each kind of row is kept; the
deletes and what they always keep are :mod:`tandem.store.trim`'s. Ages are measured on PostgreSQL's clock.
Contribution ids are kept longer when a kept snapshot needs them: a restore replays the input after the
snapshot's cut, and each row the replay brings again must find its id to be applied once; so no id applied
after the earliest commit of a shard's oldest TAKING or GOOD snapshot's cut (its ``replay_from``, less
:data:`CLOCK_MARGIN`) goes (:func:`replay_needs_since`, :func:`contributions_cutoff`).
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
from tandem.store.locks import plan_lock

SNAPSHOT_MARGIN = timedelta(hours=1)
"""For a snapshot that recorded no ``replay_from`` (taken before it was): how much earlier than its start
contribution ids stay (a batch published before the cut started but not committed in it is replayed)."""
CLOCK_MARGIN = timedelta(minutes=5)
"""``replay_from`` comes from the checkpoint storage's clock (a commit file's age), ``applied_at`` from
PostgreSQL's: the ids stay this much longer, for clocks that disagree."""


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


def partials_horizon(table: str, granularity: str) -> str:
    """The name :func:`tandem.store.trim.record_horizon` records an aggregation's trimmed partials under."""
    return f"partials/{table}/{granularity}"


def contributions_horizon(shard_id: str) -> str:
    """The name an instance's trimmed contribution ids are recorded under."""
    return f"contributions/{shard_id}"


def replay_needs_since(snapshot: catalog.SnapshotRecord) -> datetime:
    """The earliest ``applied_at`` of a contribution a restore from ``snapshot`` may bring again (pure)."""
    if snapshot.replay_from is None:
        return snapshot.taken_at - SNAPSHOT_MARGIN
    return min(snapshot.replay_from, snapshot.taken_at) - CLOCK_MARGIN


def contributions_cutoff(now: datetime, retention_s: float, replay_needs: datetime | None) -> datetime:
    """Contribution ids applied before this instant may go: older than the retention, and than what a restore of
    the shard's kept snapshots needs (``replay_needs``: the earliest :func:`replay_needs_since`; ``None``: the
    shard has no kept snapshot)."""
    cutoff = now - timedelta(seconds=retention_s)
    if replay_needs is not None:
        cutoff = min(cutoff, replay_needs)
    return cutoff


def trim_plan_rows(plan: PlanConfig, db: Database) -> Retention:
    """Delete ``plan``'s PostgreSQL rows older than its declared retention (what :mod:`tandem.store.trim` keeps
    stays; one :class:`Trimmed` per table and granularity), then vacuum the tables that need it."""
    with plan_lock(db.url, plan.name, "PostgreSQL retention"):
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
                    if done[-1].rows:
                        trim.record_horizon(db, plan.name, partials_horizon(spec.table, granularity), ago(seconds))
        for table, seconds, delete in (("heartbeats", retention.heartbeats_s, trim.trim_heartbeats),
                                       ("publish_log", retention.publish_log_s, trim.trim_publish_log),
                                       ("failover_events", retention.failover_events_s, trim.trim_failover_events)):
            done.append(Trimmed(table, delete(db, plan.name, ago(seconds)), ago(seconds)))
        events = [name for name, output in plan.outputs.items() if output.kind == "events"]
        relayed = [name for name in events if plan.outputs[name].stream]
        tables = [name for name, output in plan.outputs.items() if output.kind == "table"]
        needs: dict[str, datetime] = {}
        for snapshot in catalog.list_snapshots(db, plan.name, statuses=(catalog.TAKING, catalog.GOOD)):
            since = replay_needs_since(snapshot)
            needs[snapshot.shard_id] = min(since, needs.get(snapshot.shard_id, since))
        for shard_id in plan.shards:
            before = contributions_cutoff(now, retention.contributions_s, needs.get(shard_id))
            done.append(Trimmed("output_contributions", trim.trim_contributions(db, plan.name, shard_id, before),
                                before, f"instance {shard_id}"))
            if done[-1].rows:
                trim.record_horizon(db, plan.name, contributions_horizon(shard_id), before)
            if events:  # a restore's replay brings events again too: as long as it may, they stay
                before = contributions_cutoff(now, retention.events_s, needs.get(shard_id))
                done.append(Trimmed("output_events", trim.trim_events(db, plan.name, shard_id, before, relayed),
                                    before, f"instance {shard_id}"))
        for output in tables if retention.table_rows_s is not None else ():
            before = ago(retention.table_rows_s)
            done.append(Trimmed("output_table_rows", trim.trim_table_rows(db, plan.name, output, before), before,
                                f"keys of {output}"))
        return Retention(done, trim.vacuum_bloated(db, {part.table for part in done if part.rows}))
