"""Launch plan instances as detached ``spark-submit`` processes and wait for them to run.

Purpose
    An instance of a streaming plan on a node (plan × instance × node) runs for days; the task that starts it must
    not wait for it. ``SparkSubmitOperator`` waits for ``spark-submit`` to exit whenever the driver
    runs in client mode (the only mode for PySpark on local and standalone masters), so Tandem
    starts the job itself and lets it outlive the caller.

How it works
    ``launch_instance`` takes a PostgreSQL advisory lock for the instance, observes the instance
    row (status, PIDs, liveness beat) and the local processes (:mod:`tandem.supervisor.processes`),
    and lets the pure :func:`~tandem.supervisor.launch_decision.decide_launch` choose between reusing
    the job that is already there and launching a new one. A launch builds the command
    (:func:`~tandem.supervisor.submit_command.build_submit_command`), starts it in a new session (its
    own process group) with output to ``<storage_root>/logs/<plan>/<instance>/<node>-<UTC time>.log``
    (the command, logged first and in that file's first line, without its secrets:
    :func:`~tandem.redaction.redact_command`),
    and records it (status LAUNCHING, ``submit_pid``, log path); the driver's temporary files go to the
    instance's own scratch folder, emptied first (:func:`~tandem.supervisor.submit_command.scratch_dir`).
    The driver then records STARTING, RUNNING, its host, PID, Spark application id and a liveness beat
    itself; ``wait_until_running`` waits for that. Stopping is :mod:`tandem.supervisor.stopping`.

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
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tandem.config import ClusterConfig, PlanConfig, load_plan
from tandem.declarations import parse_duration
from tandem.errors import ConfigError, TandemError
from tandem.layout import checkpoint_dir, logs_dir, make_private_dirs
from tandem.names import ACTIVE
from tandem.host_identity import this_host_id
from tandem.process_start import start_since_boot
from tandem.redaction import redact_command, redact_text
from tandem.store.db import Database
from tandem.store.locks import AdvisoryLock
from tandem.store.migrations import migrate
from tandem.store.registry import InstanceKey, get_instance, record_launch, register_nodes
from tandem.supervisor.launch_decision import ENDED_STATUSES, decide_launch
from tandem.supervisor.processes import instance_process_alive, kill_group, recorded_on_this_host, track_child
from tandem.shared_storage import StorageNotShared, require_shared_storage
from tandem.supervisor.submit_command import (APPLICATION_SCRIPT, build_submit_command, child_environment,
                                             reset_scratch_dir, scratch_dir)

log = logging.getLogger(__name__)


class LaunchError(TandemError):
    """A plan instance could not be launched, did not reach RUNNING, or could not be stopped."""


class LaunchRejected(LaunchError):
    """The launch request itself is invalid (instance or node outside the plan, bad trigger interval)."""


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
    """The ``spark-submit`` command of a launch, its secrets masked (:func:`tandem.redaction.redact_command`)."""

    @classmethod
    def from_row(cls, row: Mapping[str, Any], *, reused: bool, reason: str,
                 command: list[str] | None = None) -> "LaunchedJob":
        return cls(instance_id=row["instance_id"], reused=reused, reason=reason, status=row["status"],
                   submit_pid=row.get("submit_pid"), pid=row.get("pid"), spark_app_id=row.get("spark_app_id"),
                   log_path=row.get("log_path"), command=command)


def log_path_for(cluster: ClusterConfig, key: InstanceKey, now: datetime) -> Path:
    """``<storage_root>/logs/<plan>/<instance>/<node>-<UTC timestamp>.log``."""
    stamp = now.astimezone(timezone.utc).strftime("%Y%m%dT%H%M%S.%f")[:-3] + "Z"
    return logs_dir(cluster, key.plan, key.instance) / f"{key.node}-{stamp}.log"


def _resolve_plan(plan: PlanConfig | str, cluster: ClusterConfig) -> PlanConfig:
    return plan if isinstance(plan, PlanConfig) else load_plan(plan, cluster)


def _trigger_seconds(plan: PlanConfig, trigger_interval: str | float | None) -> float:
    if trigger_interval is None or trigger_interval == "":
        return plan.trigger_interval_s
    try:
        return parse_duration(trigger_interval)
    except ValueError as exc:
        raise LaunchRejected(f"trigger interval: {exc}") from None


def launch_instance(cluster: ClusterConfig, plan: PlanConfig | str, instance: str, node: str,
                    trigger_interval: str | float | None = None, *, role: str = ACTIVE,
                    launched_by: str | None = None, py_files: Path | None = None,
                    application: Path | None = None) -> LaunchedJob:
    """Make sure one instance runs: return the live job if there is one, otherwise submit it, detached.

    Args:
        plan: a plan name or a loaded plan.
        trigger_interval: e.g. ``"1 second"`` or seconds; the plan's interval when omitted.
        role: ACTIVE (takes the lease when free), PASSIVE or BACKUP (hot standbys), WARM (queries start on take-over).
        launched_by: who asked (recorded on the instance row).
        py_files: the zipped ``tandem`` package (default ``<project_root>/dist/tandem.zip``).
        application: the entry point (default ``<project_root>/jobs/run_plan.py``).

    Raises:
        LaunchRejected: an unknown node, an instance or node outside the plan, a bad trigger interval.
        LaunchError: missing ``dist/tandem.zip`` or entry point, ``spark-submit`` could not start.
    """
    plan = _resolve_plan(plan, cluster)
    try:
        node_config = cluster.node(plan.check_node(node))
        plan.check_instance(instance)
    except ConfigError as exc:
        raise LaunchRejected(str(exc)) from None
    interval = _trigger_seconds(plan, trigger_interval)
    py_files = py_files or cluster.project_root / "dist" / "tandem.zip"
    application = application or cluster.project_root / "jobs" / APPLICATION_SCRIPT
    if not py_files.is_file():
        raise LaunchError(f"{py_files} not found: run `make dist` to build the tandem package for spark-submit")
    if not application.is_file():
        raise LaunchError(f"{application} not found: the spark-submit entry point is missing")
    key = InstanceKey(plan.name, instance, node)
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
                recorded_here=bool(row) and recorded_on_this_host(row),
                error=row["error"] if row else None,
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
            shown = redact_command(command.argv)
            log.info("instance %s: master %s from %s", key.id, redact_text(command.master), command.master_source)
            log.info("instance %s: command: %s", key.id, " ".join(shown))
            log_path = log_path_for(cluster, key, datetime.now(timezone.utc))
            scratch = reset_scratch_dir(scratch_dir(cluster, key))
            process = _spawn(command.argv, shown, log_path, child_environment(cluster, scratch=scratch),
                             cwd=cluster.project_root)
            try:
                record_launch(db, key, submit_pid=process.pid, submit_started_at=start_since_boot(process.pid),
                              host=socket.gethostname(), host_id=this_host_id(),
                              log_path=str(log_path), launched_by=launched_by,
                              trigger_interval_s=interval,
                              checkpoint_root=str(checkpoint_dir(cluster, plan.name, instance, node, "")))
            except Exception:
                kill_group(process.pid, signal.SIGKILL)
                raise
            row = get_instance(db, key.id)
    return LaunchedJob.from_row(row, reused=False, reason=decision.reason, command=shown)


def _spawn(argv: list[str], shown: list[str], log_path: Path, env: dict[str, str], cwd: Path) -> subprocess.Popen:
    """Start ``argv`` detached, its output appended to ``log_path`` after a header line with ``shown``, the
    command as a log may show it."""
    make_private_dirs(log_path.parent)
    with open(log_path, "ab") as output:
        output.write(f"# {datetime.now(timezone.utc).isoformat()} {' '.join(shown)}\n".encode())
        output.flush()
        try:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                       env=env, cwd=cwd, start_new_session=True, close_fds=True)
        except OSError as exc:
            raise LaunchError(f"cannot start {argv[0]!r}: {exc}") from exc
    track_child(process)
    return process


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def instance_key(plan: PlanConfig | InstanceKey | str, instance: str | None = None,
                 node: str | None = None) -> InstanceKey:
    """The key of an instance given as (plan, instance, node), an ``InstanceKey`` or ``"plan/instance/node"``."""
    if isinstance(plan, InstanceKey):
        return plan
    name = plan.name if isinstance(plan, PlanConfig) else plan
    if instance is None and node is None and name.count("/") == 2:
        name, instance, node = name.split("/")
    if not instance or not node:
        raise ValueError(f"an instance needs a plan, an instance and a node (got {name!r}, {instance!r}, {node!r})")
    return InstanceKey(name, instance, node)


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


EXIT_CONFIRM_S = 1.0
"""How long a launched process that looked gone must stay gone before the launch counts as failed."""


def wait_until_running(cluster: ClusterConfig, plan: PlanConfig | InstanceKey | str, instance: str | None = None,
                       node: str | None = None, *, timeout_s: float = 180.0, poll_s: float = 1.0) -> dict[str, Any]:
    """Poll the instance row until RUNNING and return it.

    The instance is ``(plan, instance, node)``, an ``InstanceKey`` or an instance id.

    Raises:
        LaunchError: with the tail of the log file, when the instance FAILED or STOPPED, its
            process died before RUNNING, or ``timeout_s`` passed.
    """
    key = instance_key(plan, instance, node)
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
            if recorded_on_this_host(row) and not instance_process_alive(row, key):
                # it may have just moved on (the row read before the driver recorded its own PID), or be caught in an
                # exec longer than verified_process reads again: it has exited only if it is still gone a moment later
                time.sleep(EXIT_CONFIRM_S)
                row = get_instance(db, key.id)
                if row["status"] == "RUNNING":
                    return row
                if row["status"] in ENDED_STATUSES or instance_process_alive(row, key):
                    continue  # ended: said with its error above; alive: it was between two execs
                raise LaunchError(_with_tail(
                    f"instance {key.id}: its process (submit pid {row['submit_pid']}, driver pid {row['pid']}) "
                    f"exited while {row['status']}", row["log_path"]))
            if time.monotonic() >= deadline:
                raise LaunchError(_with_tail(
                    f"instance {key.id} still {row['status']} after {timeout_s:g}s", row["log_path"]))
            time.sleep(poll_s)
