"""A process's start time, told apart from a later process that reuses its PID.

The start time recorded for an instance's processes is the kernel's own figure, the clock ticks from boot to the
process's start (``/proc/<pid>/stat``, field 22), in seconds. It never changes while the process lives. The
wall-clock start ``psutil`` reports adds the boot time, which the kernel derives from the current wall clock: a clock
step (NTP, a VM's time sync) moves it, and a live process would then no longer match what was recorded for it.
"""

from __future__ import annotations

import os

import psutil

TOLERANCE_S = 0.05
"""The start time is counted in clock ticks (10 ms): the same process always gives the same value."""

WALL_CLOCK_FLOOR = 1e9
"""Recorded start times at or above this are wall-clock seconds (2001 onward) recorded before seconds from boot were:
no host's uptime comes near it (31 years)."""

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def start_since_boot(pid: int) -> float | None:
    """When process ``pid`` started, in seconds from boot (``None`` when no such process exists)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(b")") + 2:].split()  # the command name, in parentheses, may hold spaces
    return int(fields[19]) / _TICKS_PER_S  # field 22 of the file; field 3 is fields[0]


def same_start(recorded: float, process: psutil.Process) -> bool:
    """Whether ``process`` started when ``recorded`` says.

    ``recorded`` is seconds from boot (:func:`start_since_boot`); a wall-clock figure, recorded by an earlier version,
    is compared with ``psutil``'s, so that processes launched before an upgrade are still known.

    Raises:
        psutil.NoSuchProcess: when the process has exited meanwhile.
    """
    if recorded >= WALL_CLOCK_FLOOR:
        return abs(process.create_time() - recorded) <= TOLERANCE_S
    started = start_since_boot(process.pid)
    if started is None:
        raise psutil.NoSuchProcess(process.pid)
    return abs(started - recorded) <= TOLERANCE_S
