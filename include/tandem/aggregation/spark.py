"""The Spark side of an aggregation: per-second partials of a declared spec (sums and counts, never averages)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from tandem.aggregation.sketches import EMPTY_STRING
from tandem.aggregation.spec import HLL_LG_K, AggregationSpec, Measure
from tandem.config import spark_interval


def _aggregate(measure: Measure) -> Column:
    if measure.kind == "count":
        return F.count(F.lit(1))
    if measure.kind == "distinct":
        value = F.col(measure.source).cast("string")
        return F.hll_sketch_agg(F.when(value == "", F.lit(EMPTY_STRING)).otherwise(value), HLL_LG_K)
    if measure.kind == "distinct_exact":  # the exact set (tandem.aggregation.exact_sets), bounded by the publisher
        return F.to_json(F.array_sort(F.collect_set(F.col(measure.source).cast("string")))).cast("binary")
    value = F.col(measure.source)
    if measure.kind == "sum":  # past the type's range: a long sum is null (try_sum), a double one ±Infinity
        if measure.sql_type.startswith("double"):
            return F.sum(value.cast("double"))
        return F.try_sum(value.cast("long"))
    return F.min(value) if measure.kind == "min" else F.max(value)


def second_partials(frame: DataFrame, spec: AggregationSpec, watermark_s: float | None,
                    time_column: str = "event_time") -> DataFrame:
    """Per-second partial aggregates of ``frame`` by the spec's keys, one column per measure (in order).

    ``watermark_s``: the event-time watermark to set on ``time_column`` (``None`` when the frame has
    one already, e.g. the output of a stateful operator that carries its event time).
    """
    timed = frame.withWatermark(time_column, spark_interval(watermark_s)) if watermark_s else frame
    return (
        timed.groupBy(F.window(time_column, "1 second"), *spec.keys)
        .agg(*[_aggregate(m).alias(m.column) for m in spec.measures])
        .select(F.col("window.start").alias("bucket_start"), *spec.keys, *spec.measure_columns)
    )
