"""A plan's storage upkeep: every Delta table of the plan compacted, checkpointed and vacuumed by the maintenance DAG.

Each table is maintained by :func:`tandem.lake.maintenance.maintain_table` under the plan's live appends, with
the plan's declared ``maintenance.vacuum_retention`` and, as versions to keep, those the plan's TAKING and GOOD
snapshots recorded for the table (a TAKING snapshot is recording them now, unless its taker is gone:
:func:`tandem.snapshots.takers.abandon_stale`; a GOOD one may be restored). Vacuum
and the log cleanup keep removed files and log entries for the declared ``maintenance.vacuum_retention``. The
quarantine's rows older than ``maintenance.retention.quarantine`` are deleted first.
"""

from __future__ import annotations

from datetime import timedelta

from deltalake import DeltaTable

from tandem.config import ClusterConfig, PlanConfig, quarantine_output
from tandem.lake.maintenance import Upkeep, kept_versions, maintain_table
from tandem.snapshots.restore import plan_output_tables
from tandem.snapshots.takers import abandon_stale
from tandem.store import Database
from tandem.store import snapshots as catalog
from tandem.store.locks import plan_lock


def maintain_plan_tables(cluster: ClusterConfig, plan: PlanConfig, db: Database) -> list[Upkeep]:
    """Compact, checkpoint and vacuum each Delta output table of ``plan`` (none when ``maintenance.compact`` is off)."""
    with plan_lock(cluster.database_url, plan.name, "Delta compaction and vacuum"):
        if not plan.maintenance.compact:
            return []
        abandon_stale(db, plan.name)  # a TAKING snapshot whose taker is gone keeps no version
        recorded = [s.output_versions for s in catalog.list_snapshots(db, plan.name, statuses=(catalog.TAKING,
                                                                                              catalog.GOOD))]
        expired = catalog.database_now(db) - timedelta(seconds=plan.maintenance.retention.quarantine_s)
        done = []
        for table, path in plan_output_tables(cluster, plan).items():
            keep = kept_versions(recorded, table, DeltaTable(str(path)).version())
            done.append(maintain_table(path, keep=keep, retention_s=plan.maintenance.vacuum_retention_s,
                                       log_retention_s=plan.maintenance.vacuum_retention_s,
                                       expire=("quarantined_at", expired) if table == quarantine_output(plan)
                                       else None))
        return done
