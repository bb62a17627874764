"""distinct_exact measures on real Spark and PostgreSQL: the trades plan, given a trader field and exact and HLL
distinct counts of it, runs both its instances through the runtime; every granularity read merged from PostgreSQL and
from Delta equals the plain-Python count of the events, exactly, wherever each instance's partial held at most
``max_values`` traders (also where the merged count is past it), and is marked approximate (within the sketch's
error) wherever one held more. A snapshot exports the state with the measures' names. The sink of an aggregation of
facts adds facts to exact sets the same way."""

from __future__ import annotations

import json
import logging
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from tandem.aggregation import delta as agg_delta
from tandem.aggregation import postgres as agg_postgres
from tandem.aggregation.granularity import GRANULARITIES, bucket_start
from tandem.aggregation import exact_sets, sketches
from tandem.aggregation.spec import UTC_MICROS, AggregationSpec, Measure
from tandem.config import load_cluster, load_plan
from tandem.declarations import OutputConfig
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir, instance_landing_dir
from tandem.outputs.aggregation import AggregateSink, FactAggregateSink, rebuild_postgres_instance
from tandem.outputs.base import BatchInfo
from tandem.reading import read_output
from tandem.runtime.node import run_instance
from tandem.snapshots.state_export import STATE_TABLE, read_state
from tandem.snapshots.take import take_snapshot
from tandem.sources.files import write_atomically
from tandem.store import Database, migrate
from tandem.store.leases import try_acquire
from tandem.store.registry import InstanceKey

pytestmark = pytest.mark.integration
UTC = timezone.utc
BOUND = 40
ERROR = 3 * 1.04 / 2 ** 6  # three standard errors of an lgK = 12 sketch: 4.9 %
T0 = datetime(2024, 12, 31, 23, 59, 50, tzinfo=UTC)  # the events straddle a year: every granularity has two buckets
BURST = T0 + timedelta(seconds=3)
ALL_TIME = (datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))
INSTANCES = ("shard-1", "shard-2")


def trade(symbol: str, trader: str, moment: datetime, rng: random.Random) -> dict:
    return {"symbol": symbol, "trader": trader, "price": round(rng.uniform(1, 500), 2), "quantity": rng.randint(1, 9),
            "timestamp": int(moment.timestamp() * 1000)}


def make_trades() -> dict[str, list[dict]]:
    """Per instance: IBM from a thousand traders (past the bound from a minute on, and in one burst second of
    shard-1), WSO2 from thirty (exact everywhere), ORCL from 35 traders per instance, 60 in all (each instance's
    partials within the bound, the merged count past it)."""
    rng = random.Random(11)
    events: dict[str, list[dict]] = {}
    for index, instance in enumerate(INSTANCES):
        def moment() -> datetime:
            return T0 + timedelta(milliseconds=rng.randint(0, 25_000))
        mine = [trade("IBM", f"ibm-{rng.randrange(1000)}", moment(), rng) for _ in range(220)]
        mine += [trade("WSO2", f"w-{rng.randrange(30)}", moment(), rng) for _ in range(120)]
        mine += [trade("ORCL", f"o-{index * 25 + rng.randrange(35)}", moment(), rng) for _ in range(150)]
        mine += [trade("ORCL", f"o-{index * 25 + n}", moment(), rng) for n in range(35)]  # every one of them
        events[instance] = mine
    burst = [trade("IBM", f"burst-{n}", BURST + timedelta(milliseconds=n), rng) for n in range(BOUND + 20)]
    events["shard-1"] += burst
    return events


def reference(events: dict[str, list[dict]], granularity: str) -> dict[tuple, dict]:
    """Per (bucket, symbol): the traders of each instance and of both, the trades."""
    out: dict[tuple, dict] = {}
    for instance, trades in events.items():
        for e in trades:
            moment = datetime.fromtimestamp(e["timestamp"] / 1000, UTC)
            group = out.setdefault((bucket_start(moment, granularity), e["symbol"]),
                                   {"by_instance": {}, "traders": set(), "count": 0})
            group["by_instance"].setdefault(instance, set()).add(e["trader"])
            group["traders"].add(e["trader"])
            group["count"] += 1
    return out


@pytest.fixture
def exact_project(project: Path) -> Path:
    """The trades plan with a trader field, counted exactly (at most BOUND per partial) and by HLL, the exact count
    among the other measures (a snapshot names Spark's state values in the measures' order)."""
    path = project / "conf" / "plans" / "trades.yaml"
    declared = yaml.safe_load(path.read_text())
    declared["streams"]["trades"]["fields"]["trader"] = {"type": "string"}
    declared["outputs"]["trade_aggregates"]["measures"] = {
        "price_sum": {"sum": "price"}, "trade_count": {"count": "*"},
        "traders": {"distinct_exact": "trader", "max_values": BOUND}, "quantity_sum": {"sum": "quantity"},
        "price_min": {"min": "price"}, "price_max": {"max": "price"}, "traders_hll": {"distinct": "trader"}}
    path.write_text(yaml.safe_dump(declared, sort_keys=False))
    return project


