"""PIDs recorded on another host are never signalled here, even under this host's name (issue 60), against a real
PostgreSQL: a driver's row that records another host's identity with this host's name leaves the local process that
has its PID alone (``tandem stop``, ``tandem kill``); recorded with this host's identity, the same process is the
instance's. And ``tandem.spark_cluster.stop_daemon`` signals a recorded daemon's group only while its leader is that
daemon (its start time and command line): a process that does not run the daemon's class is left alone."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tandem.config import load_cluster
from tandem.host_identity import this_host_id
from tandem.process_start import start_since_boot
from tandem.spark_cluster import WORKER_CLASS, Daemon, stop_daemon
from tandem.store import Database, migrate
from tandem.store.registry import InstanceKey, get_instance, record_start, register_nodes
from tandem.supervisor import stop_instance
from tandem.supervisor.stopping import kill_instance

pytestmark = pytest.mark.integration
KEY = InstanceKey("trades", "shard-1", "node-a")
SLEEP = "import time; time.sleep(120)"


def sleeper(process_groups, *args: str) -> subprocess.Popen:
    """A process leading a session of its own, whose command line carries ``args`` (as a driver's or a daemon's)."""
    process = subprocess.Popen([sys.executable, "-c", SLEEP, *args], start_new_session=True)
    process_groups.append(process.pid)
    deadline = time.monotonic() + 10
    while args[-1] not in psutil.Process(process.pid).cmdline() and time.monotonic() < deadline:
        time.sleep(0.02)
    return process


def test_a_driver_recorded_by_another_host_of_the_same_name_is_not_signalled_here(project: Path,
                                                                                   process_groups) -> None:
    cluster = load_cluster()
    driver = sleeper(process_groups, "/srv/tandem/jobs/run_plan.py", "--plan", KEY.plan, "--instance", KEY.instance,
                     "--node", KEY.node)
    with Database(cluster.database_url) as db:
        migrate(db)
        register_nodes(db, cluster)

        def start(host_id: str | None) -> None:
            record_start(db, KEY, host=socket.gethostname(), host_id=host_id, pid=driver.pid,
                         pid_started_at=start_since_boot(driver.pid), ancestors=[], spark_app_id="app",
                         trigger_interval_s=1.0, checkpoint_root="/c")

        start("0ther0machine/another-boot/4026531836")  # a twin: same host name, another machine
        assert kill_instance(cluster, KEY) == 0
        stopped = stop_instance(cluster, KEY, timeout_s=2.0)
        assert driver.poll() is None, "the process with another host's PID was signalled"
        assert not stopped.confirmed and "is down or cut off" in stopped.detail
        assert get_instance(db, KEY.id)["host_id"] == "0ther0machine/another-boot/4026531836"

        start(this_host_id())  # recorded here: the same process is the instance's
        assert kill_instance(cluster, KEY) == 1
        assert driver.wait(timeout=10) == -9


def test_a_spark_daemon_is_stopped_only_while_its_recorded_process_is_that_daemon(tmp_path: Path,
                                                                                  process_groups) -> None:
    other = sleeper(process_groups, "--not-a-spark-daemon")
    recorded = Daemon("worker-1", other.pid, str(tmp_path / "w.log"), start_since_boot(other.pid), this_host_id())
    stop_daemon(recorded, wait_s=1.0)  # the PID is a process that runs no worker: left alone
    assert other.poll() is None
    stop_daemon(Daemon("worker-1", other.pid, "", None), wait_s=1.0)  # no start time: cannot be verified
    assert other.poll() is None

    worker = sleeper(process_groups, WORKER_CLASS)
    stop_daemon(Daemon("worker-1", worker.pid, "", start_since_boot(worker.pid) - 5.0, this_host_id()), wait_s=1.0)
    assert worker.poll() is None, "a process that started after the recorded one was signalled"
    stop_daemon(Daemon("worker-1", worker.pid, "", start_since_boot(worker.pid), this_host_id()), wait_s=5.0)
    assert start_since_boot(worker.pid) is None, "the verified daemon was not stopped"  # (and reaped: our child)
