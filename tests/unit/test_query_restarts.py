"""Which failed queries an instance starts again from their checkpoint (pure)."""

from __future__ import annotations

from tandem.runtime.node import MAX_QUERY_RESTARTS, restartable

WORKER = "Python worker failed to connect back.\n=== Streaming Query ===\nIdentifier: pizza_shop/shop-1/node-a:orders"


def test_a_python_worker_that_did_not_connect_back_in_time_is_started_again_a_few_times() -> None:
    assert restartable(WORKER, 0)
    assert restartable("Timed out while waiting for the Python worker to connect back after 10000 ms", 1)
    assert not restartable(WORKER, MAX_QUERY_RESTARTS)  # then the instance fails, and supervision decides


def test_any_other_failure_ends_the_instance() -> None:
    assert not restartable("[STATE_STORE_CANNOT_CREATE_COLUMN_FAMILY_WITH_RESERVED_CHARS] ...", 0)
    assert not restartable("ZeroDivisionError: division by zero", 0)


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
