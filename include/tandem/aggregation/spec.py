"""The shape of a partial aggregate: its keys and its mergeable measures."""

from __future__ import annotations

from dataclasses import dataclass

# How partial values of a measure combine across shards and from child buckets to parents.
MERGE_SQL = {"sum": "sum", "count": "sum", "min": "min", "max": "max"}


@dataclass(frozen=True)
class Measure:
    column: str
    kind: str  # sum | count | min | max
    sql_type: str

    def __post_init__(self) -> None:
        if self.kind not in MERGE_SQL:
            raise ValueError(f"measure {self.column}: unknown kind {self.kind!r}")


@dataclass(frozen=True)
class Ratio:
    """A derived value computed after merging, e.g. avg = sum / count."""

    column: str
    numerator: str
    denominator: str


@dataclass(frozen=True)
class AggregationSpec:
    """A sharded aggregation served from one PostgreSQL table and one Delta table of the same rows."""

    name: str
    table: str
    keys: tuple[str, ...]
    measures: tuple[Measure, ...]
    ratios: tuple[Ratio, ...] = ()

    @property
    def measure_columns(self) -> list[str]:
        return [m.column for m in self.measures]

    @property
    def version_column(self) -> str:
        """The count measure: a partial covering more events is a newer version of the same key."""
        return next(m.column for m in self.measures if m.kind == "count")


TRADES = AggregationSpec(
    name="trades",
    table="trade_aggregates",
    keys=("symbol",),
    measures=(
        Measure("price_sum", "sum", "double precision"),
        Measure("trade_count", "count", "bigint"),
        Measure("quantity_sum", "sum", "bigint"),
        Measure("price_min", "min", "double precision"),
        Measure("price_max", "max", "double precision"),
    ),
    ratios=(Ratio("avg_price", "price_sum", "trade_count"),),
)

SPECS = {TRADES.name: TRADES}


def get_spec(name: str) -> AggregationSpec:
    try:
        return SPECS[name]
    except KeyError:
        raise ValueError(f"unknown aggregation {name!r} (known: {', '.join(SPECS)})") from None
