"""A launch refuses a change of the plan its checkpoints cannot carry, before any query starts (issue 46 §1).

The trades plan runs its two instances over some trades; then its group's parallelism goes 2 → 1 and 2 → 3, and a
measure is added. Each launch is refused in one line naming the change, the instance is recorded FAILED with it
(the same words at every launch, so the supervisor blocks it instead of looping), no lease moves and no
checkpoint file changes. With the plan as it was, the instances go on, and the totals equal a plain-Python
reference over every trade: nothing was counted twice.
"""

from __future__ import annotations

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


def run_all(cluster, spark) -> None:
    plan = load_plan("trades", cluster)
    for instance in plan.instances:
        assert run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True).status == "STOPPED"


def test_a_changed_parallelism_or_measure_is_refused_before_any_query_starts(project: Path, database_url: str,
                                                                             spark) -> None:
    cluster = load_cluster()
    first = make_events(21, 300, 20_000)
    land(cluster, first)
    run_all(cluster, spark)
    assert (project / "data" / "checkpoints" / "trades" / "shard-1" / "node-a" / SHAPE_FILE).is_file()
    before = checkpoint_files(project)
    with Database(database_url) as db:
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

    (project / "conf" / "plans" / "trades.yaml").write_text(original)
    second = make_events(22, 200, 20_000)
    land(cluster, [{**e, "timestamp": e["timestamp"] + 30_000} for e in second])
    run_all(cluster, spark)
    everything = first + [{**e, "timestamp": e["timestamp"] + 30_000} for e in second]
    assert_matches(read_output(cluster, "trades", "second", *ALL_TIME),
                   expected_aggregates(everything, "second"), "every trade counted once")
