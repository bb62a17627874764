"""Which failed queries an instance starts again from their checkpoint (pure)."""

from __future__ import annotations

from tandem.runtime.node import (
    CPU_SATURATED_PRESSURE,
    QUERY_RESTART_WINDOW_S,
    RESTART_BACKOFF_MAX_S,
    SATURATED_RESTART_WINDOW_S,
    parse_cpu_pressure,
    restart_backoff_s,
    restartable,
)

WORKER = "Python worker failed to connect back.\n=== Streaming Query ===\nIdentifier: pizza_shop/shop-1/node-a:orders"


def test_a_python_worker_that_did_not_connect_back_in_time_is_started_again_for_a_few_minutes() -> None:
    assert restartable(WORKER, 0.0)
    assert restartable("Timed out while waiting for the Python worker to connect back after 10000 ms", 110.0)
    assert not restartable(WORKER, QUERY_RESTART_WINDOW_S)  # then the instance fails, and supervision decides


def test_on_a_saturated_cpu_the_failures_are_ridden_out_longer() -> None:
    assert restartable(WORKER, QUERY_RESTART_WINDOW_S + 1, cpu_pressure=CPU_SATURATED_PRESSURE)
    assert not restartable(WORKER, QUERY_RESTART_WINDOW_S + 1, cpu_pressure=CPU_SATURATED_PRESSURE - 1)
    assert not restartable(WORKER, QUERY_RESTART_WINDOW_S + 1, cpu_pressure=None)  # unknown: the short window
    assert not restartable(WORKER, SATURATED_RESTART_WINDOW_S, cpu_pressure=99.0)
    assert not restartable("ZeroDivisionError: division by zero", 0.0, cpu_pressure=99.0)


def test_cpu_pressure_is_the_last_minutes_share_of_some_task_waiting() -> None:
    text = ("some avg10=1.12 avg60=24.24 avg300=50.80 total=4366089012\n"
            "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert parse_cpu_pressure(text) == 24.24
    assert parse_cpu_pressure("") is None and parse_cpu_pressure("some avg10=1.0\n") is None


def test_each_start_in_a_row_waits_longer_up_to_a_bound() -> None:
    waits = [restart_backoff_s(n) for n in range(1, 20)]
    assert waits[:3] == [2.0, 4.0, 6.0] and waits == sorted(waits) and max(waits) == RESTART_BACKOFF_MAX_S


def test_any_other_failure_ends_the_instance() -> None:
    assert not restartable("[STATE_STORE_CANNOT_CREATE_COLUMN_FAMILY_WITH_RESERVED_CHARS] ...", 0.0)
    assert not restartable("ZeroDivisionError: division by zero", 0.0)


def test_a_failure_reads_the_same_when_a_relaunch_fails_the_same_way():
    from types import SimpleNamespace

    from tandem.runtime.node import failure_of

    first = ("[STREAM_FAILED] Query [id = 0b0e4c1e-9a3f-4c38-8f47-2a0d3f3c6a11, runId = "
             "5d2f6c4b-1e2a-4b8e-9c7d-3f1a2b3c4d5e] terminated with exception: boom\nat line 1")
    again = first.replace("5d2f6c4b", "77777777")
    assert failure_of("aggregates", first, None) == failure_of("aggregates", again, None)
    assert "runId = …" in failure_of("aggregates", first, None) and "at line 1" not in failure_of("aggregates", first, None)
    publisher = SimpleNamespace(failure="trade_aggregates batch 7 of checkpoint q1: SQLSTATE P0001: refused")
    assert failure_of("aggregates", first, publisher) == \
        "query aggregates: trade_aggregates batch 7 of checkpoint q1: SQLSTATE P0001: refused"


def test_a_transient_failure_never_reads_as_failing_the_same_way():
    """A Python worker that missed Spark's 10 s to connect back, run after run on a saturated host (the soak of
    2026-11-29 BLOCKED a temperatures group on both nodes with it), is about the machine: no failure identity, so
    the supervisor fails the instance over and relaunches it instead of blocking it."""
    from tandem.runtime.node import failure_of

    for text in ("[STREAM_FAILED] Query [id = 0b0e4c1e-9a3f-4c38-8f47-2a0d3f3c6a11] terminated with exception: "
                 "Python worker failed to connect back.",
                 "org.apache.spark.SparkException: Timed out while waiting for the Python worker to connect back"):
        assert failure_of("avg_temps", text, None) is None
    assert failure_of("avg_temps", "ZeroDivisionError: division by zero", None) == \
        "query avg_temps: ZeroDivisionError: division by zero"
