"""The cause an error's text gives, as ``tandem status``, the page and the failure identity read it (pure).

The Spark text is the one a ``foreachBatch`` function's exception gives (``StreamingQueryException.desc`` of PySpark
4.2, recorded from a real query; paths shortened): its first line is the top of a Python traceback.
"""

from __future__ import annotations

import pytest

from tandem.errors import cause_of, raised_in
from tandem.runtime.node import RunResult, failure_of, release_reason
from tandem.supervisor.health import FAILED, STOPPED, NodeObservation, Thresholds, evaluate

SPARK_TEXT = """An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
                   ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/pyspark/sql/utils.py", line 163, in call
    self.func(DataFrame(jdf, wrapped_session_jdf), batch_id)
  File "/tmp/sparkerr.py", line 6, in fail
    raise DataError("value 1e400 out of range for column price")
tandem.errors.DataError: value 1e400 out of range for column price

=== Streaming Query ===
Identifier: [id = a52bd478-cc33-46d2-8b71-b76fdb6bf6d6, runId = eac614a1-6249-4f98-8915-c66377afb3f4]
Current Committed Offsets: {}
"""
CAUSE = "tandem.errors.DataError: value 1e400 out of range for column price"
CHAINED = """Traceback (most recent call last):
  File "a.py", line 1, in f
psycopg2.OperationalError: connection refused

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "b.py", line 2, in g
tandem.errors.StoreUnreachable: PostgreSQL at 127.0.0.1:5432 cannot be reached
"""


@pytest.mark.parametrize(("text", "cause"), [
    (SPARK_TEXT, CAUSE),
    ("query order_stats failed: " + SPARK_TEXT, "query order_stats failed: " + CAUSE),  # as an instance records it
    (CHAINED, "tandem.errors.StoreUnreachable: PostgreSQL at 127.0.0.1:5432 cannot be reached"),  # the outermost
    ("[STREAM_FAILED] Query [id = 0b0e4c1e, runId = 5d2f6c4b] terminated with exception: boom\nat line 1", "boom"),
    ("psycopg2.errors.DataError: bad value\nDETAIL: more", "psycopg2.errors.DataError: bad value"),
    ("", ""),
    (None, None),
])
def test_the_cause_is_the_line_that_says_why(text, cause) -> None:
    assert cause_of(text) == cause


def test_a_cause_is_one_line_of_a_bounded_length() -> None:
    assert cause_of("x" * 600) == "x" * 499 + "…"
    assert raised_in("no traceback here") is None
    assert raised_in("Traceback (most recent call last):\n  File \"a.py\", line 1\n") is None  # cut short


def test_a_failed_instance_shows_the_cause_not_the_top_of_a_traceback() -> None:
    limits = Thresholds(heartbeat_timeout_s=3.0, stall_timeout_s=30.0, launch_timeout_s=120.0)
    failed = evaluate(NodeObservation("node-a", "FAILED", error="query q failed: " + SPARK_TEXT), limits)
    assert (failed.state, failed.evidence) == (FAILED, f"ended with an error: query q failed: {CAUSE}")
    stopped = evaluate(NodeObservation("node-a", "STOPPED", error="stopped at the request of ops"), limits)
    assert (stopped.state, stopped.evidence) == (STOPPED, "stopped: stopped at the request of ops")


def test_two_different_python_errors_are_two_failures_and_the_same_one_repeats() -> None:
    """Spark's first line is the same for every Python error of a foreachBatch function: a failure identity made of
    it would take any two failures for the same one (and block the instance)."""
    other = SPARK_TEXT.replace(CAUSE, "ZeroDivisionError: division by zero")
    assert failure_of("q", SPARK_TEXT, None) == f"query q: {CAUSE}"
    assert failure_of("q", SPARK_TEXT.replace("a52bd478", "ffffffff"), None) == failure_of("q", SPARK_TEXT, None)
    assert failure_of("q", other, None) == "query q: ZeroDivisionError: division by zero"


@pytest.mark.parametrize(("result", "requested_by", "reason"), [
    (RunResult("STOPPED"), None, "instance stopped"),
    (RunResult("STOPPED"), "ops@host pid 7", "instance stopped at the request of ops@host pid 7"),
    (RunResult("FAILED", "query q failed: " + SPARK_TEXT), None, f"instance failed: query q failed: {CAUSE}"),
    (None, None, "instance failed: interrupted"),
])
def test_a_released_lease_says_whether_the_instance_stopped_or_failed(result, requested_by, reason) -> None:
    assert release_reason(result, requested_by) == reason
