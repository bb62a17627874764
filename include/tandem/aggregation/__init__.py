"""Sharded partial aggregates: granularities, publishing, and merge on read.

Use :func:`query` to read merged aggregates from PostgreSQL (indexed, for serving) or from
Delta (the same numbers, for the lake).
"""

from __future__ import annotations

from datetime import datetime

import psycopg2.errors

from tandem.aggregation import delta as _delta
from tandem.aggregation import postgres as _postgres
from tandem.aggregation.granularity import GRANULARITIES, bucket_end, bucket_start
from tandem.aggregation.merge import MergedRow, merge_partials
from tandem.aggregation.spec import AggregationSpec, aggregation_outputs, spec_for
from tandem.config import ClusterConfig, load_plan
from tandem.errors import NothingPublished, QueryError
from tandem.layout import delta_table_dir
from tandem.store.db import Database

SOURCES = ("postgres", "delta")


def query(cluster: ClusterConfig, plan: str, granularity: str, start: datetime, end: datetime, *,
          output: str | None = None, keys: dict[str, list[str]] | None = None,
          source: str = "postgres") -> list[MergedRow]:
    """Merged aggregates of a plan's aggregation output for buckets of ``granularity`` starting in ``[start, end)``.

    avg = Σsum / Σcount across shards, min of mins, max of maxes, distinct = the union's estimate.
    ``output``: the aggregation (default: the plan's only one). ``keys`` restricts key fields to some values,
    e.g. ``{"symbol": ["IBM"]}``.
    """
    declared = load_plan(plan, cluster)
    outputs = aggregation_outputs(declared)
    if output is None and len(outputs) != 1:
        raise QueryError(f"plan {plan} has {len(outputs)} aggregation outputs: name one ({', '.join(outputs)})")
    output = output or outputs[0]
    if output not in outputs:
        raise QueryError(f"plan {plan} has no aggregation output {output!r} (aggregations: {', '.join(outputs)})")
    spec = spec_for(declared, output)
    if granularity not in spec.granularities:
        raise QueryError(f"unknown granularity {granularity!r}: plan {plan} keeps {output} by "
                         f"{', '.join(spec.granularities)}")
    if start.tzinfo is None or end.tzinfo is None:
        raise QueryError("start and end must be timezone-aware")
    if end <= start:
        raise QueryError(f"empty range: end {end.isoformat()} is not after start {start.isoformat()}")
    unknown = sorted(set(keys or {}) - set(spec.keys))
    if unknown:
        raise QueryError(f"{output} of plan {plan} has no key {', '.join(unknown)} (keys: {', '.join(spec.keys)})")
    if source == "postgres":
        with Database(cluster.database_url, "tandem-query") as db:
            try:
                return _postgres.read_merged(db.run, spec, plan, granularity, start, end, keys)
            except psycopg2.errors.UndefinedTable:
                raise NothingPublished(f"table tandem.{spec.table} does not exist yet: no instance of plan {plan} has "
                                 f"published {output} (or the database is not migrated: tandem migrate)") from None
    if source == "delta":
        path = delta_table_dir(cluster, plan, output)
        return _delta.query_merged(path, spec, granularity, start, end, keys)
    raise QueryError(f"unknown source {source!r} (expected one of {', '.join(SOURCES)})")


__all__ = ["GRANULARITIES", "AggregationSpec", "MergedRow", "bucket_end", "bucket_start", "merge_partials", "query",
           "spec_for"]
