"""An instance's publish of per-second partials into PostgreSQL: upsert, then every coarser bucket rolled up from its
children, against a plain-Python reference over the same partials.

The batches are what an ``update``-mode aggregation sends: new seconds, seconds sent again with more events, a
stale partial (fewer events than the stored one: ignored) and a replayed batch (changes nothing). They straddle a
minute, hour, day, month and year boundary, and the first lands in a table PostgreSQL holds no statistics for
(a catch-up's), where the roll-up's plan is chosen blind.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest

from tandem.aggregation import postgres as agg_postgres
from tandem.aggregation.granularity import bucket_start
from tandem.aggregation.spec import GRANULARITIES, MERGE_SQL, UTC_MICROS, AggregationSpec, Measure
from tandem.store import aggregates
from tandem.store.db import Database
from tandem.store.migrations import migrate

pytestmark = pytest.mark.integration
SPEC = AggregationSpec(
    name="ticks", table="tick_aggregates", keys=("symbol",),
    measures=(Measure("tick_count", "count", "bigint"), Measure("price_sum", "sum", "double precision", "price"),
              Measure("price_min", "min", "double precision", "price"),
              Measure("price_max", "max", "double precision", "price")))
NEW_YEAR = datetime(2026, 1, 1, tzinfo=timezone.utc)
Partials = dict[tuple[datetime, str], dict[str, float]]


def partials(rng: random.Random, seconds: list[datetime], symbols: list[str]) -> Partials:
    out: Partials = {}
    for second in seconds:
        for symbol in rng.sample(symbols, rng.randint(1, len(symbols))):
            prices = [round(rng.uniform(1, 100), 3) for _ in range(rng.randint(1, 6))]
            out[(second, symbol)] = {"tick_count": len(prices), "price_sum": sum(prices), "price_min": min(prices),
                                     "price_max": max(prices)}
    return out


def as_table(batch: Partials) -> pa.Table:
    keys = list(batch)
    return pa.table({"bucket_start": pa.array([k[0] for k in keys], UTC_MICROS), "symbol": [k[1] for k in keys],
                     **{m.column: [batch[k][m.column] for k in keys] for m in SPEC.measures}})


def expected_rows(stored: Partials) -> dict[tuple, dict[str, float]]:
    """Every bucket of every granularity, merged straight from the seconds (not through the coarser levels)."""
    rows: dict[tuple, dict[str, float]] = {}
    for (second, symbol), values in stored.items():
        for granularity in GRANULARITIES:
            key = (granularity, bucket_start(second, granularity), symbol)
            row = rows.setdefault(key, {"tick_count": 0, "price_sum": 0.0, "price_min": values["price_min"],
                                        "price_max": values["price_max"]})
            row["tick_count"] += values["tick_count"]
            row["price_sum"] += values["price_sum"]
            row["price_min"] = min(row["price_min"], values["price_min"])
            row["price_max"] = max(row["price_max"], values["price_max"])
    return rows


def stored_rows(db: Database) -> dict[tuple, dict[str, float]]:
    def read(cursor):
        cursor.execute("SELECT * FROM tick_aggregates WHERE plan = 'p' AND instance = 's0'")
        return cursor.fetchall()
    return {(row["granularity"], row["bucket_start"], row["symbol"]): {m.column: row[m.column] for m in SPEC.measures}
            for row in db.run(read)}


def test_published_partials_roll_up_to_every_granularity_as_merged_from_the_seconds(database_url: str) -> None:
    rng = random.Random(11)
    symbols = ["AAA", "BBB", "CCC", "DDD"]
    seconds = [NEW_YEAR + timedelta(seconds=s) for s in range(-150, 150, 3)]
    first = partials(rng, seconds[::2], symbols)
    resent = {key: {**values, "tick_count": values["tick_count"] + 2, "price_sum": values["price_sum"] + 7.5,
                    "price_max": values["price_max"] + 1.0}
              for key, values in rng.sample(sorted(first.items()), 40)}
    stale_key = next(key for key in first if key not in resent)
    second = {**partials(rng, seconds[1::2], symbols), **resent,
              stale_key: {**first[stale_key], "tick_count": first[stale_key]["tick_count"] - 1, "price_sum": -1.0}}

    with Database(database_url) as db:
        migrate(db)
        written = []
        for batch_id, batch in enumerate([first, second, second]):
            def publish(cursor, batch=batch, batch_id=batch_id) -> pa.Table:
                aggregates.ensure_table(cursor, SPEC)
                staged = as_table(batch)
                aggregates.stage_batch(cursor, SPEC, staged)
                return agg_postgres.upsert_and_roll_up(cursor, SPEC, "p", "s0", epoch=1, batch_id=batch_id,
                                                       seconds=staged)
            written.append(db.run(publish))
            if batch_id == 0:
                db.run(lambda cursor: cursor.execute("ANALYZE tick_aggregates"))
                # a batch of new seconds is returned as staged, not read back: exactly what the table holds
                held = db.run(lambda cursor: agg_postgres.rows_of_seconds(cursor, SPEC, "p", "s0", set(first)))
                assert sorted(written[0].to_pylist(), key=str) == sorted(held.to_pylist(), key=str)
        stored = stored_rows(db)

    newest = {**first, **{key: values for key, values in second.items() if key != stale_key}}
    expected = expected_rows(newest)
    assert set(stored) == set(expected)
    assert {g for g, _, _ in stored} == set(GRANULARITIES)
    for key, values in expected.items():
        assert stored[key]["tick_count"] == values["tick_count"], key
        assert stored[key]["price_min"] == values["price_min"], key
        assert stored[key]["price_max"] == values["price_max"], key
        assert stored[key]["price_sum"] == pytest.approx(values["price_sum"], rel=1e-12), key

    # every batch returns what it wrote: the seconds it upserted and each bucket they touch, with their new values
    touched = {(g, bucket_start(second, g), symbol) for second, symbol in second for g in GRANULARITIES}
    replayed = written[2]
    assert replayed.num_rows == len(touched) - 1  # the stale second was not written (a stored one has more events)
    returned = {(row["granularity"], row["bucket_start"], row["symbol"]): row for row in replayed.to_pylist()}
    assert set(returned) == touched - {("second", *stale_key)}
    assert all(row["tick_count"] == stored[key]["tick_count"] and row["batch_id"] == 2
               for key, row in returned.items())


def test_a_bucket_whose_children_are_gone_is_left_as_it_is(database_url: str) -> None:
    # staged seconds that were never upserted (or whose rows are gone) have no children to roll up from
    with Database(database_url) as db:
        migrate(db)

        def roll_up_alone(cursor) -> pa.Table:
            aggregates.ensure_table(cursor, SPEC)
            aggregates.stage_batch(cursor, SPEC, as_table(partials(random.Random(3), [NEW_YEAR], ["AAA"])))
            return aggregates.roll_up(cursor, SPEC, MERGE_SQL, "p", "s0", 1, 0, "minute", "second")

        assert db.run(roll_up_alone).num_rows == 0
        assert stored_rows(db) == {}
