"""Partial aggregates in PostgreSQL: publish (upsert + roll-up) and merge on read; the SQL is
:mod:`tandem.store.aggregates`'s.

A micro-batch brings complete per-second partials of one instance. They are upserted, then every
coarser bucket they touch is recomputed from its children (second → minute → … → year) in the
same transaction, so each row always holds full values and replaying a batch changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import psycopg2.errors
import pyarrow as pa

from tandem.aggregation import distinct
from tandem.aggregation.granularity import bucket_start
from tandem.aggregation.merge import MergedRow, with_ratios
from tandem.aggregation.spec import MERGE_SQL, AggregationSpec, Measure
from tandem.store import aggregates


def upsert_and_roll_up(cursor, spec: AggregationSpec, plan: str, instance: str, epoch: int, batch_id: int,
                       seconds: pa.Table) -> pa.Table:
    """Upsert the staged seconds of one plan's instance and recompute every touched coarser bucket.

    ``seconds`` were staged by :func:`tandem.store.aggregates.stage_batch`. Returns every written row
    (``spec.written_schema``: without the plan column, as the Delta copy lives under the plan's own folder).
    """
    written = [aggregates.upsert_seconds(cursor, spec, plan, instance, epoch, batch_id, seconds)]
    for granularity in spec.granularities[1:]:
        child = spec.child_of(granularity)
        rows = aggregates.roll_up(cursor, spec, MERGE_SQL, plan, instance, epoch, batch_id, granularity, child)
        written.append(_with_children_sketches(cursor, spec, plan, instance, granularity, child, rows))
    return pa.concat_tables(written)


def replace_range(cursor, spec: AggregationSpec, plan: str, instance: str, seconds: pa.Table, start: datetime,
                  end: datetime, epoch: int, batch_id: int) -> tuple[pa.Table, dict[str, int]]:
    """Replace one plan's instance seconds in ``[start, end)`` with ``seconds`` (a recomputation of that range) and
    rebuild every coarser bucket overlapping it from its children; the caller holds the table's publishers off
    (:func:`tandem.store.aggregates.lock_for_replace`) in the same transaction.

    Returns the rows written (``spec.written_schema``) and how many seconds (and events they counted) were there
    before.
    """
    replaced = aggregates.delete_seconds(cursor, spec, plan, instance, start, end)
    written = [spec.written_schema.empty_table()]
    if seconds.num_rows:
        aggregates.stage_batch(cursor, spec, seconds)
        written.append(aggregates.upsert_seconds(cursor, spec, plan, instance, epoch, batch_id, seconds))
    for granularity in spec.granularities[1:]:
        child = spec.child_of(granularity)
        rows = aggregates.rebuild_buckets(cursor, spec, MERGE_SQL, plan, instance, epoch, batch_id, granularity,
                                          child, start, end)
        written.append(_with_children_sketches(cursor, spec, plan, instance, granularity, child, rows))
    return pa.concat_tables(written), replaced


def _with_children_sketches(cursor, spec: AggregationSpec, plan: str, instance: str, granularity: str, child: str,
                            rows: pa.Table) -> pa.Table:
    """``rows`` rolled up to ``granularity``, each distinct measure's partial (a sketch, or an exact set within its
    bound) set to the union of its children's (stored, and returned); ``rows`` as they are when the aggregation has
    no distinct measure.

    The children's sketches are read in one statement and the unions stored in another, whatever the number of rows
    (a pair of statements per row took minutes for 100,000 keys)."""
    if not spec.distinct_columns or not rows.num_rows:
        return rows
    children = aggregates.children_sketches(cursor, spec, plan, instance, granularity, child, rows)
    parents = children.column("parent").to_pylist()
    for measure in spec.distinct_measures:
        column = measure.column
        rows = rows.set_column(rows.schema.get_field_index(column), column, pa.array(
            unions_by_parent(measure, parents, children.column(column).to_pylist(), rows.num_rows), pa.binary()))
    aggregates.store_sketches(cursor, spec, plan, rows)
    return rows.cast(spec.written_schema)


def unions_by_parent(measure: Measure, parents: list[int], children: list[bytes | None],
                     count: int) -> list[bytes | None]:
    """The union of the ``children`` partials of ``measure`` (a distinct one) of each parent ``0 … count - 1``
    (``parents[i]``: the parent of ``children[i]``; a parent without a partial: ``None``) (pure)."""
    grouped: list[list[bytes | None]] = [[] for _ in range(count)]
    for parent, sketch in zip(parents, children):
        grouped[parent].append(sketch)
    return [distinct.union(measure, group) for group in grouped]


def rows_of_seconds(cursor, spec: AggregationSpec, plan: str, instance: str, seconds: set[tuple],
                    granularities: tuple[str, ...] | None = None) -> pa.Table:
    """An instance's rows of every bucket (of ``granularities``, default the spec's) containing one of ``seconds``
    (``(second, *keys)``), in ``spec.written_schema``."""
    wanted = sorted({(g, bucket_start(second[0], g), *second[1:]) for second in seconds
                     for g in granularities or spec.granularities},
                    key=str)
    return aggregates.rows_of_buckets(cursor, spec, plan, instance, wanted)


def query_merged(cursor, spec: AggregationSpec, plan: str, granularity: str, start: datetime, end: datetime,
                 keys: dict[str, list[str]] | None = None, careful: bool = False) -> list[MergedRow]:
    """One plan's merged aggregates for buckets in ``[start, end)``, optionally restricted to some key values.

    ``careful``: sum doubles past PostgreSQL's range as IEEE 754 does (±Infinity), more slowly; without it such a
    sum raises ``NumericValueOutOfRange``: read with :func:`read_merged`, which tries again carefully.
    """
    spec.check_granularity(granularity)
    for key in keys or {}:
        if key not in spec.keys:
            raise ValueError(f"{spec.name} has no key {key!r}")
    return [with_ratios(spec, _plain(spec, row))
            for row in aggregates.merged_rows(cursor, spec, MERGE_SQL, plan, granularity, start, end, keys,
                                              careful=careful)]


def read_merged(run: Callable[[Callable[[Any], list[MergedRow]]], list[MergedRow]], spec: AggregationSpec, plan: str,
                granularity: str, start: datetime, end: datetime, keys: dict[str, list[str]] | None = None,
                cursor_of: Callable[[Any], Any] | None = None) -> list[MergedRow]:
    """:func:`query_merged` through ``run`` (a transaction runner such as ``Database.run``), once more with IEEE sums
    in a new transaction when a double sum overflowed PostgreSQL's ``sum``; ``cursor_of`` makes the cursor to read
    with (a context manager, e.g. a capped server-side cursor) from the transaction's."""
    def read(careful: bool) -> list[MergedRow]:
        def work(cursor) -> list[MergedRow]:
            if cursor_of is None:
                return query_merged(cursor, spec, plan, granularity, start, end, keys, careful)
            with cursor_of(cursor) as wrapped:
                return query_merged(wrapped, spec, plan, granularity, start, end, keys, careful)
        return run(work)

    try:
        return read(False)
    except psycopg2.errors.NumericValueOutOfRange:
        return read(True)


def _plain(spec: AggregationSpec, row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for measure in spec.measures:
        if out[measure.column] is None or measure.distinct:  # a long sum past the 64-bit range; partials
            continue
        if measure.sql_type == "bigint":
            out[measure.column] = int(out[measure.column])
        elif measure.sql_type.startswith("double"):
            out[measure.column] = float(out[measure.column])
    out = distinct.read_row(spec, out)  # each distinct measure's array of the instances' partials
    out["instances"] = int(out["instances"])
    return out
