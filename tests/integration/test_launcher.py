"""The launcher with a real spark-submit: detached, idempotent, publishing, and stoppable."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psutil
import psycopg2
import pytest

from tandem.config import ClusterConfig, load_cluster, load_plan
from tandem.layout import instance_landing_dir
from tandem.plans.trades import TradeGenerator
from tandem.process_start import start_since_boot
from tandem.sources.files import write_atomically
from tandem.store import Database
from tandem.store.migrations import migrate
from tandem.store.registry import InstanceKey, get_instance, record_launch, register_nodes
from tandem.supervisor import LaunchError, launch_instance, stop_instance, wait_until_running
from tandem.supervisor.processes import is_instance_cmdline
from tandem.supervisor.submit_command import DRIVER_ENVIRONMENT_PREFIXES, child_environment, scratch_dir
from tandem.packaging import build_dist

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
KEY = InstanceKey("trades", "shard-1", "node-a")
MARKER = "Marker4LauncherTest"
LAUNCHER_SECRETS = {"AIRFLOW__API_AUTH__JWT_SECRET": f"jwt-{MARKER}", "AIRFLOW_CONN_TANDEM_NODE_Z": f"spark://{MARKER}",
                    "TANDEM_AIRFLOW_DB_URL": f"postgresql://u:{MARKER}@db/airflow", "SOME_API_TOKEN": MARKER}
"""Variables of a launcher's environment (an Airflow worker's) that no driver needs."""
SET_BY_SPARK_SUBMIT = {"MASTER", "PWD", "SHLVL", "PYTHONHASHSEED", "PYTHONPATH", "PYTHONUNBUFFERED", "PYSPARK_GATEWAY_PORT",
                       "PYSPARK_GATEWAY_SECRET"}
"""What spark-submit's scripts and Spark's Python runner add for the JVM and the Python driver (besides ``SPARK_*``)."""


@pytest.fixture
def launch_project(project: Path) -> Path:
    """The temp project plus a fresh ``dist/tandem.zip`` of this checkout (passed as ``py_files``)."""
    build_dist(project)
    (project / "jobs").mkdir()
    return project


def dist(project: Path) -> Path:
    return project / "dist" / "tandem.zip"


def instance_processes(key: InstanceKey) -> list[psutil.Process]:
    """Live processes running ``key`` for this test's project (others may run the same key elsewhere)."""
    storage_root = os.environ["TANDEM_STORAGE_ROOT"]
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE or not is_instance_cmdline(process.info["cmdline"] or [], key):
            continue
        try:
            if process.environ().get("TANDEM_STORAGE_ROOT") == storage_root:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(process)
        except ProcessLookupError:
            pass
    return members


def write_trades(cluster: ClusterConfig, instance: str, count: int, files: int, seed: int) -> None:
    generator = TradeGenerator(seed)
    now_ms = int(time.time() * 1000)
    events = [json.dumps(generator.event(now_ms - 1000 + i)) for i in range(count)]
    per_file = count // files
    for start in range(0, count, per_file):
        write_atomically(instance_landing_dir(cluster, load_plan("trades", cluster), instance), events[start:start + per_file])


def published_trades(database_url: str, instance: str) -> int:
    with psycopg2.connect(database_url) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT COALESCE(SUM(trade_count), 0) FROM tandem.trade_aggregates "
                       "WHERE granularity = 'second' AND instance = %s", (instance,))
        total = cursor.fetchone()[0]
    conn.close()
    return int(total)


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(1)


def outside_the_allow_list(pid: int, cluster: ClusterConfig) -> dict[str, str]:
    """Variables of the live process ``pid`` (its ``/proc/<pid>/environ``) that the launcher should not have passed."""
    passed = set(child_environment(cluster, scratch=scratch_dir(cluster, KEY)))  # TMPDIR and SPARK_SUBMIT_OPTS too
    return {name: value for name, value in psutil.Process(pid).environ().items()
            if MARKER in value or name.startswith("AIRFLOW") or not (
                name in passed or name in SET_BY_SPARK_SUBMIT or name.startswith(DRIVER_ENVIRONMENT_PREFIXES))}


