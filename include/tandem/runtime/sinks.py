"""The sinks of the ``events`` and ``table`` output kinds, and :func:`sink_for` (a declared output's sink).

Both kinds identify every row by a deterministic id (:func:`tandem.declarations.event_id` of the
declared fields), so whoever publishes a row — the active, or a standby flushing what it held
after a failover — PostgreSQL keeps it once:

- ``publish``: in one fenced transaction, insert the rows whose ids are new (events), or apply
  the new contributions to their keys' partial values (tables); then append to Delta the rows
  whose Delta copy is not committed yet and mark them ``in_lake``.
- ``hold``: a standby keeps its rows by id; ``trim`` drops those published for good (in PostgreSQL
  and in Delta); ``flush`` publishes the rest on promotion.

The Delta append is at least once: an old active paused between its PostgreSQL commit and its
Delta commit may append rows the new active also appended. Readers of the Delta copy keep one row
per id (:func:`read_events_lake`, :func:`read_table_lake`); PostgreSQL never holds a duplicate.

Rows PostgreSQL refuses for their values go to the plan's quarantine, and the rest is published
(:class:`tandem.runtime.publisher.Refusals`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tandem.aggregation import delta as agg_delta
from tandem.aggregation import postgres as agg_postgres
from tandem.aggregation import sketches
from tandem.aggregation.granularity import bucket_start
from tandem.aggregation.spec import AggregationSpec, spec_for
from tandem.config import PlanConfig
from tandem.declarations import OutputConfig, event_id
from tandem.lake.tables import append_once, read_table
from tandem.errors import DataError
from tandem.runtime.publisher import AggregateSink, BatchInfo, QuarantineSink, Refusals, Sink, fence
from tandem.store import outputs as store
from tandem.store.db import Database
from tandem.store.leases import check_fence
from tandem.store.publish_log import record_published
from tandem.store.registry import InstanceKey

log = logging.getLogger(__name__)
UTC_MICROS = pa.timestamp("us", tz="UTC")


def as_utc(value: datetime | int) -> datetime:
    """A row's time as an aware UTC datetime (an integer is epoch milliseconds).

    Raises:
        DataError: an integer outside the years 1-9999.
    """
    if isinstance(value, int):
        try:
            return datetime.fromtimestamp(value / 1000, timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise DataError(f"time {value} is not epoch milliseconds within the years 1-9999") from None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def _lake_columns(batch: BatchInfo, n: int) -> dict[str, pa.Array]:
    key = batch.instance
    return {"shard_id": pa.repeat(key.shard_id, n), "node": pa.repeat(key.node, n),
            "epoch": pa.repeat(pa.scalar(batch.epoch, pa.int64()), n),
            "batch_id": pa.repeat(pa.scalar(batch.batch_id, pa.int64()), n),
            "published_at": pa.repeat(pa.scalar(batch.published_at, UTC_MICROS), n)}


class _HeldById:
    """What a standby holds of an output: rows by id, trimmed by the ids published for good."""

    table = ""
    id_column = ""

    def __init__(self, plan: str, output: str, config: OutputConfig, instance: InstanceKey, database_url: str,
                 delta_path: Path, quarantine: QuarantineSink | None = None) -> None:
        self.plan = plan
        self.output = output
        self.config = config
        self.instance = instance
        self.delta_path = delta_path
        self.db = Database(database_url, "tandem-publisher")
        self.refusals = Refusals(output, self.db, quarantine)
        self.held: dict[str, dict[str, Any]] = {}
        self.held_batch: int | None = None
        self.schema: pa.Schema | None = None  # the query's rows, as Spark hands them over

    def identify(self, rows: pa.Table, fields: list[str]) -> dict[str, dict[str, Any]]:
        self.schema = rows.schema
        return {event_id(self.plan, self.output, {f: row[f] for f in fields}): row for row in rows.to_pylist()}

    def identified(self, rows: pa.Table) -> dict[str, dict[str, Any]]:
        """Rows by id: a table's or aggregation's ``id`` fields, an event's ``key`` fields (events have no ``id``)."""
        return self.identify(rows, self.config.id or self.config.key)

    def hold(self, rows: pa.Table, batch_id: int) -> None:
        self.held.update(self.identified(rows))
        self.held_batch = batch_id

    def trim(self) -> None:
        if not self.held:
            return
        done = self.db.run(lambda cursor: store.in_lake(cursor, self.table, self.id_column, self.plan, self.output,
                                                        list(self.held)), attempts=1)
        for done_id in done:
            self.held.pop(done_id, None)

    def flush(self, batch: BatchInfo) -> int:
        if not self.held or self.held_batch is None:
            return 0
        self.trim()
        if not self.held:
            return 0
        written = self.write(dict(self.held), replace(batch, batch_id=self.held_batch))
        log.info("published %d held rows of %s (%d new)", len(self.held), self.output, written)
        self.held.clear()
        return written

    def publish(self, rows: pa.Table, batch: BatchInfo) -> int:
        return self.write(self.identified(rows), batch) if rows.num_rows else 0

    def to_lake(self, rows: pa.Table, batch: BatchInfo, ids: list[str]) -> None:
        """Append rows to Delta once per batch (after the fence is checked again), then mark their ids ``in_lake``."""
        for name, column in _lake_columns(batch, rows.num_rows).items():
            rows = rows.append_column(name, column)
        fence(self.db, batch)
        append_once(self.delta_path, rows, app_id=batch.app_id(self.output), version=batch.batch_id)
        self.db.run(lambda cursor: store.mark_in_lake(cursor, self.table, self.id_column, self.plan, self.output, ids))

    def write(self, rows: dict[str, dict[str, Any]], batch: BatchInfo) -> int:
        raise NotImplementedError


