"""A cut-over carries out what a running plan's checkpoints refuse, every output exact (issue 48 §2-3).

The trades plan (4 partitions) runs its group at parallel 2 over some trades; the group goes to 3 (refused at
launch, then cut over with `tandem plan cutover`), more trades land, some in the seconds the retired instances
counted, and the three instances run; then the group goes back to 2 and gains a measure in one cut-over, and more
trades land. After each step the merged aggregates, from PostgreSQL and from Delta, equal a plain-Python reference
over every trade (each counted once: by a retired instance before the cut, by a new one after it); the new measure
holds what the trades after its cut say. A cut-over that dies half-way refuses the group's launches until it is run
again, which finishes it. A backfill of a range before a cut is refused.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest
from _nats import edit_plan
from _references import PIZZA_T0, last_orders_reference, make_orders, pizza_reference
from test_trades_plan import ALL_TIME, T0, assert_matches, expected_aggregates, write_events

from tandem.batch.backfill import check_backfill
from tandem.config import load_cluster, load_plan
from tandem.cutover import CutoverRefused, cut_over, load_cut
from tandem.errors import BackfillRefused, PlanChanged
from tandem.layout import checkpoint_dir, landing_dir
from tandem.outputs.aggregation import AggregationKind
from tandem.producer import advance_watermark, partitioned
from tandem.quality import validate_output
from tandem.sources.files import write_atomically
from tandem.store.outputs import read_table_rows
from tandem.reading import read_output
from tandem.runtime.node import run_instance
from tandem.store import Database, migrate
from tandem.store.leases import release, try_acquire
from tandem.store.locks import AdvisoryLock, plan_lock
from tandem.store.registry import InstanceKey

pytestmark = pytest.mark.integration

SYMBOLS = ("IBM", "WSO2", "ORCL", "MSFT")
"""One symbol a partition (of 4): a symbol's partition is its index."""


def trades(seed: int, count: int, start_ms: int, spread_ms: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"symbol": rng.choice(SYMBOLS), "price": round(rng.uniform(1, 500), 2), "quantity": rng.randint(1, 1000),
             "timestamp": start_ms + rng.randint(0, spread_ms)} for _ in range(count)]


def land(cluster, events: list[dict]) -> None:
    for partition, symbol in enumerate(SYMBOLS):
        mine = [e for e in events if e["symbol"] == symbol]
        if mine:
            write_events(landing_dir(cluster, "trades", partition), mine, per_file=40)


def run_group(spark) -> list[str]:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    for instance in plan.instances:
        result = run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True)
        assert result.status == "STOPPED", (instance, result.error)
    return list(plan.instances)


def cutover() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tandem.cli", "plan", "cutover", "trades", "--yes"],
                          capture_output=True, text=True, env=os.environ)


def assert_exact(cluster, events: list[dict], label: str) -> None:
    for source in ("postgres", "delta"):
        assert_matches(read_output(cluster, "trades", "second", *ALL_TIME, source=source),
                       expected_aggregates(events, "second"), f"{label} ({source})")
    assert_matches(read_output(cluster, "trades", "hour", *ALL_TIME), expected_aggregates(events, "hour"), label)


