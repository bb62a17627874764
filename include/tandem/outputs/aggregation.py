"""The ``aggregation`` output kind: partial aggregates per instance and bucket, merged on read.

Two ways in: Spark's per-second partial aggregates (:class:`AggregateSink`, an aggregation without
``id``: the query aggregates in ``update`` mode) and facts added once each by id
(:class:`FactAggregateSink`, an aggregation with ``id``: the sink aggregates).

Restore (:func:`restore`): an aggregation of facts is kept (published once by id); Spark's partials
are rolled back to the snapshot's cut, in Delta for the instance's slice and in PostgreSQL for the
keys that changed (the newest version of each in the restored slice). Validation
(:func:`validation`): the serving table's partial rows whose bucket overlaps the window, with the
declared ratios added, against what the declaration implies (:func:`expectations`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg2.errors
import pyarrow as pa
import pyarrow.compute as pc

from tandem.aggregation import delta as agg_delta
from tandem.aggregation import postgres as agg_postgres
from tandem.aggregation import distinct
from tandem.aggregation.granularity import bucket_end, bucket_start
from tandem.aggregation.merge import long_sum
from tandem.aggregation.spec import UTC_MICROS, AggregationSpec, Measure, spec_for
from tandem.declarations import MAX_EPOCH_MILLIS, OUTPUT_RULES, FieldConfig, OutputConfig
from tandem.json_values import times_as_iso
from tandem.errors import NothingPublished, QueryError
from tandem.lake.history import roll_back_slice
from tandem.layout import delta_table_dir
from tandem.outputs.base import (
    ALL_TIME,
    BatchInfo,
    HeldById,
    HeldUntilPublished,
    OutputKind,
    ReadRequest,
    Refusals,
    RetentionRun,
    Trimmed,
    Validation,
    Window,
    as_utc,
    capped,
    fence,
    reading,
    row_difference,
    plan_time_fields,
)
from tandem.outputs.expectations import expect, instances, not_null
from tandem.outputs.quarantine import QuarantineSink
from tandem.outputs.recompute import (
    BATCH_COLUMN,
    Outcome,
    PublishedById,
    Recomputed,
    same,
)
from tandem.store import aggregates
from tandem.store import outputs as store
from tandem.store.db import Database
from tandem.store import trim as store_trim
from tandem.store.leases import check_fence
from tandem.store.publish_log import last_published, published_watermark, record_position, record_published
from tandem.store.registry import InstanceKey

if TYPE_CHECKING:
    import pandas as pd

    from tandem.config import ClusterConfig, PlanConfig

log = logging.getLogger(__name__)


class ApproximateNotices:
    """A warning, once per process, for each ``distinct_exact`` partial written past its measure's bound (stored as
    an HLL sketch from then on: its bucket reads ``<measure>_exact: false``), naming the bucket, the keys and the
    instance: every batch that touches such a bucket writes it again, and says so once."""

    REMEMBERED = 10_000
    """The most partials remembered as told (then forgotten, and told again)."""
    SHOWN = 5
    """The most partials a warning names (with how many more there are)."""

    def __init__(self, plan: str, output: str) -> None:
        self.plan, self.output = plan, output
        self.told: set[distinct.Approximate] = set()

    def note(self, spec: AggregationSpec, written: pa.Table) -> list[distinct.Approximate]:
        """Warn of the partials of ``written`` (``spec.written_schema``) past their bound not told yet; returns them."""
        if not any(m.kind == "distinct_exact" for m in spec.measures):
            return []
        new = [a for a in dict.fromkeys(distinct.approximate(spec, written)) if a not in self.told]
        if not new:
            return []
        if len(self.told) + len(new) > self.REMEMBERED:
            self.told.clear()
        self.told.update(new)
        more = f"; and {len(new) - self.SHOWN} more" if len(new) > self.SHOWN else ""
        log.warning("plan %s, output %s: %d distinct_exact partial%s past max_values, stored as HLL sketches and "
                    "read as approximate (<measure>_exact false) from now on: %s%s", self.plan, self.output,
                    len(new), "" if len(new) == 1 else "s", "; ".join(a.describe() for a in new[:self.SHOWN]), more)
        return new


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
        self.approximate = ApproximateNotices(instance.plan, self.output)

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
        rows = distinct.bounded(self.spec, rows)
        key = batch.instance
        position = self.position()

        def write(cursor, indices: list[int]) -> pa.Table:
            # COPY first: a publisher frozen in the middle of a COPY (SIGSTOP, a stalled VM) is "active", not
            # idle in its transaction, so idle_in_transaction_session_timeout never ends it; it must not hold
            # the lease's FOR KEY SHARE lock then, or the take-over would wait for as long as it is frozen.
            staged = rows if len(indices) == rows.num_rows else rows.take(indices)
            aggregates.stage_batch(cursor, self.spec, staged)
            check_fence(cursor, key.plan, key.instance, key.node, batch.epoch)
            if not self.table_ready:
                aggregates.ensure_table(cursor, self.spec)
                aggregates.ensure_key_index(cursor, self.spec)
            written = agg_postgres.upsert_and_roll_up(cursor, self.spec, key.plan, key.instance, batch.epoch,
                                                      batch.batch_id, staged)
            record_published(cursor, key, self.output, batch.batch_id, batch.epoch, written.num_rows, newest, None)
            return written

        written, _ = self.refusals.run(write, list(range(rows.num_rows)), lambda i: rows.slice(i, 1).to_pylist()[0],
                                       batch)
        if written is None:
            return 0
        self.table_ready = True
        self.approximate.note(self.spec, written)
        fence(self.db, batch)
        agg_delta.append_rows(self.delta_path, self.spec, written, node=key.node, published_at=batch.published_at,
                              app_id=batch.app_id(self.output), batch_id=batch.batch_id)
        # The position a standby trims by covers this batch only once Delta has it too: if the
        # active dies between the PostgreSQL commit and the Delta append, the standby still
        # holds (and on promotion republishes) these rows instead of dropping them.
        record_position(self.db, key, self.output, batch.batch_id, position)
        return written.num_rows

    def identities(self, rows: pa.Table) -> dict[tuple, dict]:
        self._see(rows)
        identity = ["bucket_start", *self.spec.keys]
        return {tuple(row[c] for c in identity): row for row in distinct.bounded(self.spec, rows).to_pylist()}

    def published_of(self, held: dict[tuple, dict]) -> list[tuple]:
        done = published_watermark(self.db, self.instance.plan, self.instance.instance, self.output)
        # a bucket ending at or before the published position is final on the active's side
        if done is None:
            return []
        return [k for k, row in held.items() if row["bucket_start"] + timedelta(seconds=1) <= done]

    def publish_held(self, held: dict[tuple, dict], batch: BatchInfo) -> int:
        return self.publish(pa.Table.from_pylist(list(held.values())), batch)

    def settled(self, identities: list[tuple]) -> list[tuple]:
        position = self.position()
        return [] if position is None else [i for i in identities if i[0] + timedelta(seconds=1) <= position]

    def differences(self, rows: dict[tuple, dict]) -> list[str]:
        """Each second and key against the active's partial of the same instance (its measures)."""
        published = self.db.run(lambda cursor: agg_postgres.rows_of_seconds(
            cursor, self.spec, self.instance.plan, self.instance.instance, set(rows), ("second",)), attempts=1)
        keys = self.spec.keys
        old = {(as_utc(r["bucket_start"]), *(str(r[k]) for k in keys)): r for r in published.to_pylist()}
        lines = []
        for (second, *values), row in rows.items():
            label = f"{as_utc(second).isoformat()} {dict(zip(keys, values))}"
            line = row_difference(label, old.get((as_utc(second), *(str(v) for v in values))), row,
                                  self.spec.measure_columns)
            if line:
                lines.append(line)
        return lines


