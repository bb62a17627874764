"""Partial aggregates in Delta: the same rows as PostgreSQL, appended once per micro-batch.

Every published row carries ``(epoch, batch_id)``; a key that was updated by several batches
appears several times and readers keep its newest version before merging instances.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from tandem.aggregation.merge import MergedRow, merge_partials
from tandem.aggregation.spec import UTC_MICROS, AggregationSpec
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from tandem.lake.tables import retry_on_conflict
from tandem.lake.tables import append_once, read_table, string_literal, table_exists

def arrow_schema(spec: AggregationSpec) -> pa.Schema:
    """The Delta table's columns: a written row's, then who published it and when."""
    return pa.schema([*spec.written_schema, ("node", pa.string()), ("published_at", UTC_MICROS)])


def append_rows(path: Path, spec: AggregationSpec, rows: pa.Table, *, node: str, published_at: datetime, app_id: str,
                batch_id: int) -> bool:
    """Append the rows written to PostgreSQL for one micro-batch, once."""
    return append_once(path, _rows_table(spec, rows, node, published_at), app_id=app_id, version=batch_id,
                       partition_by=["granularity"], merge_schema=True)  # a cut-over may have added a measure


NEWEST_FIRST = [("epoch", "descending"), ("batch_id", "descending"), ("published_at", "descending")]
"""The order of a key's versions, newest first: a backfill's rows carry the instance's last published (epoch, batch)
and come after that batch's own rows."""


def _rows_table(spec: AggregationSpec, rows: pa.Table, node: str, published_at: datetime) -> pa.Table:
    count = rows.num_rows
    return (rows.select(spec.written_schema.names)
            .append_column("node", pa.repeat(pa.scalar(node, pa.string()), count))
            .append_column("published_at", pa.repeat(pa.scalar(published_at, UTC_MICROS), count))
            .cast(arrow_schema(spec)))


def replace_range(path: Path, spec: AggregationSpec, instance: str, start: datetime, end: datetime,
                  written: pa.Table, *, node: str, published_at: datetime, app_id: str) -> int:
    """The Delta side of :func:`tandem.aggregation.postgres.replace_range`: the instance's seconds in ``[start, end)``
    replaced by the recomputed ones (one commit with a predicate, tried again after a conflict with a live append),
    then the rebuilt coarser buckets appended (their newest version wins on read). Returns the rows written."""
    is_second = pc.equal(written["granularity"], "second")
    seconds, coarser = written.filter(is_second), written.filter(pc.invert(is_second))
    predicate = (f"granularity = 'second' AND instance = {string_literal(instance)} "
                 f"AND bucket_start >= '{start.isoformat()}' AND bucket_start < '{end.isoformat()}'")
    path.mkdir(parents=True, exist_ok=True)
    retry_on_conflict(lambda: write_deltalake(str(path), _rows_table(spec, seconds, node, published_at),
                                              mode="overwrite", predicate=predicate, partition_by=["granularity"],
                                              commit_properties=CommitProperties(
                                                  app_transactions=[Transaction(f"{app_id}/seconds", 0)])),
                      time.sleep)
    if coarser.num_rows:
        append_once(path, _rows_table(spec, coarser, node, published_at), app_id=app_id, version=0,
                    partition_by=["granularity"])
    return written.num_rows


def relabel_instances(path: Path, labels: dict[str, str]) -> None:
    """The Delta side of :func:`tandem.store.aggregates.relabel_instances`: every row of the instances in ``labels``
    moved to its label, in one commit (tried again after a conflict); nothing when the table does not exist."""
    if not labels or not table_exists(path):
        return
    cases = " ".join(f"WHEN instance = {string_literal(old)} THEN {string_literal(new)}" for old, new in labels.items())
    predicate = f"instance IN ({', '.join(string_literal(old) for old in labels)})"
    retry_on_conflict(lambda: DeltaTable(str(path)).update(updates={"instance": f"CASE {cases} END"},
                                                           predicate=predicate), time.sleep)


def read_partials(path: Path, spec: AggregationSpec, granularity: str, start: datetime, end: datetime,
                  keys: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
    """The newest version of every partial row in ``[start, end)`` (one per instance and key)."""
    spec.check_granularity(granularity)
    condition = (ds.field("granularity") == granularity) & (ds.field("bucket_start") >= pa.scalar(start, UTC_MICROS)) \
        & (ds.field("bucket_start") < pa.scalar(end, UTC_MICROS))
    for key, values in (keys or {}).items():
        if key not in spec.keys:
            raise ValueError(f"{spec.name} has no key {key!r}")
        condition &= ds.field(key).isin(list(values))
    table = read_table(path, condition)
    if table.num_rows == 0:
        return []
    identity = ["granularity", "bucket_start", *spec.keys, "instance"]
    table = table.sort_by([*[(c, "ascending") for c in identity], *NEWEST_FIRST])
    latest: dict[tuple, dict[str, Any]] = {}
    for row in table.to_pylist():
        row["bucket_start"] = row["bucket_start"].astimezone(timezone.utc)
        latest.setdefault(tuple(row[c] for c in identity), row)
    return list(latest.values())


def query_merged(path: Path, spec: AggregationSpec, granularity: str, start: datetime, end: datetime,
                 keys: dict[str, list[str]] | None = None) -> list[MergedRow]:
    """Merged aggregates read from Delta; the same numbers as :func:`tandem.aggregation.postgres.query_merged`."""
    return merge_partials(spec, read_partials(path, spec, granularity, start, end, keys))