def test_a_group_rescaled_and_given_a_measure_by_cut_overs_counts_every_trade_once(project: Path, database_url: str,
                                                                                   spark, monkeypatch) -> None:
    edit_plan(project, "trades", lambda d: d["streams"]["trades"].update(partitions=4))
    cluster = load_cluster()
    first = trades(31, 400, T0, 20_000)
    land(cluster, first)
    assert run_group(spark) == ["shard-1", "shard-2"]
    assert_exact(cluster, first, "parallel 2")

    edit_plan(project, "trades", lambda d: d["groups"]["shard"].update(parallel=3))
    with pytest.raises(PlanChanged, match=r"tandem plan cutover trades --group shard"):
        run_instance(cluster, load_plan("trades", load_cluster()), "node-a", "shard-3", spark=spark,
                     available_now=True)
    status = subprocess.run([sys.executable, "-m", "tandem.cli", "status", "trades"], capture_output=True, text=True,
                            env={**os.environ, "COLUMNS": "250"})
    assert "trades / group shard: its checkpoints refuse group shard's parallel changed from 2 to 3" in status.stdout \
        and "tandem plan cutover trades --group shard" in status.stdout, status.stdout + status.stderr
    done = cutover()
    assert done.returncode == 0 and "generation 1" in done.stdout, done.stdout + done.stderr
    # a backfill may not start before the end of the newest second the retired partials hold (event time)
    assert load_cut(cluster, "trades", "shard").reach_ms == (max(t["timestamp"] for t in first) // 1000 + 1) * 1000
    # more trades: some in the seconds the retired instances counted (the new instances' watermarks start afresh)
    second = trades(32, 300, T0, 20_000) + trades(33, 300, T0 + 20_000, 20_000)
    land(cluster, second)
    assert run_group(spark) == ["shard-1", "shard-2", "shard-3"]
    assert_exact(cluster, first + second, "parallel 2 -> 3")
    with Database(database_url) as db:
        labels = db.run(lambda c: (c.execute("SELECT DISTINCT instance FROM trade_aggregates"),
                                   sorted(r["instance"] for r in c.fetchall()))[1])
    assert labels == ["shard-1", "shard-1~1", "shard-2", "shard-2~1", "shard-3"]

    def back_to_two_with_a_measure(d: dict) -> None:
        d["groups"]["shard"].update(parallel=2)
        d["outputs"]["trade_aggregates"]["measures"].update(quantity_max={"max": "quantity"})

    edit_plan(project, "trades", back_to_two_with_a_measure)
    checked = subprocess.run([sys.executable, "-m", "tandem.cli", "plan", "diff", "trades", "--json"],
                             capture_output=True, text=True, env=os.environ)
    classes = {c["class"] for d in json.loads(checked.stdout)["checkpoints"] for c in d["changes"]}
    assert checked.returncode == 2 and classes == {"topology", "state to rebuild"}, checked.stdout

    def crash(*_args) -> None:
        raise RuntimeError("the cut-over's process dies after recording the cut")

    with monkeypatch.context() as patched, Database(database_url) as db:  # a cut-over that stops half-way ...
        patched.setattr(AggregationKind, "retire", crash)
        with pytest.raises(RuntimeError):
            cut_over(load_cluster(), load_plan("trades", load_cluster()), db)
    with pytest.raises(PlanChanged, match=r"the cut-over of group shard \(generation 2\) stopped half-way"):
        run_instance(cluster, load_plan("trades", load_cluster()), "node-a", "shard-1", spark=spark,
                     available_now=True)
    done = cutover()  # ... is finished by running it again, with its own cut
    assert done.returncode == 0 and "generation 2" in done.stdout, done.stdout + done.stderr
    third = trades(34, 300, T0 + 30_000, 20_000)
    land(cluster, third)
    assert run_group(spark) == ["shard-1", "shard-2"]
    everything = first + second + third
    assert_exact(cluster, everything, "parallel 3 -> 2, a measure added")
    newest = {}  # the new measure: the trades after its cut only (rows before it have none)
    for trade in third:
        key = (trade["timestamp"] // 1000, trade["symbol"])
        newest[key] = max(newest.get(key, 0), trade["quantity"])
    merged = {(int(r["bucket_start"].timestamp()), r["symbol"]): r["quantity_max"]
              for r in read_output(cluster, "trades", "second", *ALL_TIME)}
    assert {key: value for key, value in merged.items() if value is not None} == newest

    plan = load_plan("trades", cluster)
    # the retired labels of both cuts publish as the plan's instances did: the validation suite passes
    report = validate_output(cluster, plan, "trade_aggregates", *ALL_TIME)
    assert report.success and report.row_count > 0, report.summary()
    with Database(database_url) as db, \
            pytest.raises(BackfillRefused, match="where the partials the cut-over of group shard"):
        check_backfill(cluster, plan, db, datetime.fromtimestamp(T0 / 1000, timezone.utc),
                       datetime.fromtimestamp((T0 + 10_000) / 1000, timezone.utc), list(plan.instances))


def test_a_group_published_by_id_rebuilds_its_state_from_the_horizon_across_a_cut_over(project: Path,
                                                                                       database_url: str, spark) -> None:
    """Pizza shop, 2 -> 3 instances: orders placed before the cut and delivered after it are decided by their new
    instance, whose state the replay of the horizon rebuilt; every output (a table of contributions, events, the
    latest per key, a fact aggregation) equals the reference, each row once."""
    cluster = load_cluster()
    plan = load_plan("pizza_shop", cluster)
    orders, deliveries = make_orders(41, 200)
    split = PIZZA_T0 + 70_000  # orders placed in the 40 s before it are undecided at the cut

    def land_pizza(plan, wanted) -> None:
        chunk = {"orders": [(e, json.dumps(e)) for e in orders if wanted(e["time"])],
                 "deliveries": [(e, json.dumps(e)) for e in deliveries if wanted(e["time"])]}
        for (stream, partition), lines in partitioned(plan, chunk).items():
            write_atomically(landing_dir(cluster, stream, partition), lines)

    land_pizza(plan, lambda t: t < split)
    for instance in plan.instances:
        assert run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True).status == "STOPPED"
    with Database(database_url) as db:
        decided = db.run(lambda c: (c.execute("SELECT count(*) AS n FROM output_contributions WHERE plan = "
                                              "'pizza_shop'"), c.fetchone()["n"])[1])
    assert 0 < decided < len(orders)  # some orders decided before the cut, others waiting for it

    edit_plan(project, "pizza_shop", lambda d: d["groups"]["shop"].update(parallel=3))
    done = subprocess.run([sys.executable, "-m", "tandem.cli", "plan", "cutover", "pizza_shop", "--yes"],
                          capture_output=True, text=True, env=os.environ)
    assert done.returncode == 0, done.stdout + done.stderr
    plan = load_plan("pizza_shop", load_cluster())
    land_pizza(plan, lambda t: t >= split)
    advance_watermark(cluster, plan, PIZZA_T0 + 3_600_000)  # every order decided
    for instance in plan.instances:
        result = run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True)
        assert result.status == "STOPPED", (instance, result.error)

    per_customer, overdue = pizza_reference(orders, deliveries)
    with Database(database_url) as db:
        merged = db.run(lambda cursor: read_table_rows(cursor, "pizza_shop", "delivered_orders", ["delivered"]))
        published = db.run(lambda c: (c.execute("SELECT payload->>'order_no' AS o FROM output_events WHERE plan = "
                                                "'pizza_shop' AND output = 'overdue_orders'"),
                                      [r["o"] for r in c.fetchall()])[1])
    assert {row["key"]["customer_name"]: int(row["delivered"]) for row in merged} == per_customer
    assert sorted(published) == sorted(overdue)
    latest = read_output(cluster, "pizza_shop", output="last_orders")
    assert {row["customer_name"]: {k: v for k, v in row.items() if k != "instance"} for row in latest} == \
        last_orders_reference(orders, deliveries)
    on_time = {o["order_no"] for o in orders} - overdue
    day = read_output(cluster, "pizza_shop", "day", output="order_stats")
    assert [(r["orders"], r["on_time"]) for r in day] == [(len(orders), len(on_time))]