class FactAggregateSink(HeldById):
    """An aggregation of facts (each with an id): every new fact is added to its second's partial once.

    For outputs whose facts come out of a stateful operator (an order's outcome at its expiry) and
    cannot feed a Spark aggregation (Spark refuses rows older than the watermark after a
    ``transformWithState``). In one fenced transaction: record the facts' ids, add the new ones to
    the per-second partials (count, sums, min, max, HLL sketches, exact sets), roll up every granularity; then
    the touched rows go to Delta and the facts are marked ``in_lake``.
    """

    table = "output_contributions"
    id_column = "contribution_id"

    def __init__(self, spec: AggregationSpec, plan: str, output: str, config: OutputConfig, instance: InstanceKey,
                 database_url: str, delta_path: Path, quarantine: QuarantineSink | None = None) -> None:
        super().__init__(plan, output, config, instance, database_url, delta_path, quarantine)
        self.spec = spec
        self.table_ready = False
        self.approximate = ApproximateNotices(plan, output)

    def _second(self, fact: dict[str, Any]) -> tuple:
        return (bucket_start(as_utc(fact[self.config.time]), "second"), *(str(fact[k]) for k in self.spec.keys))

    def write(self, rows: dict[str, dict[str, Any]], batch: BatchInfo) -> int:
        key = batch.instance
        spec = self.spec

        def work(cursor, ids: list[str]) -> tuple[pa.Table, list[str]]:
            check_fence(cursor, key.plan, key.instance, key.node, batch.epoch)
            if not self.table_ready:
                aggregates.ensure_table(cursor, spec)
                aggregates.ensure_key_index(cursor, spec)
            new = store.insert_contributions(cursor, key, self.output, {cid: {} for cid in ids})
            written = spec.written_schema.empty_table()
            if new:
                seconds = add_facts(cursor, spec, key.plan, key.instance, [rows[i] for i in new], self._second)
                aggregates.stage_batch(cursor, spec, seconds)
                written = agg_postgres.upsert_and_roll_up(cursor, spec, key.plan, key.instance, batch.epoch,
                                                          batch.batch_id, seconds)
            pending = store.not_in_lake(cursor, self.table, self.id_column, key.plan, self.output, ids)
            if set(pending) - new:  # applied by an active that died before its Delta append: copy their rows now
                written = pa.concat_tables([written, agg_postgres.rows_of_seconds(
                    cursor, spec, key.plan, key.instance, {self._second(rows[i]) for i in pending})])
            record_published(cursor, key, self.output, batch.batch_id, batch.epoch, written.num_rows, None, None)
            return written, pending

        applied, _ = self.refusals.run(work, list(rows), rows.__getitem__, batch)
        written, pending = applied or (spec.written_schema.empty_table(), [])
        self.table_ready = True
        self.approximate.note(spec, written)
        if pending:
            fence(self.db, batch)
            if written.num_rows:
                agg_delta.append_rows(self.delta_path, spec, written, node=key.node, published_at=batch.published_at,
                                      app_id=batch.app_id(self.output), batch_id=batch.batch_id)
            self.db.run(lambda cursor: store.mark_in_lake(cursor, self.table, self.id_column, key.plan, self.output,
                                                          pending))
        return written.num_rows


