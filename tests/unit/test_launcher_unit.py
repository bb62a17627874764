"""The launcher's pure parts: the launch decision, the command line, process matching, paths."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tandem.config import load_cluster, load_plan
from tandem.store.registry import InstanceKey
from tandem.supervisor.launch_decision import decide_launch
from tandem.supervisor.launcher import LaunchError, LaunchRejected, launch_instance, log_path_for
from tandem.supervisor.processes import is_instance_cmdline, runs_instance
from tandem.errors import PathOutsideRoot
from tandem.supervisor.submit_command import (application_args, build_submit_command, child_environment,
                                             reset_scratch_dir, scratch_dir)

PROJECT = Path(__file__).resolve().parents[2]
KEY = InstanceKey("trades", "shard-1", "node-a")


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The real conf/ copied into a temp project (no database is touched by these tests)."""
    shutil.copytree(PROJECT / "conf", tmp_path / "conf")
    for name in ("TANDEM_HOME", "TANDEM_CONF_DIR", "TANDEM_STORAGE_ROOT", "TANDEM_DATABASE_URL", "TANDEM_SCRATCH_DIR"):
        monkeypatch.delenv(name, raising=False)
    return load_cluster(tmp_path / "conf" / "cluster.yaml")


# --- decide_launch -------------------------------------------------------------------------------

@pytest.mark.parametrize("status", ["LAUNCHING", "STARTING", "RUNNING"])
def test_reuses_an_active_instance_whose_process_is_alive(status):
    decision = decide_launch(status, process_alive=True, beat_age_s=None,
                             heartbeat_timeout_s=3.0, recorded_here=True)
    assert decision.reuse and decision.action == "reuse"
    assert "alive" in decision.reason


@pytest.mark.parametrize("status", ["STARTING", "RUNNING"])
def test_reuses_an_instance_of_another_host_with_a_fresh_beat(status):
    decision = decide_launch(status, process_alive=False, beat_age_s=1.2, heartbeat_timeout_s=3.0,
                             recorded_here=False)
    assert decision.reuse
    assert "1.2s old" in decision.reason


@pytest.mark.parametrize("status", ["STARTING", "RUNNING"])
def test_launches_when_the_process_here_is_gone_even_with_a_fresh_beat(status):
    # kill -9 a moment ago: the beat is recent, but this host sees that the job is dead
    decision = decide_launch(status, process_alive=False, beat_age_s=1.2, heartbeat_timeout_s=3.0,
                             recorded_here=True)
    assert not decision.reuse
    assert "process is gone from this host" in decision.reason and "1.2s old" in decision.reason


def test_launches_when_nothing_was_recorded():
    decision = decide_launch(None, process_alive=False, beat_age_s=None,
                             heartbeat_timeout_s=3.0, recorded_here=True)
    assert not decision.reuse and decision.action == "launch"
    assert decision.reason == "no instance recorded yet"


@pytest.mark.parametrize("status", ["STOPPED", "FAILED"])
def test_launches_after_the_previous_run_ended_even_if_a_process_lingers(status):
    decision = decide_launch(status, process_alive=True, beat_age_s=0.5,
                             heartbeat_timeout_s=3.0, recorded_here=True)
    assert not decision.reuse
    assert status in decision.reason


def test_launches_when_an_active_row_has_no_process_and_a_stale_beat():
    decision = decide_launch("RUNNING", process_alive=False, beat_age_s=3.0, heartbeat_timeout_s=3.0,
                             recorded_here=False)
    assert not decision.reuse
    assert "process is gone" in decision.reason and "3.0s old" in decision.reason


def test_launches_when_a_launch_died_before_its_first_beat():
    decision = decide_launch("LAUNCHING", process_alive=False, beat_age_s=None,
                             heartbeat_timeout_s=3.0, recorded_here=True)
    assert not decision.reuse
    assert "never beat" in decision.reason


# --- command line --------------------------------------------------------------------------------

