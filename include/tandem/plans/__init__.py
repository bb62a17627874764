"""Plans: the queries of each streaming application, as pure DataFrame functions.

A plan module (``conf/plans/<name>.yaml`` → ``module``) exposes ``build(ctx) -> list[QueryDefinition]``.
The YAML declares the streams, groups and outputs; the module reads streams with
:meth:`PlanContext.stream`, writes outputs through :meth:`PlanContext.sink`, and the runtime
starts the queries of the instance's group (``ctx.queries``) only.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import reduce
from types import ModuleType

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import PlanError
from tandem.layout import delta_table_dir, instance_landing_dirs
from tandem.runtime.listener import QUALITY_METRICS
from tandem.runtime.publisher import QuarantineSink, Sink
from tandem.runtime.sinks import RoutedSink, sink_for
from tandem.runtime.records import parse_and_validate, record_schema
from tandem.runtime.sources import landing_lines
from tandem.store.registry import InstanceKey


@dataclass(frozen=True)
class PlanContext:
    """What a plan needs to build its queries for one instance (one instance of one group)."""

    cluster: ClusterConfig
    plan: PlanConfig
    instance: InstanceKey
    spark: SparkSession

    @property
    def group(self) -> str:
        return self.plan.group_of(self.instance.shard_id)[0]

    @property
    def queries(self) -> list[str]:
        """The queries this instance runs: those of its group."""
        return list(self.plan.groups[self.group].queries)

    def stream(self, name: str) -> DataFrame:
        """This instance's share of a declared stream, parsed and checked.

        Columns: ``raw``, ``source_file``, every declared field, and ``reason`` (null for a good line).
        """
        stream = self.plan.streams[name]
        directories = instance_landing_dirs(self.cluster, self.plan, self.instance.shard_id)[name]
        lines = landing_lines(self.spark, directories, stream.max_files_per_trigger)
        return parse_and_validate(lines, record_schema(stream))

    def sink(self, output: str) -> Sink:
        """The sink of a declared output, by its kind."""
        if output not in self.plan.outputs:
            raise PlanError(f"{self.plan.path}: outputs: a query writes {output!r}, which is not declared "
                            f"(outputs: {', '.join(self.plan.outputs)})")
        return sink_for(self.plan, output, self.instance, self.cluster.database_url,
                        delta_table_dir(self.cluster, self.plan.name, output), self._quarantine())

    def _quarantine(self) -> QuarantineSink | None:
        """Where rows an output's store refuses go: the plan's quarantine output (``None`` without one)."""
        names = [name for name, declared in self.plan.outputs.items() if declared.kind == "quarantine"]
        if not names:
            return None
        return QuarantineSink(self.instance, self.cluster.database_url,
                              delta_table_dir(self.cluster, self.plan.name, names[0]), output=names[0])

    def routed(self, column: str, outputs: dict[str, str]) -> Sink:
        """One query, several outputs: each row goes to the output named for its value of ``column``."""
        return RoutedSink(column, {value: self.sink(output) for value, output in outputs.items()})


def good_events(validated: DataFrame, plan: PlanConfig, stream: str) -> DataFrame:
    """The good lines of a stream: its fields and ``event_time`` (a timestamp from the event-time field)."""
    declared = plan.streams[stream]
    return validated.where(F.col("valid")).select(
        *declared.fields, F.timestamp_millis(declared.event_time).alias("event_time"))


QUARANTINE_TRIGGER_S = 5.0


def quarantine_query(ctx: PlanContext, *validated: DataFrame) -> QueryDefinition:
    """The plan's ``quarantine`` query: the bad lines of all its streams, at most every 5 seconds."""
    return QueryDefinition("quarantine", quarantined(*validated), "append", ctx.sink("quarantine"),
                           min_trigger_interval_s=QUARANTINE_TRIGGER_S)


def quarantined(*validated: DataFrame) -> DataFrame:
    """Bad lines of one or more streams with the reason, counted as an observed metric for the heartbeats.

    A plan with several streams quarantines them all in one query: every streaming query costs a
    micro-batch every trigger (planning, listing, commit), and a node runs all of its queries.
    """
    bad = [frame.where(~F.col("valid")).select("raw", "source_file", "reason") for frame in validated]
    return reduce(DataFrame.unionByName, bad).observe(QUALITY_METRICS, F.count(F.lit(1)).alias("quarantined_rows"))


@dataclass(frozen=True)
class QueryDefinition:
    """One streaming query of a plan: a streaming DataFrame and where its batches go."""

    name: str
    frame: DataFrame
    output_mode: str
    sink: Sink
    state_value_names: tuple[str, ...] = ()
    """Names of the fields of the query's state values, in order (Spark names them after the
    aggregate functions: ``sum``, ``count``, ...); used by snapshot exports."""
    state_store: str = "default"
    """``rocksdb`` for queries whose operators need it (``transformWithStateInPandas``); the
    provider is fixed in the query's checkpoint when it first starts."""
    min_trigger_interval_s: float = 0.0
    """The query starts a micro-batch at most this often, even when the plan's trigger interval
    is shorter (outputs that need no low latency, like the quarantine, leave the cores to the rest)."""


def load_plan_module(plan: PlanConfig) -> ModuleType:
    try:
        module = importlib.import_module(plan.module)
    except ImportError as exc:
        raise PlanError(f"{plan.path}: module: cannot import {plan.module!r}: {exc}") from exc
    if not callable(getattr(module, "build", None)):
        raise PlanError(f"{plan.path}: module: {plan.module!r} has no build(ctx) function")
    return module


def group_queries(ctx: PlanContext, definitions: list[QueryDefinition]) -> list[QueryDefinition]:
    """The definitions of the instance's group, each declared query exactly once."""
    by_name = {d.name: d for d in definitions}
    missing = [q for q in ctx.queries if q not in by_name]
    if missing:
        raise PlanError(f"{ctx.plan.path}: groups.{ctx.group}.queries: {ctx.plan.module}.build() defines no "
                        f"query {', '.join(map(repr, missing))} (it defines {', '.join(by_name) or 'none'})")
    return [by_name[q] for q in ctx.queries]
