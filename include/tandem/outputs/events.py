"""The ``events`` output kind: append-only notifications, one per deterministic event id.

The id is :func:`tandem.declarations.event_id` of the declared ``key`` fields, so whoever publishes
an event — the active, or a standby flushing what it held after a failover — PostgreSQL keeps it
once. The Delta append is at least once (an old active paused between its PostgreSQL commit and its
Delta commit may append rows the new active appended too): :func:`read_events_lake` keeps one row
per id.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from tandem.config import PlanConfig
from tandem.lake.tables import read_table
from tandem.outputs.base import BatchInfo, HeldById, as_utc
from tandem.outputs.quarantine import QuarantineSink
from tandem.store import outputs as store
from tandem.store.leases import check_fence
from tandem.store.publish_log import record_published
from tandem.store.registry import InstanceKey


class EventsSink(HeldById):
    """Append-only notifications: one PostgreSQL row per event id; Delta copy read one row per id."""

    table = "output_events"
    id_column = "event_id"

    def write(self, rows: dict[str, dict[str, Any]], batch: BatchInfo) -> int:
        key = batch.instance

        def work(cursor, ids: list[str]) -> list[str]:
            events = {eid: (as_utc(rows[eid][self.config.time]), rows[eid]) for eid in ids}
            newest = max(time for time, _ in events.values())
            store.stage_events(cursor, events)  # before the fence's lock (see check_fence)
            check_fence(cursor, key.plan, key.shard_id, key.node, batch.epoch)
            pending = store.insert_staged_events(cursor, key, self.output, batch.epoch, batch.batch_id)
            record_published(cursor, key, self.output, batch.batch_id, batch.epoch, len(pending), newest, None)
            return pending

        pending, _ = self.refusals.run(work, list(rows), rows.__getitem__, batch)
        if pending:
            lake = pa.Table.from_pylist([rows[eid] for eid in pending], schema=self.schema)
            self.to_lake(lake.append_column("event_id", pa.array(pending, pa.string())), batch, pending)
        return len(pending or ())


def sink(plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
         quarantine: QuarantineSink | None = None) -> EventsSink:
    return EventsSink(plan.name, output, plan.outputs[output], instance, database_url, delta_path, quarantine)


def read_events_lake(path: Path) -> pa.Table:
    """The Delta copy of an events output, one row per event id (the first committed)."""
    table = read_table(path)
    if table.num_rows == 0:
        return table
    table = table.sort_by([("event_id", "ascending"), ("published_at", "ascending")])
    ids = table.column("event_id").to_pylist()
    return table.filter(pa.array([i == 0 or ids[i] != ids[i - 1] for i in range(len(ids))], pa.bool_()))
