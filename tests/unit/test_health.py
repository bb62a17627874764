"""Health of one instance from hand-written observations (pure)."""

from __future__ import annotations

import pytest

from tandem.supervisor.health import (
    BLOCKED,
    DEAD,
    FAILED,
    HEALTHY,
    MISSING,
    STALLED,
    STARTING,
    STOPPED,
    NodeObservation,
    Thresholds,
    evaluate,
)

LIMITS = Thresholds(heartbeat_timeout_s=3.0, stall_timeout_s=30.0, launch_timeout_s=120.0)


def running(**changes) -> NodeObservation:
    values = dict(node="node-a", status="RUNNING", role="ACTIVE", epoch=4, beat_age_s=0.4, launched_age_s=600.0,
                  started_age_s=590.0, last_batch_age_s=0.8, waiting_input_age_s=None)
    values.update(changes)
    return NodeObservation(**values)


def test_a_beating_instance_without_waiting_input_is_healthy():
    health = evaluate(running(), LIMITS)
    assert health.state == HEALTHY and health.alive and not health.failing
    assert (health.node, health.role, health.epoch) == ("node-a", "ACTIVE", 4)


def test_an_idle_instance_is_healthy_however_long_ago_its_last_batch_was():
    assert evaluate(running(last_batch_age_s=None, waiting_input_age_s=None), LIMITS).state == HEALTHY
    assert evaluate(running(last_batch_age_s=7200.0), LIMITS).state == HEALTHY


def test_never_recorded_is_missing():
    assert evaluate(NodeObservation("node-b", None), LIMITS).state == MISSING


def test_failed_carries_the_error():
    health = evaluate(running(status="FAILED", error="query aggregates failed: boom"), LIMITS)
    assert health.state == FAILED and health.failing
    assert "boom" in health.evidence


def test_stopped_is_neither_alive_nor_failing():
    health = evaluate(running(status="STOPPED"), LIMITS)
    assert health.state == STOPPED and not health.alive and not health.failing


@pytest.mark.parametrize("beat", [3.0, 3.5, 60.0, None])
def test_no_beat_within_the_heartbeat_timeout_is_dead(beat):
    health = evaluate(running(beat_age_s=beat), LIMITS)
    assert health.state == DEAD
    assert "heartbeat timeout 3s" in health.evidence


def test_a_frozen_starting_instance_is_dead_too():
    assert evaluate(running(status="STARTING", beat_age_s=9.0), LIMITS).state == DEAD
    assert evaluate(running(status="STARTING", beat_age_s=1.0), LIMITS).state == STARTING


def test_a_launch_is_starting_until_the_launch_timeout():
    fresh = running(status="LAUNCHING", launched_age_s=30.0, beat_age_s=900.0, started_age_s=None)
    assert evaluate(fresh, LIMITS).state == STARTING
    late = running(status="LAUNCHING", launched_age_s=121.0, beat_age_s=900.0, started_age_s=None)
    health = evaluate(late, LIMITS)
    assert health.state == DEAD and "launch timeout 120s" in health.evidence


def test_a_beat_left_over_from_the_previous_run_does_not_keep_a_launch_alive():
    # beat 1 s old but the launch was 0.5 s ago: the beat is the old driver's
    old_beat = running(status="LAUNCHING", launched_age_s=200.0, beat_age_s=201.0)
    assert evaluate(old_beat, LIMITS).state == DEAD
    new_beat = running(status="LAUNCHING", launched_age_s=200.0, beat_age_s=1.0)
    assert evaluate(new_beat, LIMITS).state == STARTING


def test_input_waiting_past_the_stall_timeout_without_a_batch_is_stalled():
    health = evaluate(running(waiting_input_age_s=31.0, last_batch_age_s=45.0), LIMITS)
    assert health.state == STALLED and health.failing
    assert "input has waited 31.0s" in health.evidence and "stall timeout 30s" in health.evidence


def test_waiting_input_is_not_a_stall_while_batches_run():
    # a backlog: input older than the stall timeout waits, but a batch started 2 s ago
    assert evaluate(running(waiting_input_age_s=400.0, last_batch_age_s=2.0), LIMITS).state == HEALTHY


def test_input_that_just_arrived_is_not_a_stall():
    assert evaluate(running(waiting_input_age_s=5.0, last_batch_age_s=600.0), LIMITS).state == HEALTHY


