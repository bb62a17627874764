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
- Rows a store refuses for what they hold (a *data error*: :func:`is_data_error`) do not fail the
  batch: :class:`Refusals` finds them by bisecting the batch in a transaction it rolls back, sends
  them to the plan's quarantine with the store's error as the reason, and the sink publishes the
  rest. The decision depends on the rows alone, so a standby that publishes the same rows after a
  failover refuses the same ones; the quarantine keeps each refused row once (by its content).
  Any other error fails the query, as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark.sql import DataFrame

from tandem.aggregation import delta as agg_delta
from tandem.aggregation import postgres as agg_postgres
from tandem.aggregation.spec import AggregationSpec
from tandem.errors import DataError, FencedError
from tandem.lake.tables import append_once, read_table
from tandem.runtime.roles import RoleController
from tandem.store.db import Database
from tandem.store.leases import check_fence
from tandem.store.outputs import to_json
from tandem.store.publish_log import published_watermark, record_position, record_published
from tandem.store.registry import InstanceKey

log = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


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


DATA_ERROR_SQLSTATES = ("22", "54000")
"""PostgreSQL's data exceptions (class 22: a value it cannot convert, store or compute) and 54000 (an index
row over the size limit): errors about the rows' values, not about the store's state."""


def is_data_error(exc: BaseException) -> bool:
    """Whether a sink's error is about the values of the rows it was given (quarantine them) or not (fail)."""
    if isinstance(exc, DataError):
        return True
    code = getattr(exc, "pgcode", None) or ""
    return code.startswith(DATA_ERROR_SQLSTATES)


def first_line(exc: BaseException) -> str:
    """An error's first line, the way an operator reads it (the SQLSTATE of a PostgreSQL error in front)."""
    code = getattr(exc, "pgcode", None)
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
    return f"SQLSTATE {code}: {text}" if code else text


class _ProbesDone(Exception):
    """Ends the probing transaction: everything it wrote is rolled back."""


class Refusals:
    """What a sink does with rows its store refuses for what they hold: the dead-letter queue of Kafka Connect.

    Purpose
        One value PostgreSQL cannot store must not stop a plan: without this, the active fails the
        batch, the standby takes over, replays the same rows and fails the same way.

    How it works
        :meth:`run` runs the sink's transaction (``apply(cursor, keys)``) on a batch's rows. On a data
        error it bisects the rows in one transaction that it rolls back, each probe in a savepoint,
        down to the rows the store refuses on their own; sends them to the plan's quarantine (the
        row as JSON, the store's error as the reason, ``output:<name>/<content hash>`` as the
        source, so a refused row is quarantined once whoever refuses it); and runs the transaction
        again with the rest.

    What it does not do
        It does not quarantine when no row fails on its own (rows that fail only together, a table
        that is gone): the original error fails the batch, and the supervisor blocks the instance if
        it keeps failing there. A plan without a quarantine output fails on every data error.
    """

    def __init__(self, output: str, db: Database, quarantine: QuarantineSink | None) -> None:
        self.output = output
        self.db = db
        self.quarantine = quarantine

    def run(self, apply: Callable[[Any, list[K]], T], keys: list[K], row_of: Callable[[K], dict[str, Any]],
            batch: BatchInfo) -> tuple[T | None, list[K]]:
        """``(apply's result, the keys it was applied to)``: every key, or those the store did not refuse.

        The result is ``None`` when every key was refused (nothing was applied).
        """
        try:
            return self.db.run(lambda cursor: apply(cursor, keys)), keys
        except Exception as exc:
            if self.quarantine is None or not is_data_error(exc):
                raise
            refused = self.refused(apply, keys, first_line(exc))
            if not refused:
                raise
        self.quarantine.publish_refused(self.output, {key: (row_of(key), reason) for key, reason in refused.items()},
                                        batch)
        kept = [key for key in keys if key not in refused]
        log.warning("%s batch %d: %d of %d rows refused by the store, quarantined: %s", self.output, batch.batch_id,
                    len(refused), len(keys), next(iter(refused.values())))
        if not kept:
            return None, kept
        return self.db.run(lambda cursor: apply(cursor, kept)), kept

    def refused(self, apply: Callable[[Any, list[K]], Any], keys: list[K], error: str) -> dict[K, str]:
        """The keys ``apply`` fails on by themselves, each with its error (``keys`` failed with ``error``).

        Nothing is written: every probe runs in a savepoint of one transaction that is rolled back.
        """
        found: dict[K, str] = {}

        def probe(cursor) -> None:
            def fails(part: list[K]) -> str | None:
                cursor.execute("SAVEPOINT tandem_probe")
                try:
                    apply(cursor, part)
                    return None
                except Exception as exc:
                    if not is_data_error(exc):
                        raise
                    return first_line(exc)
                finally:
                    cursor.execute("ROLLBACK TO SAVEPOINT tandem_probe")

            def search(part: list[K], part_error: str) -> None:
                if len(part) == 1:
                    found[part[0]] = part_error
                    return
                half = len(part) // 2
                for piece in (part[:half], part[half:]):
                    piece_error = fails(piece)
                    if piece_error is not None:
                        search(piece, piece_error)

            search(list(keys), error)
            raise _ProbesDone

        try:
            self.db.run(probe, attempts=3)
        except _ProbesDone:
            pass
        return found


