"""The plan API: what a plan module declares, and how the runtime turns it into streaming queries.

A plan is ``conf/plans/<name>.yaml`` (what: streams, groups, outputs, policies) and one module
(how: one function per query, declared with :func:`query`). Plan modules import this API from
:mod:`tandem.plans`; the runtime loads them by name (:func:`load_plan_module`) and never imports
them, so plans sit above the runtime and the runtime below them.

What the runtime derives, so a plan does not say it:

- the ``quarantine`` query: the bad lines of every stream of the plan, into its quarantine output
  (implicit when the YAML declares none), in the group(s) listing ``quarantine`` or else the first;
- the output mode: ``update`` for a query writing an aggregation without ``id`` (Spark's partial
  aggregates change as events arrive), ``append`` otherwise;
- the state store: RocksDB for a query that uses ``transformWithState`` (it requires it), Spark's
  default otherwise (``@query(state_store=...)`` overrides);
- the names of the state values a snapshot exports: the measures of the aggregation it writes.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from tandem.aggregation.spec import spec_for
from tandem.checkpoints import processed_files_by_source
from tandem.config import ClusterConfig, PlanConfig, quarantine_output
from tandem.cutover import Cut
from tandem.errors import PlanError
from tandem.layout import checkpoint_dir, delta_table_dir
from tandem.names import QUARANTINE_QUERY
from tandem.outputs import kind_of, sink_for
from tandem.outputs.base import Sink
from tandem.outputs.quarantine import QuarantineSink
from tandem.plan_version import plan_module_file, plan_version
from tandem.runtime.listener import QUALITY_METRICS
from tandem.runtime.publisher import ALL_ROWS, RoutedSink
from tandem.runtime.records import parse_and_validate, record_schema
from tandem.sources import source_of
from tandem.store.registry import InstanceKey

STATE_STORES = ("default", "rocksdb")
QUARANTINE_TRIGGER_S = 5.0
_FILE_SCHEME = re.compile(r"^file:/+")
"""The quarantine query starts a micro-batch at most this often: bad lines need no low latency."""


@dataclass(frozen=True)
class PlanContext:
    """What a query function gets: the plan, the instance it runs for, and its streams and outputs."""

    cluster: ClusterConfig
    plan: PlanConfig
    instance: InstanceKey
    spark: SparkSession
    input_folders: Mapping[str, list[Path]] | None = None
    """A recomputation's gathered input (:func:`tandem.batch.backfill.gather_input`): the streams whose kind gathered
    some read these folders instead of their live input."""
    cut: Cut | None = None
    """The group's newest cut-over (:mod:`tandem.cutover`): each query reads only past it (:meth:`stream`)."""
    _streams: dict[Any, DataFrame] = field(default_factory=dict, compare=False, repr=False)
    _building: list[QuerySpec] = field(default_factory=list, compare=False, repr=False)
    """The query :func:`define` is building (at most one)."""

    @property
    def group(self) -> str:
        return self.plan.group_of(self.instance.instance)[0]

    @property
    def queries(self) -> list[str]:
        """The queries this instance runs: those of its group."""
        return list(self.plan.groups[self.group].queries)

    def stream(self, name: str) -> DataFrame:
        """This instance's share of a declared stream, parsed and checked.

        Columns: ``raw``, ``source_file``, every declared field, ``valid`` and ``reason`` (null for a
        good line). The same DataFrame for every call of one instance.
        """
        if name not in self.plan.streams:
            raise PlanError(f"{self.plan.path}: streams: a query reads {name!r}, which is not declared "
                            f"(streams: {', '.join(self.plan.streams)})")
        past_cut = self._past_cut(name)
        key = name if past_cut is None else (name, self._building[-1].name)
        if key not in self._streams:
            lines = source_of(self.plan, name).lines(self.spark, self.cluster, self.plan, self.instance.instance, name,
                                                     folders=(self.input_folders or {}).get(name))
            validated = parse_and_validate(lines, record_schema(self.plan.streams[name]))
            self._streams[key] = validated if past_cut is None else validated.where(past_cut)
        return self._streams[key]

    def _past_cut(self, stream: str) -> Column | None:
        """Which lines of ``stream`` the query being built reads after a cut-over (``None``: all of them): none of
        the files the retired instances' same query read, if it writes partials (or is the quarantine); else their
        events from the state horizon on (they rebuild its state; it publishes by id)."""
        if self.cut is None or not self._building:
            return None
        building = self._building[-1]
        query_dir = checkpoint_dir(self.cluster, self.plan.name, self.instance.instance, self.instance.node,
                                   building.name)
        read_since = {uri for files in processed_files_by_source(query_dir) for uri in files or ()}
        # what the query's own checkpoint has read needs no filter: after its first batches, none (a small plan)
        files = sorted({_FILE_SCHEME.sub("/", uri) for uri in self.cut.consumed.get(building.name, ())
                        if uri not in read_since})
        if not files:
            return None
        # Spark's log says file:///x, a row's _metadata file:/x (both URI-escaped): compared without the scheme
        unread = ~F.regexp_replace("source_file", _FILE_SCHEME.pattern, "/").isin(files)
        if building.name == QUARANTINE_QUERY or partial_aggregations(self.plan, building):
            return unread
        event_time = self.plan.streams[stream].event_time
        return unread | (F.col("valid") & (F.col(event_time) >= F.lit(self.cut.horizon_start_ms)))

    def events(self, name: str) -> DataFrame:
        """The good events of a declared stream: its fields and ``event_time`` (a timestamp)."""
        return good_events(self.stream(name), self.plan, name)

    def sink(self, output: str) -> Sink:
        """The sink of a declared output, by its kind."""
        if output not in self.plan.outputs:
            raise PlanError(f"{self.plan.path}: outputs: a query writes {output!r}, which is not declared "
                            f"(outputs: {', '.join(self.plan.outputs)})")
        return sink_for(self.plan, output, self.instance, self.cluster.database_url,
                        delta_table_dir(self.cluster, self.plan.name, output), self._quarantine())

    def _quarantine(self) -> QuarantineSink:
        """Where rows an output's store refuses go: the plan's quarantine output."""
        name = quarantine_output(self.plan)
        return QuarantineSink(self.instance, self.cluster.database_url,
                              delta_table_dir(self.cluster, self.plan.name, name), output=name,
                              plan_version=plan_version(self.plan))

    def routed(self, column: str, outputs: Mapping[str, tuple[str, ...]]) -> Sink:
        """One query, several outputs: each row goes to the outputs named for its value of ``column``."""
        return RoutedSink(column, [(value, self.sink(output)) for value, names in outputs.items() for output in names])


