"""Launch plan instances as detached ``spark-submit`` processes, find them again, stop them.

Purpose
    A streaming plan instance (plan × shard × node) runs for days; the task that starts it must
    not wait for it. ``SparkSubmitOperator`` waits for ``spark-submit`` to exit whenever the driver
    runs in client mode (the only mode for PySpark on local and standalone masters), so Tandem
    starts the job itself and lets it outlive the caller.

How it works
    ``launch_instance`` takes a PostgreSQL advisory lock for the instance, observes the instance
    row (status, PIDs, liveness beat) and the local processes, and lets the pure
    :func:`decide_launch` choose between reusing the job that is already there and launching a new
    one. A launch builds the command with the apache-spark provider's ``SparkSubmitHook`` (master
    from the node's Airflow connection, or from ``spark_master`` in ``cluster.yaml`` when no
    connection is available, e.g. from the CLI), starts it in a new session (its own process
    group) with output to ``<storage_root>/logs/<plan>/<shard>/<node>-<UTC time>.log``, and
    records it (status LAUNCHING, ``submit_pid``, log path). The driver then records STARTING,
    RUNNING, its host, PID, Spark application id and a liveness beat itself.

What it does not do
    It does not decide roles or fail over, and it does not restart a job that died: a later
    launch does that. PIDs are only meaningful on the host that recorded them; for an instance on
    another host only the liveness beat tells whether it is alive.
"""

from __future__ import annotations

import getpass
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

from tandem.config import ClusterConfig, NodeConfig, PlanConfig, load_plan, parse_duration, spark_interval
from tandem.errors import ConfigError, TandemError
from tandem.layout import checkpoint_dir, logs_dir
from tandem.names import ACTIVE
from tandem.store.db import Database
from tandem.store.locks import AdvisoryLock
from tandem.store.migrations import migrate
from tandem.store.registry import (InstanceKey, get_instance, record_launch, record_status, register_nodes,
                                   request_stop)
from tandem.supervisor.storage import StorageNotShared, require_shared_storage

log = logging.getLogger(__name__)

ACTIVE_STATUSES = ("LAUNCHING", "STARTING", "RUNNING")
ENDED_STATUSES = ("STOPPED", "FAILED", "BLOCKED")
APPLICATION_SCRIPT = "run_plan.py"
DRIVER_ENVIRONMENT = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH",  # the process
    "JAVA_HOME", "HADOOP_CONF_DIR", "YARN_CONF_DIR",  # spark-submit and the JVM
    "PYTHONPATH", "PYTHONHASHSEED",  # the Python driver and its workers
})
"""The variables a driver takes from its launcher's environment as they are, besides ``LC_*`` and ``SPARK_*``
(:data:`DRIVER_ENVIRONMENT_PREFIXES`). Nothing else passes: not Airflow's settings and secrets
(``AIRFLOW__API_AUTH__JWT_SECRET``, ``AIRFLOW_CONN_*``), not the other ``TANDEM_*`` variables
(``TANDEM_AIRFLOW_DB_URL`` may hold a password), not a parent driver's ``PYSPARK_GATEWAY_SECRET``. Java
options go through ``conf/spark-defaults.conf`` (``spark.driver.extraJavaOptions``) or ``SPARK_SUBMIT_OPTS``."""
DRIVER_ENVIRONMENT_PREFIXES = ("LC_", "SPARK_")
_children: dict[int, subprocess.Popen] = {}  # processes this interpreter started, reaped on observation


class LaunchError(TandemError):
    """A plan instance could not be launched, did not reach RUNNING, or could not be stopped."""


class LaunchRejected(LaunchError):
    """The launch request itself is invalid (shard or node outside the plan, bad trigger interval)."""


@dataclass(frozen=True)
class LaunchDecision:
    """What :func:`decide_launch` chose: ``reuse`` the existing job or ``launch`` a new one, and why."""

    action: str  # reuse | launch
    reason: str

    @property
    def reuse(self) -> bool:
        return self.action == "reuse"


