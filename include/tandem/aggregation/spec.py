"""The shape of a partial aggregate: its keys and its mergeable measures, from a plan's declared output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from tandem.aggregation.granularity import GRANULARITIES
from tandem.declarations import DEFAULT_MAX_VALUES, EXACT_FLAG_SUFFIX

# How partial values of a measure combine across instances and from child buckets to parents.
# A distinct measure is unioned in Python: an HLL sketch (DataSketches format, ``distinct``) or an exact set of
# values up to a bound (``distinct_exact``, :mod:`tandem.aggregation.exact_sets`).
MERGE_SQL = {"sum": "sum", "count": "sum", "min": "min", "max": "max"}
DISTINCT_KINDS = ("distinct", "distinct_exact")
KINDS = (*MERGE_SQL, *DISTINCT_KINDS)
SQL_TYPES = {"double": "double precision", "long": "bigint", "string": "text", "epoch_millis": "bigint"}
HLL_LG_K = 12
"""log2 of the HLL sketches' buckets: relative standard error ≈ 1.04 / sqrt(2^12) = 1.6 %."""
ARROW_TYPES = {"double precision": pa.float64(), "bigint": pa.int64(), "bytea": pa.binary(), "text": pa.string()}
UTC_MICROS = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class Measure:
    column: str
    kind: str  # sum | count | min | max | distinct | distinct_exact
    sql_type: str
    source: str | None = None  # the input column (None for count)
    max_values: int | None = None
    """``distinct_exact``: the most values a stored partial holds as an exact set (default
    :data:`tandem.declarations.DEFAULT_MAX_VALUES`); ``None`` for the other kinds."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"measure {self.column}: unknown kind {self.kind!r}")
        if self.kind == "distinct_exact":
            if self.max_values is None:
                object.__setattr__(self, "max_values", DEFAULT_MAX_VALUES)
            elif self.max_values < 1:
                raise ValueError(f"measure {self.column}: max_values must be at least 1, not {self.max_values}")
        elif self.max_values is not None:
            raise ValueError(f"measure {self.column}: max_values is a setting of a distinct_exact measure, not of "
                             f"{self.kind}")

    @property
    def distinct(self) -> bool:
        """Whether its partials are sets of values (a sketch or an exact set), unioned in Python: the SQL of a
        roll-up or a merge leaves them to :mod:`tandem.aggregation`."""
        return self.kind in DISTINCT_KINDS

    @property
    def exact_flag(self) -> str | None:
        """The column a read adds beside a ``distinct_exact`` measure: whether its count is exact."""
        return f"{self.column}{EXACT_FLAG_SUFFIX}" if self.kind == "distinct_exact" else None


@dataclass(frozen=True)
class Ratio:
    """A derived value computed after merging, e.g. avg = sum / count."""

    column: str
    numerator: str
    denominator: str


@dataclass(frozen=True)
class AggregationSpec:
    """An aggregation of partials per instance, served from one PostgreSQL table and one Delta table of the same rows."""

    name: str
    table: str
    keys: tuple[str, ...]
    measures: tuple[Measure, ...]
    ratios: tuple[Ratio, ...] = ()
    granularities: tuple[str, ...] = GRANULARITIES
    """The buckets kept, finest first; always ``second``, from which the others are rolled up."""

    def child_of(self, granularity: str) -> str:
        """The next finer kept granularity, from which ``granularity``'s buckets are rolled up."""
        return self.granularities[self.granularities.index(granularity) - 1]

    def check_granularity(self, granularity: str) -> str:
        if granularity not in self.granularities:
            raise ValueError(f"unknown granularity {granularity!r}: {self.name} keeps {', '.join(self.granularities)}")
        return granularity

    @property
    def measure_columns(self) -> list[str]:
        return [m.column for m in self.measures]

    @property
    def state_value_names(self) -> list[str]:
        """The fields of Spark's state value for these measures (its aggregation buffer, in order): a ``long`` sum
        keeps whether it has seen a value beside its total (``try_sum``)."""
        names = []
        for m in self.measures:
            names.append(m.column)
            if m.kind == "sum" and m.sql_type == "bigint":
                names.append(f"{m.column}_is_empty")
        return names

    @property
    def distinct_columns(self) -> list[str]:
        """The measures whose partials are unioned in Python (``distinct`` and ``distinct_exact``)."""
        return [m.column for m in self.measures if m.distinct]

    @property
    def distinct_measures(self) -> list[Measure]:
        return [m for m in self.measures if m.distinct]

    @property
    def written_schema(self) -> pa.Schema:
        """A published row's columns, as a publish returns them (the serving table's, without ``plan`` and
        ``updated_at``)."""
        return pa.schema([("granularity", pa.string()), ("bucket_start", UTC_MICROS),
                          *[(k, pa.string()) for k in self.keys], ("instance", pa.string()),
                          *[(m.column, ARROW_TYPES[m.sql_type]) for m in self.measures],
                          ("epoch", pa.int64()), ("batch_id", pa.int64())])

    @property
    def version_column(self) -> str:
        """The count measure: a partial covering more events is a newer version of the same key."""
        return next(m.column for m in self.measures if m.kind == "count")


def spec_for(plan: Any, output: str) -> AggregationSpec:
    """The aggregation a plan declares as ``output`` (a :class:`tandem.config.PlanConfig`)."""
    declared = plan.outputs[output]
    if declared.kind != "aggregation":
        raise ValueError(f"{plan.path}: outputs.{output} is a {declared.kind} output, not an aggregation")
    field_types = {name: f.column_type for stream in plan.streams.values() for name, f in stream.fields.items()}
    measures = []
    for column, measure in declared.measures.items():
        kind, source = measure.function, measure.source
        if kind in DISTINCT_KINDS:
            sql_type = "bytea"
        elif kind == "count":
            sql_type = "bigint"
        else:
            sql_type = SQL_TYPES[measure.type or field_types.get(source, "double")]
        measures.append(Measure(column, kind, sql_type, source, measure.max_values))
    return AggregationSpec(name=output, table=declared.serving_table(plan.name, output), keys=tuple(declared.key),
                           measures=tuple(measures),
                           ratios=tuple(Ratio(c, n, d) for c, (n, d) in declared.ratios.items()),
                           granularities=tuple(g for g in GRANULARITIES
                                               if g == "second" or g in (declared.granularities or GRANULARITIES)))


def aggregation_outputs(plan: Any) -> list[str]:
    """The names of a plan's aggregation outputs, in declaration order."""
    return [name for name, output in plan.outputs.items() if output.kind == "aggregation"]
