"""The supervision DAG for real with ``dag.test()`` (trigger run in-line, no scheduler or triggerer).

ensure launches node-a ACTIVE and node-b PASSIVE with spark-submit; the test kills node-b with
SIGKILL while the watch sensor's trigger polls PostgreSQL; the trigger fires DEAD; react re-syncs
node-b from node-a and relaunches it as PASSIVE; the run succeeds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psycopg2
import psycopg2.extras
import pytest

from _airflow import dag_result, dag_test, dag_test_command, private_airflow_env
from _ha import configure_one_shard
from _ha import instance_row as instance
from tandem.config import load_cluster, load_plan
from tandem.supervisor import stop_instance

pytestmark = pytest.mark.integration

@pytest.fixture
def airflow_env(tmp_path: Path, project: Path) -> dict[str, str]:
    """A private Airflow over the temp project: one shard, both nodes on local[1], hot standby."""
    configure_one_shard(project)
    return private_airflow_env(tmp_path)


def test_supervise_dag_brings_a_killed_passive_back_as_passive(airflow_env, database_url, process_groups):
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    run = subprocess.Popen(dag_test_command("tandem_trades_supervise"), env=airflow_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 420
        while True:
            rows = {n: instance(database_url, n) for n in ("node-a", "node-b")}
            for row in rows.values():
                if row and row["submit_pid"] and row["submit_pid"] not in process_groups:
                    process_groups.append(row["submit_pid"])
            if all(r and r["status"] == "RUNNING" for r in rows.values()) and rows["node-b"]["role"] == "PASSIVE":
                break
            assert run.poll() is None, run.communicate()[0][-5000:]
            assert time.monotonic() < deadline, "ensure did not bring both nodes up"
            time.sleep(1)
        killed = rows["node-b"]
        time.sleep(3)  # let ensure finish and the watch defer
        os.killpg(killed["submit_pid"], signal.SIGKILL)
        output, _ = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
        for node in ("node-a", "node-b"):
            row = instance(database_url, node)
            if row and row["submit_pid"]:
                process_groups.append(row["submit_pid"])
    result = dag_result(output)
    assert result, output[-8000:]
    try:
        assert result["state"] == "success", output[-8000:]
        assert {t: s["state"] for t, s in result["tis"].items()} == {"ensure": "success", "watch": "success",
                                                                   "react": "success"}
        event = result["xcom"]["watch.return_value"]
        event = json.loads(event) if isinstance(event, str) else event
        assert (event["node"], event["health"]) == ("node-b", "DEAD")
        back = instance(database_url, "node-b")
        assert (back["status"], back["role"]) == ("RUNNING", "PASSIVE")
        assert back["pid"] != killed["pid"]
        assert instance(database_url, "node-a")["role"] == "ACTIVE"
        with psycopg2.connect(database_url) as conn, conn.cursor() as cur:
            cur.execute("SELECT kind, node FROM tandem.failover_events ORDER BY id")
            events = cur.fetchall()
        conn.close()
        after = events[events.index(("DETECTED", "node-b")):]
        assert [k for k, n in after if n == "node-b"][:4] == ["DETECTED", "STOP", "LAUNCH", "RESYNC"]
        assert "re-synced node-b from node-a" in output
    finally:
        for node in ("node-a", "node-b"):
            stop_instance(cluster, plan, "shard-1", node, timeout_s=20)


def test_ops_dag_refuses_a_failover_without_a_live_active_and_says_why(airflow_env, database_url):
    conf = {"action": "failover_now", "plan": "trades", "shard_id": "shard-1", "node": ""}
    result, output = dag_test(airflow_env, "tandem_ops", conf)
    assert result["state"] == "failed" and result["tis"]["act"]["try_number"] == 1, output[-5000:]
    assert "trades/shard-1 has no live ACTIVE instance to fail over from" in output
