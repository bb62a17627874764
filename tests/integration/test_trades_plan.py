"""The trades plan on real Spark and PostgreSQL, checked against values the test computes itself."""

from __future__ import annotations

import json
import random
import threading
from datetime import datetime, timezone
from pathlib import Path

import psycopg2
import psycopg2.extras
import pytest
from _ha import expected_aggregates as expected_partials
from deltalake import DeltaTable
from tandem.config import load_cluster, load_plan
from tandem.layout import checkpoint_dir, delta_table_dir, instance_landing_dir, landing_dir
from tandem.lake.tables import read_table
from tandem.sources.files import write_atomically
from tandem.runtime.node import run_instance
from tandem.store import Database, migrate
from tandem.store.migrations import available_migrations
from tandem.reading import read_output

pytestmark = pytest.mark.integration
UTC = timezone.utc
GRANULARITIES = ("second", "minute", "hour", "day", "month", "year")
# Events straddle a year boundary so every granularity has more than one bucket.
T0 = int(datetime(2024, 12, 31, 23, 59, 50, tzinfo=UTC).timestamp() * 1000)


def expected_aggregates(events: list[dict], granularity: str) -> dict[tuple, dict]:
    """The test's own aggregates of ``events`` (see ``_ha.expected_aggregates``), with the average."""
    rows = expected_partials([(e["timestamp"], e["symbol"], e["price"], e["quantity"]) for e in events], granularity)
    return {key: {**values, "avg_price": values["price_sum"] / values["trade_count"]} for key, values in rows.items()}


def make_events(seed: int, count: int, spread_ms: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"symbol": rng.choice(["IBM", "WSO2", "ORCL"]), "price": round(rng.uniform(1, 500), 2),
             "quantity": rng.randint(1, 1000), "timestamp": T0 + rng.randint(0, spread_ms)} for _ in range(count)]


def write_events(directory: Path, events: list[dict], per_file: int) -> None:
    for start in range(0, len(events), per_file):
        write_atomically(directory, [json.dumps(e) for e in events[start:start + per_file]])


def assert_matches(actual_rows: list[dict], expected: dict[tuple, dict], label: str) -> None:
    actual = {(row["bucket_start"], row["symbol"]): row for row in actual_rows}
    assert set(actual) == set(expected), label
    for key, values in expected.items():
        for column, value in values.items():
            assert actual[key][column] == pytest.approx(value, rel=1e-9), f"{label} {key} {column}"


def partial_rows(database_url: str, instance: str, granularity: str) -> list[dict]:
    with psycopg2.connect(database_url) as conn, conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute("SELECT * FROM tandem.trade_aggregates WHERE instance = %s AND granularity = %s",
                    (instance, granularity))
        rows = cur.fetchall()
    for row in rows:
        row["bucket_start"] = row["bucket_start"].astimezone(UTC)
        row["avg_price"] = row["price_sum"] / row["trade_count"]
    return rows


ALL_TIME = (datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))


def test_partials_per_instance_and_merged_values_match_the_events(project: Path, database_url: str, spark) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    events = {"shard-1": make_events(1, 600, 25_000), "shard-2": make_events(2, 400, 25_000)}
    for instance, instance_events in events.items():
        write_events(instance_landing_dir(cluster, plan, instance), instance_events, per_file=100)
        result = run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True)
        assert result.status == "STOPPED", result.error

    everything = events["shard-1"] + events["shard-2"]
    for granularity in GRANULARITIES:
        for instance, instance_events in events.items():
            assert_matches(partial_rows(database_url, instance, granularity), expected_aggregates(instance_events, granularity),
                           f"partial {instance} {granularity}")
        expected = expected_aggregates(everything, granularity)
        from_postgres = read_output(cluster, "trades", granularity, *ALL_TIME)
        from_delta = read_output(cluster, "trades", granularity, *ALL_TIME, source="delta")
        assert_matches(from_postgres, expected, f"merged postgres {granularity}")
        assert_matches(from_delta, expected, f"merged delta {granularity}")
    [year_2025] = read_output(cluster, "trades", "year", datetime(2025, 1, 1, tzinfo=UTC),
                                    datetime(2026, 1, 1, tzinfo=UTC), keys={"symbol": ["IBM"]})
    expected_2025 = expected_aggregates([e for e in everything if e["symbol"] == "IBM"], "year")
    assert year_2025["trade_count"] == expected_2025[(datetime(2025, 1, 1, tzinfo=UTC), "IBM")]["trade_count"]
    assert year_2025["instances"] == 2