def add_facts(cursor, spec: AggregationSpec, plan: str, instance: str, facts: list[dict[str, Any]],
              second_of) -> pa.Table:
    """The per-second partials touched by ``facts``, with the facts added to what the table holds."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for fact in facts:
        groups.setdefault(second_of(fact), []).append(fact)
    current = agg_postgres.rows_of_seconds(cursor, spec, plan, instance, set(groups), granularities=("second",))
    by_group = {(r["bucket_start"], *(r[k] for k in spec.keys)): r for r in current.to_pylist()}
    out = []
    for group, members in groups.items():
        row = {"bucket_start": group[0], **dict(zip(spec.keys, group[1:]))}
        before = by_group.get(group)
        for measure in spec.measures:
            values = [f[measure.source] for f in members] if measure.source else []
            old = before[measure.column] if before else None
            if measure.kind == "count":
                row[measure.column] = (old or 0) + len(members)
            elif measure.kind == "sum" and measure.sql_type == "bigint":
                total = 0 if before is None else old
                for value in values:
                    total = long_sum(total, value or 0)
                row[measure.column] = total
            elif measure.kind == "sum":
                row[measure.column] = (old or 0.0) + sum(float(v or 0) for v in values)
            elif measure.kind in ("min", "max"):
                pick = min if measure.kind == "min" else max
                row[measure.column] = pick([v for v in [old, *values] if v is not None])
            else:
                row[measure.column] = distinct.union(measure, [old, distinct.of(measure, values)])
        out.append(row)
    return pa.Table.from_pylist(out)


def newest_per_key(rows: pa.Table, spec: AggregationSpec) -> pa.Table:
    """The newest version (highest epoch, then batch, then publish time) of every (granularity, bucket, keys, instance) in ``rows`` (pure)."""
    identity = ["granularity", "bucket_start", *spec.keys, "instance"]
    if rows.num_rows == 0:
        return rows
    newest_first = [(c, order) for c, order in agg_delta.NEWEST_FIRST if c in rows.column_names]
    ordered = rows.sort_by([*[(c, "ascending") for c in identity], *newest_first])
    changed = None  # row i+1 starts a new key
    for column in identity:
        values = ordered.column(column).combine_chunks()
        differs = pc.not_equal(values.slice(1), values.slice(0, len(values) - 1))
        changed = differs if changed is None else pc.or_(changed, differs)
    return ordered.filter(pa.concat_arrays([pa.array([True]), changed]))


def rebuild_postgres_instance(db: Database, spec: AggregationSpec, plan: str, instance: str, delta_rows: pa.Table,
                           touched: pa.Table | None = None) -> int:
    """Make one plan's instance rows of the spec's PostgreSQL table the newest version of each key in ``delta_rows``.

    With ``touched`` (rows whose keys changed), only those keys are replaced; otherwise every row
    of the instance. One transaction; returns how many rows were written.
    """
    identity = ["granularity", "bucket_start", *spec.keys]
    columns = [*identity, "instance", *spec.measure_columns, "epoch", "batch_id"]
    keys = None
    if touched is not None:
        keys = touched.select(identity).group_by(identity).aggregate([])
        delta_rows = delta_rows.join(keys, identity, join_type="inner") if delta_rows.num_rows else delta_rows
    latest = newest_per_key(delta_rows, spec)
    rows = latest.select(columns) if latest.num_rows else latest

    def work(cursor) -> int:
        aggregates.replace_instance_rows(cursor, spec, plan, instance, rows, keys)
        return latest.num_rows

    return db.run(work)


# --- validation --------------------------------------------------------------------------------------------------

AVG_TOLERANCE = 1e-9
"""avg = sum / count can land a few ulps outside [min, max] when every value in a bucket is equal; an
average within this relative distance of a bound counts as the bound."""
_SERVING_KEYS = ("granularity", "bucket_start")


def serving_frame(rows: list[Mapping[str, Any]], spec: AggregationSpec) -> pd.DataFrame:
    """Partial-aggregate rows as a DataFrame with the spec's ratios added (e.g. ``avg_price``) (pure)."""
    import pandas as pd  # only validations build frames

    columns = [*_SERVING_KEYS, *spec.keys, "instance", *spec.measure_columns]
    frame = pd.DataFrame.from_records([{c: row.get(c) for c in columns} for row in rows], columns=columns)
    for measure in spec.measures:
        frame[measure.column] = pd.to_numeric(frame[measure.column], errors="coerce")
    frame["bucket_start"] = pd.to_datetime(frame["bucket_start"], utc=True)
    lows = [m.column for m in spec.measures if m.kind == "min"]
    highs = [m.column for m in spec.measures if m.kind == "max"]
    for ratio in spec.ratios:
        denominator = frame[ratio.denominator]
        value = (frame[ratio.numerator] / denominator).where(denominator > 0)
        if len(lows) == 1 and len(highs) == 1:
            value = _snap(value, frame[lows[0]], frame[highs[0]])
        frame[ratio.column] = value
    return frame


