"""Merge partial aggregates across shards (pure): avg = Σsum / Σcount, min of mins, max of maxes, union of sketches."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from tandem.aggregation import sketches
from tandem.aggregation.spec import AggregationSpec

MergedRow = dict[str, Any]

_COMBINE = {
    "sum": lambda a, b: a + b,
    "count": lambda a, b: a + b,
    "min": min,
    "max": max,
    "distinct": lambda a, b: sketches.union([a, b]),
}


def with_ratios(spec: AggregationSpec, row: MergedRow) -> MergedRow:
    """Add the derived columns (e.g. ``avg_price``) to a merged row."""
    for ratio in spec.ratios:
        denominator = row[ratio.denominator]
        row[ratio.column] = row[ratio.numerator] / denominator if denominator else None
    return row


def merge_partials(spec: AggregationSpec, partials: Iterable[Mapping[str, Any]]) -> list[MergedRow]:
    """Merge partial rows that share ``(bucket_start, *keys)`` into one row each.

    Each partial must carry ``bucket_start``, the spec's keys and measures, and ``shard_id``.
    The result is sorted by bucket then keys and carries ``shards`` (how many shards contributed).
    """
    merged: dict[tuple, MergedRow] = {}
    shards: dict[tuple, set[str]] = {}
    for part in partials:
        group = (part["bucket_start"], *(part[k] for k in spec.keys))
        current = merged.get(group)
        if current is None:
            merged[group] = {"bucket_start": part["bucket_start"], **{k: part[k] for k in spec.keys},
                             **{m.column: part[m.column] for m in spec.measures}}
            shards[group] = {part["shard_id"]}
            continue
        for measure in spec.measures:
            current[measure.column] = _COMBINE[measure.kind](current[measure.column], part[measure.column])
        shards[group].add(part["shard_id"])
    rows = []
    for group in sorted(merged, key=_sort_key):
        row = merged[group]
        for column in spec.distinct_columns:
            row[column] = sketches.estimate(row[column])
        row["shards"] = len(shards[group])
        rows.append(with_ratios(spec, row))
    return rows


def _sort_key(group: tuple) -> tuple:
    bucket: datetime = group[0]
    return (bucket.timestamp(), *group[1:])
