"""Great Expectations suites: where a plan's suite comes from, running one on a DataFrame, and its report.

A suite lives in ``conf/expectations/<name>.json`` (an ExpectationSuite in Great Expectations 1.x
JSON), or is implied by the plan's declarations when the plan has no suite file
(:mod:`tandem.quality.implied`). ``$PARAMETER`` references (e.g. ``{"$PARAMETER": "plan_instances"}``,
the plan's instances) are filled when it runs. A suite runs in an ephemeral Great Expectations
context: nothing is stored and no file is written.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import TandemError
from tandem.quality.implied import implied_output_suite

log = logging.getLogger(__name__)

SAMPLE_SIZE = 20
DEFAULT_MAX_ROWS = 2_000_000


class ValidationError(TandemError):
    """The suite is missing or invalid, or the arguments are (not: bad rows)."""


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
    """The outcome of validating one output of a plan over a window."""

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


def suite_for_output(definition: dict[str, Any], output: str, takes_unnamed: bool) -> dict[str, Any]:
    """The suite's expectations that apply to ``output``: those whose ``meta.output`` names it, and those that
    name no output when ``takes_unnamed`` (:attr:`tandem.outputs.base.Validation.takes_unnamed`)."""

    def applies(expectation: dict[str, Any]) -> bool:
        named = (expectation.get("meta") or {}).get("output")
        return named == output if named is not None else takes_unnamed

    return {**definition, "expectations": [e for e in definition["expectations"] if applies(e)]}


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