def _snap(value: pd.Series, low: pd.Series, high: pd.Series) -> pd.Series:
    """Values within ``AVG_TOLERANCE`` (relative) outside ``[low, high]`` become the bound."""
    near_low = (value < low) & ((low - value) <= AVG_TOLERANCE * low.abs().clip(lower=1.0))
    near_high = (value > high) & ((value - high) <= AVG_TOLERANCE * high.abs().clip(lower=1.0))
    return value.mask(near_low, low).mask(near_high, high)


def _declared_field(plan: PlanConfig, name: str) -> FieldConfig | None:
    """The stream field ``name`` when every stream that has one declares it alike (else ``None``)."""
    declared = [stream.fields[name] for stream in plan.streams.values() if name in stream.fields]
    return declared[0] if declared and all(d == declared[0] for d in declared) else None


def _bounds(config: FieldConfig) -> tuple[tuple[float, bool] | None, tuple[float, bool] | None]:
    """The tightest declared ``(lower, strict)`` and ``(upper, strict)`` of a field (``None``: unbounded)."""
    lower = [(b, s) for b, s in ((config.greater_than, True), (config.at_least, False)) if b is not None]
    upper = [(b, s) for b, s in ((config.less_than, True), (config.at_most, False)) if b is not None]
    if config.column_type == "epoch_millis":
        lower, upper = [*lower, (0, False)], [*upper, (MAX_EPOCH_MILLIS, False)]
    return (max(lower) if lower else None,
            min(upper, key=lambda bound: (bound[0], not bound[1])) if upper else None)


def _measure_bounds(plan: PlanConfig, measure: Measure, declared_type: str | None) -> list[dict[str, Any]]:
    """A sum, min or max of a declared field keeps the field's bounds (a sum: a lower bound >= 0, an
    upper bound <= 0, as every partial adds at least one accepted value)."""
    config = _declared_field(plan, measure.source) if measure.kind in ("sum", "min", "max") else None
    if config is None or declared_type not in (None, {"epoch_millis": "long"}.get(config.column_type, config.type)):
        return []
    lower, upper = _bounds(config)
    if measure.kind == "sum":
        lower = lower if lower is not None and lower[0] >= 0 else None
        upper = upper if upper is not None and upper[0] <= 0 else None
    kwargs: dict[str, Any] = {}
    if lower is not None:
        kwargs.update(min_value=lower[0], **({"strict_min": True} if lower[1] else {}))
    if upper is not None:
        kwargs.update(max_value=upper[0], **({"strict_max": True} if upper[1] else {}))
    if not kwargs:
        return []
    return [expect("expect_column_values_to_be_between",
                   f"{measure.kind}({measure.source}): {measure.source} is checked on the streams "
                   "(bad lines are quarantined)", column=measure.column, **kwargs)]


