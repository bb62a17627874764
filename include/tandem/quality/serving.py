"""Validate a plan's serving table (PostgreSQL partial aggregates) with a Great Expectations suite.

The suite lives in ``conf/expectations/<plan.validation.suite>.json`` (an ExpectationSuite in
Great Expectations 1.x JSON), or is implied by the plan's declarations when the plan has no suite
file (:mod:`tandem.quality.implied`). Its shard expectation takes ``{"$PARAMETER": "plan_shards"}``,
filled at run time with the plan's configured shards. Validation runs in an ephemeral Great
Expectations context: nothing is stored and no file is written.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from tandem.aggregation.spec import AggregationSpec, aggregation_outputs, spec_for
from tandem.config import ClusterConfig, PlanConfig, load_plan
from tandem.errors import TandemError
from tandem.quality.implied import SHARDS_PARAMETER, implied_output_suite
from tandem.store import aggregates
from tandem.store.db import Database

log = logging.getLogger(__name__)

# avg = sum / count can land a few ulps outside [min, max] when every price in a bucket is equal;
# an average within this relative distance of a bound counts as the bound.
AVG_TOLERANCE = 1e-9
SAMPLE_SIZE = 20
DEFAULT_MAX_ROWS = 2_000_000


class ValidationError(TandemError):
    """The suite is missing or invalid, or the serving table could not be read (not: bad rows)."""


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation's result: what was expected, whether it held, and samples of bad rows."""

    expectation: str
    kwargs: dict[str, Any]
    success: bool
    element_count: int | None = None
    unexpected_count: int | None = None
    samples: list[dict[str, Any]] = field(default_factory=list)
    exception: str | None = None

    @property
    def label(self) -> str:
        target = ", ".join(f"{k}={v}" for k, v in self.kwargs.items()
                           if k in ("column", "column_A", "column_B", "value_set", "min_value", "max_value"))
        return f"{self.expectation}({target})"


