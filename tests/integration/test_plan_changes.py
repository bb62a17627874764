"""A launch refuses a change of the plan its checkpoints cannot carry, before any query starts (issue 46 §1).

The trades plan runs its two instances over some trades; then its group's parallelism goes 2 → 1 and 2 → 3, and a
measure is added. Each launch is refused in one line naming the change, the instance is recorded FAILED with it
(the same words at every launch, so the supervisor blocks it instead of looping), no lease moves and no
checkpoint file changes. With the plan as it was, the instances go on, and the totals equal a plain-Python
reference over every trade: nothing was counted twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _nats import edit_plan
from test_backfill import land
from test_trades_plan import ALL_TIME, assert_matches, expected_aggregates, make_events

from tandem.config import load_cluster, load_plan
from tandem.errors import PlanChanged
from tandem.plan_shape import SHAPE_FILE
from tandem.plan_version import plan_version
from tandem.runtime.node import run_instance
from tandem.store import Database
from tandem.store.leases import read_lease
from tandem.reading import read_output

pytestmark = pytest.mark.integration


def checkpoint_files(project: Path) -> dict[str, tuple[int, int]]:
    """Every checkpoint file but the shape records, with its size and modification time."""
    root = project / "data" / "checkpoints" / "trades"
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")
            if p.is_file() and p.name != SHAPE_FILE}


def instance_row(db: Database, instance: str) -> dict:
    return db.run(lambda cursor: (cursor.execute(
        "SELECT status, error, failure, failure_repeats FROM plan_instances WHERE instance_id = %s",
        (f"trades/{instance}/node-a",)), cursor.fetchone())[1])


def versions(db: Database) -> dict[str, str]:
    return dict(db.run(lambda cursor: (cursor.execute(
        "SELECT instance, plan_version FROM plan_instances WHERE plan = 'trades' AND node = 'node-a'"),
        [(r["instance"], r["plan_version"]) for r in cursor.fetchall()])[1]))


def plan_diff() -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "tandem.cli", "plan", "diff", "trades", "--json"],
                          capture_output=True, text=True, env=os.environ)
    return done.returncode, json.loads(done.stdout)


def run_all(cluster, spark) -> None:
    plan = load_plan("trades", cluster)
    for instance in plan.instances:
        assert run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True).status == "STOPPED"


def test_a_changed_parallelism_or_measure_is_refused_before_any_query_starts(project: Path, database_url: str,
                                                                             spark, monkeypatch) -> None:
    cluster = load_cluster()
    first = make_events(21, 300, 20_000)
    land(cluster, first)
    run_all(cluster, spark)
    assert (project / "data" / "checkpoints" / "trades" / "shard-1" / "node-a" / SHAPE_FILE).is_file()
    before = checkpoint_files(project)
    first_version = plan_version(load_plan("trades", cluster))
    with Database(database_url) as db:
        assert versions(db) == {"shard-1": first_version, "shard-2": first_version}  # what each run was launched as
        leases = {instance: read_lease(db, "trades", instance) for instance in ("shard-1", "shard-2")}

    refusals = [
        ("parallel 2 -> 1", lambda d: d["groups"]["shard"].update(parallel=1), "shard-1",
         "group shard's parallel changed from 2 to 1"),
        ("parallel 2 -> 3: the new instance too", lambda d: d["groups"]["shard"].update(parallel=3), "shard-3",
         "group shard's parallel changed from 2 to 3"),
        ("a measure added", lambda d: (d["groups"]["shard"].update(parallel=2), d["outputs"]["trade_aggregates"]
                                       ["measures"].update(quantity_max={"max": "quantity"})), "shard-2",
         "aggregation trade_aggregates: measure quantity_max added"),
    ]
    original = (project / "conf" / "plans" / "trades.yaml").read_text()
    for label, change, instance, words in refusals:
        edit_plan(project, "trades", change)
        changed = load_plan("trades", load_cluster())
        checked = subprocess.run([sys.executable, "-m", "tandem.cli", "config", "check"], capture_output=True,
                                 text=True, env=os.environ)
        assert checked.returncode == 2 and words in checked.stdout + checked.stderr, (label, checked.stdout)
        code, diff = plan_diff()  # each checkpoint's record, the change classified and refused
        assert code == 2 and diff["version"] == plan_version(changed), label
        refused = {(c["class"], c["refused"]) for d in diff["checkpoints"] for c in d["changes"] if words in c["change"]}
        assert refused and refused <= {("topology", True), ("state to rebuild", True)}, (label, diff)
        for attempt in (1, 2):
            with pytest.raises(PlanChanged) as refused:
                run_instance(cluster, changed, "node-a", instance, spark=spark, available_now=True)
            line = str(refused.value)
            assert "\n" not in line and words in line and line.startswith(f"plan trades, instance {instance}: "), label
            with Database(database_url) as db:
                row = instance_row(db, instance)
                assert (row["status"], row["error"], row["failure"]) == ("FAILED", line, line), label
                assert row["failure_repeats"] == attempt, label  # the same failure: the supervisor blocks it
        assert not spark.streams.active, label
    assert checkpoint_files(project) == before
    with Database(database_url) as db:
        assert {instance: read_lease(db, "trades", instance) for instance in leases}.keys() == leases.keys()
        assert all(read_lease(db, "trades", s).epoch == leases[s].epoch for s in leases)

    # a change of the code only (here a comment of the YAML): classified, taken, the new version recorded
    (project / "conf" / "plans" / "trades.yaml").write_text(original + "# reviewed\n")
    code, diff = plan_diff()
    assert code == 0 and {d["version"] for d in diff["checkpoints"]} == {first_version}, diff
    assert {(d["instance"], c["class"]) for d in diff["checkpoints"] for c in d["changes"]} == {
        ("shard-1", "code only"), ("shard-2", "code only")}, diff
    second = make_events(22, 200, 20_000)
    land(cluster, [{**e, "timestamp": e["timestamp"] + 30_000} for e in second])
    run_all(cluster, spark)
    with Database(database_url) as db:
        now = versions(db)
        assert {now["shard-1"], now["shard-2"]} == {plan_version(load_plan("trades", cluster))} != {first_version}
    everything = first + [{**e, "timestamp": e["timestamp"] + 30_000} for e in second]
    assert_matches(read_output(cluster, "trades", "second", *ALL_TIME),
                   expected_aggregates(everything, "second"), "every trade counted once")

    # a change of the code that no declaration shows but Spark's state does (here the query groups by one more
    # column): Spark refuses the checkpoint's state; the instance fails in one line, never with Spark's trace
    module = sys.modules["tandem.plans.trades"]
    monkeypatch.setitem(sys.modules, module.__name__, module)  # the project's module is imported under its name
    bundled = Path(module.__file__).read_text()
    regrouped = bundled.replace(
        "return second_partials(ctx.events(STREAM), spec_for(ctx.plan, OUTPUT), ctx.plan.watermark_s)",
        "spec = spec_for(ctx.plan, OUTPUT)\n"
        "    frame = ctx.events(STREAM).withColumn('venue', F.lit('x'))\n"
        "    return second_partials(frame, replace(spec, keys=(*spec.keys, 'venue')), ctx.plan.watermark_s)"
        ".drop('venue')").replace("from pyspark.sql import DataFrame\n", "from dataclasses import replace\n"
                                  "from pyspark.sql import DataFrame\nfrom pyspark.sql import functions as F\n")
    assert regrouped.count("venue") == 3
    (project / "conf" / "plans" / "trades.py").write_text(regrouped)
    edit_plan(project, "trades", lambda d: d.pop("module"))
    published = read_output(cluster, "trades", "second", *ALL_TIME)
    land(cluster, [{**e, "timestamp": e["timestamp"] + 60_000} for e in make_events(23, 50, 20_000)])
    result = run_instance(cluster, load_plan("trades", load_cluster()), "node-a", "shard-1", spark=spark,
                          available_now=True)
    assert result.status == "FAILED" and "\n" not in result.error, result.error[:2000]
    assert result.error.startswith("plan trades: query aggregates's state in its checkpoint was written by another "
                                   "version of the query (Spark: STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE)"), result.error
    with Database(database_url) as db:
        row = instance_row(db, "shard-1")
        assert (row["status"], row["error"], row["failure"]) == ("FAILED", result.error, result.error)
    assert read_output(cluster, "trades", "second", *ALL_TIME) == published  # nothing of it was published
