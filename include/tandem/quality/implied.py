"""The expectations a plan's declarations imply: the suites of a plan that names no suite file (pure).

Purpose
    A plan is one YAML and one module: ``conf/expectations/`` is optional. A plan whose
    ``validation.suite`` / ``snapshot.suite`` is ``None`` once loaded (it names none and no default
    file exists, :mod:`tandem.config`) validates its outputs with :func:`implied_output_suite` and its
    snapshots' exported state with :func:`implied_state_suite`. Both are suite definitions in the
    shape of the JSON files (``name``, ``meta``, ``expectations``), so the validation code runs them
    as it runs a file; ``$PARAMETER`` references are filled at run time as for the files.

How it works
    Per output (``meta.output`` names it): an ``events`` or ``table`` output gets
    :func:`generated_expectations` (added to a suite file's too). An aggregation gets what its
    serving table and its declaration imply (:func:`aggregation_expectations`): the columns, keys
    not null, its granularities, the plan's instances, a count of at least 1, the bounds of the
    source fields declared on the streams carried to sums / minimums / maximums, ``min <= max`` of
    one field and an average of it between the two. The state suite is the part every shipped
    state suite shares that does not depend on the plan's queries.

What it does not do
    Nothing about what a query computes beyond its declaration (e.g. ``temp > 40`` of
    ``high_temps``): that belongs to a suite file, which replaces the implied suite.
"""

from __future__ import annotations

from typing import Any

from tandem.aggregation.spec import Measure, spec_for
from tandem.config import PlanConfig
from tandem.declarations import MAX_EPOCH_MILLIS, FieldConfig, OutputConfig

SHARDS_PARAMETER = "plan_shards"
"""Filled with the plan's instance ids when a suite runs."""
STATE_ROWS_PARAMETER = "expected_state_rows"
MAX_PARTITION_PARAMETER = "max_partition_id"
VALIDATED_KINDS = ("aggregation", "events", "table")
_SERVING_KEYS = ("granularity", "bucket_start")


def _expect(kind: str, why: str, **kwargs: Any) -> dict[str, Any]:
    return {"type": kind, "kwargs": kwargs, "meta": {"why": f"{why} (generated from the plan)"}}


def _not_null(column: str, why: str) -> dict[str, Any]:
    return _expect("expect_column_values_to_not_be_null", why, column=column)


def _instances() -> dict[str, Any]:
    return _expect("expect_column_values_to_be_in_set", "only the plan's instances publish",
                   column="shard_id", value_set={"$PARAMETER": SHARDS_PARAMETER})


def generated_expectations(config: OutputConfig) -> list[dict[str, Any]]:
    """The expectations an ``events`` or ``table`` output's declaration implies (columns: the payload's
    fields of an event, the key's and the value's of a table row, as ``tandem.quality.outputs`` flattens them)."""
    if config.kind == "events":
        return [
            _not_null("event_id", "every event has its deterministic id"),
            _expect("expect_column_values_to_be_unique", "one row per event id", column="event_id"),
            *[_not_null(field, "the fields the id is computed from") for field in config.key],
            *([] if config.time in config.key else [_not_null(config.time, "the event's time")]),
            _instances(),
        ]
    if config.kind == "table":
        return [
            *[_not_null(field, "the table's key") for field in config.key],
            _expect("expect_compound_columns_to_be_unique", "one partial row per key and instance",
                    column_list=[*config.key, "shard_id"]),
            *[_not_null(value, "a value of the table") for value in config.values],
            _expect("expect_column_values_to_be_between", "a row exists once a contribution was applied",
                    column="version", min_value=1),
            _instances(),
        ]
    raise ValueError(f"no generated expectations for a {config.kind} output")


def _declared_field(plan: PlanConfig, name: str) -> FieldConfig | None:
    """The stream field ``name`` when every stream that has one declares it alike (else ``None``)."""
    declared = [stream.fields[name] for stream in plan.streams.values() if name in stream.fields]
    return declared[0] if declared and all(d == declared[0] for d in declared) else None


def _bounds(config: FieldConfig) -> tuple[tuple[float, bool] | None, tuple[float, bool] | None]:
    """The tightest declared ``(lower, strict)`` and ``(upper, strict)`` of a field (``None``: unbounded)."""
    lower = [(b, s) for b, s in ((config.greater_than, True), (config.at_least, False)) if b is not None]
    upper = [(b, s) for b, s in ((config.less_than, True), (config.at_most, False)) if b is not None]
    if config.type == "epoch_millis":
        lower, upper = [*lower, (0, False)], [*upper, (MAX_EPOCH_MILLIS, False)]
    return (max(lower) if lower else None,
            min(upper, key=lambda bound: (bound[0], not bound[1])) if upper else None)


