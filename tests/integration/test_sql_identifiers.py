"""Names from a plan's YAML are data: they reach SQL quoted, never as SQL text (issue 24, §3).

Configuration refuses such names (tests/unit/test_config_refusals.py); these tests hand hostile
names straight to the code that writes SQL, with real PostgreSQL and a real Delta table, so that
quoting holds on its own: every statement runs, names nothing else, and a table the names try to
drop is still there.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from psycopg2 import sql

from tandem.aggregation import postgres as agg_postgres
from tandem.aggregation import sketches
from tandem.aggregation.spec import AggregationSpec, Measure
from tandem.lake.history import roll_back_slice
from tandem.lake.tables import read_table
from tandem.outputs.aggregation import rebuild_postgres_instance
from tandem.store import aggregates
from tandem.store import outputs as store
from tandem.store.db import Database
from tandem.store.migrations import migrate
from tandem.store.registry import InstanceKey

pytestmark = pytest.mark.integration
INJECTION = "x'; DROP TABLE victim; --"
SPEC = AggregationSpec(
    name="hostile", table='agg "table"; DROP TABLE victim; --', keys=("select", "child", "Key With Space"),
    measures=(Measure("order", "count", "bigint"), Measure(INJECTION, "sum", "double precision", "price"),
              Measure("group", "distinct", "bytea", "user")),
    granularities=("second", "minute"))
"""Reserved words, a quote, a space, capitals, a key named like a query parameter (``child``), a table
name that closes its quote and drops another table."""


def victim_exists(db: Database) -> bool:
    return db.run(lambda cursor: (cursor.execute("SELECT to_regclass('victim') IS NOT NULL AS present"),
                                  cursor.fetchone())[1]["present"])


@pytest.fixture
def db(database_url: str):
    with Database(database_url) as db:
        migrate(db)
        db.run(lambda cursor: cursor.execute("CREATE TABLE victim (id int)"))
        yield db


def seconds(start: datetime) -> pa.Table:
    """Three per-second partials in one minute, two of them of the same key."""
    return pa.table({
        "bucket_start": pa.array([start, start + timedelta(seconds=1), start + timedelta(seconds=2)],
                                 pa.timestamp("us", tz="UTC")),
        "select": ["a", "a", "b"], "child": ["c1", "c1", "c2"], "Key With Space": ["k", "k", "k"],
        "order": pa.array([2, 3, 1], pa.int64()), INJECTION: [1.5, 2.5, 4.0],
        "group": [sketches.of(["u1", "u2"]), sketches.of(["u2", "u3"]), sketches.of(["u9"])],
    })


def test_an_aggregation_publishes_merges_restores_and_validates_under_hostile_names(db: Database) -> None:
    start = datetime(2026, 1, 2, 3, 4, 0, tzinfo=timezone.utc)

    def publish(cursor) -> pa.Table:
        aggregates.ensure_table(cursor, SPEC)
        staged = seconds(start)
        aggregates.stage_batch(cursor, SPEC, staged)
        return agg_postgres.upsert_and_roll_up(cursor, SPEC, "plan", "shard-1", epoch=1, batch_id=0, seconds=staged)

    written = db.run(publish)
    assert len(written) == 5  # 3 seconds, 2 minutes

    [minute_a] = db.run(lambda cursor: agg_postgres.query_merged(cursor, SPEC, "plan", "minute", start,
                                                                 start + timedelta(minutes=1), {"select": ["a"]}))
    assert (minute_a["order"], minute_a[INJECTION], minute_a["group"]) == (5, 4.0, 3)
    found = db.run(lambda cursor: agg_postgres.rows_of_seconds(cursor, SPEC, "plan", "shard-1",
                                                               {(start, "a", "c1", "k")}))
    assert sorted(found.column("granularity").to_pylist()) == ["minute", "second"]

    # restore: the Delta rows of the instance back into PostgreSQL, all of them and only the touched keys (the
    # sketches travel as hex text)
    assert rebuild_postgres_instance(db, SPEC, "plan", "shard-1", written) == 5
    assert rebuild_postgres_instance(db, SPEC, "plan", "shard-1", written, touched=written.slice(0, 1)) == 1
    [again] = db.run(lambda cursor: agg_postgres.query_merged(cursor, SPEC, "plan", "minute", start,
                                                              start + timedelta(minutes=1), {"select": ["a"]}))
    assert again == minute_a

    assert len(db.run(lambda cursor: aggregates.serving_rows(cursor, SPEC, "plan", start, None, "second", 100))) == 3
    absent = replace(SPEC, table='no "such" table')
    assert db.run(lambda cursor: aggregates.serving_rows(cursor, absent, "plan", start, None, None, 100)) == []
    assert victim_exists(db)


def test_table_values_are_json_keys_and_column_names_never_sql(db: Database) -> None:
    instance, values = InstanceKey("plan", "shard-1", "node-a"), ["on'time", INJECTION]
    contributions = {"c1": ({"customer": "ann"}, {"on'time": 1, INJECTION: 2}),
                     "c2": ({"customer": "ann"}, {"on'time": 1, INJECTION: 3})}
    db.run(lambda cursor: store.apply_contributions(cursor, instance, "delivered", values, contributions, 1, 0))
    [row] = db.run(lambda cursor: store.read_table_rows(cursor, "plan", "delivered", values))
    assert (row["key"], row["on'time"], row[INJECTION], row["version"]) == ({"customer": "ann"}, 2, 5, 2)
    assert victim_exists(db)


def test_a_instance_slice_is_restored_by_a_predicate_that_matches_only_its_instance(tmp_path: Path) -> None:
    path = tmp_path / "delta"
    instances = ["x' OR '1'='1", "x", "back\\slash'"]
    write_deltalake(str(path), pa.table({"instance": instances, "value": [1, 2, 3]}))
    write_deltalake(str(path), pa.table({"instance": instances, "value": [10, 20, 30]}), mode="append")
    for instance in (instances[0], instances[2]):
        restored = roll_back_slice(path, instance, version=0).restored
        assert restored.column("instance").to_pylist() == [instance]
    assert sorted(read_table(path).to_pylist(), key=str) == sorted(
        [{"instance": instances[0], "value": 1}, {"instance": "x", "value": 2}, {"instance": "x", "value": 20},
         {"instance": instances[2], "value": 3}], key=str)


def test_rows_copied_out_are_the_values_psycopg2_reads(db: Database) -> None:
    """A publish's rows come back through COPY as CSV (``aggregates.copied_out``): every value a key, a measure or a
    time can hold reads back as psycopg2 reads it, text that looks like NULL, a hex string or a number included, in
    an ``INSERT … RETURNING`` (what a publish runs) and a ``SELECT``."""
    schema = pa.schema([("id", pa.int64()), (INJECTION, pa.string()), ("x", pa.float64()), ("n", pa.int64()),
                        ("t", pa.timestamp("us", tz="UTC")), ("b", pa.binary())])
    texts = ["", "NA", "null", "NULL", "\\N", "a,b", 'say "hi"', "line\nbreak", "tab\there", "ünïcødé", "\\x41", "1e5"]
    doubles = [0.1 + 0.2, -0.0, 1e-300, 1.7976931348623157e308, float("nan"), float("inf"), float("-inf"), 5e-324]
    longs = [0, -9223372036854775808, 9223372036854775807]
    times = [datetime(1900, 1, 1, tzinfo=timezone.utc), datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=timezone.utc),
             datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc)]
    blobs = [b"", b"\x00\xff,\n\"", None]
    count = max(len(texts), len(doubles))
    rows = [(i, texts[i % len(texts)], doubles[i % len(doubles)], longs[i % len(longs)], times[i % len(times)],
             blobs[i % len(blobs)]) for i in range(count)]
    table = sql.Identifier("copied out")
    columns = sql.SQL(", ").join(map(sql.Identifier, schema.names))

    def insert_and_read(cursor) -> tuple[pa.Table, pa.Table, list[tuple]]:
        cursor.execute(sql.SQL('CREATE TABLE {} (id bigint, {} text, x double precision, n bigint, t timestamptz, '
                               'b bytea)').format(table, sql.Identifier(INJECTION)))
        returned = aggregates.copied_out(cursor, sql.SQL("INSERT INTO {} ({}) VALUES {} RETURNING {}").format(
            table, columns, sql.SQL(", ").join(sql.SQL("%s") for _ in rows), columns), rows, schema)
        selected = aggregates.copied_out(cursor, sql.SQL("SELECT {} FROM {} WHERE id >= %s").format(
            columns, table), (0,), schema)
        cursor.execute(sql.SQL("SELECT {} FROM {} ORDER BY id").format(columns, table))
        return returned, selected, [tuple(row.values()) for row in cursor.fetchall()]

    returned, selected, fetched = db.run(insert_and_read)

    def comparable(values) -> list[str]:
        return [v.astimezone(timezone.utc).isoformat() if isinstance(v, datetime)
                else repr(bytes(v) if isinstance(v, memoryview) else v) for v in values]

    expected = comparable(v for row in fetched for v in row)
    for got in (returned, selected):
        assert got.schema == schema
        assert comparable(v for row in got.sort_by("id").to_pylist() for v in row.values()) == expected
    assert comparable(r[1] for r in fetched) == comparable(texts[i % len(texts)] for i in range(count))
    assert victim_exists(db)


def test_the_reserved_words_refused_in_plans_are_the_servers(db: Database) -> None:
    """The constant checked into the code is PostgreSQL 15's list (another release may reserve more)."""
    from tandem.declarations import RESERVED_WORDS

    def major_version_and_reserved_words(cursor) -> tuple[int, set[str]]:
        cursor.execute("SELECT current_setting('server_version_num')::int / 10000 AS major")
        major = cursor.fetchone()["major"]
        cursor.execute("SELECT word FROM pg_get_keywords() WHERE catcode IN ('R', 'T')")
        return major, {row["word"] for row in cursor.fetchall()}

    major, words = db.run(major_version_and_reserved_words)
    if major != 15:
        pytest.skip(f"the list is PostgreSQL 15's; this server is {major}")
    assert RESERVED_WORDS == words
