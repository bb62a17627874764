"""The deadline of a launch request that a node's worker may pick up late (pure)."""

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