def decide_launch(status: str | None, process_alive: bool, beat_age_s: float | None,
                  heartbeat_timeout_s: float, *, recorded_here: bool) -> LaunchDecision:
    """Reuse the recorded job when it is still alive, otherwise launch (pure).

    Args:
        status: the instance row's status, ``None`` when the instance was never recorded.
        process_alive: whether the recorded ``spark-submit`` or driver process is still alive on this
            host (same PID, same start time, a command line that runs this instance).
        beat_age_s: seconds since the driver's last liveness beat, ``None`` when it never beat.
        heartbeat_timeout_s: the plan's heartbeat timeout (interval × max missed beats).
        recorded_here: the job was recorded on this host, so ``process_alive`` is the whole truth; a
            recent beat then only means the job died a moment ago (e.g. ``kill -9``), not that it lives.
    """
    if status is None:
        return LaunchDecision("launch", "no instance recorded yet")
    if status not in ACTIVE_STATUSES:
        return LaunchDecision("launch", f"previous run ended ({status})")
    if process_alive:
        return LaunchDecision("reuse", f"{status} and its process is alive")
    beat = "it never beat" if beat_age_s is None else f"its last beat is {beat_age_s:.1f}s old"
    if recorded_here:
        return LaunchDecision("launch", f"{status} but its process is gone from this host ({beat})")
    if beat_age_s is not None and beat_age_s < heartbeat_timeout_s:
        return LaunchDecision(
            "reuse", f"{status} and its liveness beat is {beat_age_s:.1f}s old (< {heartbeat_timeout_s:g}s timeout)")
    return LaunchDecision("launch", f"{status} but its process is gone and {beat} (>= {heartbeat_timeout_s:g}s)")


@dataclass(frozen=True)
class SubmitCommand:
    """A ``spark-submit`` command line and where its master URL came from."""

    argv: list[str]
    master: str
    master_source: str


@dataclass(frozen=True)
class LaunchedJob:
    """The job of one plan instance, just launched (``reused`` False) or found running (True)."""

    instance_id: str
    reused: bool
    reason: str
    status: str
    submit_pid: int | None
    pid: int | None
    spark_app_id: str | None
    log_path: str | None
    command: list[str] | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, reused: bool, reason: str,
                 command: list[str] | None = None) -> "LaunchedJob":
        return cls(instance_id=row["instance_id"], reused=reused, reason=reason, status=row["status"],
                   submit_pid=row.get("submit_pid"), pid=row.get("pid"), spark_app_id=row.get("spark_app_id"),
                   log_path=row.get("log_path"), command=command)


@dataclass(frozen=True)
class StopResult:
    """How a stop ended. ``confirmed`` is False when the instance's host did not answer (no liveness
    beat): the row says STOPPED, but whether its processes still run there is unknown."""

    instance_id: str
    status: str | None
    graceful: bool
    detail: str
    confirmed: bool = True


def application_args(key: InstanceKey, trigger_interval_s: float, role: str = ACTIVE) -> list[str]:
    """The arguments of ``jobs/run_plan.py`` for one instance."""
    return ["--plan", key.plan, "--node", key.node, "--instance", key.shard_id,
            "--trigger-interval", spark_interval(trigger_interval_s), "--role", role]


def is_instance_cmdline(cmdline: Iterable[str], key: InstanceKey) -> bool:
    """Whether a process command line runs ``run_plan.py`` for exactly this instance (pure; ``--shard``, the
    instance's flag before ``--instance``, still counts: a driver launched before an upgrade is still known)."""
    args = ["--instance" if arg == "--shard" else arg for arg in cmdline]
    if not any(arg.endswith(APPLICATION_SCRIPT) for arg in args):
        return False
    wanted = {"--plan": key.plan, "--node": key.node, "--instance": key.shard_id}
    found = {flag: args[i + 1] for i, flag in enumerate(args[:-1]) if flag in wanted}
    return found == wanted


def log_path_for(cluster: ClusterConfig, key: InstanceKey, now: datetime) -> Path:
    """``<storage_root>/logs/<plan>/<shard>/<node>-<UTC timestamp>.log``."""
    stamp = now.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")[:-3] + "Z"
    return logs_dir(cluster, key.plan, key.shard_id) / f"{key.node}-{stamp}.log"


