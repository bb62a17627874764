"""TradeStream / TradeAggregation (reference seed 003).

Events ``{symbol, price, quantity, timestamp (epoch ms)}`` → per-second partial aggregates by
symbol with an event-time window and a watermark (bounded state), as declared in
``conf/plans/trades.yaml``. The publisher rolls seconds up to minute, hour, day, month and year,
so every granularity is served from one stateful query, as WSO2's incremental aggregation does.
Bad lines go to the quarantine table with the reason.
"""

from __future__ import annotations

from tandem.aggregation.spark import second_partials
from tandem.aggregation.spec import spec_for
from tandem.plans import PlanContext, QueryDefinition, good_events, quarantine_query

STREAM = "trades"
OUTPUT = "trade_aggregates"


def build(ctx: PlanContext) -> list[QueryDefinition]:
    validated = ctx.stream(STREAM)
    spec = spec_for(ctx.plan, OUTPUT)
    return [
        QueryDefinition(
            name="aggregates",
            frame=second_partials(good_events(validated, ctx.plan, STREAM), spec, ctx.plan.watermark_s),
            output_mode="update",
            sink=ctx.sink(OUTPUT),
            state_value_names=tuple(spec.measure_columns),  # the .agg() order of second_partials
        ),
        quarantine_query(ctx, validated),
    ]
