"""The DAGs run for real with ``dag.test()``: a private Airflow home (SQLite), real PostgreSQL and Spark.

The supervision DAG's kill-and-recover path runs through a real scheduler and triggerer in
``tests/e2e/test_presenter_page.py`` (on one host) and ``tests/hosts`` (on several).
"""

from __future__ import annotations

import json
import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
import psycopg2
import pytest

from _airflow import dag_test, private_airflow_env
from tandem.config import load_cluster
from tandem.store import Database
from tandem.store.registry import get_instance
from tandem.supervisor import stop_instance

pytestmark = pytest.mark.integration
UTC = timezone.utc


DAG_TEST_USER = "dag_test"
"""The triggering user of every ``dag.test()`` run (Airflow's own name for it)."""

PLAN_SCOPED_AUTH = '''
import os

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager


class PlanScopedAuthManager(SimpleAuthManager):
    """SimpleAuthManager with per-DAG rights, as FAB or Keycloak give: nobody may trigger the DAGs that
    TANDEM_TEST_DENIED_DAGS names."""

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None):
        if method != "GET" and details is not None and details.id in os.environ["TANDEM_TEST_DENIED_DAGS"].split(","):
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
'''


@pytest.fixture
def airflow_env(tmp_path: Path, project: Path) -> dict[str, str]:
    """A private Airflow whose SimpleAuthManager knows the user of ``dag.test()`` runs as an operator (``op``): it
    may trigger every DAG, so ``tandem_ops`` and ``tandem_restore`` act for it."""
    return {**private_airflow_env(tmp_path), "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{DAG_TEST_USER}:op"}


def insert_partials(database_url: str, rows: list[tuple[str, str, float, int, float, float]]) -> None:
    bucket = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    with psycopg2.connect(database_url) as conn, conn.cursor() as cursor:
        for symbol, instance, price_sum, count, low, high in rows:
            cursor.execute(
                """INSERT INTO tandem.trade_aggregates (plan, granularity, bucket_start, symbol, instance,
                       price_sum, trade_count, quantity_sum, price_min, price_max, batch_id)
                   VALUES ('trades', 'hour', %s, %s, %s, %s, %s, %s, %s, %s, 0)""",
                (bucket, symbol, instance, price_sum, count, 10 * count, low, high))
    conn.close()


GOOD = [("IBM", "shard-1", 300.0, 3, 99.0, 101.0), ("IBM", "shard-2", 200.0, 2, 98.0, 102.0),
        ("WSO2", "shard-2", 50.0, 1, 50.0, 50.0)]


def test_validate_dag_passes_and_logs_the_merged_hourly_aggregates(airflow_env, database_url):
    insert_partials(database_url, GOOD)
    result, output = dag_test(airflow_env, "tandem_trades_validate")
    assert result["state"] == "success", output[-5000:]
    report = result["xcom"]["validate.return_value"]
    report = json.loads(report) if isinstance(report, str) else report
    assert report["success"] is True and report["row_count"] == 3
    assert report["merged_rows"] == {"trade_aggregates": 2}
    assert "merged hourly rows of trades trade_aggregates" in output
    assert "IBM" in output and "100.0000" in output  # (300 + 200) / (3 + 2), merged across both instances


def test_validate_dag_fails_without_retry_and_names_the_expectation(airflow_env, database_url):
    insert_partials(database_url, [*GOOD, ("NVDA", "shard-9", 15.0, 2, 7.0, 8.0)])
    result, output = dag_test(airflow_env, "tandem_trades_validate")
    assert result["state"] == "failed"
    assert result["tis"]["validate"]["state"] == "failed"
    assert result["tis"]["validate"]["try_number"] == 1
    assert "expect_column_values_to_be_in_set(column=instance" in output
    assert "shard-9" in output and "NVDA" in output


