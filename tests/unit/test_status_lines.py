"""The words of ``tandem status`` and of the events behind it (pure): take-over times, lag, what is due, how a
previous run ended, who took the lease."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest

from tandem.cli import event_reason, event_time, lag_text, next_action_lines, status_document
from tandem.presenter.models import InstanceStatus, NodeState, PlanStatus, TimelineEvent
from tandem.presenter.views import clock_lag
from tandem.runtime.roles import LAUNCHED_ACTIVE, TAKEN_OVER, take_reason
from tandem.store.leases import takeover_detail
from tandem.supervisor.launch_decision import decide_launch, previous_run
from tandem.supervisor.stopping import died_while

AT = datetime(2026, 12, 7, 13, 58, 52, 757112, tzinfo=timezone.utc)


def _event(kind: str = "PROMOTED", took_over_s: float | None = None, previous: str | None = "node-a") -> TimelineEvent:
    return TimelineEvent(id=1, happened_at=AT, instance="shard-1", kind=kind, node="node-b", previous_node=previous,
                         epoch=4, reason="node-b (PASSIVE standby) took the lease: lease expired or handed over",
                         took_over_s=took_over_s)


def _node(node: str, status: str | None, lag_s: float | None = None, ahead: float | None = None) -> NodeState:
    return NodeState(node=node, role=None, epoch=None, status=status, health="MISSING", evidence="never launched",
                     drained=False, host=None, pid=None, beat_age_s=None, last_batch_id=None, last_batch_age_s=None,
                     lag_s=lag_s, ahead_of_clock_s=ahead, waiting_input_s=None)


def _instance(*statuses: str | None, due: list[str] | None = None) -> InstanceStatus:
    return InstanceStatus(instance="shard-1", group="shard", standby="hot", lease=None,
                          nodes=[_node(f"node-{chr(97 + i)}", s) for i, s in enumerate(statuses)],
                          due=due if due is not None else ["launch node-a as ACTIVE: no node runs the instance"],
                          last_failover=None, last_good_snapshot=None)


def test_a_node_launched_active_took_the_lease_as_launched_not_as_a_passive() -> None:
    assert take_reason("node-a", "PASSIVE", LAUNCHED_ACTIVE) == "node-a took the lease: launched as ACTIVE"
    assert take_reason("node-b", "BACKUP", TAKEN_OVER) == ("node-b (BACKUP standby) took the lease: lease expired "
                                                           "or handed over")


@pytest.mark.parametrize("holder, since, expected", [
    ("node-a", 2.41234, {"took_over_s": 2.412}),
    ("node-a", -0.001, {"took_over_s": 0.0}),  # renewed_at by now(), the take by clock_timestamp(): never negative
    (None, None, {}),  # a lease never held: nothing was taken over
    ("node-a", None, {}),  # a holder that never renewed (a row from before renewals were recorded)
])
def test_the_take_over_time_is_from_the_previous_holders_last_renewal(holder, since, expected) -> None:
    assert takeover_detail(holder, since) == expected


def test_a_take_over_shows_its_time_to_the_hundredth_and_the_event_to_the_millisecond() -> None:
    assert event_reason(_event(took_over_s=2.4123)).endswith("; took over in 2.41 s after node-a's last renewal")
    assert event_reason(_event(kind="RELEASED")) == _event().reason
    assert event_time(AT) == "2026-12-07 13:58:52.757"
    assert event_time(AT.astimezone(timezone(timedelta(hours=2)))) == "2026-12-07 13:58:52.757"


@pytest.mark.parametrize("lag, expected", [(3.5, (3.5, None)), (0.0, (0.0, None)), (None, (None, None)),
                                           (-12.25, (0.0, 12.25))])
def test_a_watermark_ahead_of_the_clock_lags_zero_and_is_ahead(lag, expected) -> None:
    assert clock_lag(lag) == expected


def test_the_lag_column_never_shows_a_negative_number() -> None:
    assert lag_text(*clock_lag(-12.25)) == "ahead of clock"
    assert lag_text(*clock_lag(3.5)) == "3.5s"
    assert lag_text(None, None) == "-"


def test_an_instance_no_node_ever_ran_is_not_launched_not_due() -> None:
    lines = next_action_lines("trades", _instance(None, None))
    assert lines == ["  not launched: `tandem launch trades shard-1 node-a` starts it (the supervise DAG would: "
                     "launch node-a as ACTIVE: no node runs the instance)"]
    assert next_action_lines("trades", _instance("STOPPED", None, due=["stop node-a: DEAD"])) == \
        ["  due: stop node-a: DEAD"]
    assert next_action_lines("trades", _instance("RUNNING", "RUNNING", due=[])) == []
    stopped = _instance("STOPPED", "STOPPED", due=["launch node-a as ACTIVE: no node runs the instance"])
    assert next_action_lines("trades", stopped.model_copy(update={"stopped": True})) == \
        ["  stopped cleanly: no node runs it (the supervise DAG would: launch node-a as ACTIVE: no node runs the "
         "instance)"]


def test_a_run_a_stop_found_dead_is_said_to_be_dead_at_the_relaunch() -> None:
    """kill -9, then ``tandem launch ... --replace``: the stop finds no process and records STOPPED; the launch said
    ``previous run ended (STOPPED)`` of a node the status showed DEAD."""
    reason = decide_launch("STOPPED", process_alive=False, beat_age_s=4.0, heartbeat_timeout_s=3.0,
                           recorded_here=True, error=f"stop_instance: {died_while('RUNNING')}").reason
    assert reason.startswith("previous run was DEAD (killed or crashed while RUNNING") and "no clean stop" in reason
    assert "ended (STOPPED" not in reason


@pytest.mark.parametrize("status, error, expected", [
    ("STOPPED", "stop_instance: killed with SIGKILL: still running 10s after SIGTERM",
     "previous run was killed with SIGKILL: still running 10s after SIGTERM (no clean stop)"),
    ("STOPPED", "stopped at the request of ops@h pid 1", "previous run ended (STOPPED: stopped at the request of ops@h "
                                                         "pid 1)"),
    ("STOPPED", None, "previous run ended (STOPPED)"),
    ("FAILED", "query aggregates failed:\n  boom", "previous run ended (FAILED: query aggregates failed: boom)"),
])
def test_the_previous_run_is_named_by_how_it_ended(status: str, error: str | None, expected: str) -> None:
    assert previous_run(status, error) == expected


def test_the_status_document_is_json_with_full_timestamps() -> None:
    status = PlanStatus(plan="trades", observed_at=AT, version="v1", instances=[_instance("RUNNING", None, due=[])])
    document = json.loads(json.dumps(status_document([(status, [_event(took_over_s=2.41)])], {"x": "x.yaml: bad"})))
    assert document["broken"] == {"x": "x.yaml: bad"}
    [plan] = document["plans"]
    assert plan["observed_at"] == "2026-12-07T13:58:52.757112Z"
    assert plan["events"][0]["took_over_s"] == 2.41 and plan["events"][0]["happened_at"] == plan["observed_at"]
    assert [n["status"] for n in plan["instances"][0]["nodes"]] == ["RUNNING", None]


def test_a_launch_says_where_its_re_sync_cut_each_query() -> None:
    from tandem.cli import resync_line

    assert resync_line("node-b", {"aggregates": {"batch_id": 41, "files": 9, "bytes": 1},
                                  "quarantine": {"batch_id": None, "files": 0, "bytes": 0}}) == \
        "re-synced from node-b: aggregates at batch 41, quarantine: nothing committed"
    assert resync_line("node-b", None).startswith("re-sync from node-b failed: the node starts from its own")