def good_events(validated: DataFrame, plan: PlanConfig, stream: str) -> DataFrame:
    """The good lines of a stream: its fields and ``event_time`` (a timestamp from the event-time field)."""
    declared = plan.streams[stream]
    return validated.where(F.col("valid")).select(
        *declared.fields, F.timestamp_millis(declared.event_time).alias("event_time"))


def quarantined(*validated: DataFrame) -> DataFrame:
    """Bad lines of one or more streams with the reason, counted as an observed metric for the heartbeats.

    A plan with several streams quarantines them all in one query: every streaming query costs a
    micro-batch every trigger (planning, listing, commit), and a node runs all of its queries.
    """
    bad = [frame.where(~F.col("valid")).select("raw", "source_file", "reason") for frame in validated]
    return reduce(DataFrame.unionByName, bad).observe(QUALITY_METRICS, F.count(F.lit(1)).alias("quarantined_rows"))


# --- declaring queries -----------------------------------------------------------------------------------------


class QueryFunction(Protocol):
    def __call__(self, ctx: PlanContext) -> DataFrame: ...


@dataclass(frozen=True)
class QuerySpec:
    """One query as its plan module declares it: its function and the outputs its rows go to."""

    name: str
    function: Callable[[PlanContext], DataFrame]
    routes: Mapping[str, tuple[str, ...]]
    """``{value of route_by: outputs}``; ``"*"`` takes every row (a query writing one output: ``{"*": (output,)}``)."""
    route_by: str | None = None
    state_store: str | None = None
    """``None``: derived from the query (RocksDB for ``transformWithState``)."""
    min_trigger_interval_s: float = 0.0

    @property
    def outputs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(output for outputs in self.routes.values() for output in outputs))

    @property
    def where(self) -> str:
        """``<file>: <function>()``, for errors about this query."""
        try:
            source = inspect.getsourcefile(self.function) or self.function.__module__
        except TypeError:
            source = getattr(self.function, "__module__", "?")
        return f"{source}: {getattr(self.function, '__name__', self.name)}()"


QUERY_ATTRIBUTE = "__tandem_query__"


