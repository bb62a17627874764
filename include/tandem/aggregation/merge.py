"""Merge partial aggregates across instances (pure): avg = Σsum / Σcount, min of mins, max of maxes, union of sketches
and of exact sets."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from tandem.aggregation import distinct
from tandem.aggregation.spec import AggregationSpec, Measure
from tandem.store.aggregates import LONG_RANGE

MergedRow = dict[str, Any]

def long_sum(a: int | None, b: int | None) -> int | None:
    """Two partial ``long`` sums added: ``None`` (no value) once either is, or once the total leaves 64 bits (as
    Spark's ``try_sum``)."""
    if a is None or b is None:
        return None
    total = a + b
    return total if LONG_RANGE[0] <= total <= LONG_RANGE[1] else None


_COMBINE = {
    "sum": lambda a, b: a + b,  # doubles: IEEE 754, ±inf past ±1.8e308 (and nan for +inf and -inf)
    "count": lambda a, b: a + b,
    "min": min,
    "max": max,
}


def combine(measure: Measure, a: Any, b: Any) -> Any:
    """Two partial values of ``measure`` merged. ``None`` is no value (a row published before a cut-over added the
    measure), except for a ``long`` sum, where it is a sum past 64 bits and stays ``None``. A distinct measure's
    partials are unioned once for all (:func:`tandem.aggregation.distinct.read`), not here."""
    if measure.kind == "sum" and measure.sql_type == "bigint":
        return long_sum(a, b)
    if a is None or b is None:
        return b if a is None else a
    return _COMBINE[measure.kind](a, b)


def with_ratios(spec: AggregationSpec, row: MergedRow) -> MergedRow:
    """Add the derived columns (e.g. ``avg_price``) to a merged row; ``None`` where a value is missing or the
    denominator is 0."""
    for ratio in spec.ratios:
        numerator, denominator = row[ratio.numerator], row[ratio.denominator]
        row[ratio.column] = numerator / denominator if denominator and numerator is not None else None
    return row


def merge_partials(spec: AggregationSpec, partials: Iterable[Mapping[str, Any]]) -> list[MergedRow]:
    """Merge partial rows that share ``(bucket_start, *keys)`` into one row each.

    Each partial must carry ``bucket_start``, the spec's keys and measures, and ``instance``.
    The result is sorted by bucket then keys and carries ``instances`` (how many instances contributed), and a
    ``distinct_exact`` measure's flag (:func:`tandem.aggregation.distinct.read`).
    """
    merged: dict[tuple, MergedRow] = {}
    instances: dict[tuple, set[str]] = {}
    for part in partials:
        group = (part["bucket_start"], *(part[k] for k in spec.keys))
        current = merged.get(group)
        if current is None:
            merged[group] = {"bucket_start": part["bucket_start"], **{k: part[k] for k in spec.keys},
                             **{m.column: [part[m.column]] if m.distinct else part[m.column] for m in spec.measures}}
            instances[group] = {part["instance"]}
            continue
        for measure in spec.measures:
            if measure.distinct:
                current[measure.column].append(part[measure.column])
            else:
                current[measure.column] = combine(measure, current[measure.column], part[measure.column])
        instances[group].add(part["instance"])
    rows = []
    for group in sorted(merged, key=_sort_key):
        row = distinct.read_row(spec, merged[group])
        row["instances"] = len(instances[group])
        rows.append(with_ratios(spec, row))
    return rows


def _sort_key(group: tuple) -> tuple:
    bucket: datetime = group[0]
    return (bucket.timestamp(), *group[1:])
