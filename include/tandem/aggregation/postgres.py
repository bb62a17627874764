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
from psycopg2 import sql

from tandem.aggregation import sketches
from tandem.aggregation.granularity import bucket_start
from tandem.aggregation.merge import MergedRow, with_ratios
from tandem.aggregation.spec import MERGE_SQL, AggregationSpec
from tandem.store.identifiers import each, identifiers


def ensure_table(cursor, spec: AggregationSpec) -> None:
    """Create the aggregation's serving table if it is not there (``trade_aggregates`` comes from migration 001)."""
    measures = sql.Composed([sql.SQL("{} {}{}, ").format(sql.Identifier(m.column), sql.SQL(m.sql_type),
                                                         sql.SQL("" if m.kind == "distinct" else " NOT NULL"))
                             for m in spec.measures])
    cursor.execute(sql.SQL(
        """CREATE TABLE IF NOT EXISTS {table} (
               plan text NOT NULL, granularity text NOT NULL, bucket_start timestamptz NOT NULL, {keys}
               shard_id text NOT NULL, {measures} epoch bigint NOT NULL, batch_id bigint NOT NULL,
               updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY ({identity}))""").format(
        table=sql.Identifier(spec.table), keys=each("{0} text NOT NULL, ", spec.keys), measures=measures,
        identity=identifiers(["plan", "granularity", "bucket_start", *spec.keys, "shard_id"])))


def _merged(measure, alias: str = "c") -> sql.Composable:
    """The SQL that merges a measure's partials (a distinct measure's sketches are unioned afterwards, in Python)."""
    if measure.kind == "distinct":
        return sql.SQL("NULL::bytea")
    return sql.SQL("{}({})").format(sql.SQL(MERGE_SQL[measure.kind]), sql.Identifier(alias, measure.column))


def _columns(spec: AggregationSpec) -> sql.Composed:
    """Every column a publish writes, in table order."""
    return identifiers(["plan", "granularity", "bucket_start", *spec.keys, "shard_id", *spec.measure_columns,
                        "epoch", "batch_id"])


def _returning(spec: AggregationSpec) -> sql.Composed:
    return identifiers(["granularity", "bucket_start", *spec.keys, "shard_id", *spec.measure_columns, "epoch",
                        "batch_id"])


def _conflict_update(spec: AggregationSpec) -> sql.Composed:
    """Replace a row only with one that covers at least as many events (its count is its version)."""
    return sql.SQL("ON CONFLICT ({target}) DO UPDATE SET {updates}updated_at = now() "
                   "WHERE {current} <= EXCLUDED.{version}").format(
        target=identifiers(["plan", "granularity", "bucket_start", *spec.keys, "shard_id"]),
        updates=each("{0} = EXCLUDED.{0}, ", [*spec.measure_columns, "epoch", "batch_id"]),
        current=sql.Identifier(spec.table, spec.version_column), version=sql.Identifier(spec.version_column))


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
    declared = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(types[c])) for c in columns)
    cursor.execute(sql.SQL("CREATE TEMP TABLE _batch ({}) ON COMMIT DROP").format(declared))
    buffer = io.BytesIO()
    pacsv.write_csv(seconds.select(columns), buffer)
    buffer.seek(0)
    cursor.copy_expert(sql.SQL("COPY _batch ({}) FROM STDIN WITH (FORMAT csv, HEADER true)").format(
        identifiers(columns)), buffer)


def upsert_and_roll_up(cursor, spec: AggregationSpec, plan: str, shard_id: str, epoch: int,
                       batch_id: int) -> list[dict[str, Any]]:
    """Upsert the staged seconds of one plan's shard and recompute every touched coarser bucket.

    Returns every written row (without the plan column: the Delta copy lives under the plan's own folder).
    """
    parts = {"table": sql.Identifier(spec.table), "columns": _columns(spec), "conflict": _conflict_update(spec),
             "returning": _returning(spec), "measures": identifiers(spec.measure_columns)}
    params = {"plan": plan, "shard_id": shard_id, "epoch": epoch, "batch_id": batch_id}
    cursor.execute(sql.SQL(
        """INSERT INTO {table} ({columns})
           SELECT %(plan)s, 'second', bucket_start, {keys}%(shard_id)s, {measures}, %(epoch)s, %(batch_id)s
           FROM _batch
           {conflict}
           RETURNING {returning}""").format(keys=each("{0}, ", spec.keys), **parts), params)
    written = cursor.fetchall()
    roll_up = sql.SQL(
        """INSERT INTO {table} ({columns})
           SELECT %(plan)s, %(granularity)s, p.bucket, {parent_keys}%(shard_id)s, {merged}, %(epoch)s, %(batch_id)s
           FROM (SELECT DISTINCT {keys}date_trunc(%(granularity)s, bucket_start) AS bucket FROM _batch) p
           JOIN {table} c
             ON c.plan = %(plan)s AND c.granularity = %(child)s AND c.shard_id = %(shard_id)s{key_join}
            AND c.bucket_start >= p.bucket AND c.bucket_start < p.bucket + ('1 ' || %(granularity)s)::interval
           GROUP BY p.bucket{group_keys}
           {conflict}
           RETURNING {returning}""").format(
        parent_keys=each("p.{0}, ", spec.keys), merged=sql.SQL(", ").join(_merged(m) for m in spec.measures),
        keys=each("{0}, ", spec.keys), key_join=each(" AND c.{0} = p.{0}", spec.keys),
        group_keys=each(", p.{0}", spec.keys), **parts)
    for granularity in spec.granularities[1:]:
        cursor.execute(roll_up, {**params, "granularity": granularity, "child": spec.child_of(granularity)})
        rows = cursor.fetchall()
        if spec.distinct_columns:
            _union_children(cursor, spec, plan, shard_id, granularity, rows)
        written.extend(rows)
    return written