def test_without_any_batch_the_time_since_start_counts_against_the_launch_timeout():
    # the first micro-batch of a run loads state, starts Python workers and catches up the input that waited
    first = running(last_batch_age_s=None, waiting_input_age_s=100.0, started_age_s=110.0)
    assert evaluate(first, LIMITS).state == HEALTHY
    never = evaluate(running(last_batch_age_s=None, waiting_input_age_s=125.0, started_age_s=130.0), LIMITS)
    assert never.state == STALLED
    assert "no micro-batch since it started 130.0s ago" in never.evidence and "launch timeout" in never.evidence
    # after its first micro-batch, the stall timeout again
    assert evaluate(running(last_batch_age_s=45.0, waiting_input_age_s=40.0, started_age_s=110.0), LIMITS).state == STALLED


def test_a_long_micro_batch_whose_spark_work_advances_is_slow_not_stalled():
    # a loaded machine: the batch started 90 s ago, but a task of it completed 2 s ago
    slow = evaluate(running(waiting_input_age_s=80.0, last_batch_age_s=90.0, work_age_s=2.0), LIMITS)
    assert slow.state == HEALTHY and "long micro-batch" in slow.evidence
    first = running(last_batch_age_s=None, waiting_input_age_s=40.0, started_age_s=120.0, work_age_s=1.0)
    assert evaluate(first, LIMITS).state == HEALTHY


def test_a_micro_batch_whose_work_stopped_advancing_is_stalled():
    stuck = evaluate(running(waiting_input_age_s=80.0, last_batch_age_s=90.0, work_age_s=31.0), LIMITS)
    assert stuck.state == STALLED and "Spark work last advanced 31.0s ago" in stuck.evidence
    # work advancing does not hide a stall that batches would not show either: the older of the two never wins
    assert evaluate(running(waiting_input_age_s=80.0, last_batch_age_s=5.0, work_age_s=300.0), LIMITS).state == HEALTHY


def test_dead_wins_over_stalled():
    assert evaluate(running(beat_age_s=10.0, waiting_input_age_s=100.0, last_batch_age_s=100.0), LIMITS).state == DEAD


def test_a_failure_that_repeats_at_the_same_batch_is_blocked_a_first_one_is_failed():
    failure = "query aggregates: trade_aggregates batch 7 of checkpoint q1: SQLSTATE P0001: refused"
    once = evaluate(running(status="FAILED", error="boom", failure=failure, failure_repeats=1), LIMITS)
    assert once.state == FAILED and once.failing
    twice = evaluate(running(status="FAILED", error="boom", failure=failure, failure_repeats=2), LIMITS)
    assert twice.state == BLOCKED and not twice.alive and not twice.failing
    assert failure in twice.evidence and "2 runs in a row" in twice.evidence
    recorded = evaluate(running(status="BLOCKED", error="failed 2 runs in a row at the same batch: x"), LIMITS)
    assert recorded.state == BLOCKED and recorded.status == "BLOCKED"


@pytest.mark.parametrize(("before", "now", "advanced"), [
    ({}, {}, False),                      # nothing runs
    ({}, {3: 0}, True),                   # a stage started
    ({3: 4}, {3: 4}, False),              # the same stage, no task completed: stuck so far
    ({3: 4}, {3: 5}, True),               # a task completed
    ({3: 4}, {}, False),                  # the stage ended and nothing started (the batch's Python part)
    ({3: 4}, {5: 0}, True),               # the next stage started
])
def test_spark_work_advanced_when_a_stage_starts_or_a_task_completes(before, now, advanced):
    from tandem.runtime.listener import work_advanced

    assert work_advanced(before, now) is advanced


def test_a_warm_standby_runs_no_query_and_is_healthy_while_it_beats() -> None:
    warm = running(role="WARM", epoch=0, last_batch_age_s=None, waiting_input_age_s=900.0, work_age_s=None)
    assert evaluate(warm, LIMITS).state == HEALTHY  # input waits for the ACTIVE, not for it
    assert evaluate(running(role="WARM", beat_age_s=3.5), LIMITS).state == DEAD
    # once it took over its queries are judged like any ACTIVE's, from the take-over (STARTING, then RUNNING)
    assert evaluate(running(role="ACTIVE", status="STARTING", last_batch_age_s=None), LIMITS).state == STARTING
