"""Expectations as Great Expectations 1.x suite entries (plain dicts, pure): what a declaration implies.

The output kinds build their implied expectations with these (:mod:`tandem.outputs`), and
:mod:`tandem.quality` runs them as it runs a suite file's; ``$PARAMETER`` references are filled when
a suite runs.
"""

from __future__ import annotations

from typing import Any

INSTANCES_PARAMETER = "plan_instances"
"""Filled with the plan's instance ids when a suite runs."""

FORMER_INSTANCES_PARAMETER = "plan_shards"
"""The same, under its name before the rename (issue 47): a suite written for it still runs until the next release."""


def suite_parameters(instances: list[str]) -> dict[str, list[str]]:
    """The ``$PARAMETER`` values of a suite run over a plan of these instances."""
    return {INSTANCES_PARAMETER: instances, FORMER_INSTANCES_PARAMETER: instances}


def expect(kind: str, why: str, **kwargs: Any) -> dict[str, Any]:
    """One expectation of type ``kind`` with ``kwargs``; ``why`` says what it guards (marked as generated)."""
    return {"type": kind, "kwargs": kwargs, "meta": {"why": f"{why} (generated from the plan)"}}


def not_null(column: str, why: str) -> dict[str, Any]:
    return expect("expect_column_values_to_not_be_null", why, column=column)


def instances() -> dict[str, Any]:
    """Only the plan's instances publish (the ``instance`` column)."""
    return expect("expect_column_values_to_be_in_set", "only the plan's instances publish",
                  column="instance", value_set={"$PARAMETER": INSTANCES_PARAMETER})
