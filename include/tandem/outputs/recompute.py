"""What a backfill and a reconcile do with an output's recomputed rows, for the kinds published once by id.

A backfill (:mod:`tandem.batch.backfill`) and a reconcile (:mod:`tandem.batch.reconcile`) recompute a closed
range of one instance and hand each output's rows to its kind (:meth:`tandem.outputs.base.OutputKind.replace`,
:meth:`~tandem.outputs.base.OutputKind.compare`) as a :class:`Recomputed`. For an output published once by id
the rule is the same whatever the kind: publish the rows the stream never published (:func:`publish_missing`),
and count as late those it never published (:func:`compare_published`); a kind adds what it alone knows (an
events output's payloads, its events no longer produced).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from tandem.errors import BackfillRefused
from tandem.json_values import json_text, spelled
from tandem.layout import delta_table_dir
from tandem.outputs.base import UTC_MICROS, BatchInfo, OutputKind
from tandem.store import outputs as store_outputs
from tandem.store.db import Database
from tandem.store.leases import read_lease
from tandem.store.registry import InstanceKey

if TYPE_CHECKING:
    from tandem.config import ClusterConfig, PlanConfig
    from tandem.outputs.base import HeldById

BATCH_COLUMN = "_backfill_batch"
"""The column a recomputation adds to its rows: the micro-batch that emitted them (an update-mode query emits a
bucket again when it changes; the newest wins)."""
BACKFILL_BATCH = -1
"""The batch id rows published by a backfill carry (PostgreSQL's ``batch_id``, the Delta rows and the
``publish_log`` row of the lease holder); the Delta commit's application id names the backfill."""
DIFFERENCES = ("late", "extra", "different")
"""What a reconcile counts: ``late`` (recomputed, not published: after the watermark), ``extra`` (published, not
recomputed), ``different`` (both, with other values)."""
EXAMPLES = 5
RELATIVE = 1e-9
"""Sums of doubles recomputed in another order may differ in the last bits."""


@dataclass(frozen=True)
class Recomputed:
    """One instance's recomputed rows of one output for ``[start, end)`` (``rows`` ``None``: it emitted none)."""

    cluster: ClusterConfig
    plan: PlanConfig
    db: Database
    instance: str
    output: str
    rows: pa.Table | None
    start: datetime
    end: datetime

    @property
    def declared(self):
        return self.plan.outputs[self.output]

    @property
    def delta_path(self) -> Path:
        return delta_table_dir(self.cluster, self.plan.name, self.output)

    def in_range(self) -> pa.Table | None:
        """The rows whose declared ``time`` lies in the range (without the batch column); ``None`` when none."""
        if self.rows is None:
            return None
        return in_range(self.rows.drop_columns([BATCH_COLUMN]), self.declared.time, self.start, self.end)


@dataclass
class Outcome:
    """The differences of one instance's output."""

    instance: str
    output: str
    compared: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DIFFERENCES, 0))
    examples: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in DIFFERENCES})
    skipped: str | None = None

    def add(self, kind: str, example: Any) -> None:
        self.counts[kind] += 1
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(example)

    def row(self) -> dict[str, Any]:
        """What :func:`tandem.batch.reconciliations.store_outcomes` stores of it."""
        return {"instance": self.instance, "output": self.output, "compared": self.compared, **self.counts,
                "examples": json_text(self.examples), "skipped": self.skipped}

    @property
    def real(self) -> int:
        """Differences the watermark does not explain."""
        return self.counts["extra"] + self.counts["different"]


def same(a: Any, b: Any) -> bool:
    """Whether a published and a recomputed value agree (doubles within :data:`RELATIVE`; NaN and the infinities
    equal to themselves, as doubles or as the strings a JSON store keeps them as: :func:`spelled`)."""
    a, b = spelled(a), spelled(b)
    if isinstance(a, float) or isinstance(b, float):
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
        return numbers and math.isclose(a, b, rel_tol=RELATIVE, abs_tol=1e-9)
    return a == b


def compare_ids(outcome: Outcome, published: Mapping[str, Any] | None, recomputed: Mapping[str, Any]) -> Outcome:
    """Outputs published once by id: late when recomputed but never published; with ``published`` (id -> row),
    extra when only published and different when the rows differ (pure; doubles within :data:`RELATIVE`, as a
    reading's average summed in another order may differ in the last bits)."""
    outcome.compared += len(set(recomputed) | set(published or {}))
    for row_id, row in sorted(recomputed.items()):
        if published is not None and row_id in published:
            theirs = published[row_id]
            differing = {k: [theirs.get(k), v] for k, v in row.items() if not same(theirs.get(k), v)}
            if differing:
                outcome.add("different", {"id": row_id, **differing})
        else:
            outcome.add("late", {"id": row_id})
    for row_id in sorted(set(published or {}) - set(recomputed)):
        outcome.add("extra", {"id": row_id})
    return outcome


