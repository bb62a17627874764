"""Values at the edge of their type never make a publish, a roll-up, a merge or a read fail (issue 46 §1).

Every measure kind over every declared type, with values drawn at the types' limits (hypothesis): two instances'
per-second partials are published (upsert + roll-up to every granularity, in PostgreSQL, then the Delta copy) and
read back merged from PostgreSQL, from Delta and through the presenter's REST API, against a plain-Python
reference over the same events. What a sum past its type's range reads as (docs/writing-plans.md, "Values at the
edge of their type"): a double sum is ±Infinity (the strings ``"Infinity"``/``"-Infinity"`` in JSON), a long sum
is null. The Spark side (the per-second partials of the plan's query) is checked on the same kinds of values.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tandem.aggregation import delta as agg_delta
from tandem.aggregation import postgres as agg_postgres
from tandem.aggregation import exact_sets, sketches
from tandem.aggregation.granularity import bucket_end, bucket_start
from tandem.aggregation.spec import UTC_MICROS, spec_for
from tandem.config import load_cluster, load_plan
from tandem.layout import delta_table_dir
from tandem.store import aggregates
from tandem.store.db import Database
from tandem.store.migrations import migrate

pytestmark = pytest.mark.integration

MAX = 1.7976931348623157e308
LONG_MIN, LONG_MAX = -2**63, 2**63 - 1
NEW_YEAR = datetime(2027, 1, 1, tzinfo=timezone.utc)
SECONDS = [NEW_YEAR + timedelta(seconds=s) for s in (-2, -1, 0, 1)]  # straddle every coarser bucket's boundary
SYMBOLS = ("a", "b")
INSTANCES = ("shard-1", "shard-2")
DOUBLES = st.one_of(st.sampled_from([MAX, 1e308, 8.98846567431158e307, 2.2250738585072014e-308, 5e-324, 0.0, 1.5]),
                    st.floats(min_value=0, max_value=MAX))
LONGS = st.one_of(st.sampled_from([LONG_MAX, LONG_MAX - 1, 2**62, 1, 0]), st.integers(0, LONG_MAX))
STRINGS = st.one_of(st.sampled_from(["", "a" * 1000, "zzz", "é", "\U0010ffff"]),
                    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20))


@dataclass(frozen=True)
class Event:
    instance: str
    second: datetime
    symbol: str
    price: float
    quantity: int
    venue: str


def events_strategy() -> st.SearchStrategy[list[Event]]:
    """Events of both instances; each symbol's doubles and longs share one sign (drawn), so whether a sum overflows
    does not depend on the order of the additions (IEEE 754 sums of mixed signs near the limit do)."""
    def signed(symbol_signs: dict[str, int]) -> st.SearchStrategy[list[Event]]:
        def event(instance: str, second: datetime, symbol: str, price: float, quantity: int, venue: str) -> Event:
            if symbol_signs[symbol] > 0:
                return Event(instance, second, symbol, price, quantity, venue)
            return Event(instance, second, symbol, -price, LONG_MIN if quantity == LONG_MAX else -quantity, venue)
        return st.lists(st.builds(event, st.sampled_from(INSTANCES), st.sampled_from(SECONDS),
                                  st.sampled_from(SYMBOLS), DOUBLES, LONGS, STRINGS), min_size=1, max_size=12)
    return st.fixed_dictionaries({s: st.sampled_from([1, -1]) for s in SYMBOLS}).flatmap(signed)


# -- the reference: the plan's semantics over the events, in plain Python -------------------------------------------

def double_sum_band(values: list[float]) -> tuple[str, float | None]:
    """What a same-signed double sum may read as: ``("inf", ±inf)`` past the range, ``("finite", exact)`` well
    inside it, ``("edge", None)`` within rounding of the overflow threshold (either may come)."""
    exact = sum((Fraction(v) for v in values), Fraction(0))
    threshold = Fraction(2) ** 1024 - Fraction(2) ** 970  # round-to-nearest overflows from here
    margin = threshold * Fraction(len(values) + 8, 2 ** 52)
    if abs(exact) >= threshold + margin:
        return "inf", math.inf if exact > 0 else -math.inf
    if abs(exact) < threshold - margin:
        return "finite", float(exact)
    return "edge", None


def long_sum(values: list[int]) -> int | None:
    total = sum(values)
    return total if LONG_MIN <= total <= LONG_MAX else None


def partials_of(events: list[Event]) -> dict[str, pa.Table]:
    """Each instance's per-second partials, as the plan's query makes them (Spark's sum, try_sum, min, max, HLL)."""
    by_instance: dict[str, dict[tuple, list[Event]]] = {}
    for e in events:
        by_instance.setdefault(e.instance, {}).setdefault((e.second, e.symbol), []).append(e)
    tables = {}
    for instance, groups in by_instance.items():
        rows = []
        for (second, symbol), members in groups.items():
            price_total = 0.0
            for member in members:
                price_total += member.price
            rows.append({"bucket_start": second, "symbol": symbol, "trade_count": len(members),
                         "price_sum": price_total, "quantity_sum": long_sum([m.quantity for m in members]),
                         "price_min": min(m.price for m in members), "price_max": max(m.price for m in members),
                         "quantity_min": min(m.quantity for m in members),
                         "quantity_max": max(m.quantity for m in members),
                         "venue_min": min(m.venue for m in members), "venue_max": max(m.venue for m in members),
                         "venues": sketches.of(m.venue for m in members),
                         "venue_count": exact_sets.encode(m.venue for m in members)})
        tables[instance] = pa.Table.from_pylist(rows)
    return tables


def expected(events: list[Event], granularity: str) -> dict[tuple, dict[str, Any]]:
    """Per bucket and symbol: every measure merged over both instances, straight from the events."""
    groups: dict[tuple, list[Event]] = {}
    for e in events:
        groups.setdefault((bucket_start(e.second, granularity), e.symbol), []).append(e)
    return {key: {"trade_count": len(members), "price_sum": double_sum_band([m.price for m in members]),
                  "quantity_sum": long_sum([m.quantity for m in members]),
                  "price_min": min(m.price for m in members), "price_max": max(m.price for m in members),
                  "quantity_min": min(m.quantity for m in members), "quantity_max": max(m.quantity for m in members),
                  "venue_min": min(m.venue for m in members), "venue_max": max(m.venue for m in members),
                  "venues": len({m.venue for m in members}),
                  "venue_count": len({m.venue for m in members}), "venue_count_exact": True,
                  "instances": len({m.instance for m in members})}
            for key, members in groups.items()}


def as_float(value: Any) -> float | None:
    """A double as read: JSON spells the non-finite ones as strings."""
    if isinstance(value, str):
        return {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}[value]
    return value


def check_rows(rows: list[dict[str, Any]], want: dict[tuple, dict[str, Any]], where: str) -> None:
    got = {(r["bucket_start"] if isinstance(r["bucket_start"], datetime)
            else datetime.fromisoformat(r["bucket_start"].replace("Z", "+00:00")), r["symbol"]): r for r in rows}
    assert set(got) == set(want), where
    for key, values in want.items():
        row = got[key]
        for column, value in values.items():
            if column == "price_sum":
                kind, number = value
                actual = as_float(row[column])
                if kind == "inf":
                    assert actual == number, (where, key, column, actual)
                elif kind == "finite":
                    assert math.isfinite(actual) and actual == pytest.approx(number, rel=1e-9, abs=1e-300), \
                        (where, key, column, actual)
            elif column == "venues":
                assert row[column] == pytest.approx(value, rel=0.03), (where, key, column)
            elif column in ("price_min", "price_max"):
                assert as_float(row[column]) == value, (where, key, column)
            else:
                assert row[column] == value, (where, key, column, row[column], value)
        ratio = row["avg_price"] if "avg_price" in row else None
        kind, number = values["price_sum"]
        if kind == "inf":
            assert as_float(ratio) == number, (where, key, "avg_price")


# -- the stack: a project whose plan keeps every measure kind over every type ----------------------------------------

@pytest.fixture
def limits_project(project: Path) -> Path:
    """The trades plan with a string field and a measure of every kind over each type, in a table of its own."""
    path = project / "conf" / "plans" / "trades.yaml"
    declared = yaml.safe_load(path.read_text())
    declared["streams"]["trades"]["fields"]["venue"] = {"type": "string"}
    declared["outputs"]["trade_aggregates"].update(table="limit_aggregates", measures={
        "trade_count": {"count": "*"}, "price_sum": {"sum": "price"}, "quantity_sum": {"sum": "quantity"},
        "price_min": {"min": "price"}, "price_max": {"max": "price"}, "quantity_min": {"min": "quantity"},
        "quantity_max": {"max": "quantity"}, "venue_min": {"min": "venue"}, "venue_max": {"max": "venue"},
        "venues": {"distinct": "venue"}, "venue_count": {"distinct_exact": "venue"}})
    path.write_text(yaml.safe_dump(declared))
    return project


@pytest.fixture
def rest_client(limits_project: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The presenter's REST API in-process over the project (Airflow's user and auth manager as fakes)."""
    from airflow.api_fastapi.core_api.security import get_user
    from fastapi.testclient import TestClient

    from tandem.presenter import access
    from tandem.presenter.api import auth_manager, create_app, dag_teams

    class Anyone:
        def get_name(self) -> str:
            return "ann"

        def is_authorized_dag(self, **_: Any) -> bool:
            return True

    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "")
    app = create_app()
    app.dependency_overrides[get_user] = Anyone
    app.dependency_overrides[auth_manager] = Anyone
    app.dependency_overrides[dag_teams] = lambda: access.no_teams
    with TestClient(app) as client:
        yield client


def publish(db: Database, spec, delta_path: Path, instance: str, partials: pa.Table, batch_id: int) -> None:
    def work(cursor) -> pa.Table:
        aggregates.ensure_table(cursor, spec)
        aggregates.stage_batch(cursor, spec, partials)
        return agg_postgres.upsert_and_roll_up(cursor, spec, "trades", instance, epoch=1, batch_id=batch_id,
                                               seconds=partials)

    written = db.run(work)
    agg_delta.append_rows(delta_path, spec, written, node="node-a", published_at=datetime.now(timezone.utc),
                          app_id=f"limits/{instance}", batch_id=batch_id)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=events_strategy())
@example(events=[Event("shard-1", SECONDS[2], "a", 1e308, LONG_MAX, "x"),
                 Event("shard-2", SECONDS[2], "a", 1e308, LONG_MAX, "y"),
                 Event("shard-1", SECONDS[0], "b", -MAX, LONG_MIN, ""),
                 Event("shard-1", SECONDS[0], "b", -MAX, -1, "\U0010ffff")])
def test_every_measure_at_its_type_limits_reads_the_same_from_postgres_delta_and_rest(
        limits_project: Path, rest_client, events: list[Event]) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    spec = spec_for(plan, "trade_aggregates")
    delta_path = delta_table_dir(cluster, "trades", "trade_aggregates")
    shutil.rmtree(delta_path, ignore_errors=True)
    with Database(cluster.database_url) as db:
        migrate(db)
        db.run(lambda cursor: cursor.execute("DROP TABLE IF EXISTS limit_aggregates"))
        for batch_id, (instance, partials) in enumerate(sorted(partials_of(events).items())):
            publish(db, spec, delta_path, instance, partials, batch_id)
        for granularity in spec.granularities:
            start, end = bucket_start(SECONDS[0], granularity), bucket_end(SECONDS[-1], granularity)
            want = expected(events, granularity)
            check_rows(agg_postgres.read_merged(db.run, spec, "trades", granularity, start, end), want,
                       f"postgres {granularity}")
            check_rows(agg_delta.query_merged(delta_path, spec, granularity, start, end), want,
                       f"delta {granularity}")
            response = rest_client.get("/api/v1/plans/trades/outputs/trade_aggregates/aggregates",
                                       params={"granularity": granularity, "start": start.isoformat(),
                                               "end": end.isoformat()})
            assert response.status_code == 200, response.text
            check_rows(response.json()["rows"], want, f"rest {granularity}")


def test_the_plan_query_makes_partials_of_values_at_the_limits_without_failing(limits_project: Path, spark) -> None:
    """Spark's side: a long sum past 64 bits is null (ANSI ``sum`` would stop the query), a double one infinite."""
    from pyspark.sql import functions as F

    from tandem.aggregation.spark import second_partials

    plan = load_plan("trades", load_cluster())
    spec = spec_for(plan, "trade_aggregates")
    at = int(NEW_YEAR.timestamp() * 1000)
    rows = [("a", MAX, LONG_MAX, "x", at), ("a", MAX, LONG_MAX, "é", at + 1),
            ("b", -MAX, LONG_MIN, "", at), ("b", -5e-324, -1, "\U0010ffff", at + 2),
            ("c", 5e-324, 7, "z", at)]
    frame = spark.createDataFrame(rows, "symbol string, price double, quantity long, venue string, ts long") \
        .withColumn("event_time", F.timestamp_millis("ts"))
    got = {row["symbol"]: row.asDict() for row in second_partials(frame, spec, None).collect()}
    assert got["a"]["price_sum"] == math.inf and got["a"]["quantity_sum"] is None
    assert got["b"]["price_sum"] == -MAX and got["b"]["quantity_sum"] is None
    assert got["c"]["price_sum"] == 5e-324 and got["c"]["quantity_sum"] == 7
    assert (got["a"]["quantity_max"], got["b"]["quantity_min"]) == (LONG_MAX, LONG_MIN)
    assert (got["a"]["venue_min"], got["a"]["venue_max"], got["b"]["venue_max"]) == ("x", "é", "\U0010ffff")
    assert [got[s]["trade_count"] for s in "abc"] == [2, 2, 1]
    assert round(sketches.estimate(bytes(got["a"]["venues"]))) == 2
    assert exact_sets.decode(got["a"]["venue_count"]) == {"x", "é"}
    assert exact_sets.decode(got["b"]["venue_count"]) == {"", "\U0010ffff"}


def test_a_sum_past_the_range_reads_as_json_text_from_the_command_line() -> None:
    from tandem.json_values import json_text

    assert json_text([{"s": math.inf, "t": -math.inf, "u": math.nan, "v": None, "w": 1.5}]) == \
        '[{"s": "Infinity", "t": "-Infinity", "u": "NaN", "v": null, "w": 1.5}]'