def build_submit_command(cluster: ClusterConfig, node: NodeConfig, key: InstanceKey, trigger_interval_s: float, *,
                         py_files: Path, application: Path, role: str = ACTIVE) -> SubmitCommand:
    """The ``spark-submit`` command of one instance, assembled by the provider's ``SparkSubmitHook``.

    The master comes from the node's Airflow connection (``node.airflow_conn_id``); when that
    connection cannot be read (not defined, or no Airflow around), from ``node.spark_master``.
    """
    hook = _node_submit_hook(
        fallback_master=node.spark_master,
        conn_id=node.airflow_conn_id,
        properties_file=str(cluster.spark_defaults),
        py_files=str(py_files),
        driver_memory=node.driver_memory,
        name=f"tandem:{key.id}",
        application_args=application_args(key, trigger_interval_s, role),
    )
    argv = hook._build_spark_submit_command(str(application))
    if hook.connection_error is None:
        source = f"Airflow connection {node.airflow_conn_id!r}"
    else:
        source = f"cluster.yaml nodes.{node.name}.spark_master (connection {node.airflow_conn_id!r} unavailable)"
    return SubmitCommand(argv=argv, master=hook._connection["master"], master_source=source)


def _node_submit_hook(*, fallback_master: str, **kwargs: Any):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk import Connection

    class NodeSparkSubmitHook(SparkSubmitHook):
        """``SparkSubmitHook`` that reads the node's ``spark_master`` when its connection is unavailable.

        The stand-in is an ordinary ``spark`` connection whose host is the master URL, so the
        provider resolves it exactly as one defined in Airflow.
        """

        def __init__(self, **hook_kwargs: Any) -> None:
            self.connection_error: str | None = "not looked up"
            super().__init__(**hook_kwargs)

        def get_connection(self, conn_id: str):  # shadows the classmethod for this hook's lookup
            try:
                connection = SparkSubmitHook.get_connection(conn_id)
            except Exception as exc:  # not defined, or no Airflow secrets/API reachable from here
                self.connection_error = f"{type(exc).__name__}: {exc}"
                return Connection(conn_id=conn_id, conn_type="spark", host=fallback_master,
                                  description="stand-in built from cluster.yaml")
            self.connection_error = None
            return connection

    return NodeSparkSubmitHook(**kwargs)


