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

import itertools
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa

from tandem.declarations import OUTPUT_RULES, OutputConfig
from tandem.json_values import times_as_iso
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir
from tandem.outputs.base import (
    ALL_TIME,
    LAKE_COLUMNS,
    BatchInfo,
    HeldById,
    ReadRequest,
    RetentionRun,
    Trimmed,
    Validation,
    Window,
    as_utc,
    reading,
    row_difference,
)
from tandem.outputs.expectations import expect, instances, not_null
from tandem.outputs.quarantine import QuarantineSink
from tandem.outputs.recompute import Outcome, PublishedById, Recomputed, compare_ids, publish_missing, \
    recomputed_by_id, unbounded
from tandem.store import outputs as store
from tandem.store import trim as store_trim
from tandem.store.db import Database
from tandem.store.leases import check_fence
from tandem.store.publish_log import record_published
from tandem.store.registry import InstanceKey

if TYPE_CHECKING:
    from tandem.config import ClusterConfig, PlanConfig


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
            check_fence(cursor, key.plan, key.instance, key.node, batch.epoch)
            pending = store.insert_staged_events(cursor, key, self.output, batch.epoch, batch.batch_id, ids)
            record_published(cursor, key, self.output, batch.batch_id, batch.epoch, len(pending), newest, None)
            return pending

        pending, _ = self.refusals.run(work, list(rows), rows.__getitem__, batch)
        if pending:
            lake = pa.Table.from_pylist([rows[eid] for eid in pending], schema=self.schema)
            self.to_lake(lake.append_column("event_id", pa.array(pending, pa.string())), batch, pending)
        return len(pending or ())

    def differences(self, rows: dict[str, dict[str, Any]]) -> list[str]:
        """Each event against the payload the active published under its id."""
        published = self.db.run(lambda cursor: store.event_payloads(cursor, self.plan, self.output, list(rows)),
                                attempts=1)
        lines = []
        for eid, row in rows.items():
            new = store.as_stored(row)
            line = row_difference(f"event {eid}", published.get(eid), new, new)
            if line:
                lines.append(line)
        return lines


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
    return pd.DataFrame([{**row["payload"], "event_id": row["event_id"], "instance": row["instance"],
                          "event_time": row["event_time"]} for row in rows],
                        columns=None if rows else ["event_id", "instance", "event_time"])


def validation(plan: PlanConfig, output: str) -> Validation:
    """The events whose event time lies in the window, with what the declaration implies of them."""
    implied = expectations(plan.outputs[output])

    def read(cursor, window: Window, limit: int) -> list[dict[str, Any]]:
        until = window.until or datetime.now(timezone.utc)
        return store.sample_events(cursor, plan.name, output, window.since, until, limit)

    return Validation(table="tandem.output_events", key_columns=["event_id"], implied=implied, required=implied,
                      takes_unnamed=False, read=read, frame=events_frame)


LAKE_ONLY = (*LAKE_COLUMNS, "event_id")
PAGE_ROWS = 1000


def _published_events(db: Database, plan: str, output: str, start: datetime | None, end: datetime | None, *,
                      follow: bool = False, attempts: int = 3) -> Iterator[dict[str, Any]]:
    """The output's events of ``[start, end)`` (an open side when not given) from PostgreSQL in time order, then id,
    a page at a time: ``event_id``, ``event_time`` (ISO 8601), ``instance`` and the payload's fields; ``follow``:
    then each new one, polled each second, for good (``attempts``: of each page's read while PostgreSQL is away)."""
    after: tuple[datetime, str] | None = None
    while True:
        page = db.run(lambda cursor: store.read_events(cursor, plan, output, start or ALL_TIME[0], end or ALL_TIME[1],
                                                       after=after, limit=PAGE_ROWS), attempts=attempts)
        for row in page:
            after = (row["event_time"], row["event_id"])
            yield {"event_id": row["event_id"], "event_time": row["event_time"].isoformat(),
                   "instance": row["instance"], **row["payload"]}
        if len(page) < PAGE_ROWS:
            if not follow:
                return
            time.sleep(1.0)