def test_launch_runs_detached_reuses_the_running_job_publishes_and_stops(launch_project, database_url, process_groups,
                                                                         monkeypatch):
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    write_trades(cluster, "shard-1", 200, files=4, seed=7)
    for name, value in LAUNCHER_SECRETS.items():
        monkeypatch.setenv(name, value)

    job = launch_instance(cluster, plan, "shard-1", "node-a", "1 second", launched_by="test_launcher",
                          py_files=dist(launch_project))
    process_groups.append(job.submit_pid)
    assert not job.reused and job.status == "LAUNCHING"
    assert job.command[0] == "spark-submit"
    assert job.command[job.command.index("--py-files") + 1] == str(dist(launch_project))
    assert str(REPO / "jobs" / "run_plan.py") in job.command
    log_path = Path(job.log_path)
    assert log_path.parent == cluster.storage_root / "logs" / "trades" / "shard-1"
    assert log_path.name.startswith("node-a-") and log_path.suffix == ".log"
    assert os.getpgid(job.submit_pid) == job.submit_pid, "spark-submit must lead its own process group"

    row = wait_until_running(cluster, plan, "shard-1", "node-a", timeout_s=240)
    assert row["status"] == "RUNNING"
    assert row["pid"] and row["pid"] != job.submit_pid
    assert row["spark_app_id"].startswith("local-")
    assert row["launched_by"] == "test_launcher" and row["log_path"] == job.log_path
    assert os.getpgid(row["pid"]) == job.submit_pid
    for pid in (job.submit_pid, row["pid"]):  # the JVM (spark-submit) and the Python driver: no secret of the launcher
        assert outside_the_allow_list(pid, cluster) == {}
    scratch = scratch_dir(cluster, KEY)  # the driver's temporary files: in its own folder on this host
    assert scratch == launch_project / "scratch" / "trades" / "shard-1" / "node-a"
    assert f"-Djava.io.tmpdir={scratch}" in psutil.Process(job.submit_pid).cmdline()
    assert psutil.Process(row["pid"]).environ()["TMPDIR"] == str(scratch)
    wait_for(lambda: any(p.name.startswith("blockmgr-") for p in scratch.iterdir()), 30,
             "Spark's block manager folder in the instance's scratch folder")

    again = launch_instance(cluster, plan, "shard-1", "node-a", "1 second", launched_by="test_launcher retry",
                            py_files=dist(launch_project))
    assert again.reused, again.reason
    assert (again.submit_pid, again.pid) == (job.submit_pid, row["pid"])
    assert again.command is None
    other_interval = launch_instance(cluster, plan, "shard-1", "node-a", "2 seconds", py_files=dist(launch_project))
    assert other_interval.reused and "stop it first" in other_interval.reason
    processes = instance_processes(KEY)
    assert {p.pid for p in processes} == {job.submit_pid, row["pid"]}, "a second job was started"
    with Database(cluster.database_url) as db:
        assert get_instance(db, KEY.id)["launched_by"] == "test_launcher"

    wait_for(lambda: published_trades(database_url, "shard-1") == 200, 90, "the first 200 trades to be published")
    write_trades(cluster, "shard-1", 50, files=1, seed=8)
    wait_for(lambda: published_trades(database_url, "shard-1") == 250, 90, "50 more trades while running")
    with Database(cluster.database_url) as db:
        assert get_instance(db, KEY.id)["beat_age_s"] < plan.heartbeat.timeout_s

    result = stop_instance(cluster, plan, "shard-1", "node-a", timeout_s=60)
    assert result.status == "STOPPED" and result.graceful, result
    assert group_members(job.submit_pid) == []
    assert instance_processes(KEY) == []
    with Database(cluster.database_url) as db:
        final = get_instance(db, KEY.id)
    assert final["status"] == "STOPPED" and final["stopped_at"] is not None
    assert "ended: STOPPED" in log_path.read_text(errors="replace")