def test_a_cut_over_waits_for_the_plan_s_locks_checks_what_runs_under_them_and_needs_a_refused_change(
        project: Path, database_url: str) -> None:
    """Issue 60: a cut-over took no lock (a backfill, retention, a restore or a launch could interleave with its
    relabelling), checked "running" once before, and cut over a group whose checkpoints refused nothing."""
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    for instance in plan.instances:
        checkpoint_dir(cluster, "trades", instance, "node-a").mkdir(parents=True)
    with Database(database_url) as db:
        migrate(db)
        with pytest.raises(CutoverRefused, match=r"group shard: its checkpoints carry the plan as it is: nothing to "
                                                 r"cut over \(--force"):
            cut_over(cluster, plan, db, "shard")
        epoch = try_acquire(db, "trades", "shard-1", "node-a", 60.0)
        with pytest.raises(CutoverRefused, match="node-a holds the lease of instance shard-1"):
            cut_over(cluster, plan, db, "shard", force=True)
        assert release(db, "trades", "shard-1", "node-a", epoch, "test")
    assert load_cut(cluster, "trades", "shard") is None

    def waits_for(lock) -> None:
        """A cut-over started while ``lock`` is held waits for it, writing nothing, then finishes."""
        done: dict = {}

        def run() -> None:
            with Database(database_url) as own:
                done["cut"] = cut_over(cluster, plan, own, "shard", force=True)

        before = load_cut(cluster, "trades", "shard")
        with lock:
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            thread.join(2.0)
            assert thread.is_alive() and not done, "the cut-over waits while the lock is held"
            assert load_cut(cluster, "trades", "shard") == before, "and changes nothing meanwhile"
        thread.join(60)
        assert done["cut"].done and done["cut"].generation == (before.generation + 1 if before else 1)
        for instance in plan.instances:  # the next cut-over finds checkpoints again
            checkpoint_dir(cluster, "trades", instance, "node-a").mkdir(parents=True, exist_ok=True)

    waits_for(plan_lock(database_url, "trades", "a backfill"))
    waits_for(AdvisoryLock(database_url, "launch", InstanceKey("trades", "shard-2", "node-b").id))