class EventsKind(PublishedById):
    """``events``: append-only notifications, one per deterministic event id, optionally relayed to a stream."""

    name = "events"
    rules = OUTPUT_RULES[name]

    def sink(self, plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
             quarantine: QuarantineSink | None = None) -> EventsSink:
        return EventsSink(plan.name, output, plan.outputs[output], instance, database_url, delta_path, quarantine)

    def read(self, cluster: ClusterConfig, plan: PlanConfig, output: str, request: ReadRequest,
             db: Database | None = None) -> list[dict[str, Any]]:
        """The events of ``[start, end)`` (default: all) in time order, then id: ``event_id``, ``event_time``
        (ISO 8601), ``instance`` and the payload's fields (times as ISO 8601 text, :meth:`time_fields`)."""
        times = self.time_fields(plan, output)
        if request.source == "delta":
            time_field = plan.outputs[output].time
            rows = []
            for event in read_events_lake(delta_table_dir(cluster, plan.name, output)).to_pylist():
                at = as_utc(event[time_field])
                if request.covers(at):
                    payload = {k: v for k, v in event.items() if k not in LAKE_ONLY}
                    rows.append({"event_id": event["event_id"], "event_time": at.isoformat(),
                                 "instance": event["instance"], **store.to_json(payload)})
            rows = request.picked(sorted(rows, key=lambda e: (e["event_time"], e["event_id"])))
            return [times_as_iso(row, times) for row in rows]
        with reading(cluster, db) as connection:
            wanted = (event for event in _published_events(connection, plan.name, output, request.start, request.end)
                      if request.matches(event))
            return [times_as_iso(row, times) for row in itertools.islice(wanted, request.limit)]

    def follow(self, cluster: ClusterConfig, plan: PlanConfig, output: str, request: ReadRequest,
               emit: Callable[[dict[str, Any]], None]) -> None:
        """Every event from ``start`` on (default: all) in time order, then each new one (polled each second), as
        :meth:`read` gives them."""
        times = self.time_fields(plan, output)
        with Database(cluster.database_url, "tandem-query") as db:
            for event in _published_events(db, plan.name, output, request.start, None, follow=True, attempts=30):
                if request.matches(event):
                    emit(times_as_iso(event, times))

    def page(self, db: Database, plan: PlanConfig, output: str, after: tuple[int, str] | None, tail: int | None,
             limit: int) -> list[dict[str, Any]]:
        """Events in (inserting transaction, event id) order: those of transactions every later poll sees ended
        (migration 006), so none is missed or given twice; the payload's times as ISO 8601 text (:meth:`time_fields`).
        """
        if after is None and tail is not None:
            rows = db.run(lambda c: store.newest_events(c, plan.name, output, tail), attempts=3)
        else:
            rows = db.run(lambda c: store.events_after(c, plan.name, output, after or store.START, limit), attempts=3)
        times = self.time_fields(plan, output)
        return [{**row, "payload": times_as_iso(row["payload"], times)} for row in rows]

    def replace(self, job: Recomputed, backfill_id: str) -> dict[str, Any]:
        """Publish the missing events; count those published that the recomputation no longer produces (a
        notification cannot be unsent)."""
        why = unbounded(job)
        if why:
            return {"recomputed": False, "why": why}
        outcome, recomputed = publish_missing(self, job, backfill_id)
        gone = sorted(e["event_id"] for e in self._published(job) if e["event_id"] not in recomputed)
        return {**outcome, "no_longer_produced": len(gone), "examples": gone[:5]}

    def compare(self, job: Recomputed) -> Outcome:
        """Late, extra and different events, their payloads compared."""
        why = unbounded(job)
        if why:
            return Outcome(job.instance, job.output, skipped=why)
        _, recomputed = recomputed_by_id(self, job)
        return compare_ids(Outcome(job.instance, job.output),
                           {e["event_id"]: e["payload"] for e in self._published(job)}, recomputed)

    @staticmethod
    def _published(job: Recomputed) -> list[dict[str, Any]]:
        events = job.db.run(lambda cursor: store.read_events(cursor, job.plan.name, job.output, job.start, job.end),
                            attempts=3)
        return [e for e in events if e["instance"] == job.instance]

    def trim(self, run: RetentionRun, output: str) -> list[Trimmed]:
        """Each instance's events older than ``retention.events`` (kept while a restore may replay them, and until
        the relay has sent them)."""
        relayed = [output] if run.plan.outputs[output].stream else []
        done = []
        for instance in run.plan.instances:
            before = run.replay_cutoff(run.plan.maintenance.retention.events_s, instance)
            done.append(Trimmed("output_events", store_trim.trim_events(run.db, run.plan.name, instance, before,
                                                                        relayed, output),
                                before, f"{output} of instance {instance}"))
        return done

    def summary(self, plan: PlanConfig, output: str) -> dict[str, Any]:
        return {**super().summary(plan, output), "time": plan.outputs[output].time}

    def validation(self, plan: PlanConfig, output: str) -> Validation:
        return validation(plan, output)

    def reset(self, db: Database, plan: PlanConfig, output: str) -> list[str]:
        """Its events, and the position its relay recorded in its NATS stream."""
        from tandem.store.output_streams import forget_relayed

        def work(cursor) -> list[str]:
            events = store.delete_output_rows(cursor, "output_events", plan.name, output)
            return [f"{events} events (output_events)"] + (
                ["its relay's position (output_streams)"] if forget_relayed(cursor, plan.name, output) else [])

        return db.run(work, attempts=3)


KIND = EventsKind()
