"""End to end through a real Airflow: the run DAG launches the trades plan for two instances via
spark-submit; the test feeds events and checks the merged aggregates against its own arithmetic;
then the snapshot DAG, on its schedule, snapshots both instances into the catalog."""

from __future__ import annotations

import json
import random
import time
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
import pytest
import yaml

from tandem.airflow_rest import AirflowClient
from tandem.checkpoints import committed_batch
from tandem.config import load_cluster, load_plan
from tandem.layout import checkpoint_dir, instance_landing_dir
from tandem.sources.files import write_atomically
from tandem.store import Database, snapshots as catalog
from tandem.store.heartbeats import input_rows_since
from tandem.store.registry import get_instance, instance_id
from tandem.supervisor.stopping import stop_instance
from tandem.reading import read_output

pytestmark = pytest.mark.e2e
UTC = timezone.utc
PLACEMENTS = (("shard-1", "node-a"), ("shard-2", "node-b"))


def _events(seed: int, count: int, now_ms: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"symbol": rng.choice(["IBM", "WSO2", "ORCL", "MSFT"]), "price": round(rng.uniform(5, 300), 2),
             "quantity": rng.randint(1, 900), "timestamp": now_ms - rng.randint(0, 4000)} for _ in range(count)]


def _expected(events: list[dict], granularity: str) -> dict[tuple, dict]:
    cut = {"minute": lambda m: m.replace(second=0, microsecond=0),
           "hour": lambda m: m.replace(minute=0, second=0, microsecond=0)}[granularity]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for event in events:
        groups[(cut(datetime.fromtimestamp(event["timestamp"] / 1000, tz=UTC)), event["symbol"])].append(event)
    return {key: {"trade_count": len(g), "quantity_sum": sum(e["quantity"] for e in g),
                  "price_sum": sum(e["price"] for e in g), "price_min": min(e["price"] for e in g),
                  "price_max": max(e["price"] for e in g)} for key, g in groups.items()}


@pytest.fixture
def snapshots_every_minute(project: Path) -> None:
    """The temp project's trades plan snapshots every minute (set before the Airflow stack parses the DAGs)."""
    path = project / "conf" / "plans" / "trades.yaml"
    plan = yaml.safe_load(path.read_text())
    plan["snapshot"]["interval"] = "1 minute"
    path.write_text(yaml.safe_dump(plan))


def test_run_dag_launches_two_instances_merged_aggregates_match_and_the_snapshot_dag_snapshots_them(
        project: Path, database_url: str, snapshots_every_minute: None, airflow: AirflowClient) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    launched: list[int] = []
    try:
        airflow.wait_for_dag("tandem_trades_run")
        airflow.set_paused("tandem_trades_run", False)
        runs = [airflow.trigger("tandem_trades_run", {"node": node, "instance": instance, "trigger_interval": "1 second"})
                for instance, node in PLACEMENTS]
        for run_id in runs:
            assert airflow.wait_for_run("tandem_trades_run", run_id, timeout_s=420) == "success"

        with Database(cluster.database_url) as db:
            instances = [get_instance(db, instance_id("trades", instance, node)) for instance, node in PLACEMENTS]
        for row in instances:
            assert row["status"] == "RUNNING", row
            launched.append(row["submit_pid"])
            # The job outlived the Airflow task that launched it.
            assert psutil.pid_exists(row["submit_pid"])

        since = datetime.now(UTC)
        now_ms = int(time.time() * 1000)
        events = {instance: _events(seed, 500, now_ms) for seed, (instance, _) in enumerate(PLACEMENTS)}
        lines = 0
        for instance, instance_events in events.items():
            for start in range(0, len(instance_events), 100):
                chunk = instance_events[start:start + 100]
                write_atomically(instance_landing_dir(cluster, plan, instance), [json.dumps(e) for e in chunk])
                lines += len(chunk)
            write_atomically(instance_landing_dir(cluster, plan, instance), ['{"symbol": "IBM", "price": -1}'])
            lines += 1

        deadline = time.monotonic() + 240
        with Database(cluster.database_url) as db:
            while input_rows_since(db, "trades", "aggregates", since) < lines and time.monotonic() < deadline:
                time.sleep(2)
            assert input_rows_since(db, "trades", "aggregates", since) >= lines

        everything = events["shard-1"] + events["shard-2"]
        window = (datetime.fromtimestamp(now_ms / 1000, tz=UTC) - timedelta(hours=2),
                  datetime.fromtimestamp(now_ms / 1000, tz=UTC) + timedelta(hours=1))
        for granularity in ("minute", "hour"):
            merged = {(r["bucket_start"], r["symbol"]): r for r in read_output(cluster, "trades", granularity, *window)}
            expected = _expected(everything, granularity)
            assert set(merged) == set(expected)
            for key, values in expected.items():
                for column, value in values.items():
                    assert merged[key][column] == pytest.approx(value), (granularity, key, column)
                assert merged[key]["avg_price"] == pytest.approx(values["price_sum"] / values["trade_count"])

        # the snapshot DAG runs on its schedule (every minute here): one GOOD snapshot per instance's ACTIVE node
        airflow.wait_for_dag("tandem_trades_snapshot")
        airflow.set_paused("tandem_trades_snapshot", False)
        deadline = time.monotonic() + 300
        while not airflow.runs("tandem_trades_snapshot", "scheduled") and time.monotonic() < deadline:
            time.sleep(2)
        [run, *_] = airflow.runs("tandem_trades_snapshot", "scheduled")
        assert airflow.wait_for_run("tandem_trades_snapshot", run["dag_run_id"], timeout_s=300) == "success"
        with Database(cluster.database_url) as db:
            for instance, node in PLACEMENTS:
                snapshot = catalog.latest_good(db, "trades", instance)
                assert snapshot is not None, f"no GOOD snapshot of {instance}"
                assert snapshot.node == node and snapshot.taken_at >= since
                live = checkpoint_dir(cluster, "trades", instance, node, "aggregates")
                assert 0 <= snapshot.batch_id <= committed_batch(live)
                assert snapshot.state_rows > 0 and snapshot.output_versions["trade_aggregates"] >= 0
                assert snapshot.validation["success"] is True
    finally:
        for instance, node in PLACEMENTS:
            stop_instance(cluster, plan, instance, node)
    for pid in launched:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
