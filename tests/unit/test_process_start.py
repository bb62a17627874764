"""A process's start time as recorded for an instance: seconds from boot, read from ``/proc``, that no clock step
moves; wall-clock figures recorded by an earlier version still match."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from tandem.process_start import TOLERANCE_S, WALL_CLOCK_FLOOR, same_start, start_since_boot

RENAME_AND_WAIT = "open('/proc/self/comm', 'w').write('a) b (c'); import time; time.sleep(60)"


@pytest.fixture
def child():
    """A child process whose command name holds spaces and parentheses, as ``/proc/<pid>/stat`` shows it."""
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    process = subprocess.Popen([sys.executable, "-c", RENAME_AND_WAIT])
    after = time.clock_gettime(time.CLOCK_BOOTTIME)
    try:
        deadline = time.monotonic() + 10
        while psutil.Process(process.pid).name() != "a) b (c":
            assert time.monotonic() < deadline, "the child did not rename itself"
            time.sleep(0.01)
        yield process, before, after
    finally:
        process.kill()
        process.wait()


def test_the_start_is_the_seconds_from_boot_at_which_the_process_was_forked(child) -> None:
    process, before, after = child
    started = start_since_boot(process.pid)
    assert started is not None
    assert before - 0.01 <= started <= after + 0.01  # the kernel counts in ticks of 10 ms
    assert started < WALL_CLOCK_FLOOR


def test_the_recorded_start_matches_the_same_process_and_no_other(child) -> None:
    process, _, _ = child
    started = start_since_boot(process.pid)
    live = psutil.Process(process.pid)
    assert same_start(started, live)
    assert not same_start(started + 2 * TOLERANCE_S, live)
    assert not same_start(start_since_boot(psutil.Process().pid), live)


def test_a_wall_clock_start_recorded_before_this_version_still_matches(child) -> None:
    process, _, _ = child
    live = psutil.Process(process.pid)
    assert same_start(live.create_time(), live)
    assert not same_start(live.create_time() + 1, live)


def test_a_process_that_has_exited_has_no_start(child) -> None:
    process, _, _ = child
    live = psutil.Process(process.pid)
    started = start_since_boot(process.pid)
    process.kill()
    process.wait()
    assert start_since_boot(process.pid) is None
    with pytest.raises(psutil.NoSuchProcess):
        same_start(started, live)
