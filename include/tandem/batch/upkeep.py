"""A plan's storage upkeep: every Delta table of the plan compacted, checkpointed and vacuumed by the maintenance DAG.

Each table is maintained by :func:`tandem.lake.maintenance.maintain_table` under the plan's live appends, with
the plan's declared ``maintenance.vacuum_retention`` and, as versions to keep, those the plan's TAKING and GOOD
snapshots recorded for the table (a TAKING snapshot is recording them now; a GOOD one may be restored). Vacuum
and the log cleanup keep removed files and log entries for the declared ``maintenance.vacuum_retention``.
"""

from __future__ import annotations

from deltalake import DeltaTable

from tandem.config import ClusterConfig, PlanConfig
from tandem.lake.maintenance import Upkeep, kept_versions, maintain_table
from tandem.snapshots.restore import plan_output_tables
from tandem.store import Database
from tandem.store import snapshots as catalog


def maintain_plan_tables(cluster: ClusterConfig, plan: PlanConfig, db: Database) -> list[Upkeep]:
    """Compact, checkpoint and vacuum each Delta output table of ``plan`` (none when ``maintenance.compact`` is off)."""
    if not plan.maintenance.compact:
        return []
    recorded = [s.output_versions for s in catalog.list_snapshots(db, plan.name, statuses=(catalog.TAKING,
                                                                                          catalog.GOOD))]
    done = []
    for table, path in plan_output_tables(cluster, plan).items():
        keep = kept_versions(recorded, table, DeltaTable(str(path)).version())
        done.append(maintain_table(path, keep=keep, retention_s=plan.maintenance.vacuum_retention_s,
                                   log_retention_s=plan.maintenance.vacuum_retention_s))
    return done