def in_range(rows: pa.Table, field_name: str, start: datetime, end: datetime) -> pa.Table:
    """The rows whose ``field_name`` (a timestamp, or epoch milliseconds) lies in ``[start, end)`` (pure)."""
    column = rows[field_name]
    if pa.types.is_integer(column.type):
        column = pc.cast(pc.multiply(column, 1000), pa.int64()).cast(UTC_MICROS)
    elif pa.types.is_timestamp(column.type) and column.type.tz is None:
        column = column.cast(pa.timestamp("us")).cast(UTC_MICROS)
    else:
        column = column.cast(UTC_MICROS)
    return rows.filter(pc.and_(pc.greater_equal(column, pa.scalar(start, UTC_MICROS)),
                               pc.less(column, pa.scalar(end, UTC_MICROS))))


def instance_sink(kind: OutputKind, job: Recomputed, node: str) -> HeldById:
    """The output's sink for the recomputed instance, as ``node`` (``backfill``, ``reconcile``): its own store."""
    return kind.sink(job.plan, job.output, InstanceKey(job.plan.name, job.instance, node), job.cluster.database_url,
                     job.delta_path, None)


def unbounded(job: Recomputed) -> str | None:
    """Why the output's range cannot be recomputed (it declares no ``time``), or ``None``."""
    if job.declared.time is None:
        return f"{job.output} declares no time field: its range cannot be bounded"
    return None


def publish_missing(kind: OutputKind, job: Recomputed, backfill_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Publish the recomputed rows of the range (by the output's ``time``) the stream never published, through the
    instance's own sink under the ACTIVE's lease, so each is published once whoever comes first.

    Returns ``(what happened, the recomputed rows by id)``; a row the recomputation no longer produces stays (a
    notification cannot be unsent; an applied value is not subtracted).
    """
    sink = instance_sink(kind, job, "backfill")
    rows = job.in_range()
    recomputed = {} if rows is None else sink.identities(rows)
    known = already_published(job, sink, list(recomputed))
    missing = {i: row for i, row in recomputed.items() if i not in known}
    if missing:
        publish_under_lease(job, sink, missing, backfill_id)
    return {"recomputed": True, "rows": len(recomputed), "published": len(missing),
            "already_published": len(known)}, recomputed


def already_published(job: Recomputed, sink: HeldById, ids: list[str]) -> set[str]:
    """Of ``ids`` (of rows published once by id), those the instance's output already holds, whoever published them."""
    if not ids:
        return set()
    return job.db.run(lambda cursor: store_outputs.known_ids(cursor, sink.table, sink.id_column, job.plan.name,
                                                             job.output, ids), attempts=3)


def publish_under_lease(job: Recomputed, sink: Any, rows: dict[Any, dict[str, Any]], backfill_id: str) -> int:
    """Write ``rows`` (by identity) through the instance's own ``sink`` (which took them with ``identities()``) as
    the ACTIVE node, under its lease and epoch, as batch :data:`BACKFILL_BATCH`; what the sink wrote.

    Raises:
        BackfillRefused: the instance has no ACTIVE node (a valid lease).
    """
    lease = read_lease(job.db, job.plan.name, job.instance)
    if lease is None or lease.holder is None or lease.expired_for_s > 0:
        raise BackfillRefused(f"backfill of plan {job.plan.name}: instance {job.instance} has no ACTIVE node to "
                              f"publish {len(rows)} rows of {job.output} under its lease: start it, then again")
    holder = InstanceKey(job.plan.name, job.instance, lease.holder)
    sink.instance = holder  # the same sink: identities() recorded the rows' schema its write() needs
    return sink.write(rows, BatchInfo(holder, BACKFILL_BATCH, lease.epoch, datetime.now(timezone.utc),
                                      f"backfill-{backfill_id}"))


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(row, default=str))


def recomputed_by_id(kind: OutputKind, job: Recomputed) -> tuple[HeldById, dict[str, dict[str, Any]]]:
    """The output's sink (for its table) and the recomputed rows of the range by id, as plain JSON values."""
    sink = instance_sink(kind, job, "reconcile")
    rows = job.in_range()
    return sink, ({} if rows is None else {i: _plain(row) for i, row in sink.identities(rows).items()})


def compare_published(kind: OutputKind, job: Recomputed) -> Outcome:
    """An output published once by id whose published rows are not kept as rows (a table's contributions, a fact
    aggregation's facts): late when a recomputed id was never applied."""
    outcome = Outcome(job.instance, job.output)
    sink, recomputed = recomputed_by_id(kind, job)
    known = already_published(job, sink, list(recomputed))
    outcome.compared += len(known)
    return compare_ids(outcome, None, {i: row for i, row in recomputed.items() if i not in known})


class PublishedById(OutputKind):
    """A kind whose rows are published once by id: a backfill publishes what the stream never published, a
    reconcile counts those as late."""

    def replace(self, job: Recomputed, backfill_id: str) -> dict[str, Any]:
        why = unbounded(job)
        return {"recomputed": False, "why": why} if why else publish_missing(self, job, backfill_id)[0]

    def compare(self, job: Recomputed) -> Outcome:
        why = unbounded(job)
        return Outcome(job.instance, job.output, skipped=why) if why else compare_published(self, job)
