"""TradeStream / TradeAggregation (reference seed 003).

Events ``{symbol, price, quantity, timestamp (epoch ms)}`` → per-second partial aggregates by
symbol with an event-time window and a watermark (bounded state), as declared in
``conf/plans/trades.yaml``. The publisher rolls seconds up to minute, hour, day, month and year,
so every granularity is served from one stateful query, as WSO2's incremental aggregation does.
Bad lines go to the quarantine table with the reason.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame

from tandem.aggregation.spark import second_partials
from tandem.aggregation.spec import spec_for
from tandem.plans import PlanContext, query

STREAM = "trades"
OUTPUT = "trade_aggregates"
SYMBOLS = ("IBM", "WSO2", "ORCL", "MSFT", "GOOG", "AAPL", "AMZN", "NVDA", "TSLA", "META")


@query(OUTPUT)
def aggregates(ctx: PlanContext) -> DataFrame:
    """Per-second partial aggregates by symbol (the measures of ``trade_aggregates``)."""
    return second_partials(ctx.events(STREAM), spec_for(ctx.plan, OUTPUT), ctx.plan.watermark_s)


@dataclass
class TradeGenerator:
    """Reproducible trade events: the same seed gives the same symbols, prices and quantities."""

    seed: int = 42
    symbols: Sequence[str] = SYMBOLS

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)
        self.prices = {s: 50.0 + 10.0 * i for i, s in enumerate(self.symbols)}

    def event(self, timestamp_ms: int) -> dict[str, Any]:
        symbol = self.random.choice(self.symbols)
        self.prices[symbol] = max(1.0, round(self.prices[symbol] * (1 + self.random.uniform(-0.01, 0.01)), 2))
        return {"symbol": symbol, "price": self.prices[symbol], "quantity": self.random.randint(1, 500),
                "timestamp": timestamp_ms}

    def events(self, now_ms: int, count: int) -> dict[str, list[dict[str, Any]]]:
        return {STREAM: [self.event(now_ms) for _ in range(count)]}


generator = TradeGenerator
