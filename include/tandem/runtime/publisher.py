"""The plan-independent publisher: every micro-batch of every query goes out through here.

``MicroBatchPublisher`` is the ``foreachBatch`` function. It turns the batch into Arrow once and,
when this instance is ACTIVE, hands it to the query's sink with the batch's identity (instance,
batch id, fencing epoch); when it is a standby, the sink holds the rows back instead.

Sinks are idempotent and fenced:

- PostgreSQL rows are upserted with deterministic keys in one transaction that first checks the
  lease (``check_fence``) and also records the batch and the published position in
  ``publish_log``. A row only replaces one that covers no more events (count as version), so a
  new active that lags cannot move a value backwards.
- Delta appends carry an application transaction (app id = ``<instance>/<output>/<query id>``,
  version = batch id), so a replayed batch is skipped; the epoch is checked again just before the
  commit. The query id (from the checkpoint's ``metadata``) names the checkpoint's lineage: a
  checkpoint re-synced from another instance's cut gets a new one, so its batches are not taken
  for replays of the batches this instance published before under its old checkpoint.
- A standby keeps the newest version of each output key it would have published, trimmed by the
  position the active has published; on promotion it publishes what is left, then goes live.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark.sql import DataFrame

from tandem.aggregation import delta as agg_delta
from tandem.aggregation import postgres as agg_postgres
from tandem.aggregation.spec import AggregationSpec
from tandem.errors import FencedError
from tandem.lake.tables import append_once, read_table
from tandem.runtime.roles import RoleController
from tandem.store.db import Database
from tandem.store.leases import check_fence
from tandem.store.publish_log import published_watermark, record_position, record_published
from tandem.store.registry import InstanceKey

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchInfo:
    instance: InstanceKey
    batch_id: int
    epoch: int
    published_at: datetime
    lineage: str = ""

    def app_id(self, output: str) -> str:
        base = f"{self.instance.id}/{output}"
        return f"{base}/{self.lineage}" if self.lineage else base


def checkpoint_lineage(checkpoint: Path | None) -> str:
    """The query id in a checkpoint's ``metadata`` ('' when there is none yet)."""
    if checkpoint is None:
        return ""
    try:
        return str(json.loads((checkpoint / "metadata").read_text().splitlines()[0]).get("id", ""))
    except (FileNotFoundError, IndexError, ValueError, AttributeError):
        return ""


class Sink(Protocol):
    output: str

    def publish(self, rows: pa.Table, batch: BatchInfo) -> int:
        """Write one micro-batch idempotently and fenced; return how many rows were written."""

    def hold(self, rows: pa.Table, batch_id: int) -> None:
        """Keep a standby's batch back instead of publishing it."""

    def flush(self, batch: BatchInfo) -> int:
        """Publish everything held (on promotion); return how many rows were written."""

    def trim(self) -> None:
        """Drop held rows the active has already published for good."""


def fence(db: Database, batch: BatchInfo) -> None:
    """Raise :class:`FencedError` unless this instance still holds the lease at the batch's epoch."""
    key = batch.instance
    db.run(lambda cursor: check_fence(cursor, key.plan, key.shard_id, key.node, batch.epoch), attempts=3)


class AggregateSink:
    """Per-second partials → PostgreSQL (upsert + roll-up to every granularity) → the same rows to Delta."""

    def __init__(self, spec: AggregationSpec, instance: InstanceKey, database_url: str, delta_path: Path,
                 watermark_s: float) -> None:
        self.spec = spec
        self.instance = instance
        self.output = spec.table
        self.delta_path = delta_path
        self.watermark = timedelta(seconds=watermark_s)
        self.db = Database(database_url, "tandem-publisher")
        self.newest_bucket: datetime | None = None
        self.held: dict[tuple, dict] = {}
        self.held_batch: int | None = None
        self.table_ready = False

    def _see(self, rows: pa.Table) -> datetime | None:
        newest = pc.max(rows["bucket_start"]).as_py() if rows.num_rows else None
        if newest is not None and (self.newest_bucket is None or newest > self.newest_bucket):
            self.newest_bucket = newest
        return newest

    def position(self) -> datetime | None:
        """Buckets ending at or before this are final: no event for them is accepted any more."""
        return None if self.newest_bucket is None else self.newest_bucket - self.watermark

    def publish(self, rows: pa.Table, batch: BatchInfo) -> int:
        newest = self._see(rows)
        if rows.num_rows == 0:
            return 0
        key = batch.instance
        position = self.position()

        def write(cursor) -> list[dict]:
            # COPY first: a publisher frozen in the middle of a COPY (SIGSTOP, a stalled VM) is "active", not
            # idle in its transaction, so idle_in_transaction_session_timeout never ends it; it must not hold
            # the lease's FOR SHARE lock then, or the take-over would wait for as long as it is frozen.
            agg_postgres.stage_batch(cursor, self.spec, rows)
            check_fence(cursor, key.plan, key.shard_id, key.node, batch.epoch)
            if not self.table_ready:
                agg_postgres.ensure_table(cursor, self.spec)
            written = agg_postgres.upsert_and_roll_up(cursor, self.spec, key.plan, key.shard_id, batch.epoch,
                                                      batch.batch_id)
            record_published(cursor, key, self.output, batch.batch_id, batch.epoch, len(written), newest, None)
            return written

        written = self.db.run(write)
        self.table_ready = True
        fence(self.db, batch)
        agg_delta.append_rows(self.delta_path, self.spec, written, node=key.node, published_at=batch.published_at,
                              app_id=batch.app_id(self.output), batch_id=batch.batch_id)
        # The position a standby trims by covers this batch only once Delta has it too: if the
        # active dies between the PostgreSQL commit and the Delta append, the standby still
        # holds (and on promotion republishes) these rows instead of dropping them.
        record_position(self.db, key, self.output, batch.batch_id, position)
        return len(written)

    def hold(self, rows: pa.Table, batch_id: int) -> None:
        self._see(rows)
        identity = ["bucket_start", *self.spec.keys]
        for row in rows.to_pylist():
            self.held[tuple(row[c] for c in identity)] = row
        self.held_batch = batch_id

    def trim(self) -> None:
        if not self.held:
            return
        done = published_watermark(self.db, self.instance.plan, self.instance.shard_id, self.output)
        if done is not None:
            # a bucket ending at or before the published position is final on the active's side
            self.held = {k: r for k, r in self.held.items() if r["bucket_start"] + timedelta(seconds=1) > done}

    def flush(self, batch: BatchInfo) -> int:
        if not self.held or self.held_batch is None:
            return 0
        self.trim()
        rows = pa.Table.from_pylist(list(self.held.values()))
        written = self.publish(rows, replace(batch, batch_id=self.held_batch))
        log.info("published %d held rows (%d written) of %s", rows.num_rows, written, self.output)
        self.held.clear()
        return written


