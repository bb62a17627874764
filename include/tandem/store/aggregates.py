"""The SQL of aggregation tables: create, stage, upsert and roll up, read, replace an instance's rows.

An aggregation's spec (:class:`tandem.aggregation.spec.AggregationSpec`) names the table, its keys
and measures; it is passed in and read only (``table``, ``keys``, ``measures``, ``measure_columns``,
``distinct_columns``, ``version_column``, ``written_schema``), never imported: the store sits below
:mod:`tandem.aggregation`, which merges sketches, computes ratios and decides which buckets to
read. Every name from the spec is quoted (:mod:`tandem.store.identifiers`); values are parameters.

The rows a publish writes come back as Arrow tables through ``COPY (… RETURNING …) TO STDOUT``
(:func:`copied_out`): a catch-up batch writes hundreds of thousands of rows, and fetching them as
Python dicts, then building Arrow from those for Delta, cost more than the statements themselves.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar

import psycopg2.errors
import pyarrow as pa
import pyarrow.csv as pacsv
from psycopg2 import sql

from tandem.store.identifiers import each, identifiers

T = TypeVar("T")
LONG_RANGE = (-2**63, 2**63 - 1)
"""A ``long`` sum outside this range is no value (NULL), as Spark's ``try_sum`` says; PostgreSQL sums bigints in
``numeric``, so the test never overflows itself."""


def ensure_table(cursor, spec: Any) -> None:
    """Create the aggregation's serving table if it is not there (``trade_aggregates`` comes from migration 001)."""
    measures = sql.Composed([sql.SQL("{} {}{}{}, ").format(
        sql.Identifier(m.column), sql.SQL(m.sql_type),
        sql.SQL(' COLLATE "C"' if m.sql_type == "text" else ""),  # min and max by code point, as Spark compares
        sql.SQL("" if _nullable(m) else " NOT NULL")) for m in spec.measures])
    cursor.execute(sql.SQL(
        """CREATE TABLE IF NOT EXISTS {table} (
               plan text NOT NULL, granularity text NOT NULL, bucket_start timestamptz NOT NULL, {keys}
               instance text NOT NULL, {measures} epoch bigint NOT NULL, batch_id bigint NOT NULL,
               updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY ({identity}))""").format(
        table=sql.Identifier(spec.table), keys=each("{0} text NOT NULL, ", spec.keys), measures=measures,
        identity=identifiers(["plan", "granularity", "bucket_start", *spec.keys, "instance"])))
    _allow_nulls(cursor, spec)
    _follow_measures(cursor, spec)


def _follow_measures(cursor, spec: Any) -> None:
    """A measure a cut-over added gets its column (NULL in the rows published before it); one it removed may be
    NULL from now on (no-op when the table has the spec's measures)."""
    cursor.execute("SELECT column_name, is_nullable FROM information_schema.columns WHERE table_schema = "
                   "current_schema() AND table_name = %s", (spec.table,))
    present = {row["column_name"]: row["is_nullable"] == "YES" for row in cursor.fetchall()}
    fixed = {"plan", "granularity", "bucket_start", *spec.keys, "instance", "epoch", "batch_id", "updated_at"}
    for measure in spec.measures:
        if measure.column not in present:
            cursor.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}{}").format(
                sql.Identifier(spec.table), sql.Identifier(measure.column), sql.SQL(measure.sql_type),
                sql.SQL(' COLLATE "C"' if measure.sql_type == "text" else "")))
    declared = {m.column for m in spec.measures}
    for column, nullable in present.items():
        if column not in fixed and column not in declared and not nullable:
            cursor.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP NOT NULL").format(
                sql.Identifier(spec.table), sql.Identifier(column)))


def _nullable(measure) -> bool:
    """A distinct measure's partial (a sketch or an exact set) is set after its row; a ``long`` sum is NULL once it
    leaves the 64-bit range."""
    return measure.distinct or _is_long_sum(measure)


def _is_long_sum(measure) -> bool:
    return measure.kind == "sum" and measure.sql_type == "bigint"


def _is_double_sum(measure) -> bool:
    return measure.kind == "sum" and measure.sql_type.startswith("double")


def _allow_nulls(cursor, spec: Any) -> None:
    """Drop ``NOT NULL`` from the long sums of a table created before they could be NULL (no-op afterwards)."""
    cursor.execute("SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                   "AND table_name = %s AND is_nullable = 'NO' AND column_name = ANY(%s)",
                   (spec.table, [m.column for m in spec.measures if _nullable(m)]))
    for row in cursor.fetchall():
        cursor.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} DROP NOT NULL").format(
            sql.Identifier(spec.table), sql.Identifier(row["column_name"])))


