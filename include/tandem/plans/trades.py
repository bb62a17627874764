"""TradeStream / TradeAggregation (reference seed 003).

Events ``{symbol, price, quantity, timestamp (epoch ms)}`` → per-second partial aggregates by
symbol with an event-time window and a watermark (bounded state). The publisher rolls seconds up
to minute, hour, day, month and year, so every granularity is served from one stateful query,
as WSO2's incremental aggregation does. Bad lines go to the quarantine table with the reason.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType

from tandem.aggregation.spec import TRADES
from tandem.config import spark_interval
from tandem.layout import delta_table_dir, landing_dir
from tandem.plans import PlanContext, QueryDefinition
from tandem.runtime.listener import QUALITY_METRICS
from tandem.runtime.publisher import AggregateSink, QuarantineSink
from tandem.runtime.records import Check, FieldRule, RecordSchema, parse_and_validate
from tandem.runtime.sources import landing_lines

MAX_EPOCH_MILLIS = 253402300799999  # 9999-12-31T23:59:59.999Z

TRADE_EVENT = RecordSchema((
    FieldRule("symbol", StringType(), (Check(lambda c: F.length(F.trim(c)) > 0, "must not be empty"),)),
    FieldRule("price", DoubleType(), (Check(lambda c: (c > 0) & ~F.isnan(c), "must be > 0"),)),
    FieldRule("quantity", LongType(), (Check(lambda c: c > 0, "must be > 0"),)),
    FieldRule("timestamp", LongType(), (Check(lambda c: (c >= 0) & (c <= MAX_EPOCH_MILLIS),
                                              "must be epoch milliseconds between 1970 and 9999"),)),
))


def good_trades(validated: DataFrame) -> DataFrame:
    """Valid events with their event time."""
    return validated.where(F.col("reason").isNull()).select(
        "symbol", "price", "quantity", F.timestamp_millis("timestamp").alias("event_time"))


def second_partials(trades: DataFrame, watermark_s: float) -> DataFrame:
    """Per-second partial aggregates by symbol (sums and counts, never an average)."""
    return (
        trades.withWatermark("event_time", spark_interval(watermark_s))
        .groupBy(F.window("event_time", "1 second"), "symbol")
        .agg(
            F.sum("price").alias("price_sum"),
            F.count(F.lit(1)).alias("trade_count"),
            F.sum("quantity").alias("quantity_sum"),
            F.min("price").alias("price_min"),
            F.max("price").alias("price_max"),
        )
        .select(F.col("window.start").alias("bucket_start"), "symbol", *TRADES.measure_columns)
    )


def quarantined(validated: DataFrame) -> DataFrame:
    """Bad lines with the reason, counted as an observed metric for the heartbeats."""
    bad = validated.where(F.col("reason").isNotNull()).select("raw", "source_file", "reason")
    return bad.observe(QUALITY_METRICS, F.count(F.lit(1)).alias("quarantined_rows"))


def build(ctx: PlanContext) -> list[QueryDefinition]:
    plan, instance = ctx.plan, ctx.instance
    lines = landing_lines(ctx.spark, landing_dir(ctx.cluster, plan.source.stream, instance.shard_id),
                          plan.source.max_files_per_trigger)
    validated = parse_and_validate(lines, TRADE_EVENT)
    return [
        QueryDefinition(
            name="aggregates",
            frame=second_partials(good_trades(validated), plan.watermark_s),
            output_mode="update",
            sink=AggregateSink(TRADES, instance, ctx.cluster.database_url,
                               delta_table_dir(ctx.cluster, plan.name, TRADES.table), plan.watermark_s),
            state_value_names=tuple(TRADES.measure_columns),  # the .agg() order of second_partials
        ),
        QueryDefinition(
            name="quarantine",
            frame=quarantined(validated),
            output_mode="append",
            sink=QuarantineSink(instance, ctx.cluster.database_url, delta_table_dir(ctx.cluster, plan.name, "quarantine")),
        ),
    ]