class EventsSink(_HeldById):
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


class TableSink(_HeldById):
    """A keyed table whose instances' partial values are summed on read; each contributing row applied once."""

    table = "output_contributions"
    id_column = "contribution_id"

    def write(self, rows: dict[str, dict[str, Any]], batch: BatchInfo) -> int:
        key = batch.instance

        def work(cursor, ids: list[str]) -> list[dict]:
            contributions = {cid: ({k: rows[cid][k] for k in self.config.key},
                                   {v: rows[cid][v] for v in self.config.values}) for cid in ids}
            check_fence(cursor, key.plan, key.shard_id, key.node, batch.epoch)
            current = store.apply_contributions(cursor, key, self.output, self.config.values, contributions,
                                                batch.epoch, batch.batch_id)
            record_published(cursor, key, self.output, batch.batch_id, batch.epoch, len(current), None, None)
            return current

        current, _ = self.refusals.run(work, list(rows), rows.__getitem__, batch)
        if current:
            schema = pa.schema([*(self.schema.field(k) for k in self.config.key),
                                *((v, pa.float64()) for v in self.config.values), ("version", pa.int64())])
            lake = pa.Table.from_pylist([
                {**row["key"], **{v: float(row["value"][v]) for v in self.config.values}, "version": row["version"]}
                for row in current], schema=schema)
            self.to_lake(lake, batch, [cid for row in current for cid in row["ids"]])
        return len(current or ())


class FactAggregateSink(_HeldById):
    """An aggregation of facts (each with an id): every new fact is added to its second's partial once.

    For outputs whose facts come out of a stateful operator (an order's outcome at its expiry) and
    cannot feed a Spark aggregation (Spark refuses rows older than the watermark after a
    ``transformWithState``). In one fenced transaction: record the facts' ids, add the new ones to
    the per-second partials (count, sums, min, max, HLL sketches), roll up every granularity; then
    the touched rows go to Delta and the facts are marked ``in_lake``.
    """

    table = "output_contributions"
    id_column = "contribution_id"

    def __init__(self, spec: AggregationSpec, plan: str, output: str, config: OutputConfig, instance: InstanceKey,
                 database_url: str, delta_path: Path, quarantine: QuarantineSink | None = None) -> None:
        super().__init__(plan, output, config, instance, database_url, delta_path, quarantine)
        self.spec = spec
        self.table_ready = False

    def _second(self, fact: dict[str, Any]) -> tuple:
        return (bucket_start(as_utc(fact[self.config.time]), "second"), *(str(fact[k]) for k in self.spec.keys))

    def write(self, rows: dict[str, dict[str, Any]], batch: BatchInfo) -> int:
        key = batch.instance
        spec = self.spec

        def work(cursor, ids: list[str]) -> tuple[list[dict], list[str]]:
            check_fence(cursor, key.plan, key.shard_id, key.node, batch.epoch)
            if not self.table_ready:
                agg_postgres.ensure_table(cursor, spec)
            new = store.insert_contributions(cursor, key, self.output, {cid: {} for cid in ids})
            written: list[dict] = []
            if new:
                seconds = add_facts(cursor, spec, key.plan, key.shard_id, [rows[i] for i in new], self._second)
                agg_postgres.stage_batch(cursor, spec, seconds)
                written = agg_postgres.upsert_and_roll_up(cursor, spec, key.plan, key.shard_id, batch.epoch,
                                                          batch.batch_id)
            pending = store.not_in_lake(cursor, self.table, self.id_column, key.plan, self.output, ids)
            if set(pending) - new:  # applied by an active that died before its Delta append: copy their rows now
                written += agg_postgres.rows_of_seconds(cursor, spec, key.plan, key.shard_id,
                                                        {self._second(rows[i]) for i in pending})
            record_published(cursor, key, self.output, batch.batch_id, batch.epoch, len(written), None, None)
            return written, pending

        applied, _ = self.refusals.run(work, list(rows), rows.__getitem__, batch)
        written, pending = applied or ([], [])
        self.table_ready = True
        if pending:
            fence(self.db, batch)
            if written:
                agg_delta.append_rows(self.delta_path, spec, written, node=key.node, published_at=batch.published_at,
                                      app_id=batch.app_id(self.output), batch_id=batch.batch_id)
            self.db.run(lambda cursor: store.mark_in_lake(cursor, self.table, self.id_column, key.plan, self.output,
                                                          pending))
        return len(written)


