"""A launch request on a node's queue: its deadline, and whether a worker took its task (pure)."""

from datetime import datetime, timedelta, timezone

import pytest

from tandem.supervisor.launcher import LaunchRejected
from tandem.supervisor.node_actions import check_deadline, expired

NOW = datetime(2026, 11, 24, 3, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(("deadline", "late"), [
    (None, False),
    (NOW + timedelta(seconds=1), False),
    (NOW, False),
    (NOW - timedelta(milliseconds=1), True),
])
def test_a_request_is_late_only_after_its_deadline(deadline, late):
    assert expired(deadline, NOW) is late


def test_a_late_request_is_refused_with_both_times():
    with pytest.raises(LaunchRejected, match=r"launch of node-a: the request expired at 2026-11-24T02:59:00"):
        check_deadline(NOW - timedelta(minutes=1), NOW, "launch of node-a")
    check_deadline(NOW + timedelta(minutes=1), NOW, "launch of node-a")


@pytest.mark.parametrize(("state", "started"), [
    (None, False), ("scheduled", False), ("queued", False),
    ("running", True), ("up_for_retry", True), ("failed", True), ("success", True), ("skipped", True),
])
def test_a_launch_task_counts_as_started_once_a_worker_took_it(state, started):
    from tandem.airflow.node_launch import task_started

    assert task_started({"run-1": {"launch_node-a": state}}, "run-1", "launch_node-a") is started
    assert task_started({}, "run-1", "launch_node-a") is False


def test_a_state_enum_is_read_by_its_value():
    from enum import Enum

    from tandem.airflow.node_launch import task_started

    class State(str, Enum):
        QUEUED = "queued"
        RUNNING = "running"

    assert task_started({"r": {"t": State.QUEUED}}, "r", "t") is False
    assert task_started({"r": {"t": State.RUNNING}}, "r", "t") is True
