"""The ``aggregation`` output kind: partial aggregates per instance and bucket, merged on read.

Two ways in: Spark's per-second partial aggregates (:class:`AggregateSink`, an aggregation without
``id``: the query aggregates in ``update`` mode) and facts added once each by id
(:class:`FactAggregateSink`, an aggregation with ``id``: the sink aggregates).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
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
from tandem.declarations import OutputConfig
from tandem.outputs.base import BatchInfo, HeldById, HeldUntilPublished, Refusals, as_utc, fence
from tandem.outputs.quarantine import QuarantineSink
from tandem.store import aggregates
from tandem.store import outputs as store
from tandem.store.db import Database
from tandem.store.leases import check_fence
from tandem.store.publish_log import published_watermark, record_position, record_published
from tandem.store.registry import InstanceKey

log = logging.getLogger(__name__)


class AggregateSink(HeldUntilPublished[tuple, dict]):
    """Per-second partials → PostgreSQL (upsert + roll-up to every granularity) → the same rows to Delta.

    A standby holds the newest partial of each (second, key); a second is published for good once
    the active's published position has passed its end.
    """

    def __init__(self, spec: AggregationSpec, instance: InstanceKey, database_url: str, delta_path: Path,
                 watermark_s: float, quarantine: QuarantineSink | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.instance = instance
        self.output = spec.name  # the declared output (not its table): publish_log, app ids and snapshots key by it
        self.delta_path = delta_path
        self.watermark = timedelta(seconds=watermark_s)
        self.db = Database(database_url, "tandem-publisher")
        self.newest_bucket: datetime | None = None
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
            aggregates.stage_batch(cursor, self.spec, rows if len(indices) == rows.num_rows else rows.take(indices))
            check_fence(cursor, key.plan, key.shard_id, key.node, batch.epoch)
            if not self.table_ready:
                aggregates.ensure_table(cursor, self.spec)
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

    def identities(self, rows: pa.Table) -> dict[tuple, dict]:
        self._see(rows)
        identity = ["bucket_start", *self.spec.keys]
        return {tuple(row[c] for c in identity): row for row in rows.to_pylist()}

    def published_of(self, held: dict[tuple, dict]) -> list[tuple]:
        done = published_watermark(self.db, self.instance.plan, self.instance.shard_id, self.output)
        # a bucket ending at or before the published position is final on the active's side
        if done is None:
            return []
        return [k for k, row in held.items() if row["bucket_start"] + timedelta(seconds=1) <= done]

    def publish_held(self, held: dict[tuple, dict], batch: BatchInfo) -> int:
        return self.publish(pa.Table.from_pylist(list(held.values())), batch)


class FactAggregateSink(HeldById):
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
                aggregates.ensure_table(cursor, spec)
            new = store.insert_contributions(cursor, key, self.output, {cid: {} for cid in ids})
            written: list[dict] = []
            if new:
                seconds = add_facts(cursor, spec, key.plan, key.shard_id, [rows[i] for i in new], self._second)
                aggregates.stage_batch(cursor, spec, seconds)
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


def sink(plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
         quarantine: QuarantineSink | None = None) -> AggregateSink | FactAggregateSink:
    """Facts added by id when the output declares ``id``, else Spark's per-second partials."""
    spec = spec_for(plan, output)
    if plan.outputs[output].id:
        return FactAggregateSink(spec, plan.name, output, plan.outputs[output], instance, database_url, delta_path,
                                 quarantine)
    return AggregateSink(spec, instance, database_url, delta_path, plan.watermark_s, quarantine)