def expectations(plan: PlanConfig, output: str) -> list[dict[str, Any]]:
    """What an aggregation's declaration implies of its serving table's partial rows (columns as
    :func:`serving_frame` makes them: ratios added)."""
    spec = spec_for(plan, output)
    declared = plan.outputs[output].measures
    keys = [*_SERVING_KEYS, *spec.keys, "instance"]
    implied = [
        expect("expect_table_columns_to_match_set", "the serving table and its ratios are all there",
               column_set=[*keys, *spec.measure_columns, *(r.column for r in spec.ratios)], exact_match=False),
        *[not_null(column, "key") for column in keys],
        expect("expect_column_values_to_be_in_set", "the granularities the output keeps", column="granularity",
               value_set=list(spec.granularities)),
        instances(),
    ]
    for measure in spec.measures:
        if measure.kind == "count":
            implied.append(expect("expect_column_values_to_be_between",
                                  "a partial exists once an event fell into its bucket",
                                  column=measure.column, min_value=1))
        implied += _measure_bounds(plan, measure, declared[measure.column].type)
    lows = {m.source: m.column for m in spec.measures if m.kind == "min"}
    highs = {m.source: m.column for m in spec.measures if m.kind == "max"}
    for source in (s for s in lows if s in highs):
        implied.append(expect("expect_column_pair_values_a_to_be_greater_than_b",
                              f"min({source}) <= max({source})", column_A=highs[source],
                              column_B=lows[source], or_equal=True))
    by_column = {m.column: m for m in spec.measures}
    snapped = [m.kind for m in spec.measures].count("min") == 1 and [m.kind for m in spec.measures].count("max") == 1
    for ratio in spec.ratios:  # an average of a field lies between its min and max (snapped as serving_frame does)
        numerator, denominator = by_column[ratio.numerator], by_column[ratio.denominator]
        source = numerator.source
        if not snapped or numerator.kind != "sum" or denominator.kind != "count" or source not in lows \
                or source not in highs:
            continue
        for high, low in ((ratio.column, lows[source]), (highs[source], ratio.column)):
            implied.append(expect("expect_column_pair_values_a_to_be_greater_than_b", f"{low} <= {high}",
                                  column_A=high, column_B=low, or_equal=True,
                                  ignore_row_if="either_value_is_missing"))
    return implied


def validation(plan: PlanConfig, output: str) -> Validation:
    """The serving table's partial rows whose bucket overlaps the window (of its granularity, if one is given).

    A suite file's expectations that name no output apply here (the trades suite predates other
    kinds); to a suite file, only the plan's-instances expectation is added (when it has none).
    """
    spec = spec_for(plan, output)

    def read(cursor, window: Window, limit: int) -> list[dict[str, Any]]:
        return aggregates.serving_rows(cursor, spec, plan.name, window.since, window.until, window.granularity,
                                       limit)

    return Validation(table=f"tandem.{spec.table}", key_columns=[*_SERVING_KEYS, *spec.keys, "instance"],
                      implied=expectations(plan, output), required=[instances()], takes_unnamed=True, read=read,
                      frame=lambda rows: serving_frame(rows, spec), granularities=tuple(spec.granularities))


# --- backfill and reconcile of Spark's partials -------------------------------------------------------------------


def newest_seconds(rows: pa.Table, keys: tuple[str, ...], start: datetime, end: datetime) -> pa.Table:
    """Per (second, keys) in ``[start, end)``, the row of the latest micro-batch (an update-mode query emits a
    second again when it changes) (pure)."""
    start_us, end_us = pa.scalar(start, UTC_MICROS), pa.scalar(end, UTC_MICROS)
    bucket = rows["bucket_start"].cast(UTC_MICROS)
    rows = rows.set_column(rows.schema.get_field_index("bucket_start"), "bucket_start", bucket)
    rows = rows.filter(pc.and_(pc.greater_equal(rows["bucket_start"], start_us), pc.less(rows["bucket_start"], end_us)))
    latest: dict[tuple, dict[str, Any]] = {}
    for row in sorted(rows.to_pylist(), key=lambda r: r[BATCH_COLUMN]):
        latest[(row["bucket_start"], *(row[k] for k in keys))] = row
    return pa.Table.from_pylist(list(latest.values()), schema=rows.schema).drop_columns([BATCH_COLUMN])