QUARANTINE_SCHEMA = pa.schema([
    ("raw", pa.string()), ("source_file", pa.string()), ("reason", pa.string()),
    ("plan", pa.string()), ("shard_id", pa.string()), ("node", pa.string()),
    ("batch_id", pa.int64()), ("quarantined_at", pa.timestamp("us", tz="UTC")),
])


class QuarantineSink:
    """Bad input lines, with the raw text, the source file and the reason, appended to Delta.

    A source file's bad lines are quarantined once per shard: a file already in the table for
    this shard is skipped when published (a replay after a restore, an old active's late batch)
    and dropped from what a standby holds. The file source reads a file whole in one batch, so
    the file is the id of its bad lines.
    """

    output = "quarantine"

    def __init__(self, instance: InstanceKey, database_url: str, delta_path: Path) -> None:
        self.instance = instance
        self.delta_path = delta_path
        self.db = Database(database_url, "tandem-publisher")
        self.held: dict[str, pa.Table] = {}
        self.held_batch: int | None = None

    def quarantined(self, source_files: list[str]) -> set[str]:
        """Of ``source_files``, those whose bad lines are already in the table for this shard."""
        done = read_table(self.delta_path, (ds.field("shard_id") == self.instance.shard_id)
                          & ds.field("source_file").isin(source_files), columns=["source_file"])
        return set(done.column("source_file").to_pylist()) if done.num_rows else set()

    def publish(self, rows: pa.Table, batch: BatchInfo) -> int:
        if rows.num_rows == 0:
            return 0
        done = self.quarantined(pc.unique(rows["source_file"]).to_pylist())
        if done:
            rows = rows.filter(pc.invert(pc.is_in(rows["source_file"], pa.array(sorted(done), pa.string()))))
            if rows.num_rows == 0:
                return 0
        n = rows.num_rows
        table = pa.table({
            "raw": rows["raw"], "source_file": rows["source_file"], "reason": rows["reason"],
            "plan": pa.repeat(batch.instance.plan, n), "shard_id": pa.repeat(batch.instance.shard_id, n),
            "node": pa.repeat(batch.instance.node, n), "batch_id": pa.repeat(pa.scalar(batch.batch_id, pa.int64()), n),
            "quarantined_at": pa.repeat(pa.scalar(batch.published_at, pa.timestamp("us", tz="UTC")), n),
        }, schema=QUARANTINE_SCHEMA)
        fence(self.db, batch)
        append_once(self.delta_path, table, app_id=batch.app_id(self.output), version=batch.batch_id)
        return n

    def hold(self, rows: pa.Table, batch_id: int) -> None:
        for source_file in pc.unique(rows["source_file"]).to_pylist():
            self.held[source_file] = rows.filter(pc.equal(rows["source_file"], source_file))
        self.held_batch = batch_id

    def trim(self) -> None:
        if not self.held:
            return
        for source_file in self.quarantined(list(self.held)):
            self.held.pop(source_file, None)

    def flush(self, batch: BatchInfo) -> int:
        self.trim()
        if not self.held or self.held_batch is None:
            return 0
        rows = pa.concat_tables(self.held.values())
        written = self.publish(rows, replace(batch, batch_id=self.held_batch))
        self.held.clear()
        return written


class MicroBatchPublisher:
    """The ``foreachBatch`` function of one query: Arrow once, then publish (ACTIVE) or hold (standby)."""

    def __init__(self, instance: InstanceKey, sink: Sink, roles: RoleController, checkpoint: Path | None = None) -> None:
        self.instance = instance
        self.sink = sink
        self.roles = roles
        self.checkpoint = checkpoint
        self._lineage: str | None = None
        roles.on_promote(lambda epoch: sink.flush(self._batch(-1, epoch)))
        roles.on_tick(sink.trim)

    def _batch(self, batch_id: int, epoch: int) -> BatchInfo:
        if not self._lineage:  # Spark writes the checkpoint's metadata when the query starts
            self._lineage = checkpoint_lineage(self.checkpoint)
        return BatchInfo(self.instance, batch_id, epoch, datetime.now(timezone.utc), self._lineage)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        rows = frame.toArrow()
        with self.roles.lock:
            epoch = self.roles.epoch
            if epoch is None:
                self.sink.hold(rows, batch_id)
                return
            try:
                written = self.sink.publish(rows, self._batch(batch_id, epoch))
            except FencedError as exc:
                self.roles.demote(str(exc))
                self.sink.hold(rows, batch_id)
                return
        log.debug("%s batch %d: %d rows in, %d rows published", self.sink.output, batch_id, rows.num_rows, written)
