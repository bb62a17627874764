"""The plan-independent publisher: every micro-batch of every query goes out through here.

``MicroBatchPublisher`` is the ``foreachBatch`` function. It turns the batch into Arrow once and
hands it to the query's sink with the batch's identity (instance, batch id, epoch). Sinks are
idempotent per batch: PostgreSQL rows are upserted with deterministic keys in one transaction
that also records the batch in ``publish_log``; Delta appends carry an application transaction
(app id = ``<instance>/<output>``, version = batch id) so a replayed batch is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from tandem.aggregation import delta as agg_delta
from tandem.aggregation import postgres as agg_postgres
from tandem.aggregation.spec import AggregationSpec
from tandem.lake.tables import append_once
from tandem.store.db import Database
from tandem.store.registry import InstanceKey

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchInfo:
    instance: InstanceKey
    batch_id: int
    epoch: int
    published_at: datetime

    def app_id(self, output: str) -> str:
        return f"{self.instance.id}/{output}"


class Sink(Protocol):
    output: str

    def publish(self, rows: pa.Table, batch: BatchInfo) -> int:
        """Write one micro-batch idempotently; return how many rows were written."""


def record_published(cursor, batch: BatchInfo, output: str, rows: int, max_event_time: datetime | None) -> None:
    cursor.execute(
        """INSERT INTO publish_log (instance_id, output, batch_id, epoch, rows, max_event_time)
           VALUES (%s, %s, %s, %s, %s, %s)
           ON CONFLICT (instance_id, output, batch_id) DO UPDATE
           SET epoch = EXCLUDED.epoch, rows = EXCLUDED.rows, max_event_time = EXCLUDED.max_event_time""",
        (batch.instance.id, output, batch.batch_id, batch.epoch, rows, max_event_time),
    )


class AggregateSink:
    """Per-second partials → PostgreSQL (upsert + roll-up to every granularity) → the same rows to Delta."""

    def __init__(self, spec: AggregationSpec, database_url: str, delta_path: Path) -> None:
        self.spec = spec
        self.output = spec.table
        self.delta_path = delta_path
        self.db = Database(database_url, "tandem-publisher")

    def publish(self, rows: pa.Table, batch: BatchInfo) -> int:
        if rows.num_rows == 0:
            return 0
        newest = pc.max(rows["bucket_start"]).as_py()

        def write(cursor) -> list[dict]:
            agg_postgres.stage_batch(cursor, self.spec, rows)
            written = agg_postgres.upsert_and_roll_up(
                cursor, self.spec, batch.instance.shard_id, batch.epoch, batch.batch_id)
            record_published(cursor, batch, self.output, len(written), newest)
            return written

        written = self.db.run(write)
        agg_delta.append_rows(self.delta_path, self.spec, written, node=batch.instance.node,
                              published_at=batch.published_at, app_id=batch.app_id(self.output),
                              batch_id=batch.batch_id)
        return len(written)


QUARANTINE_SCHEMA = pa.schema([
    ("raw", pa.string()), ("source_file", pa.string()), ("reason", pa.string()),
    ("plan", pa.string()), ("shard_id", pa.string()), ("node", pa.string()),
    ("batch_id", pa.int64()), ("quarantined_at", pa.timestamp("us", tz="UTC")),
])


class QuarantineSink:
    """Bad input lines, with the raw text, the source file and the reason, appended to Delta."""

    output = "quarantine"

    def __init__(self, delta_path: Path) -> None:
        self.delta_path = delta_path

    def publish(self, rows: pa.Table, batch: BatchInfo) -> int:
        if rows.num_rows == 0:
            return 0
        n = rows.num_rows
        table = pa.table({
            "raw": rows["raw"], "source_file": rows["source_file"], "reason": rows["reason"],
            "plan": pa.repeat(batch.instance.plan, n), "shard_id": pa.repeat(batch.instance.shard_id, n),
            "node": pa.repeat(batch.instance.node, n), "batch_id": pa.repeat(pa.scalar(batch.batch_id, pa.int64()), n),
            "quarantined_at": pa.repeat(pa.scalar(batch.published_at, pa.timestamp("us", tz="UTC")), n),
        }, schema=QUARANTINE_SCHEMA)
        append_once(self.delta_path, table, app_id=batch.app_id(self.output), version=batch.batch_id)
        return n


class MicroBatchPublisher:
    """The ``foreachBatch`` function of one query: Arrow once, then the sink."""

    def __init__(self, instance: InstanceKey, sink: Sink, epoch: Callable[[], int] = lambda: 0) -> None:
        self.instance = instance
        self.sink = sink
        self.epoch = epoch

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        rows = frame.toArrow()
        batch = BatchInfo(self.instance, batch_id, self.epoch(), datetime.now(timezone.utc))
        written = self.sink.publish(rows, batch)
        log.debug("%s batch %d: %d rows in, %d rows published", self.sink.output, batch_id, rows.num_rows, written)