def test_exact_counts_merge_across_instances_and_granularities_past_the_bound_approximate(
        exact_project: Path, database_url: str, spark, caplog) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    events = make_trades()
    with caplog.at_level(logging.WARNING, logger="tandem.outputs.aggregation"):
        for instance, trades in events.items():
            landing = instance_landing_dir(cluster, plan, instance)
            for start in range(0, len(trades), 150):  # several files: several micro-batches
                write_atomically(landing, [json.dumps(e) for e in trades[start:start + 150]])
            result = run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True)
            assert result.status == "STOPPED", result.error
    told = "\n".join(r.getMessage() for r in caplog.records if "distinct_exact" in r.getMessage())
    assert f"traders second {BURST.isoformat()} symbol=IBM instance shard-1 (past max_values {BOUND})" in told, told

    seen = {"exact": 0, "exact past the bound": 0, "approximate": 0}
    for granularity in GRANULARITIES:
        want = reference(events, granularity)
        for source in ("postgres", "delta"):
            rows = read_output(cluster, plan, granularity, *ALL_TIME, source=source)
            got = {(r["bucket_start"], r["symbol"]): r for r in rows}
            assert set(got) == set(want), (granularity, source)
            for group, expected in want.items():
                row, label = got[group], (granularity, source, group)
                traders = len(expected["traders"])
                assert row["trade_count"] == expected["count"], label
                assert row["instances"] == len(expected["by_instance"]), label
                exact = all(len(s) <= BOUND for s in expected["by_instance"].values())
                assert row["traders_exact"] is exact, (label, row["traders"], traders)
                if exact:
                    assert row["traders"] == traders, label
                    seen["exact past the bound" if traders > BOUND else "exact"] += 1
                else:
                    assert abs(row["traders"] - traders) <= max(1.0, ERROR * traders), (label, row["traders"], traders)
                    seen["approximate"] += 1
                assert abs(row["traders_hll"] - traders) <= max(1.0, ERROR * traders), label
                assert "traders_hll_exact" not in row
    assert all(n >= 4 for n in seen.values()), seen
    [burst] = [r for r in read_output(cluster, plan, "second", BURST, BURST + timedelta(seconds=1),
                                      keys={"symbol": ["IBM"]})]
    assert burst["traders_exact"] is False

    snapshot = take_snapshot(cluster, plan, "shard-1", spark, node="node-a")
    assert snapshot.good, snapshot.summary()  # conf/expectations/trades_state.json reads value.quantity_sum & co
    state = read_state(delta_table_dir(cluster, "trades", STATE_TABLE), snapshot.record.id, query="aggregates")
    assert state and all(set(row["value"]) >= {"trade_count", "traders", "quantity_sum", "traders_hll"}
                         for row in state)