def test_run_dag_launches_once_reuses_the_job_and_relaunches_or_stops_a_frozen_driver(airflow_env, database_url,
                                                                                     process_groups):
    """launch twice (one job), then with the driver frozen (SIGSTOP, as a driver that ignores its stop
    request): relaunch replaces it, stop ends it; neither leaves a process of the frozen job behind.
    A stop that names the replaced launch (``launched_at``) leaves the new one running."""
    cluster = load_cluster()
    env = {**airflow_env, "AIRFLOW_CONN_TANDEM_NODE_B": json.dumps({"conn_type": "spark", "host": "local[1]"})}
    conf = {"node": "node-b", "instance": "shard-2", "trigger_interval": "2 seconds"}
    try:
        first, output = dag_test(env, "tandem_trades_run", conf)
        with Database(cluster.database_url) as db:
            row = get_instance(db, "trades/shard-2/node-b")
        if row and row["submit_pid"]:
            process_groups.append(row["submit_pid"])
        assert first["state"] == "success", output[-5000:]
        xcom = first["xcom"]
        assert first["tis"]["route"]["state"] == "success"
        assert first["tis"]["launch_node-a"]["state"] == "skipped", "only the chosen node's task runs"
        assert xcom["launch_node-b.instance_id"] == "trades/shard-2/node-b"
        assert xcom["launch_node-b.pid"] == row["pid"] and xcom["launch_node-b.spark_app_id"] == row["spark_app_id"]
        assert xcom["launch_node-b.log_path"] == row["log_path"] and xcom["launch_node-b.reused"] is False
        assert row["status"] == "RUNNING" and row["trigger_interval_s"] == 2.0
        assert row["launched_by"].startswith("airflow tandem_trades_run/")
        header = Path(row["log_path"]).read_text().splitlines()[0]
        assert "--master local[1]" in header, "the master must come from the node's Airflow connection"
        assert psutil.pid_exists(row["pid"]), "the job must outlive the task that launched it"

        second, output = dag_test(env, "tandem_trades_run", conf)
        assert second["state"] == "success", output[-5000:]
        why = [line for line in output.splitlines() if "trades/shard-2/node-b (" in line]  # "launched <id> (<reason>)"
        assert second["xcom"]["launch_node-b.reused"] is True, (why, Path(row["log_path"]).read_text()[-3000:])
        assert second["xcom"]["launch_node-b.pid"] == row["pid"]
        with Database(cluster.database_url) as db:
            assert get_instance(db, "trades/shard-2/node-b")["submit_pid"] == row["submit_pid"]

        replaced_launch = row["launched_at"].isoformat()
        for action in ("relaunch", "stop"):
            if action == "stop":  # a late stop of the replaced launch leaves the new one alone
                late, output = dag_test(env, "tandem_trades_run", {**conf, "action": "stop",
                                                                   "launched_at": replaced_launch})
                assert late["state"] == "success", output[-5000:]
                assert "left alone" in late["xcom"]["stop_node-b.return_value"]["detail"], late["xcom"]
                with Database(cluster.database_url) as db:
                    assert get_instance(db, "trades/shard-2/node-b")["status"] == "RUNNING"
            members = [p for p in psutil.process_iter() if _group(p.pid) == row["submit_pid"]]
            assert psutil.Process(row["pid"]) in members
            psutil.Process(row["pid"]).suspend()  # the driver: frozen, it reads no stop request
            result, output = dag_test(env, "tandem_trades_run", {**conf, "action": action, "stop_timeout": "20 seconds"})
            assert result["state"] == "success", output[-5000:]
            assert result["tis"][f"{'stop' if action == 'stop' else 'launch'}_node-b"]["state"] == "success"
            assert not [p for p in members if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], \
                f"{action}: a process of the frozen job is left"
            with Database(cluster.database_url) as db:
                after = get_instance(db, "trades/shard-2/node-b")
            if action == "relaunch":
                process_groups.append(after["submit_pid"])
                assert (after["status"], result["xcom"]["launch_node-b.reused"]) == ("RUNNING", False)
                assert after["pid"] != row["pid"] and psutil.pid_exists(after["pid"])
                assert re.search(r"before the launch of node-b: (stopped gracefully|killed after 10s) \(STOPPED\)",
                                 output), [line for line in output.splitlines() if "node-b" in line][-12:]
                row = after
            else:
                assert after["status"] == "STOPPED" and result["xcom"]["stop_node-b.return_value"]["status"] == "STOPPED"
                assert result["tis"]["launch_node-b"]["state"] == "skipped"
    finally:
        stopped = stop_instance(cluster, "trades", "shard-2", "node-b", timeout_s=30)
    assert stopped.status == "STOPPED"


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def test_ops_dag_refuses_a_failover_without_a_live_active_and_says_why(airflow_env, database_url):
    conf = {"action": "failover_now", "plan": "trades", "instance": "shard-1", "node": ""}
    result, output = dag_test(airflow_env, "tandem_ops", conf)
    assert result["state"] == "failed" and result["tis"]["act"]["try_number"] == 1, output[-5000:]
    assert f"{DAG_TEST_USER} triggered this run: Airflow lets them act on plan trades" in output, output[-5000:]
    assert "trades/shard-1 has no live ACTIVE instance to fail over from" in output


