"""End to end through a real Airflow scheduler and triggerer: the supervision DAG sees a kill -9 of
the passive and brings the node back as PASSIVE, re-synced from the active, while the active keeps
publishing every event exactly once."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import psycopg2.extras
import pytest

from _airflow import code_home
from _ha import configure_one_shard, wait_for
from _ha import instance_row as instance
from _project import kill_groups
from tandem.airflow_rest import AirflowClient
from tandem.config import load_cluster, load_plan
from tandem.layout import instance_landing_dir
from tandem.producer import TradeGenerator, write_atomically
from tandem.store import Database, migrate

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
DAG = "tandem_trades_supervise"
SHARD = "shard-1"


@pytest.fixture
def stop_plan_after(project: Path, database_url: str) -> Iterator[None]:
    """After the stack is down: kill every instance the supervisor launched (they outlive Airflow) by
    the process group recorded for it in this test's database (no graceful stop: the database goes next)."""
    yield
    groups = []
    for node in ("node-a", "node-b"):
        try:
            row = instance(database_url, node)
        except Exception:  # noqa: BLE001 - best effort
            row = None
        if row and row["submit_pid"]:
            groups.append(row["submit_pid"])
    kill_groups(groups)


def query(database_url: str, sql: str, params: tuple = ()) -> list[tuple]:
    with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
        cur.execute(sql, params)
        rows = cur.fetchall()
    conn.close()
    return rows


def runs(airflow: AirflowClient) -> list[dict]:
    response = airflow.request("GET", f"/dags/{DAG}/dagRuns", params={"order_by": "run_after", "limit": 50})
    assert response.ok, response.text
    return response.json()["dag_runs"]


def task_states(airflow: AirflowClient, run_id: str) -> dict[str, str]:
    response = airflow.request("GET", f"/dags/{DAG}/dagRuns/{run_id}/taskInstances")
    assert response.ok, response.text
    return {t["task_id"]: t["state"] for t in response.json()["task_instances"]}


def test_supervision_dag_brings_a_killed_passive_back_as_passive(stop_plan_after, airflow_stack, project: Path,
                                                                  database_url: str, tmp_path: Path) -> None:
    configure_one_shard(project, "hot")
    env_file = code_home(tmp_path)
    with Database(database_url) as db:
        migrate(db)
    generator, written = TradeGenerator(21), [0, 0]
    directory = instance_landing_dir(load_cluster(), load_plan("trades"), SHARD)

    def feed(count: int = 80) -> None:
        now_ms = int(time.time() * 1000)
        events = [generator.event(now_ms - 500 + i * 5) for i in range(count)]
        write_atomically(directory, [json.dumps(e) for e in events])
        written[0] += count
        written[1] += sum(e["quantity"] for e in events)

    def all_published() -> bool:
        [(count, quantity)] = query(database_url, """SELECT COALESCE(SUM(trade_count), 0), COALESCE(SUM(quantity_sum), 0)
                                                     FROM tandem.trade_aggregates
                                                     WHERE granularity = 'second' AND shard_id = %s""", (SHARD,))
        return (int(count), int(quantity)) == tuple(written)

    with airflow_stack(tmp_path / "airflow", {"TANDEM_ENV_FILE": str(env_file)}) as airflow:
        try:
            airflow.wait_for_dag(DAG)
            airflow.set_paused(DAG, False)
            wait_for(lambda: all((row := instance(database_url, n)) and row["status"] == "RUNNING"
                                 for n in ("node-a", "node-b")), 420, "ensure to launch node-a and node-b")
            wait_for(lambda: instance(database_url, "node-b")["role"] == "PASSIVE"
                     and instance(database_url, "node-a")["role"] == "ACTIVE", 60, "the initial roles")
            [first] = wait_for(lambda: [r for r in runs(airflow) if r["state"] == "running"], 60, "a running run")
            wait_for(lambda: task_states(airflow, first["dag_run_id"]).get("watch") == "deferred", 180,
                     "the watch sensor to defer to the triggerer")
            feed()
            wait_for(all_published, 120, "the first events to be published")

            killed = instance(database_url, "node-b")
            os.killpg(killed["submit_pid"], signal.SIGKILL)
            feed()
            wait_for(lambda: (row := instance(database_url, "node-b"))["pid"] not in (None, killed["pid"])
                     and row["status"] == "RUNNING" and row["role"] == "PASSIVE", 420,
                     "the supervision DAG to bring node-b back as PASSIVE")
            done = wait_for(lambda: [r for r in runs(airflow) if r["dag_run_id"] == first["dag_run_id"]
                                     and r["state"] in ("success", "failed")], 120, "the first run to end")
            assert done[0]["state"] == "success"
            assert task_states(airflow, first["dag_run_id"]) == {"ensure": "success", "watch": "success",
                                                                 "react": "success"}
            wait_for(lambda: len(runs(airflow)) >= 2, 120, "the next supervision run (@continuous)")

            kinds = [k for k, in query(database_url, """SELECT kind FROM tandem.failover_events
                                                        WHERE node = 'node-b' ORDER BY id""")]
            detected = kinds.index("DETECTED")
            assert kinds[detected:detected + 4] == ["DETECTED", "STOP", "LAUNCH", "RESYNC"]
            [(evidence,)] = query(database_url, "SELECT reason FROM tandem.failover_events WHERE kind = 'DETECTED'")
            assert "liveness beat" in evidence
            assert instance(database_url, "node-a")["role"] == "ACTIVE"
            feed()
            wait_for(all_published, 120, "every event to be published exactly once")
        finally:
            airflow.request("PATCH", f"/dags/{DAG}", json={"is_paused": True})
