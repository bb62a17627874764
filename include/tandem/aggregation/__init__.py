"""Sharded partial aggregates: granularities, publishing, and merge on read.

Use :func:`query` to read merged aggregates from PostgreSQL (indexed, for serving) or from
Delta (the same numbers, for the lake).
"""

from __future__ import annotations

from datetime import datetime

from tandem.aggregation import delta as _delta
from tandem.aggregation import postgres as _postgres
from tandem.aggregation.granularity import GRANULARITIES, bucket_end, bucket_start
from tandem.aggregation.merge import MergedRow, merge_partials
from tandem.aggregation.spec import TRADES, AggregationSpec, get_spec
from tandem.config import ClusterConfig
from tandem.errors import QueryError
from tandem.layout import delta_table_dir
from tandem.store.db import Database

SOURCES = ("postgres", "delta")


def query(cluster: ClusterConfig, aggregation: str, granularity: str, start: datetime, end: datetime, *,
          symbols: list[str] | None = None, source: str = "postgres", plan: str | None = None) -> list[MergedRow]:
    """Merged aggregates of ``aggregation`` for buckets of ``granularity`` starting in ``[start, end)``.

    avg = Σsum / Σcount across shards, min of mins, max of maxes. ``symbols`` restricts the key.
    ``plan`` is the plan whose outputs are read (default: the plan named after the aggregation).
    """
    try:
        spec = get_spec(aggregation)
    except ValueError as exc:
        raise QueryError(str(exc)) from None
    if granularity not in GRANULARITIES:
        raise QueryError(f"unknown granularity {granularity!r} (expected one of {', '.join(GRANULARITIES)})")
    if start.tzinfo is None or end.tzinfo is None:
        raise QueryError("start and end must be timezone-aware")
    if end <= start:
        raise QueryError(f"empty range: end {end.isoformat()} is not after start {start.isoformat()}")
    keys = {"symbol": symbols} if symbols else None
    plan = plan or spec.name
    if source == "postgres":
        with Database(cluster.database_url, "tandem-query") as db:
            return db.run(lambda cursor: _postgres.query_merged(cursor, spec, plan, granularity, start, end, keys))
    if source == "delta":
        path = delta_table_dir(cluster, plan, spec.table)
        return _delta.query_merged(path, spec, granularity, start, end, keys)
    raise QueryError(f"unknown source {source!r} (expected one of {', '.join(SOURCES)})")


__all__ = ["GRANULARITIES", "TRADES", "AggregationSpec", "MergedRow", "bucket_end", "bucket_start",
           "get_spec", "merge_partials", "query"]
