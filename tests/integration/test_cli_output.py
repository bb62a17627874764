"""The real ``tandem`` commands a script runs: each ``--json`` answer is JSON alone on stdout (logs on stderr), and
``tandem run --available-now`` ends with what it read, published and quarantined."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.config import load_cluster, load_plan
from tandem.layout import instance_landing_dir
from tandem.packaging import build_dist
from tandem.plans.trades import TradeGenerator
from tandem.sources.files import write_atomically
from tandem.store import Database
from tandem.store.migrations import migrate

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def tandem(*argv: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tandem.cli", *argv], env=env or dict(os.environ),
                          capture_output=True, text=True, timeout=timeout)


def test_launch_status_and_stop_answer_json_alone_on_stdout(project: Path, process_groups) -> None:
    """``tandem launch --json`` printed Airflow's two log lines (the spark-submit command) before its JSON."""
    build_dist(project)
    shutil.copytree(REPO / "jobs", project / "jobs")
    env = {**os.environ, "TANDEM_HOME": str(project)}  # its dist/tandem.zip and jobs/

    launched = tandem("launch", "trades", "shard-1", "node-a", "--json", env=env)
    assert launched.returncode == 0, launched.stderr
    job = json.loads(launched.stdout)
    process_groups.append(job["submit_pid"])
    assert job["instance_id"] == "trades/shard-1/node-a" and job["reused"] is False
    assert "instance trades/shard-1/node-a: command: spark-submit" in launched.stderr  # the log, on stderr

    shown = tandem("status", "trades", "--json", env=env)
    assert shown.returncode == 0, shown.stderr
    [plan] = json.loads(shown.stdout)["plans"]
    nodes = {n["node"]: n for i in plan["instances"] if i["instance"] == "shard-1" for n in i["nodes"]}
    assert nodes["node-a"]["status"] in ("LAUNCHING", "STARTING", "RUNNING") and nodes["node-b"]["status"] is None

    stopped = tandem("stop", "trades", "shard-1", "node-a", "--timeout", "60", "--json", env=env)
    assert stopped.returncode == 0, stopped.stderr
    assert json.loads(stopped.stdout)["status"] in ("STOPPED", "FAILED")


def test_an_available_now_run_says_what_it_read_published_and_quarantined(project: Path) -> None:
    """It printed only ``STOPPED``."""
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    with Database(cluster.database_url) as db:
        migrate(db)
    generator = TradeGenerator(11)
    now_ms = int(time.time() * 1000)
    good = [json.dumps(generator.event(now_ms - 5000 + i)) for i in range(40)]
    bad = ['{"symbol": "IBM", "price": -1, "quantity": 1, "timestamp": %d}' % now_ms, "not json"]
    write_atomically(instance_landing_dir(cluster, plan, "shard-1"), good[:20] + bad)
    write_atomically(instance_landing_dir(cluster, plan, "shard-1"), good[20:])

    done = tandem("run", "--plan", "trades", "--node", "node-a", "--instance", "shard-1", "--available-now",
                  timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()  # the summary alone: Spark's JVM writes its warnings to stderr
    assert lines[0] == "trades/shard-1/node-a: this run" and lines[-1] == "STOPPED", done.stdout
    read = next(line for line in lines if line.startswith("  read:"))
    assert "aggregates 42 rows in" in read and "quarantine 42 rows in" in read, read
    published = next(line for line in lines if line.startswith("  published:"))
    assert "trade_aggregates " in published and " rows in " in published, published
    assert "  quarantined: 2 lines (by quarantine)" in lines, done.stdout