def query(writes: str | None = None, *, route_by: str | None = None,
          routes: Mapping[str, str | Sequence[str]] | None = None,
          name: str | None = None, state_store: str | None = None) -> Callable[[QueryFunction], QueryFunction]:
    """Declare a plan's query: the decorated function takes a :class:`PlanContext` and returns a streaming DataFrame.

    ``writes``: the output every row goes to; or ``route_by`` a column and ``routes``
    ``{value: output or [outputs]}`` (``"*"``: every row). ``name``: the query's name in the YAML's groups
    (default: the function's name).
    """
    if (writes is None) == (routes is None):
        raise PlanError("@query: give either writes=OUTPUT or route_by=COLUMN with routes={value: output}")
    if (routes is None) != (route_by is None):
        raise PlanError("@query: routes= and route_by= go together")
    if state_store is not None and state_store not in STATE_STORES:
        raise PlanError(f"@query: state_store must be one of {', '.join(STATE_STORES)}, got {state_store!r}")

    def declare(function: QueryFunction) -> QueryFunction:
        named = {ALL_ROWS: writes} if routes is None else routes
        spec = QuerySpec(name or function.__name__, function,
                         {value: (outputs,) if isinstance(outputs, str) else tuple(outputs)
                          for value, outputs in named.items()}, route_by, state_store)
        setattr(function, QUERY_ATTRIBUTE, spec)
        return function

    return declare


def declared_queries(module: ModuleType) -> dict[str, QuerySpec]:
    """The queries a plan module declares with :func:`query`, by name, in the order of the module."""
    out: dict[str, QuerySpec] = {}
    for value in vars(module).values():
        spec = getattr(value, QUERY_ATTRIBUTE, None)
        if isinstance(spec, QuerySpec):
            out.setdefault(spec.name, spec)
    return out


def quarantine_spec(plan: PlanConfig) -> QuerySpec:
    """The implicit ``quarantine`` query: the bad lines of every stream, into the plan's quarantine output."""

    def quarantine(ctx: PlanContext) -> DataFrame:
        return quarantined(*(ctx.stream(name) for name in plan.streams))

    return QuerySpec(QUARANTINE_QUERY, quarantine, {ALL_ROWS: (quarantine_output(plan),)},
                     min_trigger_interval_s=QUARANTINE_TRIGGER_S)


def plan_queries(plan: PlanConfig, module: ModuleType) -> dict[str, QuerySpec]:
    """Every query of the plan: the module's and the implicit quarantine query."""
    return {**declared_queries(module), QUARANTINE_QUERY: quarantine_spec(plan)}


def query_problems(plan: PlanConfig, module_name: str, declared: Mapping[str, QuerySpec]) -> list[str]:
    """What does not fit between a plan's YAML and its module's queries, one sentence each (pure).

    Every group's queries exist, every query runs in a group, every query writes declared outputs,
    and every output is written by a query. ``declared``: the module's queries (without the implicit one).
    """
    problems = []
    listed = {q for group in plan.groups.values() for q in group.queries}
    if QUARANTINE_QUERY in declared:
        problems.append(f"{declared[QUARANTINE_QUERY].where}: the query name {QUARANTINE_QUERY!r} is the runtime's "
                        "(the bad lines of every stream): rename the query")
    known = {**declared, QUARANTINE_QUERY: None}
    for group_name, group in plan.groups.items():
        for index, name in enumerate(group.queries):
            if name not in known:
                problems.append(f"{plan.path}: groups.{group_name}.queries[{index}]: {module_name} declares no "
                                f"query {name!r} (it declares {', '.join(map(repr, declared)) or 'none'}; "
                                "a query is a function decorated with @query)")
    written = {QUARANTINE_QUERY: {quarantine_output(plan)}}
    for name, spec in declared.items():
        if name == QUARANTINE_QUERY:
            continue
        if name not in listed:
            problems.append(f"{spec.where}: query {name!r} runs in no group (add it to a group's queries in "
                            f"{plan.path})")
        for output in spec.outputs:
            if output not in plan.outputs:
                problems.append(f"{spec.where}: writes {output!r}, which {plan.path} does not declare "
                                f"(outputs: {', '.join(plan.outputs)})")
        if spec.route_by is not None and not spec.routes:
            problems.append(f"{spec.where}: routes by {spec.route_by!r} to no output")
        written[name] = set(spec.outputs)
    every = set().union(*written.values())
    for output in plan.outputs:
        if output not in every:
            problems.append(f"{plan.path}: outputs.{output}: no query writes it")
    return problems


def check_plan_module(plan: PlanConfig, module: ModuleType) -> dict[str, QuerySpec]:
    """The plan's queries, or a :class:`PlanError` listing everything that does not fit (no Spark needed)."""
    declared = declared_queries(module)
    problems = query_problems(plan, module.__name__, declared)
    if problems:
        raise PlanError("\n".join(problems))
    return plan_queries(plan, module)


