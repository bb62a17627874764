"""Expectations as Great Expectations 1.x suite entries (plain dicts, pure): what a declaration implies.

The output kinds build their implied expectations with these (:mod:`tandem.outputs`), and
:mod:`tandem.quality` runs them as it runs a suite file's; ``$PARAMETER`` references are filled when
a suite runs.
"""

from __future__ import annotations

from typing import Any

SHARDS_PARAMETER = "plan_shards"
"""Filled with the plan's instance ids when a suite runs."""


def expect(kind: str, why: str, **kwargs: Any) -> dict[str, Any]:
    """One expectation of type ``kind`` with ``kwargs``; ``why`` says what it guards (marked as generated)."""
    return {"type": kind, "kwargs": kwargs, "meta": {"why": f"{why} (generated from the plan)"}}


def not_null(column: str, why: str) -> dict[str, Any]:
    return expect("expect_column_values_to_not_be_null", why, column=column)


def instances() -> dict[str, Any]:
    """Only the plan's instances publish (the ``shard_id`` column)."""
    return expect("expect_column_values_to_be_in_set", "only the plan's instances publish",
                  column="shard_id", value_set={"$PARAMETER": SHARDS_PARAMETER})