def compare_partials(outcome: Outcome, published: list[Mapping[str, Any]], recomputed: list[Mapping[str, Any]],
                     keys: tuple[str, ...], measures: list[str], count: str) -> Outcome:
    """Per (second, keys): late when the recomputation counts more events than were published (or the second is
    missing), extra when only published, different when the values differ otherwise (pure; sketches compared as
    bytes)."""
    def by_key(rows):
        return {(row["bucket_start"], *(row[k] for k in keys)): row for row in rows}

    ours, theirs = by_key(recomputed), by_key(published)
    outcome.compared += len(set(ours) | set(theirs))
    for key in sorted(set(ours) | set(theirs), key=lambda k: (k[0], *map(str, k[1:]))):
        label = {"bucket_start": str(key[0]), **dict(zip(keys, key[1:]))}
        if key not in theirs:
            outcome.add("late", {**label, "recomputed": ours[key][count], "published": 0})
        elif key not in ours:
            outcome.add("extra", {**label, "published": theirs[key][count]})
        elif ours[key][count] > theirs[key][count]:
            outcome.add("late", {**label, "recomputed": ours[key][count], "published": theirs[key][count]})
        elif not all(same(ours[key][m], theirs[key][m]) for m in measures):
            outcome.add("different", {**label, **{m: [theirs[key][m], ours[key][m]] for m in measures
                                                  if not same(ours[key][m], theirs[key][m])}})
    return outcome


# --- the kind ------------------------------------------------------------------------------------------------------



def partials_horizon(table: str, granularity: str) -> str:
    """The name :func:`tandem.store.trim.record_horizon` records an aggregation's trimmed partials under."""
    return f"partials/{table}/{granularity}"