def bad_snapshot(db: Database, cluster) -> str:
    """A snapshot of trades/shard-1 in the catalog, marked BAD by its validation; its id."""
    from tandem.layout import snapshots_dir
    from tandem.store import snapshots as catalog

    record = catalog.begin_snapshot(db, plan="trades", instance="shard-1", node="node-a",
                                    snapshots_dir=snapshots_dir(cluster, "trades"))
    catalog.record_contents(db, record.id, batch_id=3, query_batches={"aggregates": 3})
    catalog.mark_bad(db, record.id, "trades_state: expect_table_row_count_to_equal(): failed")
    return record.id


def test_restore_dag_refuses_a_bad_snapshot_without_force_and_says_why(airflow_env, database_url, project):
    cluster = load_cluster()
    with Database(cluster.database_url) as db:
        snapshot_id = bad_snapshot(db, cluster)
    conf = {"plan": "trades", "instance": "", "snapshot_id": snapshot_id, "node": "", "force": False, "confirm": True}
    result, output = dag_test(airflow_env, "tandem_restore", conf)
    assert result["state"] == "failed" and result["tis"]["restore"]["try_number"] == 1, output[-5000:]
    assert f"{DAG_TEST_USER} triggered this run: Airflow lets them act on plan trades" in output, output[-5000:]
    assert f"snapshot {snapshot_id} is BAD (trades_state: expect_table_row_count_to_equal(): failed)" in output
    with Database(cluster.database_url) as db:
        assert get_instance(db, "trades/shard-1/node-a") is None, "a refused restore must not touch the instances"


def test_restore_dag_refuses_a_run_without_confirm_however_it_is_triggered(airflow_env, database_url, project):
    """A run of ``tandem_restore`` whose conf leaves ``confirm`` out or false (the Params' default: a trigger from the
    UI form, ``POST /dagRuns`` or ``airflow dags trigger`` that does not confirm) fails without retry, before it
    reads the catalog or touches an instance."""
    result, output = dag_test(airflow_env, "tandem_restore", {"plan": "trades", "instance": "shard-1"})  # one run:
    assert result["state"] == "failed" and result["tis"]["restore"]["try_number"] == 1, output[-5000:]  # ~30 s each
    assert ("restore of trades refused: it rewinds the plan's outputs to the snapshot; trigger it with "
            "the Param confirm = true") in output, output[-5000:]
    with Database(load_cluster().database_url) as db:
        assert get_instance(db, "trades/shard-1/node-a") is None


def test_ops_and_restore_refuse_a_user_airflow_does_not_let_trigger_the_plans_dag_and_change_nothing(
        airflow_env, database_url, project, tmp_path):
    """Triggered directly (not through the Tandem page) by a user who may trigger ``tandem_ops`` and
    ``tandem_restore`` but not ``tandem_trades_supervise``: both runs fail without retry, say why, and touch
    nothing (the same runs by a user with the right get past the check: the two tests above)."""
    from tandem.store import snapshots as catalog
    from tandem.store.leases import recent_events

    (tmp_path / "auth").mkdir()
    (tmp_path / "auth" / "plan_scoped_auth.py").write_text(PLAN_SCOPED_AUTH)
    env = {**airflow_env, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path / "auth"),
                                                                      airflow_env.get("PYTHONPATH")])),
           "AIRFLOW__CORE__AUTH_MANAGER": "plan_scoped_auth.PlanScopedAuthManager",
           "TANDEM_TEST_DENIED_DAGS": "tandem_trades_supervise"}
    cluster = load_cluster()
    with Database(cluster.database_url) as db:
        snapshot_id = bad_snapshot(db, cluster)
        events_before = recent_events(db, "trades", None, 100)
    runs = {"tandem_ops": ("act", {"action": "failover_now", "plan": "trades", "instance": "shard-1", "node": ""}),
            "tandem_restore": ("restore", {"plan": "trades", "instance": "", "snapshot_id": snapshot_id, "node": "",
                                           "force": False, "confirm": True})}
    for dag_id, (task_id, conf) in runs.items():
        result, output = dag_test(env, dag_id, conf)
        assert result["state"] == "failed" and result["tis"][task_id]["try_number"] == 1, output[-5000:]
        assert (f"{dag_id} refused: {DAG_TEST_USER} may not act on plan trades (Airflow denies triggering its DAG "
                f"tandem_trades_supervise); nothing was changed") in output, output[-5000:]
    with Database(cluster.database_url) as db:
        assert get_instance(db, "trades/shard-1/node-a") is None
        assert catalog.get_snapshot(db, snapshot_id).status == "BAD"
        assert recent_events(db, "trades", None, 100) == events_before, "a refused run records no decision"