def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_command_falls_back_to_the_node_master_without_an_airflow_connection(cluster, monkeypatch, tmp_path):
    monkeypatch.delenv("AIRFLOW_CONN_TANDEM_NODE_A", raising=False)
    node = cluster.node("node-a")
    command = build_submit_command(cluster, node, KEY, 1.5, py_files=tmp_path / "dist" / "tandem.zip",
                                   application=tmp_path / "jobs" / "run_plan.py")
    argv = command.argv
    assert argv[0] == "spark-submit"
    assert command.master == node.spark_master == _flag(argv, "--master")
    assert "cluster.yaml" in command.master_source and "tandem_node_a" in command.master_source
    assert _flag(argv, "--properties-file") == str(cluster.spark_defaults)
    assert _flag(argv, "--py-files") == str(tmp_path / "dist" / "tandem.zip")
    assert _flag(argv, "--driver-memory") == node.driver_memory
    assert _flag(argv, "--name") == "tandem:trades/shard-1/node-a"
    app = argv.index(str(tmp_path / "jobs" / "run_plan.py"))
    assert argv[app + 1:] == ["--plan", "trades", "--node", "node-a", "--instance", "shard-1",
                              "--trigger-interval", "1500 milliseconds", "--role", "ACTIVE"]
    assert "--packages" not in argv and "--deploy-mode" not in argv


def test_command_takes_the_master_from_the_nodes_airflow_connection(cluster, monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_CONN_TANDEM_NODE_B", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    command = build_submit_command(cluster, cluster.node("node-b"), InstanceKey("trades", "shard-2", "node-b"), 2.0,
                                   py_files=tmp_path / "t.zip", application=tmp_path / "run_plan.py")
    assert command.master == "local[1]" == _flag(command.argv, "--master")
    assert command.master_source == "Airflow connection 'tandem_node_b'"
    assert _flag(command.argv, "--trigger-interval") == "2 seconds"


@pytest.mark.parametrize("master", ["local[2]", "spark://10.0.0.5:7077", "yarn", "local-cluster[2,1,1024]"])
def test_fallback_keeps_any_master_url_as_written(cluster, monkeypatch, tmp_path, master):
    from tandem.config import NodeConfig

    monkeypatch.delenv("AIRFLOW_CONN_TANDEM_NODE_X", raising=False)
    node = NodeConfig(name="node-x", spark_master=master, airflow_conn_id="tandem_node_x", driver_memory="2g")
    command = build_submit_command(cluster, node, InstanceKey("trades", "shard-1", "node-x"), 1.0,
                                   py_files=tmp_path / "t.zip", application=tmp_path / "run_plan.py")
    assert command.master == master == _flag(command.argv, "--master")
    assert _flag(command.argv, "--driver-memory") == "2g"


def test_application_args_round_trip_through_the_job_parser():
    from tandem.declarations import parse_duration

    args = application_args(KEY, 0.5, "PASSIVE")
    assert args[:6] == ["--plan", "trades", "--node", "node-a", "--instance", "shard-1"]
    assert parse_duration(args[args.index("--trigger-interval") + 1]) == 0.5
    assert args[-2:] == ["--role", "PASSIVE"]


# --- process matching, environment, paths --------------------------------------------------------

def test_cmdline_matches_only_the_same_instance():
    java = ["/usr/bin/java", "-cp", "x", "org.apache.spark.deploy.SparkSubmit", "--master", "local[2]", "--name",
            "tandem:trades/shard-1/node-a", "/p/jobs/run_plan.py", "--plan", "trades", "--node", "node-a",
            "--instance", "shard-1", "--trigger-interval", "1 seconds"]
    assert is_instance_cmdline(java, KEY)
    assert is_instance_cmdline([arg.replace("--instance", "--instance") for arg in java], KEY)  # launched before --instance
    assert is_instance_cmdline(["python", "/p/jobs/run_plan.py", "--instance", "shard-1", "--plan", "trades",
                                "--node", "node-a"], KEY)
    assert not is_instance_cmdline(java, InstanceKey("trades", "shard-2", "node-a"))
    assert not is_instance_cmdline(java, InstanceKey("trades", "shard-1", "node-b"))
    assert not is_instance_cmdline(["python", "other.py", "--plan", "trades", "--node", "node-a", "--instance",
                                    "shard-1"], KEY)
    assert not is_instance_cmdline([], KEY)