def test_replaying_a_batch_does_not_double_count(project: Path, database_url: str, spark) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    events = make_events(3, 300, 8_000)
    write_events(landing_dir(cluster, "trades", 0), events, per_file=60)
    assert run_instance(cluster, plan, "node-a", "shard-1", spark=spark, available_now=True).status == "STOPPED"
    delta_path = delta_table_dir(cluster, "trades", "trade_aggregates")
    version_before = DeltaTable(str(delta_path)).version()

    # Every event went in batch 0. Forget that it committed, as if the driver died between
    # publishing and committing: on restart Spark runs batch 0 again and publishes it again.
    query_checkpoint = checkpoint_dir(cluster, "trades", "shard-1", "node-a", "aggregates")
    assert (query_checkpoint / "commits" / "0").exists()
    for log_dir, keep in (("commits", -1), ("offsets", 0)):
        for entry in (query_checkpoint / log_dir).iterdir():
            batch = entry.name.removeprefix(".").removesuffix(".crc")  # the log file and its checksum
            if batch.isdigit() and int(batch) > keep:
                entry.unlink()
    assert run_instance(cluster, plan, "node-a", "shard-1", spark=spark, available_now=True).status == "STOPPED"

    for granularity in GRANULARITIES:
        assert_matches(read_output(cluster, "trades", granularity, *ALL_TIME),
                       expected_aggregates(events, granularity), f"after replay {granularity}")
        assert_matches(read_output(cluster, "trades", granularity, *ALL_TIME, source="delta"),
                       expected_aggregates(events, granularity), f"delta after replay {granularity}")
    assert DeltaTable(str(delta_path)).version() == version_before, "a replayed batch appended to Delta again"
    with Database(database_url) as db:
        runs = db.run(lambda cur: (cur.execute(
            "SELECT count(*) AS n FROM heartbeats WHERE query_name = 'aggregates' AND batch_id = 0 AND input_rows > 0"),
            cur.fetchone())[1])
    assert runs["n"] == 2, "batch 0 was not executed a second time"