# --- loading a plan's module ------------------------------------------------------------------------------------


def load_plan_module(plan: PlanConfig) -> ModuleType:
    """The plan's module: ``<name>.py`` beside its YAML when there is one, else ``module:`` (a bundled plan).

    A module beside the YAML is imported as ``tandem.plans.<name>`` and pickled by value, so Spark's
    Python workers (which run its ``transformWithState`` processors) need not find the file.
    """
    beside = plan_module_file(plan)
    if beside.is_file():
        return _import_file(plan, beside)
    try:
        return importlib.import_module(plan.module)
    except Exception as exc:  # noqa: BLE001 - any error of the module's own code is the plan's error
        raise PlanError(f"{plan.path}: module: cannot import {plan.module!r}: {type(exc).__name__}: {exc}") from exc


def _import_file(plan: PlanConfig, path: Path) -> ModuleType:
    name = plan.module
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) == str(path) and \
            getattr(loaded, "__tandem_mtime__", None) == path.stat().st_mtime_ns:
        return loaded
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    module.__tandem_mtime__ = path.stat().st_mtime_ns
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001
        del sys.modules[name]
        raise PlanError(f"{path}: cannot import the plan's module: {type(exc).__name__}: {exc}") from exc
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return module


# --- what the runtime starts -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueryDefinition:
    """One streaming query of an instance, ready to start: a streaming DataFrame and where its batches go."""

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


_TRANSFORM_WITH_STATE = re.compile(r"\bTransformWithState")


def uses_transform_with_state(frame: DataFrame) -> bool:
    """Whether a query's logical plan has a ``transformWithState`` operator (which needs RocksDB)."""
    return bool(_TRANSFORM_WITH_STATE.search(frame._jdf.queryExecution().logical().toString()))


def partial_aggregations(plan: PlanConfig, spec: QuerySpec) -> list[str]:
    """The aggregation outputs without ``id`` the query writes: Spark's streaming partial aggregates (pure)."""
    return [o for o in spec.outputs if not kind_of(plan, o).published_by_id(plan.outputs[o])]


def partial_outputs_by_query(plan: PlanConfig) -> dict[str, list[str]]:
    """Per query of the plan's module, the outputs it publishes as Spark's partials (:func:`partial_aggregations`):
    what a cut-over needs to know of an interrupted batch (:func:`tandem.cutover.cut_over`)."""
    specs = check_plan_module(plan, load_plan_module(plan))
    return {name: partial_aggregations(plan, spec) for name, spec in specs.items()}


def state_value_names(plan: PlanConfig, spec: QuerySpec) -> tuple[str, ...]:
    """The names of the fields of the query's state values a snapshot exports: the measures of the
    aggregation it computes (``()`` for a query without a Spark aggregation) (pure)."""
    partials = partial_aggregations(plan, spec)
    return tuple(spec_for(plan, partials[0]).state_value_names) if partials else ()


def define(ctx: PlanContext, spec: QuerySpec) -> QueryDefinition:
    """Build one query for an instance: call its function, pick its sink, derive what Spark needs."""
    ctx._building.append(spec)  # the streams it reads are read past a cut-over as its outputs need (ctx.stream)
    try:
        frame = spec.function(ctx)
    finally:
        ctx._building.pop()
    if not isinstance(frame, DataFrame) or not frame.isStreaming:
        raise PlanError(f"{spec.where}: must return a streaming DataFrame (from ctx.stream / ctx.events), "
                        f"got {type(frame).__name__}")
    partials = partial_aggregations(ctx.plan, spec)
    sink = ctx.sink(spec.routes[ALL_ROWS][0]) if spec.route_by is None else ctx.routed(spec.route_by, spec.routes)
    state_store = spec.state_store or ("rocksdb" if uses_transform_with_state(frame) else "default")
    return QueryDefinition(spec.name, frame, "update" if partials else "append", sink,
                           state_value_names(ctx.plan, spec), state_store, spec.min_trigger_interval_s)


def instance_queries(ctx: PlanContext, names: list[str] | None = None) -> list[QueryDefinition]:
    """The queries of the instance's group (or ``names``), built and checked against the YAML."""
    specs = check_plan_module(ctx.plan, load_plan_module(ctx.plan))
    return [define(ctx, specs[name]) for name in (ctx.queries if names is None else names)]


def plan_hook(plan: PlanConfig, name: str) -> Any:
    """An optional module-level hook of the plan's module (e.g. ``generator``), or ``None``."""
    return getattr(load_plan_module(plan), name, None)
