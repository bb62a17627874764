"""Which processes on this host are a plan instance's, and signalling them.

A recorded PID names an instance's process only while its start time is the recorded one (a PID
is reused once its process exits) and its command line runs ``run_plan.py`` for exactly that
instance (:func:`verified_process`); only such processes, and the process group of a verified
``spark-submit``, are ever signalled. PIDs are only meaningful on the host that recorded them
(:func:`recorded_on_this_host`, by the host identity recorded with them, not the host name: two hosts may
share one): for an instance on another host only its liveness beat tells whether it is alive.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psutil

from tandem.host_identity import pids_are_local, this_host_id
from tandem.process_start import same_start
from tandem.store.registry import InstanceKey
from tandem.supervisor.submit_command import APPLICATION_SCRIPT

_children: dict[int, subprocess.Popen] = {}  # processes this interpreter started, reaped on observation


def is_instance_cmdline(cmdline: Iterable[str], key: InstanceKey) -> bool:
    """Whether a process command line runs ``run_plan.py`` for exactly this instance (pure; ``--instance``, the
    instance's flag before ``--instance``, still counts: a driver launched before an upgrade is still known)."""
    args = ["--instance" if arg == "--instance" else arg for arg in cmdline]
    if not any(arg.endswith(APPLICATION_SCRIPT) for arg in args):
        return False
    wanted = {"--plan": key.plan, "--node": key.node, "--instance": key.instance}
    found = {flag: args[i + 1] for i, flag in enumerate(args[:-1]) if flag in wanted}
    return found == wanted


def track_child(process: subprocess.Popen) -> None:
    """Keep a process this interpreter started until it has exited and :func:`reap_children` reaped it."""
    _children[process.pid] = process


def reap_children() -> None:
    """Reap the processes this interpreter started that have exited, so that none lingers as a zombie."""
    for pid, process in list(_children.items()):
        if process.poll() is not None:
            del _children[pid]


def _process(pid: int | None) -> psutil.Process | None:
    """The live (non-zombie) process with this PID, if any."""
    if not pid:
        return None
    reap_children()
    try:
        process = psutil.Process(pid)
        return None if process.status() == psutil.STATUS_ZOMBIE else process
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


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
        if not same_start(started_at, process):
            return None
        return process if runs_instance(process, key) else None
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


EXEC_WINDOW_S = 1.0
"""How long an empty command line is read again: ``spark-submit`` execs ``spark-class``, which execs ``java`` (same
PID), and a process in the middle of an exec shows no command line for an instant."""


def runs_instance(process: psutil.Process, key: InstanceKey, *, window_s: float = EXEC_WINDOW_S,
                  poll_s: float = 0.05) -> bool:
    """Whether ``process`` (already matched by PID and start time) runs ``key``; an empty command line is read
    again for up to ``window_s`` before it counts as another program's."""
    deadline = time.monotonic() + window_s
    while True:
        cmdline = process.cmdline()
        if cmdline or time.monotonic() >= deadline:
            return is_instance_cmdline(cmdline, key)
        time.sleep(poll_s)


def recorded_on_this_host(row: Mapping[str, Any]) -> bool:
    """Whether the instance row's PIDs are this host's: its recorded host identity is this host's
    (:func:`tandem.host_identity.pids_are_local`; a row without one: it names this host's name, or none)."""
    return pids_are_local(row.get("host"), row.get("host_id"), socket.gethostname(), this_host_id())


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
    if not recorded_on_this_host(row):
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
    if not recorded_on_this_host(row):
        return False
    return any(verified_process(row.get(pid), row.get(started), key) is not None
               for pid, started in (("submit_pid", "submit_started_at"), ("pid", "pid_started_at")))


def kill_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to the process group ``pgid``; a group that is gone, or not ours to signal, is left alone."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def signal_processes(processes: Iterable[psutil.Process], sig: int) -> None:
    """Send ``sig`` to each process; one that has exited, or is not ours to signal, is passed over."""
    for process in processes:
        try:
            process.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