def child_environment(cluster: ClusterConfig, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A driver's environment: what it needs of the launcher's (``base``, default ``os.environ``; see
    :data:`DRIVER_ENVIRONMENT`), the resolved Tandem settings it reads, and this interpreter for PySpark.

    ``TANDEM_DATABASE_URL`` may hold a password: it reaches the driver here, never on its command line.
    """
    inherited = os.environ if base is None else base
    env = {name: value for name, value in inherited.items()
           if name in DRIVER_ENVIRONMENT or name.startswith(DRIVER_ENVIRONMENT_PREFIXES)}
    python_bin = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    env.update({
        "TANDEM_HOME": str(cluster.project_root),
        "TANDEM_CONF_DIR": str(cluster.conf_dir),
        "TANDEM_STORAGE_ROOT": str(cluster.storage_root),
        "TANDEM_DATABASE_URL": cluster.database_url,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": path if path.split(os.pathsep)[:1] == [python_bin] else os.pathsep.join([python_bin, path]),
    })
    return env


def _resolve_plan(plan: PlanConfig | str, cluster: ClusterConfig) -> PlanConfig:
    return plan if isinstance(plan, PlanConfig) else load_plan(plan, cluster)


def _trigger_seconds(plan: PlanConfig, trigger_interval: str | float | None) -> float:
    if trigger_interval is None or trigger_interval == "":
        return plan.trigger_interval_s
    try:
        return parse_duration(trigger_interval)
    except ValueError as exc:
        raise LaunchRejected(f"trigger interval: {exc}") from None


def launch_instance(cluster: ClusterConfig, plan: PlanConfig | str, shard_id: str, node: str,
                    trigger_interval: str | float | None = None, *, role: str = ACTIVE,
                    launched_by: str | None = None, py_files: Path | None = None,
                    application: Path | None = None) -> LaunchedJob:
    """Make sure one instance runs: return the live job if there is one, otherwise submit it, detached.

    Args:
        plan: a plan name or a loaded plan.
        trigger_interval: e.g. ``"1 second"`` or seconds; the plan's interval when omitted.
        role: ACTIVE (takes the lease when free), PASSIVE or BACKUP (hot standbys).
        launched_by: who asked (recorded on the instance row).
        py_files: the zipped ``tandem`` package (default ``<project_root>/dist/tandem.zip``).
        application: the entry point (default ``<project_root>/jobs/run_plan.py``).

    Raises:
        LaunchRejected: an unknown node, a shard or node outside the plan, a bad trigger interval.
        LaunchError: missing ``dist/tandem.zip`` or entry point, ``spark-submit`` could not start.
    """
    plan = _resolve_plan(plan, cluster)
    try:
        node_config = cluster.node(plan.check_node(node))
        plan.check_shard(shard_id)
    except ConfigError as exc:
        raise LaunchRejected(str(exc)) from None
    interval = _trigger_seconds(plan, trigger_interval)
    py_files = py_files or cluster.project_root / "dist" / "tandem.zip"
    application = application or cluster.project_root / "jobs" / APPLICATION_SCRIPT
    if not py_files.is_file():
        raise LaunchError(f"{py_files} not found: run `make dist` to build the tandem package for spark-submit")
    if not application.is_file():
        raise LaunchError(f"{application} not found: the spark-submit entry point is missing")
    key = InstanceKey(plan.name, shard_id, node)
    launched_by = launched_by or f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"

    with Database(cluster.database_url, "tandem-launcher") as db:
        migrate(db)
        register_nodes(db, cluster)
        try:
            require_shared_storage(db, cluster, plan, node)
        except StorageNotShared as exc:
            raise LaunchRejected(str(exc)) from None
        with AdvisoryLock(cluster.database_url, "launch", key.id) as lock:
            row = get_instance(db, key.id)
            decision = decide_launch(
                row["status"] if row else None,
                bool(row) and instance_process_alive(row, key),
                _float(row["beat_age_s"]) if row else None,
                plan.heartbeat.timeout_s,
                recorded_here=bool(row) and _recorded_here(row),
            )
            if decision.reuse:
                reason = decision.reason
                running_interval = _float(row["trigger_interval_s"])
                if running_interval is not None and abs(running_interval - interval) > 1e-9:
                    reason += (f"; it runs with a {running_interval:g}s trigger interval, not the requested "
                               f"{interval:g}s: stop it first to change it")
                log.info("instance %s: reusing the existing job (%s)", key.id, reason)
                return LaunchedJob.from_row(row, reused=True, reason=reason)
            log.info("instance %s: launching (%s)", key.id, decision.reason)
            lock.check()
            command = build_submit_command(cluster, node_config, key, interval, py_files=py_files,
                                           application=application, role=role)
            log.info("instance %s: master %s from %s", key.id, command.master, command.master_source)
            log_path = log_path_for(cluster, key, datetime.now(timezone.utc))
            process = _spawn(command.argv, log_path, child_environment(cluster), cwd=cluster.project_root)
            try:
                record_launch(db, key, submit_pid=process.pid, submit_started_at=_start_time(process.pid),
                              log_path=str(log_path), launched_by=launched_by,
                              trigger_interval_s=interval,
                              checkpoint_root=str(checkpoint_dir(cluster, plan.name, shard_id, node, "")))
            except Exception:
                _kill_group(process.pid, signal.SIGKILL)
                raise
            row = get_instance(db, key.id)
    return LaunchedJob.from_row(row, reused=False, reason=decision.reason, command=command.argv)


def _spawn(argv: list[str], log_path: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as output:
        output.write(f"# {datetime.now(timezone.utc).isoformat()} {' '.join(argv)}\n".encode())
        output.flush()
        try:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                       env=env, cwd=cwd, start_new_session=True, close_fds=True)
        except OSError as exc:
            raise LaunchError(f"cannot start {argv[0]!r}: {exc}") from exc
    _children[process.pid] = process
    return process


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _reap() -> None:
    for pid, process in list(_children.items()):
        if process.poll() is not None:
            del _children[pid]


def _process(pid: int | None) -> psutil.Process | None:
    """The live (non-zombie) process with this PID, if any."""
    if not pid:
        return None
    _reap()
    try:
        process = psutil.Process(pid)
        return None if process.status() == psutil.STATUS_ZOMBIE else process
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _start_time(pid: int) -> float | None:
    """When the process started (``None`` when it has already exited: nothing will ever be signalled then)."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


START_TIME_TOLERANCE_S = 0.05
"""The kernel reports a process's start time in clock ticks (10 ms): the same process always gives the same value."""


def verified_process(pid: int | None, started_at: float | None, key: InstanceKey) -> psutil.Process | None:
    """The live process ``pid`` if it is still the one that was recorded, else ``None``.

    Both must hold: its start time equals ``started_at`` (a PID is reused once its process exits),
    and its command line runs ``run_plan.py`` for exactly ``key``. A row without a recorded start
    time names no process that may be signalled.
    """
    process = _process(pid)
    if process is None or started_at is None:
        return None
    try:
        if abs(process.create_time() - started_at) > START_TIME_TOLERANCE_S:
            return None
        return process if is_instance_cmdline(process.cmdline(), key) else None
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _recorded_here(row: Mapping[str, Any]) -> bool:
    return row.get("host") in (None, socket.gethostname())


@dataclass(frozen=True)
class InstanceProcesses:
    """The verified live processes of one instance on this host (see :func:`verified_process`)."""

    submit: psutil.Process | None  # spark-submit, the leader of its own process group
    driver: psutil.Process | None  # the Python driver (run_plan.py)
    members: tuple[psutil.Process, ...]  # every live process to stop: the submit group and the driver

    def __bool__(self) -> bool:
        return bool(self.members)


def instance_processes(row: Mapping[str, Any], key: InstanceKey) -> InstanceProcesses:
    """Every live local process of the instance, each verified by PID, start time and command line.

    The submit process group is included only when its leader is the verified ``spark-submit``.
    """
    if not _recorded_here(row):
        return InstanceProcesses(None, None, ())
    submit = verified_process(row.get("submit_pid"), row.get("submit_started_at"), key)
    driver = verified_process(row.get("pid"), row.get("pid_started_at"), key)
    found: dict[int, psutil.Process] = {}
    if submit is not None:
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) == submit.pid and process.status() != psutil.STATUS_ZOMBIE:
                    found[process.pid] = process
            except (psutil.NoSuchProcess, ProcessLookupError, psutil.AccessDenied):
                continue
    if driver is not None:
        found[driver.pid] = driver
    return InstanceProcesses(submit, driver, tuple(found.values()))