def test_facts_add_to_exact_sets_once_each_and_past_the_bound_approximate(database_url: str, tmp_path: Path) -> None:
    """An aggregation of facts: each fact's visitor joins its second's set once (a fact published again by its id
    changes nothing); the coarser buckets are unions of the seconds, within the bound or sketched."""
    output = OutputConfig(kind="aggregation", id=["visit"], time="at", key=["site"], granularities=["minute", "hour"],
                          measures={"visits": {"count": "*"},
                                    "visitors": {"distinct_exact": "visitor", "max_values": 25}})
    spec = AggregationSpec(name="visits", table="web_visits", keys=("site",),
                           granularities=("second", "minute", "hour"),
                           measures=(Measure("visits", "count", "bigint"),
                                     Measure("visitors", "distinct_exact", "bytea", "visitor", max_values=25)))
    rng = random.Random(5)
    facts = {instance: [{"visit": f"{instance}/{n}", "at": T0 + timedelta(seconds=rng.randint(0, 90)),
                         "site": rng.choice("ab"), "visitor": f"u{rng.randrange(20 if instance == 'g-1' else 60)}"}
                        for n in range(300)] for instance in ("g-1", "g-2")}
    with Database(database_url) as db:
        migrate(db)
        for instance, mine in facts.items():
            key = InstanceKey("web", instance, "node-a")
            epoch = try_acquire(db, "web", instance, "node-a", 30.0)
            sink = FactAggregateSink(spec, "web", "visits", output, key, database_url, tmp_path / "visits")
            for batch_id, part in enumerate((mine[:200], mine[150:])):  # 50 facts published twice
                sink.publish(pa.Table.from_pylist(part), BatchInfo(key, batch_id, epoch, datetime.now(UTC)))
        checked = 0
        for granularity in spec.granularities:
            want: dict[tuple, dict[str, set[str]]] = {}
            for instance, mine in facts.items():
                for fact in mine:
                    group = (bucket_start(fact["at"], granularity), fact["site"])
                    want.setdefault(group, {}).setdefault(instance, set()).add(fact["visitor"])
            served = db.run(lambda cursor, g=granularity: agg_postgres.query_merged(cursor, spec, "web", g, *ALL_TIME))
            lake = agg_delta.query_merged(tmp_path / "visits", spec, granularity, *ALL_TIME)
            for rows in (served, lake):
                got = {(r["bucket_start"], r["site"]): r for r in rows}
                assert set(got) == set(want), granularity
                for group, by_instance in want.items():
                    users = set().union(*by_instance.values())
                    exact = all(len(s) <= 25 for s in by_instance.values())
                    assert got[group]["visitors_exact"] is exact, (granularity, group)
                    if exact:
                        assert got[group]["visitors"] == len(users), (granularity, group)
                    else:
                        assert abs(got[group]["visitors"] - len(users)) <= max(1.0, ERROR * len(users))
                    assert got[group]["visits"] == sum(1 for f in [*facts["g-1"], *facts["g-2"]]
                                                      if (bucket_start(f["at"], granularity), f["site"]) == group)
                    checked += 1
        approximate = [g for g in ("minute", "hour") if any(not r["visitors_exact"] for r in agg_delta.query_merged(
            tmp_path / "visits", spec, g, *ALL_TIME))]
        assert approximate == ["minute", "hour"] and checked > 8



def test_a_restore_puts_exact_sets_and_sketches_back_as_they_were(database_url: str, tmp_path: Path) -> None:
    """A restore rebuilds an instance's PostgreSQL rows from its Delta rows: the partials (a set with escapes in
    it, a set past the bound, HLL sketches) come back byte for byte, and read as before."""
    spec = AggregationSpec(name="visits", table="restored_visits", keys=("site",),
                           granularities=("second", "minute"),
                           measures=(Measure("visits", "count", "bigint"),
                                     Measure("visitors", "distinct_exact", "bytea", "visitor", max_values=3),
                                     Measure("sketched", "distinct", "bytea", "visitor")))
    people = [["a\\b", 'q"', "nl\n", ""], ["x", "y"], ["x", "é"]]
    seconds = pa.table({"bucket_start": pa.array([T0 + timedelta(seconds=s) for s in range(3)], UTC_MICROS),
                        "site": ["s", "s", "t"], "visits": pa.array([len(p) for p in people], pa.int64()),
                        "visitors": pa.array([exact_sets.encode(p) for p in people], pa.binary()),
                        "sketched": pa.array([sketches.of(p) for p in people], pa.binary())})
    key = InstanceKey("web", "g-1", "node-a")
    with Database(database_url) as db:
        migrate(db)
        epoch = try_acquire(db, "web", "g-1", "node-a", 30.0)
        AggregateSink(spec, key, database_url, tmp_path / "visits", watermark_s=1.0).publish(
            seconds, BatchInfo(key, 0, epoch, datetime.now(UTC)))

        def stored(cursor) -> dict[tuple, tuple]:
            cursor.execute("SELECT granularity, bucket_start, site, visitors, sketched FROM restored_visits")
            return {(r["granularity"], r["bucket_start"], r["site"]): (bytes(r["visitors"]), bytes(r["sketched"]))
                    for r in cursor.fetchall()}

        before = db.run(stored)
        merged = {g: db.run(lambda cursor, g=g: agg_postgres.query_merged(cursor, spec, "web", g, *ALL_TIME))
                  for g in spec.granularities}
        assert not exact_sets.is_exact(before[("second", T0, "s")][0])  # four people past a bound of three
        assert [(r["visitors"], r["visitors_exact"]) for r in merged["minute"]] == [(6, False), (2, True)]
        db.run(lambda cursor: cursor.execute("DELETE FROM restored_visits"))
        lake = read_table(tmp_path / "visits")
        assert rebuild_postgres_instance(db, spec, "web", "g-1", lake) == len(before) == 5
        assert db.run(stored) == before
        assert {g: db.run(lambda cursor, g=g: agg_postgres.query_merged(cursor, spec, "web", g, *ALL_TIME))
                for g in spec.granularities} == merged
