"""The plan-independent publisher: every micro-batch of every query goes out through here.

``MicroBatchPublisher`` is the ``foreachBatch`` function. It turns the batch into Arrow once and,
when this instance is ACTIVE, hands it to the query's sink with the batch's identity (instance,
batch id, fencing epoch); when it is a standby, the sink holds the rows back instead. A query
writing several outputs routes its rows with :class:`RoutedSink`. What a sink does is its output
kind's (:mod:`tandem.outputs`); this module only routes.

The Delta app id of a batch names the checkpoint's lineage (the query id in its ``metadata``): a
checkpoint re-synced from another instance's cut gets a new one, so its batches are not taken for
replays of the batches this instance published before under its old checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from tandem.checkpoints import checkpoint_lineage
from tandem.errors import FencedError
from tandem.logs import batch_context
from tandem.outputs.base import BatchInfo, Sink, Verification, first_line
from tandem.runtime.roles import RoleController
from tandem.store.registry import InstanceKey

log = logging.getLogger(__name__)


ALL_ROWS = "*"


class RoutedSink:
    """Rows of one query to several outputs, by the value of one column: ``routes`` pairs a value (``"*"``: every
    row) with a sink; a value may go to several sinks, rows of other values go nowhere."""

    def __init__(self, column: str, routes: list[tuple[str, Sink]]) -> None:
        self.column = column
        self.routes = routes
        self.output = "+".join(sink.output for _, sink in routes)

    def _split(self, rows: pa.Table) -> Iterator[tuple[Sink, pa.Table]]:
        for value, sink in self.routes:
            yield sink, rows if value == ALL_ROWS else rows.filter(pc.equal(rows[self.column], value))

    def publish(self, rows: pa.Table, batch: BatchInfo) -> int:
        return sum(sink.publish(part, batch) for sink, part in self._split(rows))

    def hold(self, rows: pa.Table, batch_id: int) -> None:
        for sink, part in self._split(rows):
            sink.hold(part, batch_id)

    def trim(self) -> None:
        for _, sink in self.routes:
            sink.trim()

    def flush(self, batch: BatchInfo) -> int:
        return sum(sink.flush(batch) for _, sink in self.routes)

    def verify_with(self, verification: Verification) -> None:
        for _, sink in self.routes:
            sink.verify_with(verification)


class MicroBatchPublisher:
    """The ``foreachBatch`` function of one query: Arrow once, then publish (ACTIVE) or hold (standby).

    ``failure`` says which batch failed and why when publishing or holding raised (the query then
    fails): the same words when a relaunch fails there again, so the supervisor can tell a batch
    that always fails from a crash. What is logged meanwhile carries the batch id and ``query``
    (:func:`tandem.logs.batch_context`).
    """

    def __init__(self, instance: InstanceKey, sink: Sink, roles: RoleController, checkpoint: Path | None = None,
                 query: str | None = None) -> None:
        self.instance = instance
        self.sink = sink
        self.query = query
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
        with batch_context(batch_id, self.query):
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