def test_a_job_that_dies_before_running_raises_with_the_log_tail(launch_project, database_url, process_groups):
    cluster = load_cluster()
    broken = launch_project / "jobs" / "broken_run_plan.py"
    broken.write_text("import sys\nprint('boom: this plan cannot start', file=sys.stderr)\nsys.exit(3)\n")
    job = launch_instance(cluster, "trades", "shard-2", "node-b", application=broken, py_files=dist(launch_project))
    process_groups.append(job.submit_pid)
    with pytest.raises(LaunchError, match="boom: this plan cannot start") as caught:
        wait_until_running(cluster, "trades", "shard-2", "node-b", timeout_s=120)
    assert "exited while LAUNCHING" in str(caught.value)

    # The dead job is not reused: the next launch submits again (and is stopped straight away), in a scratch folder
    # emptied of what the dead one left there.
    leftover = scratch_dir(cluster, InstanceKey("trades", "shard-2", "node-b")) / "blockmgr-of-a-killed-driver"
    leftover.mkdir()
    second = launch_instance(cluster, "trades", "shard-2", "node-b", application=broken,
                             py_files=dist(launch_project))
    process_groups.append(second.submit_pid)
    assert not second.reused and second.submit_pid != job.submit_pid
    assert "process is gone" in second.reason
    assert not leftover.exists() and leftover.parent.is_dir()
    result = stop_instance(cluster, "trades/shard-2/node-b", timeout_s=20)
    assert result.status == "STOPPED"
    assert group_members(second.submit_pid) == []