def add_facts(cursor, spec: AggregationSpec, plan: str, shard_id: str, facts: list[dict[str, Any]],
              second_of) -> pa.Table:
    """The per-second partials touched by ``facts``, with the facts added to what the table holds."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for fact in facts:
        groups.setdefault(second_of(fact), []).append(fact)
    current = agg_postgres.rows_of_seconds(cursor, spec, plan, shard_id, set(groups), granularities=("second",))
    by_group = {(r["bucket_start"], *(r[k] for k in spec.keys)): r for r in current}
    out = []
    for group, members in groups.items():
        row = {"bucket_start": group[0], **dict(zip(spec.keys, group[1:]))}
        before = by_group.get(group)
        for measure in spec.measures:
            values = [f[measure.source] for f in members] if measure.source else []
            old = before[measure.column] if before else None
            if measure.kind == "count":
                row[measure.column] = (old or 0) + len(members)
            elif measure.kind == "sum":
                row[measure.column] = (old or 0) + sum(v or 0 for v in values)
            elif measure.kind in ("min", "max"):
                pick = min if measure.kind == "min" else max
                row[measure.column] = pick([v for v in [old, *values] if v is not None])
            else:
                row[measure.column] = sketches.union([old, sketches.of(str(v) for v in values)])
        out.append(row)
    return pa.Table.from_pylist(out)


ALL_ROWS = "*"


class RoutedSink:
    """Rows of one query to several outputs, by the value of one column (``"*"``: every row; rows of
    other values go nowhere)."""

    def __init__(self, column: str, routes: dict[str, Sink]) -> None:
        self.column = column
        self.routes = routes
        self.output = "+".join(sink.output for sink in routes.values())

    def _split(self, rows: pa.Table) -> Iterator[tuple[Sink, pa.Table]]:
        for value, sink in self.routes.items():
            yield sink, rows if value == ALL_ROWS else rows.filter(pc.equal(rows[self.column], value))

    def publish(self, rows: pa.Table, batch: BatchInfo) -> int:
        return sum(sink.publish(part, batch) for sink, part in self._split(rows))

    def hold(self, rows: pa.Table, batch_id: int) -> None:
        for sink, part in self._split(rows):
            sink.hold(part, batch_id)

    def trim(self) -> None:
        for sink in self.routes.values():
            sink.trim()

    def flush(self, batch: BatchInfo) -> int:
        return sum(sink.flush(batch) for sink in self.routes.values())


def sink_for(plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
             quarantine: QuarantineSink | None = None) -> Sink:
    """The sink of the declared output ``output`` of ``plan``, by its kind; rows its store refuses go to
    ``quarantine`` (the plan's quarantine output)."""
    config = plan.outputs[output]
    if config.kind == "aggregation" and config.id:
        return FactAggregateSink(spec_for(plan, output), plan.name, output, config, instance, database_url, delta_path,
                                 quarantine)
    if config.kind == "aggregation":
        return AggregateSink(spec_for(plan, output), instance, database_url, delta_path, plan.watermark_s, quarantine)
    if config.kind == "quarantine":
        return QuarantineSink(instance, database_url, delta_path, output=output)
    if config.kind == "events":
        return EventsSink(plan.name, output, config, instance, database_url, delta_path, quarantine)
    return TableSink(plan.name, output, config, instance, database_url, delta_path, quarantine)


def read_events_lake(path: Path) -> pa.Table:
    """The Delta copy of an events output, one row per event id (the first committed)."""
    table = read_table(path)
    if table.num_rows == 0:
        return table
    table = table.sort_by([("event_id", "ascending"), ("published_at", "ascending")])
    ids = table.column("event_id").to_pylist()
    return table.filter(pa.array([i == 0 or ids[i] != ids[i - 1] for i in range(len(ids))], pa.bool_()))


def read_table_lake(path: Path, config: OutputConfig) -> list[dict[str, Any]]:
    """The Delta copy of a table, merged: per key, the sum over instances of each instance's newest version."""
    table = read_table(path)
    newest: dict[tuple, dict[str, Any]] = {}
    for row in table.to_pylist():
        identity = (tuple(row[k] for k in config.key), row["shard_id"])
        if identity not in newest or row["version"] > newest[identity]["version"]:
            newest[identity] = row
    merged: dict[tuple, dict[str, Any]] = {}
    for (key, _), row in sorted(newest.items(), key=lambda item: str(item[0])):
        out = merged.setdefault(key, {**dict(zip(config.key, key)), **{v: 0.0 for v in config.values},
                                      "instances": 0})
        for v in config.values:
            out[v] += row[v]
        out["instances"] += 1
    return list(merged.values())