class AggregationKind(OutputKind):
    """``aggregation``: partial aggregates per instance and bucket, rolled up to every granularity, merged on read.

    Spark's per-second partials (no ``id``: restored to a snapshot's cut, replaced by a backfill) or facts
    added once each by id (``id``: published once by id, as tables and events are)."""

    name = "aggregation"
    rules = OUTPUT_RULES[name]

    def published_by_id(self, config: OutputConfig) -> bool:
        return bool(config.id)

    def sink(self, plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
             quarantine: QuarantineSink | None = None) -> AggregateSink | FactAggregateSink:
        """Facts added by id when the output declares ``id``, else Spark's per-second partials."""
        spec = spec_for(plan, output)
        if plan.outputs[output].id:
            return FactAggregateSink(spec, plan.name, output, plan.outputs[output], instance, database_url,
                                     delta_path, quarantine)
        return AggregateSink(spec, instance, database_url, delta_path, plan.watermark_s, quarantine)

    def read(self, cluster: ClusterConfig, plan: PlanConfig, output: str, request: ReadRequest,
             db: Database | None = None) -> list[dict[str, Any]]:
        """Merged aggregates of buckets of the granularity (default: the finest kept) starting in ``[start, end)``
        (default: all): avg = Σsum / Σcount across instances, min of mins, max of maxes, distinct = the union's
        estimate, distinct_exact = the union's size (and ``<measure>_exact``: whether it is exact); ``instances``: how
        many instances hold the bucket. A min or max of a time is ISO 8601 text (:meth:`time_fields`)."""
        spec = spec_for(plan, output)
        granularity = request.granularity or spec.granularities[0]
        if granularity not in spec.granularities:
            raise QueryError(f"unknown granularity {granularity!r}: plan {plan.name} keeps {output} by "
                             f"{', '.join(spec.granularities)}")
        start, end = request.start or ALL_TIME[0], request.end or ALL_TIME[1]
        if start.tzinfo is None or end.tzinfo is None:
            raise QueryError("start and end must be timezone-aware")
        if end <= start:
            raise QueryError(f"empty range: end {end.isoformat()} is not after start {start.isoformat()}")
        unknown = sorted(set(request.keys) - set(spec.keys))
        if unknown:
            raise QueryError(f"{output} of plan {plan.name} has no key {', '.join(unknown)} (keys: "
                             f"{', '.join(spec.keys)})")
        keys = {k: list(v) for k, v in request.keys.items()} or None
        if request.source == "delta":
            rows = agg_delta.query_merged(delta_table_dir(cluster, plan.name, output), spec, granularity, start, end,
                                          keys)
        else:
            cursor_of = None if request.limit is None else (lambda cursor: capped(cursor, request.limit))
            with reading(cluster, db) as connection:
                try:
                    rows = agg_postgres.read_merged(lambda work: connection.run(work, attempts=3), spec, plan.name,
                                                    granularity, start, end, keys, cursor_of=cursor_of)
                except psycopg2.errors.UndefinedTable:
                    raise NothingPublished(f"table tandem.{spec.table} does not exist yet: no instance of plan "
                                           f"{plan.name} has published {output} (or the database is not migrated: "
                                           "tandem migrate)") from None
        times = self.time_fields(plan, output)
        return [times_as_iso(row, times) for row in (rows[:request.limit] if request.limit is not None else rows)]

    def time_fields(self, plan: PlanConfig, output: str) -> frozenset[str]:
        """Its min and max measures of a field that holds times, kept as epoch milliseconds (no ``type``, or
        ``long``): a time themselves. ``bucket_start`` is a time already; keys are text, sums and counts numbers."""
        times = plan_time_fields(plan)
        return frozenset(name for name, measure in plan.outputs[output].measures.items()
                         if measure.function in ("min", "max") and measure.source in times
                         and measure.type in (None, "long"))

    def restore(self, db: Database, plan: PlanConfig, output: str, path: Path, instance: str,
                version: int | None) -> dict[str, int | None] | None:
        """Put the instance's partials back to the snapshot's cut (``version`` of the Delta table at ``path``).

        An aggregation of facts is kept (``None``): its facts are applied once by id, so the replay adds
        only what is missing. Spark's partials are not: the Delta slice is rolled back, and the
        PostgreSQL rows of the keys in files changed since the cut are replaced with the newest version
        of each key in the restored slice (every row of the instance when vacuumed files hide what
        changed); nothing is written when nothing of the instance changed.
        """
        if self.published_by_id(plan.outputs[output]):
            return None
        rolled = roll_back_slice(path, instance, version)
        outcome = {**rolled.outcome(), "postgres_rows": 0}
        if rolled.restored is not None:
            outcome["postgres_rows"] = rebuild_postgres_instance(db, spec_for(plan, output), plan.name, instance,
                                                              rolled.restored, rolled.changed)
        return outcome

    def replace(self, job: Recomputed, backfill_id: str) -> dict[str, Any]:
        """Facts: as any output published once by id. Partials: the instance's seconds in the range are replaced
        and every coarser bucket overlapping it is rebuilt from its children (one PostgreSQL transaction that
        holds the table's publishers off, then one Delta commit)."""
        if self.published_by_id(job.declared):
            return PublishedById.replace(self, job, backfill_id)  # type: ignore[arg-type]
        spec = spec_for(job.plan, job.output)
        columns = ["bucket_start", *spec.keys, *spec.measure_columns]
        if job.rows is None:  # the recomputation emitted nothing: the range holds no second any more
            seconds = spec.written_schema.empty_table().select(columns)
        else:
            seconds = distinct.bounded(spec, newest_seconds(job.rows, spec.keys, job.start, job.end).select(columns))
        counted = spec.version_column

        def work(cursor) -> tuple[pa.Table, dict[str, int]]:
            aggregates.ensure_table(cursor, spec)
            aggregates.lock_for_replace(cursor, spec)
            # read under the lock: the rows written carry the newest published batch, so a batch published before
            # them never wins over them in Delta, and every batch after them rolls up from the replaced children
            epoch, batch_id = last_published(cursor, job.plan.name, job.instance, job.output)
            return agg_postgres.replace_range(cursor, spec, job.plan.name, job.instance, seconds, job.start, job.end,
                                              epoch, batch_id)

        written, before = job.db.run(work, attempts=3)
        ApproximateNotices(job.plan.name, job.output).note(spec, written)
        agg_delta.replace_range(job.delta_path, spec, job.instance, job.start, job.end, written,
                                node=f"backfill:{backfill_id}", published_at=datetime.now(timezone.utc),
                                app_id=f"backfill/{backfill_id}/{job.instance}/{job.output}")
        return {"recomputed": True, "seconds_before": before["seconds"], "events_before": before["events"],
                "seconds_after": seconds.num_rows, "events_after": int(pc.sum(seconds[counted]).as_py() or 0),
                "rows_written": written.num_rows}

    def compare(self, job: Recomputed) -> Outcome:
        if self.published_by_id(job.declared):
            return PublishedById.compare(self, job)  # type: ignore[arg-type]
        spec = spec_for(job.plan, job.output)
        recomputed = [] if job.rows is None else distinct.bounded(
            spec, newest_seconds(job.rows, spec.keys, job.start, job.end)).to_pylist()

        def published(cursor) -> list[dict[str, Any]]:
            aggregates.ensure_table(cursor, spec)
            return aggregates.seconds_between(cursor, spec, job.plan.name, job.instance, job.start, job.end)

        return compare_partials(Outcome(job.instance, job.output), job.db.run(published, attempts=3), recomputed,
                                spec.keys, spec.measure_columns, spec.version_column)

    def backfill_refusal(self, plan: PlanConfig, output: str, start: datetime, end: datetime,
                         trimmed: Mapping[str, datetime]) -> str | None:
        """Each coarser bucket the range overlaps is rebuilt from its finer rows: where the range starts or ends inside
        a bucket whose finer rows were trimmed, it would be rebuilt from the range's rows alone (and the loss rolled up
        to the year): a range aligned to such buckets is fine; an aggregation of facts adds to the range's own
        seconds, which must all be there."""
        spec = spec_for(plan, output)
        for child, parent in zip(spec.granularities, spec.granularities[1:]):
            horizon = trimmed.get(partials_horizon(spec.table, child))
            if horizon is None:
                continue
            deleted = (f"whose {child} rows before {horizon.isoformat(timespec='seconds')} were deleted "
                       f"(maintenance.retention.partials.{child})")
            if plan.outputs[output].id and start < horizon:
                return f"{output} adds facts to its {child} rows, {deleted}: start it at or after {horizon.isoformat()}"
            for edge, verb in ((start, "start"), (end, "end")):
                bucket = bucket_start(edge, parent)
                if bucket != edge and bucket < horizon:
                    return (f"it {verb}s at {edge.isoformat()}, inside the {parent} bucket {bucket.isoformat()} of "
                            f"{output}, {deleted}: the bucket would be rebuilt from the range's rows alone; {verb} "
                            f"it at a {parent} boundary ({bucket.isoformat()} or "
                            f"{bucket_end(bucket, parent).isoformat()})")
        return None

    def retire(self, db: Database, cluster: ClusterConfig, plan: PlanConfig, output: str,
               labels: Mapping[str, str]) -> None:
        """Spark's partials of the retired instances, every granularity, relabelled in PostgreSQL and in Delta:
        merged on read with the new instances' (each event was counted by one of them)."""
        spec = spec_for(plan, output)
        db.run(lambda cursor: aggregates.relabel_instances(cursor, spec, plan.name, dict(labels)))
        agg_delta.relabel_instances(delta_table_dir(cluster, plan.name, output), dict(labels))

    def counted_until(self, db: Database, plan: PlanConfig, output: str, instances: list[str]) -> datetime | None:
        """The end of the newest bucket the instances' partials hold, at the finest granularity they hold any (the
        retention may have trimmed the finer ones)."""
        spec = spec_for(plan, output)
        for granularity in spec.granularities:
            newest = db.run(lambda cursor, g=granularity: aggregates.newest_bucket(cursor, spec, plan.name, g,
                                                                                  instances), attempts=3)
            if newest is not None:
                return bucket_end(as_utc(newest), granularity)
        return None

    def state_shape(self, plan: PlanConfig, output: str) -> dict[str, Any]:
        """Its keys and measures: Spark's state holds them (a fact aggregation's state is its id deduplication, but
        its serving table's columns are these too)."""
        spec = spec_for(plan, output)
        return {"keys": list(spec.keys), "measures": {m.column: f"{m.kind} {m.sql_type}" for m in spec.measures}}

    def summary(self, plan: PlanConfig, output: str) -> dict[str, Any]:
        """Its granularities, and the columns a read gives beside the keys: ratios, measures (a ``distinct_exact``
        measure's flag after it)."""
        spec = spec_for(plan, output)
        read = [c for m in spec.measures for c in (m.column, m.exact_flag) if c is not None]
        return {"granularities": list(spec.granularities), "measures": [*(r.column for r in spec.ratios), *read],
                "time": None}

    def trim(self, run: RetentionRun, output: str) -> list[Trimmed]:
        """The partials of each granularity older than ``retention.partials``; the horizon is recorded (a backfill
        of older buckets is refused)."""
        spec = spec_for(run.plan, output)
        done = []
        for granularity, seconds in run.plan.maintenance.retention.partials_s.items():
            if granularity in spec.granularities:
                before = run.cutoff(seconds)
                done.append(Trimmed(spec.table, store_trim.trim_partials(run.db, spec.table, run.plan.name,
                                                                         granularity, before),
                                    before, f"{granularity} partials of {output}"))
                if done[-1].rows:
                    store_trim.record_horizon(run.db, run.plan.name, partials_horizon(spec.table, granularity), before)
        return done

    def validation(self, plan: PlanConfig, output: str) -> Validation:
        return validation(plan, output)

    def reset(self, db: Database, plan: PlanConfig, output: str) -> list[str]:
        """Its partials in the serving table (the table itself once no plan's rows are left in it: it is created
        again with the measures declared then) and the ids of the facts added."""
        spec = spec_for(plan, output)

        def work(cursor) -> list[str]:
            partials, dropped = aggregates.delete_plan_rows(cursor, spec, plan.name)
            facts = store.delete_output_rows(cursor, "output_contributions", plan.name, output)
            return [f"{partials} partials ({spec.table}{', dropped: no rows of any plan left' if dropped else ''})",
                    *([f"{facts} added fact ids (output_contributions)"] if facts else [])]

        return db.run(work, attempts=3)


KIND = AggregationKind()
