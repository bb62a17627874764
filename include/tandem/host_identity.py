"""Which host a recorded PID belongs to: the machine, its boot and its PID namespace, not the host name.

Purpose
    Tandem records the PIDs of the processes it starts (a driver, its ``spark-submit``, a snapshot's taker) and
    signals or trusts them only where they are local. A host name does not say where that is: two hosts may carry
    the same name (a cloned image, containers, a rename), and each would take the other's PIDs for its own, signal
    a process of its own that reuses the number, or count a dead process as alive.

How it works
    :func:`this_host_id` is ``<machine id>/<boot id>/<PID namespace>``: ``/etc/machine-id`` (or D-Bus's copy;
    ``-`` when neither exists), the kernel's ``/proc/sys/kernel/random/boot_id`` (new at every boot: a PID from
    before a reboot names nothing now) and the inode of ``/proc/self/ns/pid`` (containers on one kernel share its
    boot id, not their PID namespaces). It is recorded beside the host name, and :func:`pids_are_local` decides by
    both: a row is local only on the host of the same name and, where it carries one, the same identity; a row
    recorded before identities were (or by a process that could not read its own) by its host name alone.

What it does not do
    It does not tell whether a process lives: that is its PID and start time (:mod:`tandem.process_start`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
PID_NAMESPACE = "/proc/self/ns/pid"


def _first_line(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.readline().strip()
    except OSError:
        return ""


def read_host_id(machine_id_files: Sequence[str] = MACHINE_ID_FILES, boot_id_file: str = BOOT_ID_FILE,
                 pid_namespace: str = PID_NAMESPACE) -> str | None:
    """``<machine id>/<boot id>/<PID namespace>`` of the process reading them; ``None`` without a boot id (not
    Linux, or no ``/proc``): PIDs are then told apart by host name only."""
    boot = _first_line(boot_id_file)
    if not boot:
        return None
    machine = next((found for path in machine_id_files if (found := _first_line(path))), "-")
    try:
        namespace = os.readlink(pid_namespace)  # pid:[4026531836]
    except OSError:
        namespace = "-"
    return f"{machine}/{boot}/{namespace.removeprefix('pid:[').removesuffix(']')}"


@functools.cache
def this_host_id() -> str | None:
    """:func:`read_host_id` of this process (read once: none of its parts changes while a process lives)."""
    return read_host_id()


def pids_are_local(recorded_host: str | None, recorded_host_id: str | None, host: str, host_id: str | None) -> bool:
    """Whether PIDs recorded on ``recorded_host`` with identity ``recorded_host_id`` name processes of the host
    ``host`` whose identity is ``host_id`` (pure).

    Both must match: the name (a row that names no host counts as this one's) and, where one was recorded, the
    identity. The identity tells apart hosts of one name; the name tells apart hosts of one identity, such as network
    namespaces with a host name of their own (a UTS namespace) on one kernel, which share its machine id, boot and PID
    namespace (the multi-host tests' hosts). A row of an earlier version, without an identity, is judged by its name.
    """
    if recorded_host not in (None, host):
        return False
    return not recorded_host_id or recorded_host_id == host_id