def instance_process_alive(row: Mapping[str, Any], key: InstanceKey) -> bool:
    """Whether the row's ``spark-submit`` or driver is still alive here (verified, see :func:`verified_process`)."""
    if not _recorded_here(row):
        return False
    return any(verified_process(row.get(pid), row.get(started), key) is not None
               for pid, started in (("submit_pid", "submit_started_at"), ("pid", "pid_started_at")))


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal(processes: Iterable[psutil.Process], sig: int) -> None:
    for process in processes:
        try:
            process.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass


def instance_key(plan: PlanConfig | InstanceKey | str, shard_id: str | None = None,
                 node: str | None = None) -> InstanceKey:
    """The key of an instance given as (plan, shard, node), an ``InstanceKey`` or ``"plan/shard/node"``."""
    if isinstance(plan, InstanceKey):
        return plan
    name = plan.name if isinstance(plan, PlanConfig) else plan
    if shard_id is None and node is None and name.count("/") == 2:
        name, shard_id, node = name.split("/")
    if not shard_id or not node:
        raise ValueError(f"an instance needs a plan, a shard and a node (got {name!r}, {shard_id!r}, {node!r})")
    return InstanceKey(name, shard_id, node)


def log_tail(path: str | Path | None, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' when there is none)."""
    if not path or not Path(path).is_file():
        return ""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - 64 * 1024))
        text = handle.read().decode("utf-8", errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _with_tail(message: str, path: str | None) -> str:
    tail = log_tail(path)
    return f"{message}\n--- last lines of {path} ---\n{tail}" if tail else f"{message} (log: {path or 'none'})"


def wait_until_running(cluster: ClusterConfig, plan: PlanConfig | InstanceKey | str, shard_id: str | None = None,
                       node: str | None = None, *, timeout_s: float = 180.0, poll_s: float = 1.0) -> dict[str, Any]:
    """Poll the instance row until RUNNING and return it.

    The instance is ``(plan, shard_id, node)``, an ``InstanceKey`` or an instance id.

    Raises:
        LaunchError: with the tail of the log file, when the instance FAILED or STOPPED, its
            process died before RUNNING, or ``timeout_s`` passed.
    """
    key = instance_key(plan, shard_id, node)
    deadline = time.monotonic() + timeout_s
    with Database(cluster.database_url, "tandem-launcher") as db:
        while True:
            row = get_instance(db, key.id)
            if row is None:
                raise LaunchError(f"instance {key.id} is not recorded: launch it first")
            if row["status"] == "RUNNING":
                return row
            if row["status"] in ENDED_STATUSES:
                raise LaunchError(_with_tail(
                    f"instance {key.id} {row['status']} before RUNNING: {row['error'] or 'no error recorded'}",
                    row["log_path"]))
            if _recorded_here(row) and not instance_process_alive(row, key):
                row = get_instance(db, key.id)  # it may have just moved on
                if row["status"] == "RUNNING":
                    return row
                raise LaunchError(_with_tail(
                    f"instance {key.id}: its process (submit pid {row['submit_pid']}, driver pid {row['pid']}) "
                    f"exited while {row['status']}", row["log_path"]))
            if time.monotonic() >= deadline:
                raise LaunchError(_with_tail(
                    f"instance {key.id} still {row['status']} after {timeout_s:g}s", row["log_path"]))
            time.sleep(poll_s)


def stop_instance(cluster: ClusterConfig, plan: PlanConfig | InstanceKey | str, shard_id: str | None = None,
                  node: str | None = None, *, timeout_s: float = 30.0, poll_s: float = 0.5,
                  requested_by: str | None = None) -> StopResult:
    """Stop an instance wherever it runs: a stop request in PostgreSQL, and signals when it runs here.

    The instance is ``(plan, shard_id, node)``, an ``InstanceKey`` or an instance id.

    The stop request is read by the driver with its next liveness beat, on any host: it stops its
    queries and records STOPPED. On the host that recorded the instance its processes are also
    signalled at once (see :func:`_terminate`: SIGTERM to the driver, then the group, SIGKILL at
    the deadline), so a driver too busy to beat still ends. An instance on another host that has
    not ended within ``timeout_s`` raises, unless its beat is older than the heartbeat timeout: its
    host is then down or cut off, the row is set to STOPPED with that reason, and the request stays
    for the driver to obey if it ever comes back (its lease has expired: it cannot publish).
    """
    key = instance_key(plan, shard_id, node)
    requested_by = requested_by or f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"
    with Database(cluster.database_url, "tandem-launcher") as db:
        row = get_instance(db, key.id)
        if row is None:
            return StopResult(key.id, None, True, "not recorded: nothing to stop")
        asked = request_stop(db, key, requested_by)
        confirmed = True
        if _recorded_here(row):
            processes = instance_processes(row, key)
            graceful = _terminate(key, processes, timeout_s, poll_s) if processes else True
            detail = ("no live process" if not processes else "stopped gracefully" if graceful
                      else f"killed after {timeout_s:g}s")
        else:
            graceful, detail, confirmed = _await_remote_stop(db, cluster, key, row["host"], timeout_s, poll_s) \
                if asked else (True, f"not running ({row['status']})", True)
        row = get_instance(db, key.id)
        if row["status"] in ACTIVE_STATUSES:
            reason = (f"killed with SIGKILL: still running {timeout_s:g}s after SIGTERM" if not graceful
                      else detail if not _recorded_here(row)
                      else f"its processes ended while {row['status']} without recording a final status")
            record_status(db, key, "STOPPED", f"stop_instance: {reason}")
            row = get_instance(db, key.id)
        log.info("instance %s: %s (%s)", key.id, detail, row["status"])
        return StopResult(key.id, row["status"], graceful, detail, confirmed)


def stop_launch(cluster: ClusterConfig, plan: PlanConfig | str, shard_id: str, node: str,
                launched_at: datetime | None, *, timeout_s: float = 30.0,
                requested_by: str | None = None) -> StopResult:
    """:func:`stop_instance`, but only while the instance is still the launch of ``launched_at``
    (``None``: whichever launch runs).

    A stop asked for by a supervisor may be carried out late, by the instance's host's worker; a
    newer launch must not be ended by it. The check and the stop hold the instance's launch lock,
    so no launch slips in between.
    """
    key = instance_key(plan, shard_id, node)
    with AdvisoryLock(cluster.database_url, "launch", key.id):
        with Database(cluster.database_url, "tandem-launcher") as db:
            row = get_instance(db, key.id)
        if launched_at is not None and row is not None and row["launched_at"] != launched_at:
            return StopResult(key.id, row["status"], True,
                              f"launched again at {row['launched_at'].isoformat()} since the stop was asked for "
                              f"(of the launch at {launched_at.isoformat()}): left alone")
        return stop_instance(cluster, plan, shard_id, node, timeout_s=timeout_s, requested_by=requested_by)


def _await_remote_stop(db: Database, cluster: ClusterConfig, key: InstanceKey, host: str, timeout_s: float,
                       poll_s: float) -> tuple[bool, str, bool]:
    """Wait for a driver on another host to obey its stop request; see :func:`stop_instance`.
    Returns (graceful, detail, confirmed)."""
    heartbeat_timeout_s = load_plan(key.plan, cluster).heartbeat.timeout_s
    deadline = time.monotonic() + timeout_s
    while True:
        row = get_instance(db, key.id)
        if row["status"] not in ACTIVE_STATUSES:
            return True, f"stopped on host {host} at the stop request", True
        beat_age_s = _float(row["beat_age_s"])
        if beat_age_s is None or beat_age_s >= heartbeat_timeout_s:
            beat = "it never beat" if beat_age_s is None else f"its last beat is {beat_age_s:.1f}s old"
            return True, (f"host {host} is down or cut off, or its driver hangs ({beat}); the stop request "
                          "stays for its driver if it comes back"), False
        if time.monotonic() >= deadline:
            raise LaunchError(
                f"instance {key.id} on host {host} still {row['status']} {timeout_s:g}s after its stop request "
                f"(last beat {beat_age_s:.1f}s ago): stop it on that host (its node's worker queue)")
        time.sleep(poll_s)


def kill_instance(cluster: ClusterConfig, plan: PlanConfig | InstanceKey | str, shard_id: str | None = None,
                  node: str | None = None, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to every verified process of an instance at once (a crash, for demonstrations and drills).

    Returns how many processes were signalled. Nothing is recorded: the supervisor must find out.
    """
    key = instance_key(plan, shard_id, node)
    with Database(cluster.database_url, "tandem-launcher") as db:
        row = get_instance(db, key.id)
    if row is None:
        return 0
    processes = instance_processes(row, key)
    _signal_group_or_processes(processes.submit.pid if processes.submit is not None else None,
                               list(processes.members), sig)
    return len(processes.members)


def _terminate(key: InstanceKey, processes: InstanceProcesses, timeout_s: float, poll_s: float) -> bool:
    """SIGTERM the driver, then the group; SIGKILL what is left at the deadline. True if nothing was killed.

    Only verified processes are signalled, and the process group only through its verified leader
    (the launcher's ``spark-submit``, which started its own session).
    """
    members, driver = list(processes.members), processes.driver
    group = processes.submit.pid if processes.submit is not None else None
    start = time.monotonic()
    group_signalled = driver is None
    if group_signalled:
        _signal_group_or_processes(group, members, signal.SIGTERM)
    else:
        _signal([driver], signal.SIGTERM)
    _signal(members, signal.SIGCONT)  # a frozen (SIGSTOP) process handles its SIGTERM only once it runs again
    while time.monotonic() - start < timeout_s:
        alive = _alive(members)
        if not alive:
            return True
        if not group_signalled and (driver not in alive or time.monotonic() - start > timeout_s / 3):
            group_signalled = True
            _signal_group_or_processes(group, alive, signal.SIGTERM)
        time.sleep(poll_s)
    alive = _alive(members)
    if not alive:
        return True
    log.warning("instance %s: still alive %gs after SIGTERM, sending SIGKILL", key.id, timeout_s)
    _signal_group_or_processes(group, alive, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=10)
    _reap()
    return False


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """The processes still running (``is_running`` also compares start times: a reused PID is not alive)."""
    _reap()
    alive = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return alive


def _signal_group_or_processes(pgid: int | None, processes: list[psutil.Process], sig: int) -> None:
    if pgid and any(_group_of(p) == pgid for p in processes):
        _kill_group(pgid, sig)
    _signal([p for p in processes if _group_of(p) != pgid], sig)


def _group_of(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except ProcessLookupError:
        return None
