"""The ``events`` output kind: append-only notifications, one per deterministic event id.

The id is :func:`tandem.declarations.event_id` of the declared ``key`` fields, so whoever publishes
an event — the active, or a standby flushing what it held after a failover — PostgreSQL keeps it
once. The Delta append is at least once (an old active paused between its PostgreSQL commit and its
Delta commit may append rows the new active appended too): :func:`read_events_lake` keeps one row
per id.

Restore: kept (published once by id). Validation: the rows of ``output_events`` whose event time lies
in the window, the payload's fields as columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from tandem.config import PlanConfig
from tandem.declarations import OutputConfig
from tandem.lake.tables import read_table
from tandem.outputs.base import BatchInfo, HeldById, Validation, Window, as_utc, kept
from tandem.outputs.expectations import expect, instances, not_null
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
            pending = store.insert_staged_events(cursor, key, self.output, batch.epoch, batch.batch_id, ids)
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
    return first_per_event_id(read_table(path))


def first_per_event_id(table: pa.Table) -> pa.Table:
    """Of an events output's Delta rows, the first published of each event id (pure)."""
    if table.num_rows == 0:
        return table
    table = table.sort_by([("event_id", "ascending"), ("published_at", "ascending")])
    ids = table.column("event_id").to_pylist()
    return table.filter(pa.array([i == 0 or ids[i] != ids[i - 1] for i in range(len(ids))], pa.bool_()))


restore = kept


def expectations(config: OutputConfig) -> list[dict[str, Any]]:
    """What an events output's declaration implies of its rows (the payload's fields as columns)."""
    return [
        not_null("event_id", "every event has its deterministic id"),
        expect("expect_column_values_to_be_unique", "one row per event id", column="event_id"),
        *[not_null(field, "the fields the id is computed from") for field in config.key],
        *([] if config.time in config.key else [not_null(config.time, "the event's time")]),
        instances(),
    ]


def events_frame(rows: list[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows of ``output_events`` with the payload's fields as columns (pure)."""
    return pd.DataFrame([{**row["payload"], "event_id": row["event_id"], "shard_id": row["shard_id"],
                          "event_time": row["event_time"]} for row in rows],
                        columns=None if rows else ["event_id", "shard_id", "event_time"])


def validation(plan: PlanConfig, output: str) -> Validation:
    """The events whose event time lies in the window, with what the declaration implies of them."""
    implied = expectations(plan.outputs[output])

    def read(cursor, window: Window, limit: int) -> list[dict[str, Any]]:
        until = window.until or datetime.now(timezone.utc)
        return store.sample_events(cursor, plan.name, output, window.since, until, limit)

    return Validation(table="tandem.output_events", key_columns=["event_id"], implied=implied, required=implied,
                      takes_unnamed=False, read=read, frame=events_frame)