def _merged(measure, merge: Mapping[str, str], alias: str = "c", careful: bool = False) -> sql.Composable:
    """The SQL that merges a measure's partials (a distinct measure's sketches or exact sets are unioned afterwards,
    in Python).

    A ``long`` sum is NULL when a partial is (it left the 64-bit range) or the total leaves that range. A
    ``double`` sum is PostgreSQL's ``sum``, which refuses a total past ±1.8e308; ``careful`` uses ``ieee_sum``
    (migration 015) instead, which gives ±Infinity there as IEEE 754 (and Spark, and Python) do, at the cost of a
    PL/pgSQL call per row: callers run the fast form first and the careful one only after an overflow
    (:func:`overflow_safe`).
    """
    column = sql.Identifier(alias, measure.column)
    if measure.distinct:
        return sql.SQL("NULL::bytea")
    if _is_long_sum(measure):
        return sql.SQL("CASE WHEN count({c}) = count(*) AND sum({c}) BETWEEN {low} AND {high} "
                       "THEN sum({c})::bigint END").format(c=column, low=sql.Literal(LONG_RANGE[0]),
                                                           high=sql.Literal(LONG_RANGE[1]))
    if careful and _is_double_sum(measure):
        return sql.SQL("ieee_sum({})").format(column)
    return sql.SQL("{}({})").format(sql.SQL(merge[measure.kind]), column)


def has_double_sum(spec: Any) -> bool:
    """Whether a merge of ``spec``'s partials can overflow PostgreSQL's built-in ``sum``."""
    return any(_is_double_sum(m) for m in spec.measures)


def overflow_safe(cursor, spec: Any, statement: Callable[[bool], T]) -> T:
    """``statement(False)``; when a double sum overflowed in it, ``statement(True)`` (IEEE sums) instead, inside
    the same transaction (a savepoint undoes the failed try)."""
    if not has_double_sum(spec):
        return statement(False)
    cursor.execute("SAVEPOINT tandem_fast_sums")
    try:
        result = statement(False)
    except psycopg2.errors.NumericValueOutOfRange:
        cursor.execute("ROLLBACK TO SAVEPOINT tandem_fast_sums")
        result = statement(True)
    cursor.execute("RELEASE SAVEPOINT tandem_fast_sums")
    return result


def _columns(spec: Any) -> sql.Composed:
    """Every column a publish writes, in table order."""
    return identifiers(["plan", "granularity", "bucket_start", *spec.keys, "instance", *spec.measure_columns,
                        "epoch", "batch_id"])


def _returning(spec: Any) -> sql.Composed:
    return identifiers(["granularity", "bucket_start", *spec.keys, "instance", *spec.measure_columns, "epoch",
                        "batch_id"])


def _conflict_update(spec: Any) -> sql.Composed:
    """Replace a row only with one that covers at least as many events (its count is its version)."""
    return sql.SQL("ON CONFLICT ({target}) DO UPDATE SET {updates}updated_at = now() "
                   "WHERE {current} <= EXCLUDED.{version}").format(
        target=identifiers(["plan", "granularity", "bucket_start", *spec.keys, "instance"]),
        updates=each("{0} = EXCLUDED.{0}, ", [*spec.measure_columns, "epoch", "batch_id"]),
        current=sql.Identifier(spec.table, spec.version_column), version=sql.Identifier(spec.version_column))


def _parts(spec: Any) -> dict[str, sql.Composable]:
    return {"table": sql.Identifier(spec.table), "columns": _columns(spec), "conflict": _conflict_update(spec),
            "returning": _returning(spec), "measures": identifiers(spec.measure_columns)}


BATCH_SECOND = sql.SQL("(timestamptz 'epoch' + bucket_micros * interval '1 microsecond')")
"""A staged second's bucket start (``_batch`` holds it as epoch microseconds: as CSV text, formatting and parsing
timestamps took half of a catch-up batch's staging). No time zone takes part, and the sum is exact: PostgreSQL
multiplies the interval in double precision, which holds a whole second's microseconds exactly up to about the year
20,000, and event times are held to 1970-9999 (:data:`tandem.declarations.MAX_EPOCH_MILLIS`)."""