BAD_LINES = {
    "{not json": "invalid JSON: Expecting property name enclosed in double quotes at line 1 column 2",
    "[1, 2, 3]": "not a JSON object (got an array)",
    json.dumps({"symbol": "IBM", "price": "abc", "quantity": 1, "timestamp": T0}): "field 'price' is not a number",
    json.dumps({"symbol": "IBM", "price": 10.0, "quantity": 1.5, "timestamp": T0}): "field 'quantity' is not an integer",
    json.dumps({"symbol": "IBM", "price": 10.0, "quantity": 1, "timestamp": "yesterday"}):
        "field 'timestamp' is not an integer",
    json.dumps({"symbol": "IBM", "quantity": 1, "timestamp": T0}): "missing field 'price'",
    json.dumps({"symbol": "IBM", "price": None, "quantity": 1, "timestamp": T0}): "missing field 'price'",
    json.dumps({"price": 10.0, "quantity": 1, "timestamp": T0}): "missing field 'symbol'",
    json.dumps({"symbol": "IBM", "price": 10.0, "quantity": -4, "timestamp": T0}): "field 'quantity' must be > 0 (got -4)",
    json.dumps({"symbol": "IBM", "price": -2.5, "quantity": 4, "timestamp": T0}): "field 'price' must be > 0 (got -2.5)",
    json.dumps({"symbol": "", "price": 2.5, "quantity": 4, "timestamp": T0}): "field 'symbol' must not be empty",
    # Spark's from_json would take these as the strings '{"nested":true}', '5' and 'true'
    json.dumps({"symbol": {"nested": True}, "price": 2.5, "quantity": 4, "timestamp": T0}):
        "field 'symbol' is not a string",
    json.dumps({"symbol": 5, "price": 2.5, "quantity": 4, "timestamp": T0}): "field 'symbol' is not a string",
    json.dumps({"symbol": True, "price": 2.5, "quantity": 4, "timestamp": T0}): "field 'symbol' is not a string",
    json.dumps({"symbol": "IBM", "price": 2.5, "quantity": 4, "timestamp": -1}): "field 'timestamp' must be epoch",
    # values no sink can store (issue 24): each one passed validation and stopped the query in its sink
    json.dumps({"symbol": "IB\u0000M", "price": 2.5, "quantity": 4, "timestamp": T0}):
        "field 'symbol' must not contain NUL (U+0000) (got \"IB\\u0000M\")",
    '{"symbol": "IBM", "price": 1e999, "quantity": 4, "timestamp": %d}' % T0:
        "field 'price' must be a finite number",
    json.dumps({"symbol": "IBM", "price": float("nan"), "quantity": 4, "timestamp": T0}):
        "field 'price' must be a finite number",
    json.dumps({"symbol": "IBM", "price": "-Infinity", "quantity": 4, "timestamp": T0}):
        "field 'price' must be a finite number",
    json.dumps({"symbol": "IBM", "price": 2.5, "quantity": 2 ** 63, "timestamp": T0}):
        "field 'quantity' is outside the 64-bit integer range: 9223372036854775808",
    json.dumps({"symbol": "I" * 257, "price": 2.5, "quantity": 4, "timestamp": T0}):
        "field 'symbol' must be at most 256 characters long",
    '{"symbol": "IB\\ud800M", "price": 2.5, "quantity": 4, "timestamp": %d}' % T0:
        "line holds an unpaired UTF-16 surrogate escape",
}
HUGE_LINE = json.dumps({"symbol": "IBM", "price": 2.5, "quantity": 4, "timestamp": T0, "note": "x" * (2 << 20)})
NOT_UTF8 = b'{"symbol": "IB\xed\xa0\x80M", "price": 2.5, "quantity": 4, "timestamp": %d}' % T0


def test_quarantine_catches_each_bad_case_and_keeps_good_lines(project: Path, database_url: str, spark) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    good = make_events(4, 20, 3_000)
    good += [{**good[0], "symbol": symbol} for symbol in ("3M", "-X", "[A]", "true")]  # strings that look like JSON
    good += [{**good[1], "symbol": "😀" + "I" * 255}]  # 256 characters, one outside the BMP (a surrogate pair)
    deep = json.dumps(good[2])[:-1] + ', "extra": ' + "[" * 5000 + "]" * 5000 + "}"  # not declared: skipped
    lines = [json.dumps(e) for e in good[:2]] + [deep] + [json.dumps(e) for e in good[3:10]] + list(BAD_LINES) \
        + [HUGE_LINE] + [json.dumps(e) for e in good[10:]]
    source = write_atomically(landing_dir(cluster, "trades", 0), lines)
    not_utf8 = landing_dir(cluster, "trades", 0) / "not-utf8.jsonl"
    hidden = not_utf8.with_name(".not-utf8.tmp")
    hidden.write_bytes(NOT_UTF8 + b"\n")
    hidden.rename(not_utf8)
    assert run_instance(cluster, plan, "node-a", "shard-1", spark=spark, available_now=True).status == "STOPPED"

    quarantine = read_table(delta_table_dir(cluster, "trades", "quarantine")).to_pylist()
    reasons = {row["raw"]: row["reason"] for row in quarantine}
    kept_huge, kept_not_utf8 = HUGE_LINE[:4096], NOT_UTF8.decode("utf-8", errors="replace")
    assert set(reasons) == set(BAD_LINES) | {kept_huge, kept_not_utf8}
    for raw, fragment in BAD_LINES.items():
        assert fragment in reasons[raw], (raw, reasons[raw])
    assert reasons[kept_huge] == (f"line of {len(HUGE_LINE)} bytes is over the stream's max_line_bytes (1048576); "
                                  "its first 4096 characters are kept")
    assert reasons[kept_not_utf8] == "line is not valid UTF-8 (invalid bytes are kept as U+FFFD)"
    assert {row["source_file"].removeprefix("file:") for row in quarantine} == {str(source), str(not_utf8)}
    assert {row["instance"] for row in quarantine} == {"shard-1"}

    assert_matches(read_output(cluster, "trades", "minute", *ALL_TIME), expected_aggregates(good, "minute"),
                   "good lines of a file with bad lines")
    with Database(database_url) as db:
        counted = db.run(lambda cur: (cur.execute(
            "SELECT sum(quarantined_rows) AS n FROM heartbeats WHERE query_name = 'quarantine'"), cur.fetchone())[1])
    assert counted["n"] == len(BAD_LINES) + 2


