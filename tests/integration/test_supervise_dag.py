"""The supervision DAG for real with ``dag.test()`` (trigger run in-line, no scheduler or triggerer).

ensure launches node-a ACTIVE and node-b PASSIVE with spark-submit; the test kills node-b with
SIGKILL while the watch sensor's trigger polls PostgreSQL; the trigger fires DEAD; react re-syncs
node-b from node-a and relaunches it as PASSIVE; the run succeeds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg2
import psycopg2.extras
import pytest
import yaml

from tandem.packaging import build_dist
from tandem.config import load_cluster, load_plan
from tandem.store import Database, migrate
from tandem.supervisor import stop_instance

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

DAG_TEST = """
import json, sys
from sqlalchemy import select
from airflow.dag_processing.dagbag import DagBag
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session

dags_folder, dag_id, conf = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
dag = DagBag(dags_folder, safe_mode=False).dags[dag_id]
run = dag.test(run_conf=conf or None)
tis = {ti.task_id: {"state": str(ti.state), "try_number": ti.try_number} for ti in run.get_task_instances()}
with create_session() as session:
    rows = session.scalars(select(XComModel).where(XComModel.dag_id == run.dag_id, XComModel.run_id == run.run_id))
    xcom = {f"{x.task_id}.{x.key}": x.value for x in rows}
print("RESULT " + json.dumps({"state": str(run.state), "tis": tis, "xcom": xcom}, default=str))
"""


@pytest.fixture
def airflow_env(tmp_path: Path, project: Path) -> dict[str, str]:
    """A private Airflow (SQLite) over the temp project: one shard, both nodes on local[1], hot standby."""
    plan_path = project / "conf" / "plans" / "trades.yaml"
    plan = yaml.safe_load(plan_path.read_text())
    plan["shards"] = ["shard-1"]
    plan_path.write_text(yaml.safe_dump(plan))
    cluster_path = project / "conf" / "cluster.yaml"
    cluster = yaml.safe_load(cluster_path.read_text())
    for node in cluster["nodes"].values():
        node["spark_master"] = "local[1]"
    cluster_path.write_text(yaml.safe_dump(cluster))

    code = tmp_path / "code"
    (code / "jobs").mkdir(parents=True)
    shutil.copy(REPO / "jobs" / "run_plan.py", code / "jobs" / "run_plan.py")
    build_dist(code)
    home = tmp_path / "airflow"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "TANDEM_HOME": str(code),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    })
    subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env, check=True,
                   capture_output=True, timeout=300)
    with Database(load_cluster().database_url) as db:
        migrate(db)
    return env


def instance(database_url: str, node: str) -> dict | None:
    with psycopg2.connect(database_url) as conn, conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute("SELECT * FROM tandem.plan_instances WHERE instance_id = %s", (f"trades/shard-1/{node}",))
        row = cur.fetchone()
    conn.close()
    return row


def test_supervise_dag_brings_a_killed_passive_back_as_passive(airflow_env, database_url, process_groups):
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    run = subprocess.Popen([sys.executable, "-c", DAG_TEST, str(REPO / "dags"), "tandem_trades_supervise", "{}"],
                           env=airflow_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-8000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
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
    done = subprocess.run([sys.executable, "-c", DAG_TEST, str(REPO / "dags"), "tandem_ops", json.dumps(conf)],
                          env=airflow_env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["state"] == "failed" and result["tis"]["act"]["try_number"] == 1, output[-5000:]
    assert "trades/shard-1 has no live ACTIVE instance to fail over from" in output