def _union_children(cursor, spec: AggregationSpec, plan: str, shard_id: str, granularity: str,
                    rows: list[dict[str, Any]]) -> None:
    """Set each rolled-up row's sketches to the union of its children's (the rows returned are updated too)."""
    child = spec.child_of(granularity)
    table, sketched = sql.Identifier(spec.table), identifiers(spec.distinct_columns)
    keys = sql.Composed([sql.SQL(" AND ") + match for match in _equals_parameters(spec.keys, "key")])
    select = sql.SQL(
        """SELECT {sketched} FROM {table}
           WHERE plan = %(plan)s AND granularity = %(child)s AND shard_id = %(shard_id)s{keys}
             AND bucket_start >= %(bucket)s AND bucket_start < %(bucket)s + ('1 ' || %(granularity)s)::interval"""
    ).format(sketched=sketched, table=table, keys=keys)
    update = sql.SQL(
        """UPDATE {table} SET {sketches}
           WHERE plan = %(plan)s AND granularity = %(granularity)s AND bucket_start = %(bucket)s
             AND shard_id = %(shard_id)s{keys}"""
    ).format(table=table, sketches=sql.SQL(", ").join(_equals_parameters(spec.distinct_columns, "sketch")), keys=keys)
    for row in rows:
        params = {"plan": plan, "child": child, "shard_id": shard_id, "bucket": row["bucket_start"],
                  "granularity": granularity, **{f"key_{i}": row[k] for i, k in enumerate(spec.keys)}}
        cursor.execute(select, params)
        children = cursor.fetchall()
        for column in spec.distinct_columns:
            row[column] = sketches.union(c[column] for c in children)
        cursor.execute(update, {**params, **{f"sketch_{i}": row[c] for i, c in enumerate(spec.distinct_columns)}})


def _equals_parameters(columns: list[str] | tuple[str, ...], parameter: str) -> list[sql.Composed]:
    """``"a" = %(<parameter>_0)s``, ``"b" = %(<parameter>_1)s`` …: parameters are numbered, so a column named
    like another parameter (``plan``, ``bucket``) cannot take its value."""
    return [sql.SQL("{} = {}").format(sql.Identifier(c), sql.Placeholder(f"{parameter}_{i}"))
            for i, c in enumerate(columns)]


def rows_of_seconds(cursor, spec: AggregationSpec, plan: str, shard_id: str, seconds: set[tuple],
                    granularities: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """A shard's rows of every bucket (of ``granularities``, default the spec's) containing one of ``seconds``
    (``(second, *keys)``)."""
    if not seconds:
        return []
    wanted = sorted({(g, bucket_start(second[0], g), *second[1:]) for second in seconds
                     for g in granularities or spec.granularities},
                    key=str)
    cursor.execute(
        sql.SQL("SELECT {returning} FROM {table} WHERE plan = %s AND shard_id = %s AND ({columns}) IN %s").format(
            returning=_returning(spec), table=sql.Identifier(spec.table),
            columns=identifiers(["granularity", "bucket_start", *spec.keys])),
        (plan, shard_id, tuple(tuple(w) for w in wanted)))
    return [dict(row) for row in cursor.fetchall()]


def query_merged(cursor, spec: AggregationSpec, plan: str, granularity: str, start: datetime, end: datetime,
                 keys: dict[str, list[str]] | None = None) -> list[MergedRow]:
    """One plan's merged aggregates for buckets in ``[start, end)``, optionally restricted to some key values."""
    spec.check_granularity(granularity)
    filters = [sql.SQL("plan = %(plan)s AND granularity = %(granularity)s AND bucket_start >= %(start)s "
                       "AND bucket_start < %(end)s")]
    params = {"plan": plan, "granularity": granularity, "start": start, "end": end}
    for index, (key, values) in enumerate((keys or {}).items()):
        if key not in spec.keys:
            raise ValueError(f"{spec.name} has no key {key!r}")
        filters.append(sql.SQL("{} = ANY({})").format(sql.Identifier(key), sql.Placeholder(f"key_{index}")))
        params[f"key_{index}"] = list(values)
    group = identifiers(["bucket_start", *spec.keys])
    measures = sql.SQL(", ").join(
        sql.SQL("{merge}({column}) AS {column}").format(
            merge=sql.SQL("array_agg" if m.kind == "distinct" else MERGE_SQL[m.kind]), column=sql.Identifier(m.column))
        for m in spec.measures)
    cursor.execute(
        sql.SQL("""SELECT {group}, {measures}, count(DISTINCT shard_id) AS shards FROM {table}
                   WHERE {filters} GROUP BY {group} ORDER BY {group}""").format(
            group=group, measures=measures, table=sql.Identifier(spec.table), filters=sql.SQL(" AND ").join(filters)),
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
