"""Distinct measures, by kind (pure): how their partials are made, unioned and read.

``distinct``: an HLL sketch (:mod:`tandem.aggregation.sketches`), read as its estimate. ``distinct_exact``: the set
of values while it holds at most the measure's ``max_values``, else a sketch (:mod:`tandem.aggregation.exact_sets`),
read as its size and a flag ``<measure>_exact`` saying whether that is exact. Either kind reads the other's
partials (a cut-over from one to the other keeps the older partials in the same column).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tandem.aggregation import exact_sets, sketches
from tandem.aggregation.spec import AggregationSpec, Measure

Partial = bytes | memoryview | None


def of(measure: Measure, values: Iterable[Any]) -> bytes | None:
    """The partial of ``values`` (the facts of one second)."""
    if measure.kind == "distinct_exact":
        return exact_sets.of((None if v is None else str(v) for v in values), measure.max_values)
    return sketches.of(str(v) for v in values)


def union(measure: Measure, partials: Iterable[Partial]) -> bytes | None:
    """The partial stored for the union of ``partials`` (a coarser bucket's, from its children's; a fact's second
    with what it held): within the measure's bound."""
    if measure.kind == "distinct_exact":
        return exact_sets.union(partials, measure.max_values)
    return sketches.union(exact_sets.as_sketch(p) for p in partials)


def read(measure: Measure, partials: Iterable[Partial]) -> dict[str, Any]:
    """The columns a merge of ``partials`` (every instance's partial of one bucket and key) reads as: the count,
    and for ``distinct_exact`` its flag (an exact union while every partial is an exact set, however large)."""
    if measure.kind == "distinct_exact":
        count, exact = exact_sets.count_union(partials)
        return {measure.column: count, measure.exact_flag: exact}
    return {measure.column: sketches.estimate(sketches.union(exact_sets.as_sketch(p) for p in partials))}


def read_row(spec: AggregationSpec, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` (a merged bucket whose distinct measures hold the list of the instances' partials) with each of them
    read (:func:`read`), a ``distinct_exact`` measure's flag right after its count."""
    measures = {m.column: m for m in spec.distinct_measures}
    out: dict[str, Any] = {}
    for name, value in row.items():
        if name in measures:
            out.update(read(measures[name], value))
        else:
            out[name] = value
    return out


def bounded(spec: AggregationSpec, rows: pa.Table) -> pa.Table:
    """``rows`` (per-second partials, as Spark's query makes them) with every ``distinct_exact`` set past its
    measure's bound made a sketch, as they are stored; ``rows`` itself when none is."""
    for measure in spec.measures:
        if measure.kind != "distinct_exact" or measure.column not in rows.column_names:
            continue
        column = rows.column(measure.column)
        # n values take at least 3n + 1 bytes ('["a"]'): a shorter partial holds at most max_values, read no further
        short = min(3 * measure.max_values + 1, exact_sets.MAX_SET_BYTES)
        if not pc.any(pc.fill_null(pc.greater(pc.binary_length(column), short), False)).as_py():
            continue
        values = column.to_pylist()
        stored = [exact_sets.bounded(v, measure.max_values) for v in values]
        if stored != values:
            rows = rows.set_column(rows.schema.get_field_index(measure.column), measure.column,
                                   pa.array(stored, pa.binary()))
    return rows


@dataclass(frozen=True)
class Approximate:
    """A stored ``distinct_exact`` partial past its bound: one instance's bucket of one key."""

    measure: str
    max_values: int
    granularity: str
    bucket_start: datetime
    keys: tuple[tuple[str, Any], ...]
    instance: str

    def describe(self) -> str:
        keys = "".join(f" {k}={v}" for k, v in self.keys)
        return (f"{self.measure} {self.granularity} {self.bucket_start.isoformat()}{keys} instance {self.instance} "
                f"(past max_values {self.max_values})")


def approximate(spec: AggregationSpec, written: pa.Table) -> list[Approximate]:
    """The rows of ``written`` (``spec.written_schema``) whose ``distinct_exact`` partial is a sketch: past its
    bound, read as approximate from now on."""
    found = []
    for measure in spec.measures:
        if measure.kind != "distinct_exact" or not written.num_rows:
            continue
        first = pc.binary_slice(written.column(measure.column), 0, 1)
        sketched = written.filter(pc.fill_null(pc.not_equal(first, pa.scalar(exact_sets.SET_START, pa.binary())),
                                               False))
        for row in sketched.select(["granularity", "bucket_start", *spec.keys, "instance"]).to_pylist():
            found.append(Approximate(measure.column, measure.max_values, row["granularity"], row["bucket_start"],
                                     tuple((k, row[k]) for k in spec.keys), row["instance"]))
    return found