def _measure_bounds(plan: PlanConfig, measure: Measure, declared_type: str | None) -> list[dict[str, Any]]:
    """A sum, min or max of a declared field keeps the field's bounds (a sum: a lower bound >= 0, an
    upper bound <= 0, as every partial adds at least one accepted value)."""
    config = _declared_field(plan, measure.source) if measure.kind in ("sum", "min", "max") else None
    if config is None or declared_type not in (None, {"epoch_millis": "long"}.get(config.type, config.type)):
        return []
    lower, upper = _bounds(config)
    if measure.kind == "sum":
        lower = lower if lower is not None and lower[0] >= 0 else None
        upper = upper if upper is not None and upper[0] <= 0 else None
    kwargs: dict[str, Any] = {}
    if lower is not None:
        kwargs.update(min_value=lower[0], **({"strict_min": True} if lower[1] else {}))
    if upper is not None:
        kwargs.update(max_value=upper[0], **({"strict_max": True} if upper[1] else {}))
    if not kwargs:
        return []
    return [_expect("expect_column_values_to_be_between",
                    f"{measure.kind}({measure.source}): {measure.source} is checked on the streams "
                    "(bad lines are quarantined)", column=measure.column, **kwargs)]


def aggregation_expectations(plan: PlanConfig, output: str) -> list[dict[str, Any]]:
    """The expectations an aggregation's declaration implies for its serving table's partial rows
    (columns as :func:`tandem.quality.serving.serving_frame` makes them: ratios added)."""
    spec = spec_for(plan, output)
    declared = plan.outputs[output].measures
    keys = [*_SERVING_KEYS, *spec.keys, "shard_id"]
    expectations = [
        _expect("expect_table_columns_to_match_set", "the serving table and its ratios are all there",
                column_set=[*keys, *spec.measure_columns, *(r.column for r in spec.ratios)], exact_match=False),
        *[_not_null(column, "key") for column in keys],
        _expect("expect_column_values_to_be_in_set", "the granularities the output keeps", column="granularity",
                value_set=list(spec.granularities)),
        _instances(),
    ]
    for measure in spec.measures:
        if measure.kind == "count":
            expectations.append(_expect("expect_column_values_to_be_between",
                                        "a partial exists once an event fell into its bucket",
                                        column=measure.column, min_value=1))
        expectations += _measure_bounds(plan, measure, declared[measure.column].type)
    lows = {m.source: m.column for m in spec.measures if m.kind == "min"}
    highs = {m.source: m.column for m in spec.measures if m.kind == "max"}
    for source in (s for s in lows if s in highs):
        expectations.append(_expect("expect_column_pair_values_a_to_be_greater_than_b",
                                    f"min({source}) <= max({source})", column_A=highs[source],
                                    column_B=lows[source], or_equal=True))
    by_column = {m.column: m for m in spec.measures}
    snapped = [m.kind for m in spec.measures].count("min") == 1 and [m.kind for m in spec.measures].count("max") == 1
    for ratio in spec.ratios:  # an average of a field lies between its min and max (snapped as serving_frame does)
        numerator, denominator = by_column[ratio.numerator], by_column[ratio.denominator]
        source = numerator.source
        if not snapped or numerator.kind != "sum" or denominator.kind != "count" or source not in lows \
                or source not in highs:
            continue
        for high, low in ((ratio.column, lows[source]), (highs[source], ratio.column)):
            expectations.append(_expect("expect_column_pair_values_a_to_be_greater_than_b", f"{low} <= {high}",
                                        column_A=high, column_B=low, or_equal=True,
                                        ignore_row_if="either_value_is_missing"))
    return expectations


def output_expectations(plan: PlanConfig, output: str) -> list[dict[str, Any]]:
    """What the declaration of ``output`` (an aggregation, events or table) implies."""
    config = plan.outputs[output]
    return aggregation_expectations(plan, output) if config.kind == "aggregation" else generated_expectations(config)


def implied_output_suite(plan: PlanConfig) -> dict[str, Any]:
    """The suite a plan's outputs are validated with when it names no suite file: every validated
    output's implied expectations, each with ``meta.output`` naming its output."""
    return {
        "name": f"{plan.name}_outputs (implied)",
        "meta": {"description": f"What plan {plan.name}'s output declarations imply (no suite file)."},
        "expectations": [{**e, "meta": {**e["meta"], "output": output}}
                         for output, config in plan.outputs.items() if config.kind in VALIDATED_KINDS
                         for e in output_expectations(plan, output)],
    }


def implied_state_suite(plan: PlanConfig) -> dict[str, Any]:
    """The suite a snapshot's exported state is validated with when the plan names no suite file (the
    columns of :func:`tandem.snapshots.validation.state_frame`)."""
    return {
        "name": f"{plan.name}_state (implied)",
        "meta": {"description": f"The exported state of a snapshot of plan {plan.name}: what holds for "
                                "every plan (no suite file)."},
        "expectations": [
            _expect("expect_table_row_count_to_equal",
                    "every state row Spark counted at the cut's batch was exported, and every timer",
                    value={"$PARAMETER": STATE_ROWS_PARAMETER}),
            _not_null("key", "state key"),
            _expect("expect_compound_columns_to_be_unique", "one row per variable and key (timers: per key and "
                    "expiry)", column_list=["query", "operator_id", "store_name", "key", "value"]),
            _expect("expect_column_pair_values_to_be_equal", "the state was read at the batch the checkpoint "
                    "was cut at", column_A="batch_id", column_B="cut_batch_id"),
            _expect("expect_column_pair_values_to_be_equal", "the cut holds nothing newer than its batch (Spark's "
                    "state metadata agrees)", column_A="metadata_max_batch_id", column_B="cut_batch_id"),
            _expect("expect_column_values_to_be_between", "state partitions of the operator", column="partition_id",
                    min_value=0, max_value={"$PARAMETER": MAX_PARTITION_PARAMETER}),
        ],
    }