def stage_batch(cursor, spec: Any, seconds: pa.Table) -> None:
    """COPY a batch of per-second partials into the transaction's temporary table ``_batch`` (its second as
    ``bucket_micros``, see :data:`BATCH_SECOND`)."""
    measures = {m.column: m.sql_type for m in spec.measures}
    columns = ["bucket_micros", *spec.keys, *spec.measure_columns]
    types = {"bucket_micros": "bigint", **{k: "text" for k in spec.keys}, **measures}
    bucket = seconds["bucket_start"].cast(spec.written_schema.field("bucket_start").type)  # in microseconds
    staged = seconds.select([*spec.keys, *spec.measure_columns]).add_column(0, "bucket_micros", bucket.cast(pa.int64()))
    cursor.execute("DROP TABLE IF EXISTS _batch")
    declared = sql.SQL(", ").join(sql.SQL("{} {}").format(sql.Identifier(c), sql.SQL(types[c])) for c in columns)
    cursor.execute(sql.SQL("CREATE TEMP TABLE _batch ({}) ON COMMIT DROP").format(declared))
    copy_rows(cursor, sql.Identifier("_batch"), _hexed(staged))


def copied_out(cursor, statement: sql.Composable, params: Mapping[str, Any] | tuple, schema: pa.Schema) -> pa.Table:
    """The rows of ``statement`` (a query, or an ``INSERT``/``UPDATE``/``DELETE`` with ``RETURNING``), in
    ``schema``'s columns and order, through ``COPY … TO STDOUT`` as CSV (bytea arrives as hex text and is decoded).

    The session must print timestamps as ISO in UTC and doubles exactly (Tandem's session settings do).
    """
    buffer = io.BytesIO()
    inlined = cursor.mogrify(statement, params).decode()  # COPY takes no parameters
    cursor.copy_expert(f"COPY ({inlined}) TO STDOUT WITH (FORMAT csv, HEADER true)", buffer)
    buffer.seek(0)
    binary = [field.name for field in schema if pa.types.is_binary(field.type)]
    table = pacsv.read_csv(buffer, parse_options=pacsv.ParseOptions(newlines_in_values=True),
                           convert_options=pacsv.ConvertOptions(
                               column_types={f.name: pa.string() if f.name in binary else f.type for f in schema},
                               null_values=[""], strings_can_be_null=True, quoted_strings_can_be_null=False))
    for name in binary:
        hexed = table.column(name).to_pylist()
        table = table.set_column(table.schema.get_field_index(name), name,
                                 pa.array([None if v is None else bytes.fromhex(v[2:]) for v in hexed], pa.binary()))
    return table.select(schema.names).cast(schema)


def upsert_seconds(cursor, spec: Any, plan: str, instance: str, epoch: int, batch_id: int,
                   seconds: pa.Table) -> pa.Table:
    """Upsert the staged seconds (``_batch``, staged from ``seconds``) of one plan's instance; the rows written
    (``spec.written_schema``).

    Two statements, each finding a second's row by its primary key (``LATERAL … OFFSET 0``, whatever the planner
    believes of the table): the seconds the table holds are upserted (a row is replaced only by one covering at least
    as many events), the others plainly inserted — ``ON CONFLICT``'s speculative insertion of a new row cost a
    catch-up batch of 630,000 seconds a third of its upsert. They go in in the primary key's order: a batch arrives in
    Spark's hash order, and inserting it sorted keeps the B-tree's inserts on neighbouring pages. When every staged
    second was written, the rows written are ``seconds`` as staged (:func:`written_as_staged`), not read back; else
    the upsert runs once more, returning its rows (it rewrites only what it has just written, with the same values).
    """
    params = {"plan": plan, "instance": instance, "epoch": epoch, "batch_id": batch_id}

    def statement(existing: bool, returning: bool) -> sql.Composable:
        return sql.SQL(
            """INSERT INTO {table} ({columns})
               SELECT %(plan)s, 'second', {second}, {keys}%(instance)s, {measures}, %(epoch)s, %(batch_id)s
               FROM _batch b {join} LATERAL (
                   SELECT 1 AS found FROM {table} t
                   WHERE t.plan = %(plan)s AND t.granularity = 'second' AND t.instance = %(instance)s
                     AND t.bucket_start = {second}{key_match} OFFSET 0) e {on}
               ORDER BY b.bucket_micros{order_keys}
               {conflict}{written}""").format(
            table=sql.Identifier(spec.table), columns=_columns(spec), second=BATCH_SECOND,
            keys=each("b.{0}, ", spec.keys), measures=sql.SQL(", ").join(sql.Identifier("b", c)
                                                                         for c in spec.measure_columns),
            join=sql.SQL("CROSS JOIN" if existing else "LEFT JOIN"),
            key_match=each(" AND t.{0} = b.{0}", spec.keys),
            on=sql.SQL("" if existing else "ON true WHERE e.found IS NULL"), order_keys=each(", b.{0}", spec.keys),
            conflict=_conflict_update(spec) if existing else sql.SQL(""),
            written=sql.SQL(" RETURNING {}").format(_returning(spec)) if returning else sql.SQL(""))

    cursor.execute(statement(existing=True, returning=False), params)
    written = cursor.rowcount
    cursor.execute(statement(existing=False, returning=False), params)
    written += cursor.rowcount
    fast = written_as_staged(spec, seconds, instance, epoch, batch_id) if written == seconds.num_rows else None
    if fast is not None:
        return fast
    return copied_out(cursor, statement(existing=True, returning=True), params, spec.written_schema)


