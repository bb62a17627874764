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