class ExecingProcess:
    """A stand-in for a process in the middle of spark-submit's execs: no command line for its first reads."""

    def __init__(self, empty_reads: int, cmdline: list[str]) -> None:
        self.empty_reads, self.full, self.reads = empty_reads, cmdline, 0

    def cmdline(self) -> list[str]:
        self.reads += 1
        return [] if self.reads <= self.empty_reads else self.full


def test_a_process_between_two_execs_is_still_the_instances():
    driver = ["python", "/p/jobs/run_plan.py", "--plan", "trades", "--node", "node-a", "--instance", "shard-1"]
    between = ExecingProcess(3, driver)
    assert runs_instance(between, KEY, window_s=5, poll_s=0.001) and between.reads == 4
    assert not runs_instance(ExecingProcess(3, driver), InstanceKey("trades", "shard-2", "node-a"), window_s=5,
                             poll_s=0.001)
    gone_for_good = ExecingProcess(10**9, driver)  # a process whose command line stays empty is not the instance's
    assert not runs_instance(gone_for_good, KEY, window_s=0.05, poll_s=0.001) and gone_for_good.reads > 1


def test_child_environment_resolves_tandem_settings_and_this_python(cluster):
    needed = {"PATH": "/usr/bin", "HOME": "/home/t", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TZ": "UTC",
              "JAVA_HOME": "/jvm", "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": "/lib"}
    secrets = {"AIRFLOW__API_AUTH__JWT_SECRET": "s", "AIRFLOW__CORE__FERNET_KEY": "s", "AIRFLOW_CONN_TANDEM_NODE_A": "s",
               "TANDEM_AIRFLOW_DB_URL": "postgresql://u:s@db/airflow", "PYSPARK_GATEWAY_SECRET": "s",
               "AWS_SECRET_ACCESS_KEY": "s", "TANDEM_DATABASE_URL": "postgresql://u:stale@db/x", "KEEP": "1"}
    env = child_environment(cluster, base={**needed, **secrets})
    assert set(env) == {*needed, "TANDEM_HOME", "TANDEM_CONF_DIR", "TANDEM_PLANS_DIR", "TANDEM_STORAGE_ROOT",
                        "TANDEM_DATABASE_URL", "TANDEM_NATS_URL", "TANDEM_NATS_INBOX_PREFIX", "PYSPARK_PYTHON",
                        "PYSPARK_DRIVER_PYTHON"}
    assert env["TANDEM_NATS_URL"] == ",".join(cluster.nats.servers)  # the shipped cluster names a NATS server
    assert all(env[name] == value for name, value in needed.items() if name != "PATH")
    assert env["TANDEM_HOME"] == str(cluster.project_root)
    assert env["TANDEM_CONF_DIR"] == str(cluster.conf_dir)
    assert env["TANDEM_PLANS_DIR"] == str(cluster.conf_dir / "plans")  # the driver finds the plans where we did
    assert env["TANDEM_STORAGE_ROOT"] == str(cluster.storage_root)
    assert env["TANDEM_DATABASE_URL"] == cluster.database_url
    assert env["PYSPARK_PYTHON"] == sys.executable
    assert env["PATH"].split(os.pathsep) == [str(Path(sys.executable).parent), "/usr/bin"]