def written_as_staged(spec: Any, seconds: pa.Table, instance: str, epoch: int, batch_id: int) -> pa.Table | None:
    """The rows an upsert of ``seconds`` that wrote every one of them wrote (``spec.written_schema``), built from
    ``seconds`` — the values the table holds, as the staged CSV's round trip keeps them exactly (an integer's text is
    its cast to a string, a double's text is its shortest exact one); ``None`` when a column's type does not say so
    (a key neither text nor integer, a measure not already of its stored type): then they are read back."""
    target = spec.written_schema
    for key in spec.keys:
        kind = seconds.schema.field(key).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_integer(kind)):
            return None
    for column in spec.measure_columns:
        kind = seconds.schema.field(column).type
        if kind != target.field(column).type and not (pa.types.is_integer(kind)
                                                       and pa.types.is_integer(target.field(column).type)):
            return None
    rows = seconds.num_rows
    columns = {"granularity": pa.repeat(pa.scalar("second"), rows),
               "bucket_start": seconds["bucket_start"],
               **{key: seconds[key].cast(pa.string()) for key in spec.keys},
               "instance": pa.repeat(pa.scalar(instance), rows),
               **{column: seconds[column] for column in spec.measure_columns},
               "epoch": pa.repeat(pa.scalar(epoch, pa.int64()), rows),
               "batch_id": pa.repeat(pa.scalar(batch_id, pa.int64()), rows)}
    return pa.table(columns).cast(target)


def roll_up(cursor, spec: Any, merge: Mapping[str, str], plan: str, instance: str, epoch: int, batch_id: int,
            granularity: str, child: str) -> pa.Table:
    """Recompute one plan's instance buckets of ``granularity`` touched by the staged seconds from their ``child``
    buckets (``merge``: the SQL aggregate of each measure kind but the distinct ones, whose partials are left NULL);
    the rows written.

    Each touched bucket reads its children by an index range (``LATERAL``), whatever the planner believes about
    the table: a join left to it read a freshly filled table's statistics ("empty") and hashed every second of
    the instance against every minute of the same key (a catch-up batch's minutes took 7 s; now under 2 s). A bucket
    whose children are gone (none counted) is left as it is, as a join would.
    """
    return overflow_safe(cursor, spec, lambda careful: copied_out(cursor, sql.SQL(
        """INSERT INTO {table} ({columns})
           SELECT %(plan)s, %(granularity)s, p.bucket, {parent_keys}%(instance)s, {merged_columns}, %(epoch)s,
                  %(batch_id)s
           FROM (SELECT DISTINCT {keys}date_trunc(%(granularity)s, {second}) AS bucket FROM _batch) p
           CROSS JOIN LATERAL (
               SELECT {merged} FROM {table} c
               WHERE c.plan = %(plan)s AND c.granularity = %(child)s AND c.instance = %(instance)s{key_join}
                 AND c.bucket_start >= p.bucket AND c.bucket_start < p.bucket + ('1 ' || %(granularity)s)::interval
           ) m
           WHERE m.{version} IS NOT NULL
           {conflict}
           RETURNING {returning}""").format(
        parent_keys=each("p.{0}, ", spec.keys), second=BATCH_SECOND,
        merged=sql.SQL(", ").join(sql.SQL("{} AS {}").format(_merged(m, merge, careful=careful),
                                                             sql.Identifier(m.column)) for m in spec.measures),
        merged_columns=sql.SQL(", ").join(sql.Identifier("m", c) for c in spec.measure_columns),
        keys=each("{0}, ", spec.keys), key_join=each(" AND c.{0} = p.{0}", spec.keys),
        version=sql.Identifier(spec.version_column), **_parts(spec)),
        {"plan": plan, "instance": instance, "epoch": epoch, "batch_id": batch_id, "granularity": granularity,
         "child": child}, spec.written_schema))


def lock_for_replace(cursor, spec: Any) -> None:
    """Hold off every publisher of the aggregation's table until this transaction ends (readers go on): a range
    replaced while a stream rolls up a bucket over it must not be rolled up from children read before it."""
    cursor.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(sql.Identifier(spec.table)))


