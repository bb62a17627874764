"""Partial aggregates in PostgreSQL: publish (upsert + roll-up) and merge on read.

A micro-batch brings complete per-second partials of one shard. They are upserted, then every
coarser bucket they touch is recomputed from its children (second → minute → … → year) in the
same transaction, so each row always holds full values and replaying a batch changes nothing.
"""

from __future__ import annotations

import io
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv

from tandem.aggregation import sketches
from tandem.aggregation.granularity import bucket_start
from tandem.aggregation.merge import MergedRow, with_ratios
from tandem.aggregation.spec import MERGE_SQL, AggregationSpec


def ensure_table(cursor, spec: AggregationSpec) -> None:
    """Create the aggregation's serving table if it is not there (``trade_aggregates`` comes from migration 001)."""
    keys = "".join(f"{k} text NOT NULL, " for k in spec.keys)
    measures = "".join(f"{m.column} {m.sql_type}{'' if m.kind == 'distinct' else ' NOT NULL'}, " for m in spec.measures)
    identity = ", ".join(["plan", "granularity", "bucket_start", *spec.keys, "shard_id"])
    cursor.execute(
        f"""CREATE TABLE IF NOT EXISTS {spec.table} (
                plan text NOT NULL, granularity text NOT NULL, bucket_start timestamptz NOT NULL, {keys}
                shard_id text NOT NULL, {measures} epoch bigint NOT NULL, batch_id bigint NOT NULL,
                updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY ({identity}))""")


def _merged(measure, alias: str = "c") -> str:
    """The SQL that merges a measure's partials (a distinct measure's sketches are unioned afterwards, in Python)."""
    return "NULL::bytea" if measure.kind == "distinct" else f"{MERGE_SQL[measure.kind]}({alias}.{measure.column})"


def _returning(spec: AggregationSpec) -> str:
    return ", ".join(["granularity", "bucket_start", *spec.keys, "shard_id", *spec.measure_columns, "epoch", "batch_id"])


def _conflict_update(spec: AggregationSpec) -> str:
    """Replace a row only with one that covers at least as many events (its count is its version)."""
    target = ", ".join(["plan", "granularity", "bucket_start", *spec.keys, "shard_id"])
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in [*spec.measure_columns, "epoch", "batch_id"])
    version = spec.version_column
    return (f"ON CONFLICT ({target}) DO UPDATE SET {updates}, updated_at = now() "
            f"WHERE {spec.table}.{version} <= EXCLUDED.{version}")


def stage_batch(cursor, spec: AggregationSpec, seconds: pa.Table) -> None:
    """COPY a batch of per-second partials into the transaction's temporary table ``_batch``."""
    columns = ["bucket_start", *spec.keys, *spec.measure_columns]
    types = {"bucket_start": "timestamptz", **{k: "text" for k in spec.keys},
             **{m.column: m.sql_type for m in spec.measures}}
    for column in spec.distinct_columns:  # bytea travels through CSV as PostgreSQL's hex text
        index = seconds.schema.get_field_index(column)
        hexed = [None if v is None else "\\x" + v.hex() for v in seconds.column(column).to_pylist()]
        seconds = seconds.set_column(index, column, pa.array(hexed, pa.string()))
    cursor.execute("DROP TABLE IF EXISTS _batch")
    cursor.execute(
        f"CREATE TEMP TABLE _batch ({', '.join(f'{c} {types[c]}' for c in columns)}) ON COMMIT DROP"
    )
    buffer = io.BytesIO()
    pacsv.write_csv(seconds.select(columns), buffer)
    buffer.seek(0)
    cursor.copy_expert(f"COPY _batch ({', '.join(columns)}) FROM STDIN WITH (FORMAT csv, HEADER true)", buffer)


def upsert_and_roll_up(cursor, spec: AggregationSpec, plan: str, shard_id: str, epoch: int,
                       batch_id: int) -> list[dict[str, Any]]:
    """Upsert the staged seconds of one plan's shard and recompute every touched coarser bucket.

    Returns every written row (without the plan column: the Delta copy lives under the plan's own folder).
    """
    keys = "".join(f"{k}, " for k in spec.keys)
    params = {"plan": plan, "shard_id": shard_id, "epoch": epoch, "batch_id": batch_id}
    cursor.execute(
        f"""INSERT INTO {spec.table} (plan, granularity, bucket_start, {keys}shard_id, {', '.join(spec.measure_columns)}, epoch, batch_id)
            SELECT %(plan)s, 'second', bucket_start, {keys}%(shard_id)s, {', '.join(spec.measure_columns)}, %(epoch)s, %(batch_id)s
            FROM _batch
            {_conflict_update(spec)}
            RETURNING {_returning(spec)}""",
        params,
    )
    written = cursor.fetchall()
    merged = ", ".join(_merged(m) for m in spec.measures)
    key_join = "".join(f" AND c.{k} = p.{k}" for k in spec.keys)
    for granularity in spec.granularities[1:]:
        cursor.execute(
            f"""INSERT INTO {spec.table} (plan, granularity, bucket_start, {keys}shard_id, {', '.join(spec.measure_columns)}, epoch, batch_id)
                SELECT %(plan)s, %(granularity)s, p.bucket, {''.join(f'p.{k}, ' for k in spec.keys)}%(shard_id)s, {merged},
                       %(epoch)s, %(batch_id)s
                FROM (SELECT DISTINCT {''.join(f'{k}, ' for k in spec.keys)}date_trunc(%(granularity)s, bucket_start) AS bucket
                      FROM _batch) p
                JOIN {spec.table} c
                  ON c.plan = %(plan)s AND c.granularity = %(child)s AND c.shard_id = %(shard_id)s{key_join}
                 AND c.bucket_start >= p.bucket AND c.bucket_start < p.bucket + ('1 ' || %(granularity)s)::interval
                GROUP BY p.bucket{''.join(f', p.{k}' for k in spec.keys)}
                {_conflict_update(spec)}
                RETURNING {_returning(spec)}""",
            {**params, "granularity": granularity, "child": spec.child_of(granularity)},
        )
        rows = cursor.fetchall()
        if spec.distinct_columns:
            _union_children(cursor, spec, plan, shard_id, granularity, rows)
        written.extend(rows)
    return written