def test_a_driver_keeps_its_temporary_files_in_its_instance_scratch_folder(cluster):
    scratch = Path("/scratch/trades/shard-1/node-a")
    env = child_environment(cluster, base={"TMPDIR": "/tmp", "SPARK_SUBMIT_OPTS": "-XX:SharedArchiveFile=/a.jsa "},
                            scratch=scratch)
    assert env["TMPDIR"] == str(scratch)
    assert env["SPARK_SUBMIT_OPTS"] == "-XX:SharedArchiveFile=/a.jsa -Djava.io.tmpdir=/scratch/trades/shard-1/node-a"
    assert child_environment(cluster, base={}, scratch=scratch)["SPARK_SUBMIT_OPTS"] == f"-Djava.io.tmpdir={scratch}"
    spaced = child_environment(cluster, base={}, scratch=Path('/my "temp" dir'))["SPARK_SUBMIT_OPTS"]
    assert spaced == '"-Djava.io.tmpdir=/my \\"temp\\" dir"'  # one option to Spark's launcher, which splits on spaces
    assert "SPARK_SUBMIT_OPTS" not in child_environment(cluster, base={})


def test_scratch_folders_are_per_instance_on_the_host_and_apart_per_project(cluster, tmp_path, monkeypatch):
    place = scratch_dir(cluster, KEY)
    assert place.parent.parent.parent == cluster.scratch_root
    assert place.parts[-3:] == ("trades", "shard-1", "node-a")
    assert cluster.scratch_root.parent == Path(tempfile.gettempdir())  # local disk, not the shared storage root
    monkeypatch.setenv("TANDEM_STORAGE_ROOT", str(tmp_path / "another-root"))
    assert load_cluster(cluster.path).scratch_root != cluster.scratch_root
    monkeypatch.setenv("TANDEM_SCRATCH_DIR", str(tmp_path / "fast-disk"))
    assert scratch_dir(load_cluster(cluster.path), KEY) == tmp_path / "fast-disk" / "trades" / "shard-1" / "node-a"
    monkeypatch.setenv("TANDEM_SCRATCH_DIR", "scratch")  # relative: to the project root, wherever the command runs
    monkeypatch.chdir(tmp_path)
    assert load_cluster(cluster.path).scratch_root == cluster.project_root / "scratch"
    with pytest.raises(PathOutsideRoot, match="cannot name a folder under the scratch root"):
        scratch_dir(cluster, InstanceKey("trades", "..", "node-a"))


def test_a_launch_starts_with_an_empty_scratch_folder(tmp_path):
    place = tmp_path / "trades" / "shard-1" / "node-a"
    (place / "blockmgr-left-by-a-killed-driver").mkdir(parents=True)
    (place / "librocksdbjni123.so").write_bytes(b"x")
    assert reset_scratch_dir(place) == place and place.is_dir() and list(place.iterdir()) == []
    assert reset_scratch_dir(tmp_path / "new") == tmp_path / "new" and (tmp_path / "new").is_dir()


def test_log_path_is_per_plan_instance_and_node_with_a_utc_timestamp(cluster):
    moment = datetime(2025, 3, 4, 5, 6, 7, 891000, tzinfo=timezone.utc)
    path = log_path_for(cluster, KEY, moment)
    assert path == cluster.storage_root / "logs" / "trades" / "shard-1" / "node-a-20250304T050607.891Z.log"


def test_launch_without_dist_says_run_make_dist(cluster):
    with pytest.raises(LaunchError, match="run `make dist`"):
        launch_instance(cluster, "trades", "shard-1", "node-a")


def test_launch_rejects_a_instance_or_node_outside_the_plan(cluster):
    plan = load_plan("trades", cluster)
    with pytest.raises(LaunchRejected, match=r"trades.yaml: groups: 'shard-9' is not an instance of plan trades"):
        launch_instance(cluster, plan, "shard-9", "node-a")
    with pytest.raises(LaunchRejected, match=r"trades.yaml: nodes: 'node-z' is not a node of plan trades"):
        launch_instance(cluster, plan, "shard-1", "node-z")


def test_launch_rejects_a_bad_trigger_interval(cluster):
    with pytest.raises(LaunchError, match="trigger interval: expected a duration"):
        launch_instance(cluster, "trades", "shard-1", "node-a", "soon")