def delete_seconds(cursor, spec: Any, plan: str, instance: str, start: datetime, end: datetime) -> dict[str, int]:
    """Delete one plan's instance per-second rows in ``[start, end)``; how many ``seconds`` and the ``events`` they
    counted."""
    cursor.execute(sql.SQL("WITH gone AS (DELETE FROM {table} WHERE plan = %s AND instance = %s "
                           "AND granularity = 'second' AND bucket_start >= %s AND bucket_start < %s "
                           "RETURNING {count}) SELECT count(*) AS seconds, COALESCE(sum({count}), 0) AS events "
                           "FROM gone").format(table=sql.Identifier(spec.table),
                                               count=sql.Identifier(spec.version_column)),
                   (plan, instance, start, end))
    row = cursor.fetchone()
    return {"seconds": int(row["seconds"]), "events": int(row["events"])}


def rebuild_buckets(cursor, spec: Any, merge: Mapping[str, str], plan: str, instance: str, epoch: int,
                    batch_id: int, granularity: str, child: str, start: datetime, end: datetime) -> pa.Table:
    """Replace one plan's instance buckets of ``granularity`` overlapping ``[start, end)`` with their recomputation from
    their ``child`` buckets (whatever their counts: a recomputed range may hold fewer events); the rows written."""
    params = {"plan": plan, "instance": instance, "epoch": epoch, "batch_id": batch_id, "granularity": granularity,
              "child": child, "start": start, "end": end}
    span = sql.SQL("bucket_start >= date_trunc(%(granularity)s, %(start)s::timestamptz) AND bucket_start < %(end)s")
    cursor.execute(sql.SQL("DELETE FROM {table} WHERE plan = %(plan)s AND instance = %(instance)s "
                           "AND granularity = %(granularity)s AND {span}").format(table=sql.Identifier(spec.table),
                                                                                   span=span), params)
    return overflow_safe(cursor, spec, lambda careful: copied_out(cursor, sql.SQL(
        """INSERT INTO {table} ({columns})
           SELECT %(plan)s, %(granularity)s, date_trunc(%(granularity)s, c.bucket_start) AS bucket,
                  {child_keys}%(instance)s, {merged}, %(epoch)s, %(batch_id)s
           FROM {table} c
           WHERE c.plan = %(plan)s AND c.granularity = %(child)s AND c.instance = %(instance)s
             AND c.bucket_start >= date_trunc(%(granularity)s, %(start)s::timestamptz)
             AND c.bucket_start < date_trunc(%(granularity)s, %(end)s::timestamptz - interval '1 microsecond')
                                  + ('1 ' || %(granularity)s)::interval
           GROUP BY bucket{group_keys}
           RETURNING {returning}""").format(
        child_keys=each("c.{0}, ", spec.keys),
        merged=sql.SQL(", ").join(_merged(m, merge, careful=careful) for m in spec.measures),
        group_keys=each(", c.{0}", spec.keys), **_parts(spec)), params, spec.written_schema))


def seconds_between(cursor, spec: Any, plan: str, instance: str, start: datetime, end: datetime) -> list[dict[str, Any]]:
    """One plan's instance per-second rows in ``[start, end)``: bucket start, keys and measures (sketches as bytes)."""
    cursor.execute(sql.SQL("SELECT {columns} FROM {table} WHERE plan = %s AND instance = %s AND granularity = 'second' "
                           "AND bucket_start >= %s AND bucket_start < %s").format(
        columns=identifiers(["bucket_start", *spec.keys, *spec.measure_columns]), table=sql.Identifier(spec.table)),
        (plan, instance, start, end))
    return [{k: bytes(v) if isinstance(v, memoryview) else v for k, v in row.items()} for row in cursor.fetchall()]


def rows_of_buckets(cursor, spec: Any, plan: str, instance: str, wanted: Iterable[tuple]) -> pa.Table:
    """An instance's rows of the buckets ``wanted`` (``(granularity, bucket_start, *keys)``; none: no query), in
    ``spec.written_schema``.

    The buckets are COPied into the temporary table ``_wanted`` and each is read by its primary key (``LATERAL …
    OFFSET 0``, which the planner cannot turn into a join of the whole instance, whatever its statistics say):
    as one ``IN`` list of row values they made a statement PostgreSQL could not plan from ~10,000 buckets on
    ("stack depth limit exceeded", issue 46).
    """
    wanted = list(dict.fromkeys(tuple(w) for w in wanted))
    if not wanted:
        return spec.written_schema.empty_table()
    identity = ["granularity", "bucket_start", *spec.keys]
    columns = list(zip(*wanted))
    buckets = pa.table({"granularity": pa.array(columns[0], pa.string()),
                        "bucket_start": pa.array(columns[1], pa.timestamp("us", tz="UTC")),
                        **{key: pa.array([str(v) for v in values], pa.string())
                           for key, values in zip(spec.keys, columns[2:])}})
    _temporary(cursor, "_wanted", sql.SQL("granularity text, bucket_start timestamptz{}").format(
        each(", {0} text", spec.keys)))
    copy_rows(cursor, sql.Identifier("_wanted"), buckets)
    return copied_out(
        cursor,
        sql.SQL("SELECT t.* FROM _wanted w CROSS JOIN LATERAL ("
                "SELECT {returning} FROM {table} WHERE plan = %s AND instance = %s{match} OFFSET 0) t").format(
            returning=_returning(spec), table=sql.Identifier(spec.table),
            match=each(" AND {0} = w.{0}", identity)),
        (plan, instance), spec.written_schema)