class AggregateSink:
    """Per-second partials → PostgreSQL (upsert + roll-up to every granularity) → the same rows to Delta."""

    def __init__(self, spec: AggregationSpec, instance: InstanceKey, database_url: str, delta_path: Path,
                 watermark_s: float, quarantine: QuarantineSink | None = None) -> None:
        self.spec = spec
        self.instance = instance
        self.output = spec.name  # the declared output (not its table): publish_log, app ids and snapshots key by it
        self.delta_path = delta_path
        self.watermark = timedelta(seconds=watermark_s)
        self.db = Database(database_url, "tandem-publisher")
        self.newest_bucket: datetime | None = None
        self.held: dict[tuple, dict] = {}
        self.held_batch: int | None = None
        self.table_ready = False
        self.refusals = Refusals(self.output, self.db, quarantine)

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

        def write(cursor, indices: list[int]) -> list[dict]:
            # COPY first: a publisher frozen in the middle of a COPY (SIGSTOP, a stalled VM) is "active", not
            # idle in its transaction, so idle_in_transaction_session_timeout never ends it; it must not hold
            # the lease's FOR SHARE lock then, or the take-over would wait for as long as it is frozen.
            agg_postgres.stage_batch(cursor, self.spec, rows if len(indices) == rows.num_rows else rows.take(indices))
            check_fence(cursor, key.plan, key.shard_id, key.node, batch.epoch)
            if not self.table_ready:
                agg_postgres.ensure_table(cursor, self.spec)
            written = agg_postgres.upsert_and_roll_up(cursor, self.spec, key.plan, key.shard_id, batch.epoch,
                                                      batch.batch_id)
            record_published(cursor, key, self.output, batch.batch_id, batch.epoch, len(written), newest, None)
            return written

        written, _ = self.refusals.run(write, list(range(rows.num_rows)), lambda i: rows.slice(i, 1).to_pylist()[0],
                                       batch)
        if written is None:
            return 0
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


REFUSED_SOURCE = "output:"
"""The source of a quarantined row that an output's store refused: ``output:<output>/<hash of the row>``."""
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
    the file is the id of its bad lines. A row another output's store refused
    (:meth:`publish_refused`) has the source ``output:<output>/<hash of the row>``.
    """

    def __init__(self, instance: InstanceKey, database_url: str, delta_path: Path, output: str = "quarantine") -> None:
        self.output = output
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
        return self._append(rows, batch, batch.app_id(self.output))

    def publish_refused(self, output: str, refused: dict[Any, tuple[dict[str, Any], str]], batch: BatchInfo) -> int:
        """Quarantine rows the store of ``output`` refused: ``{key: (row, the store's error)}``."""
        texts = [json.dumps(to_json(row), default=str, sort_keys=True, ensure_ascii=False)
                 for row, _ in refused.values()]
        rows = pa.table({
            "raw": pa.array(texts, pa.string()),
            "source_file": pa.array([f"{REFUSED_SOURCE}{output}/{hashlib.sha256(text.encode()).hexdigest()[:32]}"
                                     for text in texts], pa.string()),
            "reason": pa.array([f"output {output}: the store refused the row: {error}" for _, error in refused.values()],
                               pa.string()),
        })
        # its own transaction id: several outputs of one query may refuse rows of the same batch
        return self._append(rows, batch, batch.app_id(f"{self.output}/{output}"))

    def _append(self, rows: pa.Table, batch: BatchInfo, app_id: str) -> int:
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
        append_once(self.delta_path, table, app_id=app_id, version=batch.batch_id)
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
    """The ``foreachBatch`` function of one query: Arrow once, then publish (ACTIVE) or hold (standby).

    ``failure`` says which batch failed and why when publishing or holding raised (the query then
    fails): the same words when a relaunch fails there again, so the supervisor can tell a batch
    that always fails from a crash.
    """

    def __init__(self, instance: InstanceKey, sink: Sink, roles: RoleController, checkpoint: Path | None = None) -> None:
        self.instance = instance
        self.sink = sink
        self.roles = roles
        self.checkpoint = checkpoint
        self._lineage: str | None = None
        self.failure: str | None = None
        roles.on_promote(lambda epoch: sink.flush(self._batch(-1, epoch)))
        roles.on_tick(sink.trim)

    def _batch(self, batch_id: int, epoch: int) -> BatchInfo:
        if not self._lineage:  # Spark writes the checkpoint's metadata when the query starts
            self._lineage = checkpoint_lineage(self.checkpoint)
        return BatchInfo(self.instance, batch_id, epoch, datetime.now(timezone.utc), self._lineage)

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        try:
            self._publish_or_hold(frame, batch_id)
        except Exception as exc:
            lineage = self._lineage or checkpoint_lineage(self.checkpoint)
            self.failure = f"{self.sink.output} batch {batch_id} of checkpoint {lineage or '?'}: {first_line(exc)}"
            raise

    def _publish_or_hold(self, frame: DataFrame, batch_id: int) -> None:
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