def test_events_behind_the_watermark_are_counted_as_late(project: Path, database_url: str, spark) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    directory = landing_dir(cluster, "trades", 0)
    on_time = make_events(5, 50, 2_000)
    write_events(directory, on_time, per_file=50)
    assert run_instance(cluster, plan, "node-a", "shard-1", spark=spark, available_now=True).status == "STOPPED"
    # A minute later than everything seen, so the watermark (10 s) moves well past T0 ...
    write_events(directory, [{"symbol": "IBM", "price": 1.0, "quantity": 1, "timestamp": T0 + 60_000}], per_file=1)
    assert run_instance(cluster, plan, "node-a", "shard-1", spark=spark, available_now=True).status == "STOPPED"
    # ... then three events from T0, far behind it.
    late = [{"symbol": "IBM", "price": 2.0, "quantity": 1, "timestamp": T0 + 1} for _ in range(3)]
    write_events(directory, late, per_file=3)
    assert run_instance(cluster, plan, "node-a", "shard-1", spark=spark, available_now=True).status == "STOPPED"

    with Database(database_url) as db:
        row = db.run(lambda cur: (cur.execute(
            "SELECT sum(late_rows) AS late FROM heartbeats WHERE query_name = 'aggregates'"), cur.fetchone())[1])
    # Spark counts late rows after its map-side partial aggregation (one per window and symbol
    # in a task), so three late events in one second of one symbol count at least once.
    assert 1 <= row["late"] <= 3
    on_time_plus = on_time + [{"symbol": "IBM", "price": 1.0, "quantity": 1, "timestamp": T0 + 60_000}]
    assert_matches(read_output(cluster, "trades", "second", *ALL_TIME), expected_aggregates(on_time_plus, "second"),
                   "late events are not aggregated")


def test_concurrent_migrations_apply_each_version_once(database_url: str) -> None:
    errors: list[BaseException] = []

    def start() -> None:
        try:
            with Database(database_url) as db:
                migrate(db)
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    with Database(database_url) as db:
        versions = db.run(lambda cur: (cur.execute("SELECT version FROM schema_migrations"), cur.fetchall())[1])
        assert migrate(db) == []
    assert sorted(row["version"] for row in versions) == [m.version for m in available_migrations()]


def test_per_symbol_range_query_uses_the_symbol_index(database_url: str) -> None:
    with Database(database_url) as db:
        migrate(db)

        def explain(cur) -> str:
            cur.execute("""INSERT INTO trade_aggregates (plan, granularity, bucket_start, symbol, instance, price_sum,
                               trade_count, quantity_sum, price_min, price_max, batch_id)
                           SELECT 'trades', 'minute', timestamptz '2024-01-01' + make_interval(mins => i % 5000),
                                  's' || (i / 5000), 'shard-1', 1, 1, 1, 1, 1, 0
                           FROM generate_series(0, 199999) AS i""")
            cur.execute("ANALYZE trade_aggregates")
            cur.execute("""EXPLAIN SELECT bucket_start, symbol, sum(price_sum) FROM trade_aggregates
                           WHERE plan = 'trades' AND granularity = 'minute' AND symbol = ANY(ARRAY['s7'])
                             AND bucket_start >= '2024-01-01' AND bucket_start < '2024-01-02'
                           GROUP BY bucket_start, symbol""")
            return "\n".join(row["QUERY PLAN"] for row in cur.fetchall())

        plan = db.run(explain)
    assert "trade_aggregates_by_symbol" in plan, plan
