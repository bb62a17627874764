"""What the Tandem page shows red, yellow or grey about an instance (tandem.presenter.attention).

A plan an operator stopped is no alarm: its nodes' "stopped at the request of ..." and the supervisor's "launch
node-a as ACTIVE" are notes. DEAD, FAILED, BLOCKED, STALLED, a lost lease and a failing relay stay alarms.
"""

from __future__ import annotations

from datetime import datetime, timezone

from tandem.presenter.attention import is_stopped, notices
from tandem.presenter.models import LeaseState, NodeState

REQUESTED = "stopped at the request of root@host pid 42"
LAUNCH = "launch node-a as ACTIVE"


def node(name: str, status: str | None, health: str, error: str | None = None, evidence: str = "",
         relay_error: str | None = None) -> NodeState:
    return NodeState(node=name, role=None, epoch=None, status=status, error=error, health=health, evidence=evidence,
                     drained=False, host=None, pid=None, beat_age_s=None, last_batch_id=None, last_batch_age_s=None,
                     lag_s=None, waiting_input_s=None, relay_error=relay_error)


def lease(state: str, vacancy: str | None, valid: bool = False) -> LeaseState:
    return LeaseState(state=state, holder="node-a", epoch=4, valid=valid, expires_in_s=4.0 if valid else -60.0,
                      acquired_at=datetime(2026, 1, 1, tzinfo=timezone.utc), vacancy=vacancy)


def shown(found) -> list[tuple[str, str, str | None, str]]:
    return [(n.severity, n.kind, n.node, n.text) for n in found]


def test_a_plan_stopped_at_request_is_notes_only_its_due_launch_included() -> None:
    nodes = [node("node-a", "STOPPED", "STOPPED", REQUESTED), node("node-b", "STOPPED", "STOPPED", REQUESTED)]
    found = notices(nodes, lease("stopped", "stopped: instance stopped at the request of root@host pid 42"), [LAUNCH])
    assert is_stopped(nodes)
    assert shown(found) == [
        ("note", "error", "node-a", f"node-a STOPPED: {REQUESTED}"),
        ("note", "error", "node-b", f"node-b STOPPED: {REQUESTED}"),
        ("note", "stopped", None, "stopped cleanly: no node runs it; while its supervision DAG runs, the supervisor "
                                  "would:"),
        ("note", "due", None, f"due: {LAUNCH}"),
    ]


def test_a_stop_recorded_for_a_host_that_was_down_is_no_lost_lease() -> None:
    """stop_instance sets STOPPED itself when the host does not answer: the lease then merely expired."""
    nodes = [node("node-a", "STOPPED", "STOPPED", "stop_instance: host h1 is down or cut off"),
             node("node-b", None, "MISSING", evidence="never launched on this node")]
    found = notices(nodes, lease("expired", "expired: node-a's instance stopped"), [LAUNCH])
    assert {n.severity for n in found} == {"note"}
    assert [n.kind for n in found] == ["error", "stopped", "due"]


def test_a_dead_active_and_its_expired_lease_are_alarms_and_the_relaunch_is_pending() -> None:
    dead = "RUNNING, last liveness beat 31.0s ago (heartbeat timeout 10s)"
    nodes = [node("node-a", "RUNNING", "DEAD", evidence=dead),
             node("node-b", "STOPPED", "STOPPED", REQUESTED)]
    found = notices(nodes, lease("expired", "expired: node-a stopped renewing it"), [LAUNCH])
    assert not is_stopped(nodes)
    assert shown(found) == [
        ("alarm", "health", "node-a", f"node-a DEAD: {dead}"),
        ("note", "error", "node-b", f"node-b STOPPED: {REQUESTED}"),
        ("alarm", "lease", None, "no ACTIVE: the lease expired: node-a stopped renewing it"),
        ("pending", "due", None, f"due: {LAUNCH}"),
    ]


def test_failed_blocked_and_stalled_nodes_and_a_failing_relay_are_alarms() -> None:
    nodes = [node("node-a", "FAILED", "FAILED", "ValueError: boom"),
             node("node-b", "BLOCKED", "BLOCKED", "psycopg2.errors.DataError: bad value"),
             node("node-c", "RUNNING", "STALLED", evidence="input waiting 95.0s, no micro-batch for 95.0s",
                  relay_error="nats: no servers available")]
    found = notices(nodes, lease("held", None, valid=True), [])
    assert not is_stopped(nodes)  # a failure is not a clean stop, even with nothing running
    assert shown(found) == [
        ("alarm", "error", "node-a", "node-a FAILED: ValueError: boom"),
        ("alarm", "error", "node-b", "node-b BLOCKED: psycopg2.errors.DataError: bad value"),
        ("alarm", "health", "node-c", "node-c STALLED: input waiting 95.0s, no micro-batch for 95.0s"),
        ("alarm", "relay", "node-c", "node-c relay to NATS failing: nats: no servers available"),
    ]


def test_a_failed_node_without_a_recorded_error_is_still_an_alarm() -> None:
    found = notices([node("node-a", "FAILED", "FAILED", evidence="ended with an error: no error recorded"),
                     node("node-b", "STOPPED", "STOPPED")], lease("released", "released: node-a is FAILED"), [])
    assert shown(found) == [
        ("alarm", "health", "node-a", "node-a FAILED: ended with an error: no error recorded"),
        ("alarm", "lease", None, "no ACTIVE: the lease released: node-a is FAILED"),
    ]


def test_a_healthy_pair_says_nothing_and_a_missing_standby_launch_is_pending() -> None:
    nodes = [node("node-a", "RUNNING", "HEALTHY"), node("node-b", None, "MISSING")]
    assert notices(nodes, lease("held", None, valid=True), []) == []
    found = notices(nodes, lease("held", None, valid=True), ["launch node-b as PASSIVE"])
    assert shown(found) == [("pending", "due", None, "due: launch node-b as PASSIVE")]


def test_a_plan_never_launched_is_not_stopped_and_its_first_launch_is_pending() -> None:
    nodes = [node("node-a", None, "MISSING"), node("node-b", None, "MISSING")]
    assert not is_stopped(nodes)
    assert shown(notices(nodes, None, [LAUNCH])) == [("pending", "due", None, f"due: {LAUNCH}")]