def test_stop_kills_a_job_that_ignores_sigterm(launch_project, database_url, process_groups):
    cluster = load_cluster()
    stubborn = launch_project / "jobs" / "stubborn_run_plan.py"
    ready = launch_project / "jobs" / "stubborn.ready"
    stubborn.write_text(f"import os, signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                        f"open({str(ready)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    job = launch_instance(cluster, "trades", "shard-1", "node-b", application=stubborn, py_files=dist(launch_project))
    process_groups.append(job.submit_pid)
    wait_for(lambda: ready.exists() and ready.read_text().strip(), 90, "the application to ignore SIGTERM")
    driver = psutil.Process(int(ready.read_text()))
    assert os.getpgid(driver.pid) == job.submit_pid
    with Database(cluster.database_url) as db:
        db.run(lambda cursor: cursor.execute(
            "UPDATE plan_instances SET pid = %s, status = 'RUNNING' WHERE instance_id = %s",
            (driver.pid, "trades/shard-1/node-b")))
    started = time.monotonic()
    result = stop_instance(cluster, "trades", "shard-1", "node-b", timeout_s=6)
    assert not result.graceful and result.status == "STOPPED"
    assert time.monotonic() - started < 30
    assert group_members(job.submit_pid) == []
    with Database(cluster.database_url) as db:
        assert "SIGKILL" in get_instance(db, "trades/shard-1/node-b")["error"]


def test_stopping_a_hand_started_driver_never_signals_the_process_that_took_an_old_pid(
        launch_project, database_url, process_groups):
    """A PID recorded by an earlier launch may belong to any process by now (issue 9, item 1).

    The launcher recorded ``spark-submit`` with PID P; P exited and an unrelated ``setsid sleep``
    got P. An operator then starts the driver by hand, as the README shows. Stopping the instance
    must stop that driver and leave the sleep alone (it used to kill P's whole process group).
    """
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    bystander = subprocess.Popen(["setsid", "sleep", "600"], stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: psutil.Process(bystander.pid).name() == "sleep", 10, "the bystander to exec sleep")
        with Database(cluster.database_url) as db:
            migrate(db)
            register_nodes(db, cluster)
            record_launch(db, KEY, submit_pid=bystander.pid, submit_started_at=start_since_boot(bystander.pid),
                          log_path="/dev/null", launched_by="an earlier launch", trigger_interval_s=1.0,
                          checkpoint_root=str(cluster.storage_root))
        by_hand = subprocess.Popen(
            ["spark-submit", "--properties-file", str(cluster.spark_defaults), "--py-files", str(dist(launch_project)),
             str(REPO / "jobs" / "run_plan.py"), "--plan", "trades", "--node", "node-a", "--instance", "shard-1"],
            env=child_environment(cluster), cwd=launch_project, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        process_groups.append(by_hand.pid)

        def running() -> dict | None:
            with Database(cluster.database_url) as db:
                found = get_instance(db, KEY.id)
            return found if found["status"] == "RUNNING" else None

        wait_for(running, 240, "the hand-started driver to run")
        row = running()
        assert row["submit_pid"] is None, "the driver kept a submit PID that is not its parent"
        assert row["pid_started_at"] == pytest.approx(start_since_boot(row["pid"]), abs=0.05)

        result = stop_instance(cluster, plan, "shard-1", "node-a", timeout_s=60)
        assert result.status == "STOPPED" and result.graceful, result
        assert bystander.poll() is None, "the unrelated process that took the old PID was killed"
        by_hand.wait(timeout=60)
    finally:
        bystander.kill()
        bystander.wait()


def test_a_node_that_cannot_see_the_shared_storage_root_is_refused(launch_project, database_url, tmp_path,
                                                                    monkeypatch):
    """node-a's host set the storage root up; node-b's host mounted something else there (issue 12, item 2)."""
    from tandem.supervisor import LaunchRejected
    from tandem.shared_storage import MARKER_NAME, check_storage

    cluster = load_cluster()
    with Database(cluster.database_url) as db:
        migrate(db)
        assert check_storage(db, cluster, "node-a").action == "initialise"
    assert (cluster.storage_root / MARKER_NAME).is_file()

    monkeypatch.setenv("TANDEM_STORAGE_ROOT", str(tmp_path / "not-the-shared-storage"))
    elsewhere = load_cluster()
    with pytest.raises(LaunchRejected) as refused:
        launch_instance(elsewhere, "trades", "shard-1", "node-b", py_files=dist(launch_project))
    message = str(refused.value)
    assert "node node-b" in message and "not-the-shared-storage" in message and "missing on this host" in message
    monkeypatch.setenv("TANDEM_STORAGE_ROOT", str(cluster.storage_root))
    # Until node-b's host sees the storage, the plan starts nowhere: node-a is refused too, naming node-b.
    with pytest.raises(LaunchRejected, match=r"plan trades is not started: .*node-b \(host "):
        launch_instance(load_cluster(), "trades", "shard-1", "node-a", py_files=dist(launch_project))
    with Database(cluster.database_url) as db:
        assert get_instance(db, "trades/shard-1/node-a") is None and get_instance(db, "trades/shard-1/node-b") is None
        assert check_storage(db, cluster, "node-b").ok  # node-b's host fixed its mount


def test_first_launches_at_once_agree_on_one_storage_marker(project, database_url):
    """Four nodes checking a fresh storage root at the same moment: one token, in the file and in PostgreSQL
    (two first launches at once used to leave the file with the token whose INSERT lost). Five rounds."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    from tandem.shared_storage import MARKER_NAME, check_storage

    cluster = load_cluster()
    marker = cluster.storage_root / MARKER_NAME
    nodes = ["node-a", "node-b", "node-c", "node-d"]
    with Database(cluster.database_url) as db:
        migrate(db)
    for _ in range(5):
        with Database(cluster.database_url) as db:
            db.run(lambda cursor: cursor.execute("DELETE FROM storage_marker; DELETE FROM storage_checks"))
        marker.unlink(missing_ok=True)
        start = Barrier(len(nodes))

        def check(node: str, start: Barrier = start) -> str:
            with Database(cluster.database_url) as db:
                start.wait()
                return check_storage(db, cluster, node, host=f"host-{node}").action

        with ThreadPoolExecutor(len(nodes)) as pool:
            actions = list(pool.map(check, nodes))
        assert sorted(actions) == ["initialise", "ok", "ok", "ok"]
        with Database(cluster.database_url) as db:
            [recorded] = db.run(lambda cursor: (cursor.execute("SELECT token FROM storage_marker"),
                                                cursor.fetchall())[1])
            assert all(check_storage(db, cluster, node).ok for node in nodes)
        assert marker.read_text().strip() == recorded["token"]


def test_a_stop_request_is_for_the_run_it_was_made_against(project, database_url):
    """A request made while a launch is starting reaches its driver; one left from an ended run never
    stops the next run, launched or started by hand (issue 12, item 1)."""
    from datetime import datetime, timezone

    from tandem.store.heartbeats import beat
    from tandem.store.registry import record_start, record_status, request_stop

    cluster = load_cluster()
    started = datetime.now(timezone.utc)

    def start(db) -> None:
        record_start(db, KEY, host="h1", pid=4242, pid_started_at=1.0, ancestors=[], spark_app_id="app",
                     trigger_interval_s=1.0, checkpoint_root="/c")

    with Database(cluster.database_url) as db:
        migrate(db)
        register_nodes(db, cluster)
        assert not request_stop(db, KEY, "ops@h0")  # nothing recorded, nothing to ask
        record_launch(db, KEY, submit_pid=1, submit_started_at=1.0, log_path="/l", launched_by="t",
                      trigger_interval_s=1.0, checkpoint_root="/c")
        assert request_stop(db, KEY, "ops@h0")  # asked while LAUNCHING ...
        start(db)
        assert beat(db, KEY.id, "h1", 4242, started) == "ops@h0"  # ... the driver reads it with its first beat
        record_status(db, KEY, "STOPPED", "stopped at the request of ops@h0")
        start(db)  # started again by hand after that run ended
        assert beat(db, KEY.id, "h1", 4242, started) is None
        assert request_stop(db, KEY, "ops@h2")
        record_status(db, KEY, "STOPPED")
        record_launch(db, KEY, submit_pid=2, submit_started_at=2.0, log_path="/l", launched_by="t",
                      trigger_interval_s=1.0, checkpoint_root="/c")
        start(db)
        assert beat(db, KEY.id, "h1", 4242, started) is None  # a new launch starts without the old request


def test_the_logged_spark_submit_command_carries_no_secret_of_the_nodes_connection(project, database_url,
                                                                                    monkeypatch):
    """A node's Spark connection whose master URL carries a password: every line the launch logs (the launcher's
    and the provider's own "Spark-Submit cmd"), and the header of the job's log file, show the command without it.
    The connection names a spark-submit binary that is not installed, so the launch ends where it would start the
    process: everything is logged before that, and no Spark starts."""
    import logging
    from logging.handlers import BufferingHandler

    import airflow.providers.apache.spark.hooks.spark_submit  # noqa: F401 - Airflow sets logging up on import
    from structlog.testing import capture_logs

    cluster = load_cluster()
    password = f"pw-{MARKER}"
    monkeypatch.setenv("AIRFLOW_CONN_TANDEM_NODE_A", json.dumps({
        "conn_type": "spark", "host": f"spark://tandem:{password}@127.0.0.1", "port": 7077,
        "extra": {"spark-binary": "spark3-submit"}}))
    (project / "jobs").mkdir()
    for stand_in in (project / "jobs" / "run_plan.py", project / "dist" / "tandem.zip"):
        stand_in.parent.mkdir(exist_ok=True)
        stand_in.write_text("never run\n")
    records = BufferingHandler(1000)
    records.setLevel(logging.DEBUG)
    root = logging.getLogger()
    root.addHandler(records)
    levels = {name: logging.getLogger(name).level for name in ("", "tandem", "airflow")}
    for name in levels:
        logging.getLogger(name).setLevel(logging.INFO)
    try:
        with pytest.raises(LaunchError, match="cannot start 'spark3-submit'") as failed, capture_logs() as events:
            launch_instance(cluster, "trades", "shard-1", "node-a", py_files=project / "dist" / "tandem.zip",
                            application=project / "jobs" / "run_plan.py")
    finally:
        root.removeHandler(records)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    # the launcher logs through the standard library, the provider's hook through structlog (Airflow's task logs
    # take both)
    logged = [record.getMessage() for record in records.buffer] + [
        str(event["event"]) % tuple(event.get("positional_args") or ()) for event in events]
    assert not [line for line in logged if MARKER in line], "a password of the node's connection reached a log"
    commands = [line for line in logged if "--master" in line]
    assert len(commands) == 2, ("the launcher's and the provider's command lines", logged)
    assert all("--master spark://tandem@127.0.0.1:7077 " in line for line in commands), commands
    [job_log] = (cluster.storage_root / "logs" / "trades" / "shard-1").glob("node-a-*.log")
    header = job_log.read_text()
    assert "--master spark://tandem@127.0.0.1:7077 " in header and MARKER not in header
    assert MARKER not in str(failed.value)