@dataclass(frozen=True)
class ValidationReport:
    """The outcome of validating one plan's serving table over a window."""

    plan: str
    suite: str
    table: str
    since: datetime
    until: datetime | None
    granularity: str | None
    row_count: int
    truncated: bool
    success: bool
    outcomes: list[ExpectationOutcome]

    @property
    def failures(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success]

    def failure(self, expectation: str, **kwargs: Any) -> ExpectationOutcome | None:
        """The failed outcome of ``expectation`` whose kwargs include ``kwargs``, if any."""
        for outcome in self.failures:
            if outcome.expectation == expectation and all(outcome.kwargs.get(k) == v for k, v in kwargs.items()):
                return outcome
        return None

    def summary(self, samples: int = 5) -> str:
        """A readable text: the verdict, then every failed expectation with sample bad rows."""
        window = f"{self.since.isoformat()} .. {self.until.isoformat() if self.until else 'now'}"
        verdict = "PASSED" if self.success else f"FAILED ({len(self.failures)} of {len(self.outcomes)} expectations)"
        lines = [f"{self.suite} on {self.table} for plan {self.plan}, buckets overlapping {window}"
                 f"{f', granularity {self.granularity}' if self.granularity else ''}: {self.row_count} rows"
                 f"{' (truncated)' if self.truncated else ''}: {verdict}"]
        for outcome in self.failures:
            if outcome.exception:
                lines.append(f"  ✗ {outcome.label}: raised {outcome.exception}")
                continue
            lines.append(f"  ✗ {outcome.label}: {outcome.unexpected_count} of {outcome.element_count} rows unexpected")
            for sample in outcome.samples[:samples]:
                lines.append(f"      {json.dumps(sample, default=str, sort_keys=True)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able (for XCom)."""
        data = asdict(self)
        data["since"] = self.since.isoformat()
        data["until"] = self.until.isoformat() if self.until else None
        return json.loads(json.dumps(data, default=str))


def plan_suite(cluster: ClusterConfig, plan: PlanConfig, suite: str | None,
               implied: Callable[[PlanConfig], dict[str, Any]]) -> tuple[dict[str, Any], Path | str]:
    """The suite definition ``suite`` of ``plan`` (``conf/expectations/<suite>.json``; ``None``: the
    one its declarations imply, ``implied(plan)``) and where it is from, for messages."""
    if suite is None:
        return implied(plan), f"{plan.path} (the suite its declarations imply)"
    path = cluster.conf_dir / "expectations" / f"{suite}.json"
    return load_suite_definition(path), path


def output_suite(cluster: ClusterConfig, plan: PlanConfig) -> tuple[dict[str, Any], Path | str]:
    """The suite the plan's outputs are validated with (``validation.suite``), and where it is from."""
    return plan_suite(cluster, plan, plan.validation.suite, implied_output_suite)


def load_suite_definition(path: Path) -> dict[str, Any]:
    """The suite JSON, checked for the fields a suite needs (no Great Expectations import)."""
    if not path.is_file():
        raise ValidationError(f"{path}: expectation suite not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("expectations"), list) or not data.get("name"):
        raise ValidationError(f"{path}: expected an ExpectationSuite object with 'name' and 'expectations'")
    return data


def suite_for_output(definition: dict[str, Any], plan: PlanConfig, output: str) -> dict[str, Any]:
    """The suite file's expectations that apply to ``output`` (``meta.output``; none: the aggregations)."""
    kind = plan.outputs[output].kind

    def applies(expectation: dict[str, Any]) -> bool:
        named = (expectation.get("meta") or {}).get("output")
        return named == output if named is not None else kind == "aggregation"

    return {**definition, "expectations": [e for e in definition["expectations"] if applies(e)]}


def _with_shard_expectation(definition: dict[str, Any]) -> dict[str, Any]:
    """The suite, plus the shard-set expectation when the file does not declare one."""
    for expectation in definition["expectations"]:
        if expectation.get("kwargs", {}).get("value_set") == {"$PARAMETER": SHARDS_PARAMETER}:
            return definition
    extra = {"type": "expect_column_values_to_be_in_set",
             "kwargs": {"column": "shard_id", "value_set": {"$PARAMETER": SHARDS_PARAMETER}},
             "meta": {"why": "only the plan's configured shards write partial aggregates (added by tandem)"}}
    return {**definition, "expectations": [*definition["expectations"], extra]}


def serving_frame(rows: list[Mapping[str, Any]], spec: AggregationSpec) -> pd.DataFrame:
    """Partial-aggregate rows as a DataFrame with the spec's ratios added (e.g. ``avg_price``) (pure)."""
    columns = ["granularity", "bucket_start", *spec.keys, "shard_id", *spec.measure_columns]
    frame = pd.DataFrame.from_records([{c: row.get(c) for c in columns} for row in rows], columns=columns)
    for measure in spec.measures:
        frame[measure.column] = pd.to_numeric(frame[measure.column], errors="coerce")
    frame["bucket_start"] = pd.to_datetime(frame["bucket_start"], utc=True)
    lows = [m.column for m in spec.measures if m.kind == "min"]
    highs = [m.column for m in spec.measures if m.kind == "max"]
    for ratio in spec.ratios:
        denominator = frame[ratio.denominator]
        value = (frame[ratio.numerator] / denominator).where(denominator > 0)
        if len(lows) == 1 and len(highs) == 1:
            value = _snap(value, frame[lows[0]], frame[highs[0]])
        frame[ratio.column] = value
    return frame


def _snap(value: pd.Series, low: pd.Series, high: pd.Series) -> pd.Series:
    """Values within ``AVG_TOLERANCE`` (relative) outside ``[low, high]`` become the bound."""
    near_low = (value < low) & ((low - value) <= AVG_TOLERANCE * low.abs().clip(lower=1.0))
    near_high = (value > high) & ((value - high) <= AVG_TOLERANCE * high.abs().clip(lower=1.0))
    return value.mask(near_low, low).mask(near_high, high)


def load_serving_rows(cluster: ClusterConfig, spec: AggregationSpec, plan: str, since: datetime,
                      until: datetime | None, granularity: str | None, max_rows: int) -> list[dict[str, Any]]:
    """One plan's rows of the spec's PostgreSQL table whose bucket overlaps ``[since, until)``."""
    with Database(cluster.database_url, "tandem-quality") as db:
        return db.run(lambda cursor: aggregates.serving_rows(cursor, spec, plan, since, until, granularity,
                                                             max_rows + 1))


def validate_serving_table(cluster: ClusterConfig, plan: PlanConfig | str, granularity: str | None = None,
                           since: datetime | None = None, *, until: datetime | None = None,
                           max_rows: int = DEFAULT_MAX_ROWS, output: str | None = None) -> ValidationReport:
    """Validate the partial aggregates of ``plan``'s serving table with the plan's suite.

    Args:
        plan: a plan name or a loaded plan; its ``validation.suite`` names the suite file (``None``:
            the suite its declarations imply).
        granularity: only rows of this granularity (default: every granularity).
        since: rows whose bucket ends after this moment (default: ``validation.lookback`` ago).
        until: rows whose bucket starts before this moment (default: no upper bound).
        max_rows: read at most this many rows (the report says ``truncated`` when there were more).
        output: the aggregation output (default: the plan's first).

    Raises:
        ValidationError: the suite is missing or invalid, or the arguments are.
    """
    plan = plan if isinstance(plan, PlanConfig) else load_plan(plan, cluster)
    outputs = aggregation_outputs(plan)
    if not outputs:
        raise ValidationError(f"plan {plan.name} has no aggregation output to validate (its outputs: "
                              f"{', '.join(plan.outputs)})")
    if output is not None and output not in outputs:
        raise ValidationError(f"plan {plan.name}: {output!r} is not an aggregation output ({', '.join(outputs)})")
    output = output or outputs[0]
    spec = spec_for(plan, output)
    if granularity is not None and granularity not in spec.granularities:
        raise ValidationError(f"unknown granularity {granularity!r}: {output} keeps {', '.join(spec.granularities)}")
    now = datetime.now(timezone.utc)
    since = since or datetime.fromtimestamp(now.timestamp() - plan.validation.lookback_s, timezone.utc)
    if since.tzinfo is None or (until is not None and until.tzinfo is None):
        raise ValidationError("since and until must be timezone-aware")
    suite, path = output_suite(cluster, plan)
    definition = _with_shard_expectation(suite_for_output(suite, plan, output))

    rows = load_serving_rows(cluster, spec, plan.name, since, until, granularity, max_rows)
    truncated = len(rows) > max_rows
    if truncated:
        log.warning("%s: more than %d rows in the window; validating the first %d", spec.table, max_rows, max_rows)
        rows = rows[:max_rows]
    frame = serving_frame(rows, spec)
    key_columns = ["granularity", "bucket_start", *spec.keys, "shard_id"]
    outcomes = run_suite(definition, frame, {SHARDS_PARAMETER: list(plan.shards)}, key_columns, path)
    return ValidationReport(plan=plan.name, suite=definition["name"], table=f"tandem.{spec.table}", since=since,
                            until=until, granularity=granularity, row_count=len(frame), truncated=truncated,
                            success=all(o.success for o in outcomes), outcomes=outcomes)


def run_suite(definition: dict[str, Any], frame: pd.DataFrame, parameters: dict[str, Any],
              key_columns: list[str], path: Path | str, asset: str = "partial_aggregates") -> list[ExpectationOutcome]:
    """Validate ``frame`` with the suite ``definition`` (read from ``path``, or implied: where from) in an
    ephemeral context.

    ``parameters`` fill the suite's ``$PARAMETER`` references; ``key_columns`` identify the sample
    rows of failed expectations. Raises :class:`ValidationError` when the suite is invalid.
    """
    gx_log = logging.getLogger("great_expectations")
    if gx_log.level == logging.NOTSET:  # its INFO lines (hundreds at import) drown the report
        gx_log.setLevel(logging.WARNING)
    import great_expectations as gx
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    context = gx.get_context(mode="ephemeral", project_config=DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
        analytics_enabled=False,
    ))
    try:
        suite = gx.ExpectationSuite(**{k: v for k, v in definition.items() if k != "id"})
    except Exception as exc:
        raise ValidationError(f"{path}: not a valid ExpectationSuite: {exc}") from exc
    if len(suite.expectations) != len(definition["expectations"]):
        raise ValidationError(f"{path}: some expectations are invalid (see the log for the Great Expectations error)")
    batch = (context.data_sources.add_pandas("tandem")
             .add_dataframe_asset(asset)
             .add_batch_definition_whole_dataframe("window")
             .get_batch(batch_parameters={"dataframe": frame}))
    results = batch.validate(suite, expectation_parameters=parameters, result_format={
        "result_format": "SUMMARY", "partial_unexpected_count": SAMPLE_SIZE,
        "unexpected_index_column_names": key_columns})
    return [_outcome(result) for result in results.results]


def _outcome(result: Any) -> ExpectationOutcome:
    config = result.expectation_config
    details = result.result or {}
    samples = details.get("partial_unexpected_index_list") or [
        {"value": value} for value in details.get("partial_unexpected_list") or []]
    info = result.exception_info or {}
    raised = info.get("raised_exception") if isinstance(info, dict) else False
    kwargs = {k: v for k, v in config.kwargs.items() if k != "batch_id"}
    return ExpectationOutcome(
        expectation=config.type, kwargs=_plain(kwargs), success=bool(result.success),
        element_count=details.get("element_count"), unexpected_count=details.get("unexpected_count"),
        samples=[_plain(dict(sample)) for sample in samples[:SAMPLE_SIZE]],
        exception=info.get("exception_message") if raised else None,
    )


def _plain(value: Any) -> Any:
    """numpy / pandas scalars and timestamps as plain JSON-able Python values."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_plain(v) for v in value]
    if isinstance(value, (pd.Timestamp, datetime, date)):
        return value.isoformat()
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