def _union_children(cursor, spec: AggregationSpec, plan: str, shard_id: str, granularity: str,
                    rows: list[dict[str, Any]]) -> None:
    """Set each rolled-up row's sketches to the union of its children's (the rows returned are updated too)."""
    child = spec.child_of(granularity)
    keys = "".join(f" AND {k} = %({k})s" for k in spec.keys)
    for row in rows:
        cursor.execute(
            f"""SELECT {', '.join(spec.distinct_columns)} FROM {spec.table}
                WHERE plan = %(plan)s AND granularity = %(child)s AND shard_id = %(shard_id)s{keys}
                  AND bucket_start >= %(bucket)s AND bucket_start < %(bucket)s + ('1 ' || %(granularity)s)::interval""",
            {"plan": plan, "child": child, "shard_id": shard_id, "bucket": row["bucket_start"], "granularity": granularity,
             **{k: row[k] for k in spec.keys}})
        children = cursor.fetchall()
        for column in spec.distinct_columns:
            row[column] = sketches.union(c[column] for c in children)
        cursor.execute(
            f"""UPDATE {spec.table} SET {', '.join(f'{c} = %({c})s' for c in spec.distinct_columns)}
                WHERE plan = %(plan)s AND granularity = %(granularity)s AND bucket_start = %(bucket)s
                  AND shard_id = %(shard_id)s{keys}""",
            {"plan": plan, "granularity": granularity, "bucket": row["bucket_start"], "shard_id": shard_id,
             **{k: row[k] for k in spec.keys}, **{c: row[c] for c in spec.distinct_columns}})


def rows_of_seconds(cursor, spec: AggregationSpec, plan: str, shard_id: str, seconds: set[tuple],
                    granularities: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """A shard's rows of every bucket (of ``granularities``, default the spec's) containing one of ``seconds``
    (``(second, *keys)``)."""
    if not seconds:
        return []
    wanted = sorted({(g, bucket_start(second[0], g), *second[1:]) for second in seconds
                     for g in granularities or spec.granularities},
                    key=str)
    columns = ["granularity", "bucket_start", *spec.keys]
    cursor.execute(
        f"""SELECT {_returning(spec)} FROM {spec.table}
            WHERE plan = %s AND shard_id = %s AND ({', '.join(columns)}) IN %s""",
        (plan, shard_id, tuple(tuple(w) for w in wanted)))
    return [dict(row) for row in cursor.fetchall()]


def query_merged(cursor, spec: AggregationSpec, plan: str, granularity: str, start: datetime, end: datetime,
                 keys: dict[str, list[str]] | None = None) -> list[MergedRow]:
    """One plan's merged aggregates for buckets in ``[start, end)``, optionally restricted to some key values."""
    spec.check_granularity(granularity)
    filters = ["plan = %(plan)s", "granularity = %(granularity)s", "bucket_start >= %(start)s",
               "bucket_start < %(end)s"]
    params = {"plan": plan, "granularity": granularity, "start": start, "end": end}
    for key, values in (keys or {}).items():
        if key not in spec.keys:
            raise ValueError(f"{spec.name} has no key {key!r}")
        filters.append(f"{key} = ANY(%({key})s)")
        params[key] = list(values)
    group = ", ".join(["bucket_start", *spec.keys])
    measures = ", ".join(f"{'array_agg' if m.kind == 'distinct' else MERGE_SQL[m.kind]}({m.column}) AS {m.column}"
                         for m in spec.measures)
    cursor.execute(
        f"""SELECT {group}, {measures}, count(DISTINCT shard_id) AS shards FROM {spec.table}
            WHERE {' AND '.join(filters)} GROUP BY {group} ORDER BY {group}""",
        params,
    )
    return [with_ratios(spec, _plain(spec, row)) for row in cursor.fetchall()]


def _plain(spec: AggregationSpec, row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for measure in spec.measures:
        if measure.sql_type == "bigint":
            out[measure.column] = int(out[measure.column])
        elif measure.sql_type.startswith("double"):
            out[measure.column] = float(out[measure.column])
        elif measure.kind == "distinct":
            out[measure.column] = sketches.estimate(sketches.union(out[measure.column]))
    out["shards"] = int(out["shards"])
    return out