def merged_rows(cursor, spec: Any, merge: Mapping[str, str], plan: str, granularity: str, start: datetime,
                end: datetime, keys: Mapping[str, list[str]] | None = None, careful: bool = False) -> list[dict[str, Any]]:
    """One plan's buckets in ``[start, end)`` merged across instances (a distinct measure: the array of its partials),
    optionally restricted to some key values, with ``instances``: how many instances each merges.

    A double sum past PostgreSQL's range raises ``NumericValueOutOfRange`` unless ``careful`` (see :func:`_merged`);
    the read's cursor may be a server-side one, which fails at its first fetch and cannot be rewound, so the caller
    reads again, carefully, in a new transaction."""
    filters = [sql.SQL("plan = %(plan)s AND granularity = %(granularity)s AND bucket_start >= %(start)s "
                       "AND bucket_start < %(end)s")]
    params = {"plan": plan, "granularity": granularity, "start": start, "end": end}
    for index, (key, values) in enumerate((keys or {}).items()):
        filters.append(sql.SQL("{} = ANY({})").format(sql.Identifier(key), sql.Placeholder(f"key_{index}")))
        params[f"key_{index}"] = list(values)
    group = identifiers(["bucket_start", *spec.keys])
    measures = sql.SQL(", ").join(
        sql.SQL("{merged} AS {column}").format(
            merged=sql.SQL("array_agg({})").format(sql.Identifier(m.column)) if m.distinct
            else _merged(m, merge, spec.table, careful), column=sql.Identifier(m.column))
        for m in spec.measures)
    cursor.execute(
        sql.SQL("""SELECT {group}, {measures}, count(DISTINCT instance) AS instances FROM {table}
                   WHERE {filters} GROUP BY {group} ORDER BY {group}""").format(
            group=group, measures=measures, table=sql.Identifier(spec.table), filters=sql.SQL(" AND ").join(filters)),
        params,
    )
    return cursor.fetchall()


def _table_exists(cursor, spec: Any) -> bool:
    """Whether the aggregation's serving table exists (it is created with its first rows)."""
    cursor.execute("SELECT to_regclass(%s) IS NOT NULL AS present", (sql.Identifier(spec.table).as_string(cursor),))
    return cursor.fetchone()["present"]


