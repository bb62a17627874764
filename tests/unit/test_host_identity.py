"""Which host a recorded PID is local to (issue 60): the recorded host identity decides, not the host name; and a
Spark daemon's recorded process group is signalled only while its leader is still that daemon (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tandem.host_identity import pids_are_local, read_host_id
from tandem.spark_cluster import MASTER_CLASS, WORKER_CLASS, Daemon, daemon_refusal

HERE = "m1/b1/4026531836"


@pytest.mark.parametrize(("host", "host_id", "local"), [
    ("node-1", HERE, True),                    # recorded here
    ("node-1", "m2/b7/4026531836", False),     # another machine of the same name
    ("node-1", "m1/b0/4026531836", False),     # this machine before its last boot: its PIDs are gone
    ("node-1", "m1/b1/4026532000", False),     # a container of this machine, with PID namespace of its own
    ("other", HERE, False),                    # another host name on this kernel (a namespace with its own name)
    ("node-1", None, True),                    # recorded before identities were: its name is this one's
    ("other", None, False),
    (None, None, True),                        # names no host
])
def test_a_pid_is_local_where_its_recorded_name_and_identity_are_this_hosts(
        host: str | None, host_id: str | None, local: bool) -> None:
    assert pids_are_local(host, host_id, "node-1", HERE) is local


def test_a_host_with_no_identity_of_its_own_takes_none_recorded_with_one_for_its_own() -> None:
    assert not pids_are_local("node-1", HERE, "node-1", None)
    assert pids_are_local("node-1", None, "node-1", None)


def test_the_identity_is_the_machine_the_boot_and_the_pid_namespace(tmp_path: Path) -> None:
    machine, boot, namespace = tmp_path / "machine-id", tmp_path / "boot_id", tmp_path / "pid"
    machine.write_text("0123abcd\n")
    boot.write_text("5f1c-77\n")
    namespace.symlink_to("pid:[4026531836]")
    found = read_host_id([str(tmp_path / "none"), str(machine)], str(boot), str(namespace))
    assert found == "0123abcd/5f1c-77/4026531836"
    assert read_host_id([str(tmp_path / "none")], str(boot), str(tmp_path / "no-ns")) == "-/5f1c-77/-"
    assert read_host_id([str(machine)], str(tmp_path / "no-boot"), str(namespace)) is None


WORKER = Daemon("worker-1", 4242, "/l/worker-1.log", started_at=120.5, host_id=HERE)
RUNS_WORKER = ["java", "-cp", "x", WORKER_CLASS, "--cores", "2"]


@pytest.mark.parametrize(("daemon", "started", "leads", "cmdline", "refusal"), [
    (WORKER, 120.5, True, RUNS_WORKER, None),
    (WORKER, 120.5, True, ["bash", "spark-class", WORKER_CLASS], None),  # before spark-class execs java
    (WORKER, 120.5, True, ["java", MASTER_CLASS], "does not run org.apache.spark.deploy.worker.Worker"),
    (WORKER, 3071.2, True, RUNS_WORKER, "its PID is another process's now"),
    (WORKER, None, False, [], "is gone"),
    (WORKER, 120.5, False, RUNS_WORKER, "no longer leads its own process group"),
    (Daemon("worker-1", 4242, "/l", started_at=120.5, host_id="m2/b7/1"), 120.5, True, RUNS_WORKER,
     "recorded on another host (m2/b7/1; this one is m1/b1/4026531836)"),
    (Daemon("master", 4242, "/l"), 120.5, True, ["java", MASTER_CLASS], "recorded without its start time"),
])
def test_a_daemons_group_is_signalled_only_while_its_leader_is_the_recorded_daemon(
        daemon: Daemon, started: float | None, leads: bool, cmdline: list[str], refusal: str | None) -> None:
    found = daemon_refusal(daemon, HERE, started, leads, cmdline)
    assert found is None if refusal is None else refusal in found, found
