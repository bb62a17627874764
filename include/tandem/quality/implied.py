"""The expectations a plan's declarations imply: the suites of a plan that names no suite file (pure).

Purpose
    A plan is one YAML and one module: ``conf/expectations/`` is optional. A plan whose
    ``validation.suite`` / ``snapshot.suite`` is ``None`` once loaded (it names none and no default
    file exists, :mod:`tandem.config`) validates its outputs with :func:`implied_output_suite` and its
    snapshots' exported state with :func:`implied_state_suite`. Both are suite definitions in the
    shape of the JSON files (``name``, ``meta``, ``expectations``), so the validation code runs them
    as it runs a file; ``$PARAMETER`` references are filled at run time as for the files.

How it works
    Per output (``meta.output`` names it), what its kind's validation policy says the declaration
    implies (:attr:`tandem.outputs.base.Validation.implied`: e.g. an aggregation's columns, keys not
    null, its granularities, the plan's instances, declared bounds carried to sums / minimums /
    maximums; an events output's ids unique). The state suite is the part every shipped state suite
    shares that does not depend on the plan's queries.

What it does not do
    Nothing about what a query computes beyond its declaration (e.g. ``temp > 40`` of
    ``high_temps``): that belongs to a suite file, which replaces the implied suite.
"""

from __future__ import annotations

from typing import Any

from tandem.config import PlanConfig
from tandem.outputs import kind_of
from tandem.outputs.base import Validation
from tandem.outputs.expectations import expect, not_null

STATE_ROWS_PARAMETER = "expected_state_rows"
MAX_PARTITION_PARAMETER = "max_partition_id"


def validated_outputs(plan: PlanConfig) -> dict[str, Validation]:
    """The plan's outputs that are validated, each with its kind's validation policy (in declaration order)."""
    found = {output: kind_of(plan, output).validation(plan, output) for output in plan.outputs}
    return {output: validation for output, validation in found.items() if validation is not None}


def implied_output_suite(plan: PlanConfig) -> dict[str, Any]:
    """The suite a plan's outputs are validated with when it names no suite file: every validated
    output's implied expectations, each with ``meta.output`` naming its output."""
    return {
        "name": f"{plan.name}_outputs (implied)",
        "meta": {"description": f"What plan {plan.name}'s output declarations imply (no suite file)."},
        "expectations": [{**e, "meta": {**e["meta"], "output": output}}
                         for output, validation in validated_outputs(plan).items() for e in validation.implied],
    }


def implied_state_suite(plan: PlanConfig) -> dict[str, Any]:
    """The suite a snapshot's exported state is validated with when the plan names no suite file (the
    columns of :func:`tandem.snapshots.validation.state_frame`)."""
    return {
        "name": f"{plan.name}_state (implied)",
        "meta": {"description": f"The exported state of a snapshot of plan {plan.name}: what holds for "
                                "every plan (no suite file)."},
        "expectations": [
            expect("expect_table_row_count_to_equal",
                   "every state row Spark counted at the cut's batch was exported, and every timer",
                   value={"$PARAMETER": STATE_ROWS_PARAMETER}),
            not_null("key", "state key"),
            expect("expect_compound_columns_to_be_unique", "one row per variable and key (timers: per key and "
                   "expiry)", column_list=["query", "operator_id", "store_name", "key", "value"]),
            expect("expect_column_pair_values_to_be_equal", "the state was read at the batch the checkpoint "
                   "was cut at", column_A="batch_id", column_B="cut_batch_id"),
            expect("expect_column_pair_values_to_be_equal", "the cut holds nothing newer than its batch (Spark's "
                   "state metadata agrees)", column_A="metadata_max_batch_id", column_B="cut_batch_id"),
            expect("expect_column_values_to_be_between", "state partitions of the operator", column="partition_id",
                   min_value=0, max_value={"$PARAMETER": MAX_PARTITION_PARAMETER}),
        ],
    }