def serving_rows(cursor, spec: Any, plan: str, since: datetime, until: datetime | None, granularity: str | None,
                 limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` of one plan's rows whose bucket overlaps ``[since, until)`` (``granularity``: of it only);
    none while the table does not exist (an aggregation's table is created with its first rows)."""
    if not _table_exists(cursor, spec):
        return []
    table = sql.Identifier(spec.table)
    cursor.execute(sql.SQL(
        "SELECT {columns} FROM {table} "
        "WHERE plan = %(plan)s AND bucket_start + ('1 ' || granularity)::interval > %(since)s "
        "AND (%(until)s::timestamptz IS NULL OR bucket_start < %(until)s) "
        "AND (%(granularity)s::text IS NULL OR granularity = %(granularity)s) "
        "LIMIT %(limit)s").format(
        columns=identifiers(["granularity", "bucket_start", *spec.keys, "instance", *spec.measure_columns]),
        table=table), {"plan": plan, "since": since, "until": until, "granularity": granularity, "limit": limit})
    return cursor.fetchall()


def replace_instance_rows(cursor, spec: Any, plan: str, instance: str, rows: pa.Table,
                       touched: pa.Table | None = None) -> None:
    """Delete one plan's instance rows (with ``touched``: only those of its (granularity, bucket_start, *keys)),
    then COPY ``rows`` (the table's columns but ``plan``; a distinct measure's partials as hex text) in."""
    table = sql.Identifier(spec.table)
    if touched is None:
        cursor.execute(sql.SQL("DELETE FROM {} WHERE plan = %s AND instance = %s").format(table), (plan, instance))
    else:  # an aggregation may have no keys
        identity = ["granularity", "bucket_start", *spec.keys]
        cursor.execute(sql.SQL("CREATE TEMP TABLE _touched (granularity text, bucket_start timestamptz{keys}) "
                               "ON COMMIT DROP").format(keys=each(", {0} text", spec.keys)))
        copy_rows(cursor, sql.Identifier("_touched"), touched.select(identity))
        cursor.execute(sql.SQL("DELETE FROM {table} t USING _touched k WHERE t.plan = %s AND t.instance = %s"
                               "{match}").format(table=table, match=each(" AND t.{0} = k.{0}", identity)),
                       (plan, instance))
    if rows.num_rows:
        copy_rows(cursor, table, _hexed(rows.append_column("plan", pa.repeat(pa.scalar(plan), rows.num_rows))))


def copy_rows(cursor, table: sql.Identifier, rows: pa.Table) -> None:
    """COPY ``rows`` (as CSV, its columns by name) into ``table``."""
    buffer = io.BytesIO()
    pacsv.write_csv(rows, buffer)
    buffer.seek(0)
    cursor.copy_expert(sql.SQL("COPY {table} ({columns}) FROM STDIN WITH (FORMAT csv, HEADER true)").format(
        table=table, columns=identifiers(rows.column_names)), buffer)


def _temporary(cursor, name: str, columns: sql.Composable) -> None:
    """(Re)create the transaction's temporary table ``name`` (a sink may fill it twice in one transaction)."""
    cursor.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))
    cursor.execute(sql.SQL("CREATE TEMP TABLE {} ({}) ON COMMIT DROP").format(sql.Identifier(name), columns))


def _hexed(rows: pa.Table) -> pa.Table:
    """``rows`` with every binary column as PostgreSQL's hex text of ``bytea`` (how it travels through CSV)."""
    for index, field in enumerate(rows.schema):
        if pa.types.is_binary(field.type):
            hexed = [None if v is None else "\\x" + v.hex() for v in rows.column(index).to_pylist()]
            rows = rows.set_column(index, field.name, pa.array(hexed, pa.string()))
    return rows


def children_sketches(cursor, spec: Any, plan: str, instance: str, granularity: str, child: str,
                      parents: pa.Table) -> pa.Table:
    """The sketches (distinct columns) of the ``child`` buckets of each of ``parents`` (one plan's instance buckets of
    ``granularity``: ``bucket_start`` and the keys): one row per child, ``parent`` its parent's index in ``parents``.

    The parents are COPied into ``_parents`` and each reads its children by an index range (``LATERAL … OFFSET 0``,
    as :func:`roll_up`; see :func:`ensure_key_index`), all in one statement: a pair of statements per rolled-up
    row took minutes for a batch of 100,000 keys.
    """
    staged = parents.select(["bucket_start", *spec.keys]).append_column(
        "parent", pa.array(range(parents.num_rows), pa.int64()))
    _temporary(cursor, "_parents", sql.SQL("parent bigint, bucket_start timestamptz{}").format(
        each(", {0} text", spec.keys)))
    copy_rows(cursor, sql.Identifier("_parents"), staged)
    schema = pa.schema([("parent", pa.int64()), *[(c, pa.binary()) for c in spec.distinct_columns]])
    return copied_out(cursor, sql.SQL(
        """SELECT p.parent, {sketched} FROM _parents p CROSS JOIN LATERAL (
               SELECT {sketched} FROM {table} c
               WHERE c.plan = %(plan)s AND c.granularity = %(child)s AND c.instance = %(instance)s{key_join}
                 AND c.bucket_start >= p.bucket_start
                 AND c.bucket_start < p.bucket_start + ('1 ' || %(granularity)s)::interval OFFSET 0) c""").format(
        sketched=identifiers(spec.distinct_columns), table=sql.Identifier(spec.table),
        key_join=each(" AND c.{0} = p.{0}", spec.keys)),
        {"plan": plan, "child": child, "instance": instance, "granularity": granularity}, schema)


def store_sketches(cursor, spec: Any, plan: str, rows: pa.Table) -> None:
    """Set the sketches (distinct columns) of one plan's rows ``rows`` (as written: ``spec.written_schema``) to theirs.

    The rows go through the temporary table ``_sketches`` and each finds its own by the primary key
    (``INSERT … ON CONFLICT DO UPDATE`` of the sketches alone): an ``UPDATE … FROM`` join is the planner's to
    choose, and a table without statistics can make it compare every row with every other.
    """
    _temporary(cursor, "_sketches", sql.SQL("LIKE {} INCLUDING DEFAULTS").format(sql.Identifier(spec.table)))
    copy_rows(cursor, sql.Identifier("_sketches"),
              _hexed(rows.append_column("plan", pa.repeat(pa.scalar(plan, pa.string()), rows.num_rows))))
    cursor.execute(sql.SQL(
        """INSERT INTO {table} ({columns}) SELECT {columns} FROM _sketches
           ON CONFLICT ({identity}) DO UPDATE SET {sketches}""").format(
        table=sql.Identifier(spec.table), columns=_columns(spec),
        identity=identifiers(["plan", "granularity", "bucket_start", *spec.keys, "instance"]),
        sketches=sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
                                    for c in spec.distinct_columns)))


def ensure_key_index(cursor, spec: Any) -> None:
    """Give the aggregation's serving table an index that finds a key's buckets by time,
    ``(plan, granularity, *keys, instance, bucket_start)``, unless it has one whose columns before ``bucket_start``
    hold the plan, granularity and keys (``trade_aggregates_by_symbol``; the primary key of a table without keys).

    The roll-ups read each bucket's children of one key by a time range: through the primary key, which has
    ``bucket_start`` before the keys, each read went through every key's children of that range, so a batch's
    roll-up time grew with the square of its keys (100,000 keys: minutes per granularity). A missing index is
    created in the caller's transaction, publishers of the table taking turns (an advisory lock): two first
    publishes cannot both create it, nor deadlock.
    """
    if _has_key_index(cursor, spec):
        return
    cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"tandem.key_index/{spec.table}",))
    if not _has_key_index(cursor, spec):
        cursor.execute(sql.SQL("CREATE INDEX ON {} ({})").format(
            sql.Identifier(spec.table), identifiers(["plan", "granularity", *spec.keys, "instance", "bucket_start"])))


def _has_key_index(cursor, spec: Any) -> bool:
    cursor.execute(
        """SELECT array_agg(a.attname::text ORDER BY k.position) AS columns
           FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, position)
           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
           WHERE i.indrelid = to_regclass(%s) GROUP BY i.indexrelid""",
        (sql.Identifier(spec.table).as_string(cursor),))
    needed = {"plan", "granularity", *spec.keys}
    for row in cursor.fetchall():
        columns = list(row["columns"])
        if "bucket_start" in columns and needed <= set(columns[:columns.index("bucket_start")]):
            return True
    return False


def delete_plan_rows(cursor, spec: Any, plan: str) -> tuple[int, bool]:
    """Delete ``plan``'s rows from the aggregation's serving table, and drop the table when no plan's rows are left
    in it (its next publish creates it again, with the keys and measures declared then). Returns ``(rows deleted,
    dropped)``; a table that does not exist is ``(0, False)``."""
    if not _table_exists(cursor, spec):
        return 0, False
    table = sql.Identifier(spec.table)
    cursor.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table))  # no publish in between
    cursor.execute(sql.SQL("DELETE FROM {} WHERE plan = %s").format(table), (plan,))
    deleted = cursor.rowcount
    cursor.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {}) AS left").format(table))
    if cursor.fetchone()["left"]:
        return deleted, False
    cursor.execute(sql.SQL("DROP TABLE {}").format(table))
    return deleted, True


def newest_bucket(cursor, spec: Any, plan: str, granularity: str, instances: list[str]) -> datetime | None:
    """The newest bucket start of ``granularity`` the instances' rows hold (``None``: none, or no table yet); read
    down the primary key from its newest bucket."""
    if not _table_exists(cursor, spec):
        return None
    cursor.execute(sql.SQL("""SELECT bucket_start FROM {table} WHERE plan = %s AND granularity = %s
                                AND instance = ANY(%s) ORDER BY bucket_start DESC LIMIT 1""").format(
        table=sql.Identifier(spec.table)), (plan, granularity, instances))
    row = cursor.fetchone()
    return None if row is None else row["bucket_start"]


def relabel_instances(cursor, spec: Any, plan: str, labels: dict[str, str]) -> int:
    """Every row of the instances in ``labels`` (every granularity) moved to its label (a cut-over retires them);
    the rows moved (none when the table does not exist yet)."""
    if not _table_exists(cursor, spec):
        return 0
    cursor.execute(sql.SQL(
        """UPDATE {table} AS t SET instance = l.label, updated_at = now()
           FROM unnest(%s::text[], %s::text[]) AS l(old, label)
           WHERE t.plan = %s AND t.instance = l.old""").format(table=sql.Identifier(spec.table)),
        (list(labels), list(labels.values()), plan))
    return cursor.rowcount
