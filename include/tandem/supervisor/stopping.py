"""Stop a plan instance wherever it runs, or crash it on purpose.

:func:`stop_instance` records a stop request in PostgreSQL, which the driver reads with its next
liveness beat on any host; on the host that recorded the instance it also signals the instance's
verified processes (:mod:`tandem.supervisor.processes`): SIGTERM to the driver, then its
``spark-submit`` process group, SIGKILL at the deadline. :func:`stop_launch` stops only the launch a
supervisor asked to stop, never a newer one; :func:`kill_instance` crashes an instance for
demonstrations and drills.
"""

from __future__ import annotations

import getpass
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from datetime import datetime

import psutil

from tandem.config import ClusterConfig, PlanConfig, load_plan
from tandem.store.db import Database
from tandem.store.locks import AdvisoryLock
from tandem.store.registry import InstanceKey, get_instance, record_status, request_stop
from tandem.supervisor.launch_decision import ACTIVE_STATUSES, DIED, KILLED
from tandem.supervisor.launcher import LaunchError, instance_key
from tandem.supervisor.processes import (InstanceProcesses, instance_processes, kill_group, reap_children,
                                         recorded_on_this_host, signal_processes)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StopResult:
    """How a stop ended. ``confirmed`` is False when the instance's host did not answer (no liveness
    beat): the row says STOPPED, but whether its processes still run there is unknown."""

    instance_id: str
    status: str | None
    graceful: bool
    detail: str
    confirmed: bool = True


def stop_instance(cluster: ClusterConfig, plan: PlanConfig | InstanceKey | str, instance: str | None = None,
                  node: str | None = None, *, timeout_s: float = 30.0, poll_s: float = 0.5,
                  requested_by: str | None = None) -> StopResult:
    """Stop an instance wherever it runs: a stop request in PostgreSQL, and signals when it runs here.

    The instance is ``(plan, instance, node)``, an ``InstanceKey`` or an instance id.

    The stop request is read by the driver with its next liveness beat, on any host: it stops its
    queries and records STOPPED. On the host that recorded the instance its processes are also
    signalled at once (see :func:`_terminate`: SIGTERM to the driver, then the group, SIGKILL at
    the deadline), so a driver too busy to beat still ends. An instance on another host that has
    not ended within ``timeout_s`` raises, unless its beat is older than the heartbeat timeout: its
    host is then down or cut off, the row is set to STOPPED with that reason, and the request stays
    for the driver to obey if it ever comes back (its lease has expired: it cannot publish).
    """
    key = instance_key(plan, instance, node)
    requested_by = requested_by or f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"
    with Database(cluster.database_url, "tandem-launcher") as db:
        row = get_instance(db, key.id)
        if row is None:
            return StopResult(key.id, None, True, "not recorded: nothing to stop")
        asked = request_stop(db, key, requested_by)
        confirmed = True
        died = False
        if recorded_on_this_host(row):
            processes = instance_processes(row, key)
            died = not processes and row["status"] in ACTIVE_STATUSES
            graceful = _terminate(key, processes, timeout_s, poll_s) if processes else True
            detail = (f"no live process: {died_while(row['status'])}" if died else "no live process" if not processes
                      else "stopped gracefully" if graceful else f"killed after {timeout_s:g}s")
        else:
            graceful, detail, confirmed = _await_remote_stop(db, cluster, key, row["host"], timeout_s, poll_s) \
                if asked else (True, f"not running ({row['status']})", True)
        row = get_instance(db, key.id)
        if row["status"] in ACTIVE_STATUSES:
            reason = (f"{KILLED}: still running {timeout_s:g}s after SIGTERM" if not graceful
                      else detail if not recorded_on_this_host(row)
                      else died_while(row["status"]) if died
                      else f"its processes ended while {row['status']} without recording a final status")
            record_status(db, key, "STOPPED", f"stop_instance: {reason}")
            row = get_instance(db, key.id)
        log.info("instance %s: %s (%s)", key.id, detail, row["status"])
        return StopResult(key.id, row["status"], graceful, detail, confirmed)


def died_while(status: str) -> str:
    """What a stop says of a run whose processes it found gone while its row said ``status`` (pure)."""
    return f"{DIED} while {status}: its processes had ended without recording a final status"


def stop_launch(cluster: ClusterConfig, plan: PlanConfig | str, instance: str, node: str,
                launched_at: datetime | None, *, timeout_s: float = 30.0,
                requested_by: str | None = None) -> StopResult:
    """:func:`stop_instance`, but only while the instance is still the launch of ``launched_at``
    (``None``: whichever launch runs).

    A stop asked for by a supervisor may be carried out late, by the instance's host's worker; a
    newer launch must not be ended by it. The check and the stop hold the instance's launch lock,
    so no launch slips in between.
    """
    key = instance_key(plan, instance, node)
    with AdvisoryLock(cluster.database_url, "launch", key.id):
        with Database(cluster.database_url, "tandem-launcher") as db:
            row = get_instance(db, key.id)
        if launched_at is not None and row is not None and row["launched_at"] != launched_at:
            return StopResult(key.id, row["status"], True,
                              f"launched again at {row['launched_at'].isoformat()} since the stop was asked for "
                              f"(of the launch at {launched_at.isoformat()}): left alone")
        return stop_instance(cluster, plan, instance, node, timeout_s=timeout_s, requested_by=requested_by)


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
        beat_age_s = None if row["beat_age_s"] is None else float(row["beat_age_s"])
        if beat_age_s is None or beat_age_s >= heartbeat_timeout_s:
            beat = "it never beat" if beat_age_s is None else f"its last beat is {beat_age_s:.1f}s old"
            return True, (f"host {host} is down or cut off, or its driver hangs ({beat}); the stop request "
                          "stays for its driver if it comes back"), False
        if time.monotonic() >= deadline:
            raise LaunchError(
                f"instance {key.id} on host {host} still {row['status']} {timeout_s:g}s after its stop request "
                f"(last beat {beat_age_s:.1f}s ago): stop it on that host (its node's worker queue)")
        time.sleep(poll_s)


def kill_instance(cluster: ClusterConfig, plan: PlanConfig | InstanceKey | str, instance: str | None = None,
                  node: str | None = None, sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to every verified process of an instance at once (a crash, for demonstrations and drills).

    Returns how many processes were signalled. Nothing is recorded: the supervisor must find out.
    """
    key = instance_key(plan, instance, node)
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
        signal_processes([driver], signal.SIGTERM)
    signal_processes(members, signal.SIGCONT)  # a frozen (SIGSTOP) process handles its SIGTERM only once it runs again
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
    reap_children()
    return False


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """The processes still running (``is_running`` also compares start times: a reused PID is not alive)."""
    reap_children()
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
        kill_group(pgid, sig)
    signal_processes([p for p in processes if _group_of(p) != pgid], sig)


def _group_of(process: psutil.Process) -> int | None:
    try:
        return os.getpgid(process.pid)
    except ProcessLookupError:
        return None
