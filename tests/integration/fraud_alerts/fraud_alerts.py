"""fraud_alerts: the queries of conf/plans/fraud_alerts.yaml (docs/plans.md is the plan author's guide).

Stream ``payments {card_id, merchant, amount, time}``, partitioned by ``card_id``: a card's payments
all reach one instance. One query, ``payments``, routes its rows by ``kind``:

- ``card_totals`` (table, key ``card_id``): every payment as a contribution ``payments = 1``,
  ``amount``; the table sums a card's contributions, each payment (its fields) once.
- ``fraud_alerts`` (events): *card testing* — for every tiny payment (amount below
  :data:`TINY_BELOW`) of a card, the earliest large payment (at least :data:`LARGE_AT_LEAST`) of the
  same card with ``tiny.time < large.time <= tiny.time + 30 s`` gives one alert (ties at one time
  broken by merchant, then amount).

An alert is emitted when the watermark passes the large payment's time (an event-time timer at
every watched payment's time): then no earlier large payment can still arrive, so the active, the
standby and a restore emit the same alerts whatever their micro-batch boundaries.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

from tandem.config import spark_interval
from tandem.plans import PlanContext, query

STREAM = "payments"
TINY_BELOW = 2.0
LARGE_AT_LEAST = 500.0
WITHIN_MS = 30_000

WATCHED = StructType([StructField("time", LongType()), StructField("merchant", StringType()),
                      StructField("amount", DoubleType())])
"""A tiny or large payment of the card the pattern still needs."""
PROGRESS = StructType([StructField("done_until", LongType())])
ROW = StructType([
    StructField("kind", StringType()), StructField("card_id", StringType()), StructField("merchant", StringType()),
    StructField("amount", DoubleType()), StructField("time", LongType()), StructField("payments", LongType()),
    StructField("large_merchant", StringType()), StructField("large_amount", DoubleType()),
    StructField("large_time", LongType()),
])
"""``payment`` rows (the payment, ``payments = 1``) and ``alert`` rows (the tiny payment, and the large one)."""
COLUMNS = [f.name for f in ROW.fields]

Payment = tuple[int, str, float]  # (time ms, merchant, amount)


def card_testing(watched: list[Payment], done_until: int | None,
                 now: int) -> tuple[list[tuple[Payment, Payment]], list[Payment]]:
    """One card's alerts whose large payment is in ``(done_until, now]``, and what to keep watching (pure).

    ``watched``: the tiny payments at or before ``done_until`` not alerted yet, and every tiny or
    large payment after it. Times are handled in increasing order: a tiny payment is alerted by the
    first time that has a large payment within its 30 s.
    """
    def handled(p: Payment) -> bool:
        return done_until is not None and p[0] <= done_until

    open_tiny = sorted(p for p in watched if handled(p) and p[2] < TINY_BELOW)
    alerts = []
    for t in sorted({p[0] for p in watched if not handled(p) and p[0] <= now}):
        large = sorted((m, a) for time, m, a in watched if time == t and a >= LARGE_AT_LEAST)
        if large:
            matched = [p for p in open_tiny if p[0] < t <= p[0] + WITHIN_MS]
            alerts += [(p, (t, *large[0])) for p in matched]
            open_tiny = [p for p in open_tiny if p not in matched]
        open_tiny += sorted(p for p in watched if p[0] == t and p[2] < TINY_BELOW)
    keep = [p for p in open_tiny if p[0] + WITHIN_MS > now] + sorted(p for p in watched if p[0] > now)
    return alerts, keep


class CardTesting(StatefulProcessor):
    """Per card: every payment out at once (for the table); tiny and large ones watched until final.

    A timer at every watched payment's time (and at a tiny payment's time + 30 s, to forget it). The
    first timer of a card to fire in a micro-batch handles every time up to the watermark and
    remembers it (``done_until``); the card's other timers of that batch make no state call.
    """

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.watched = handle.getListState("watched", WATCHED)
        self.progress = handle.getValueState("progress", PROGRESS)
        self.handled_cards: set[Any] = set()
        self.handled_watermark: int | None = None

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:
        frame = pd.concat(list(rows))
        card = str(key[0])
        payments = [(int(t), str(m), float(a)) for t, m, a in zip(frame["time"], frame["merchant"], frame["amount"])]
        relevant = [p for p in payments if p[2] < TINY_BELOW or p[2] >= LARGE_AT_LEAST]
        if relevant:
            done_until = self._done_until()
            fresh = [p for p in relevant if done_until is None or p[0] > done_until]
            if fresh:
                self.watched.appendList(fresh)
                for time in sorted({p[0] for p in fresh} | {p[0] + WITHIN_MS for p in fresh if p[2] < TINY_BELOW}):
                    self.handle.registerTimer(time)
        yield pd.DataFrame([("payment", card, m, a, t, 1, None, None, None) for t, m, a in payments], columns=COLUMNS)

    def handleExpiredTimer(self, key: Any, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        now = max(expiredTimerInfo.getExpiryTimeInMs(), timerValues.getCurrentWatermarkInMs())
        if self.handled_watermark != now:
            self.handled_cards, self.handled_watermark = set(), now
        if key in self.handled_cards:
            return
        self.handled_cards.add(key)
        watched = [(int(t), str(m), float(a)) for t, m, a in self.watched.get()]
        alerts, keep = card_testing(watched, self._done_until(), now)
        self.progress.update((now,))
        if sorted(keep) != sorted(watched):
            self.watched.put(keep) if keep else self.watched.clear()
        if alerts:
            card = str(key[0])
            yield pd.DataFrame([("alert", card, m, a, t, 0, lm, la, lt) for (t, m, a), (lt, lm, la) in alerts],
                               columns=COLUMNS)

    def _done_until(self) -> int | None:
        stored = self.progress.get()
        return None if stored is None else int(stored[0])

    def close(self) -> None:
        pass


@query(route_by="kind", routes={"payment": "card_totals", "alert": "fraud_alerts"})
def payments(ctx: PlanContext) -> DataFrame:
    """Every payment (for the card totals) and, once final, every card-testing alert."""
    timed = ctx.events(STREAM).withWatermark("event_time", spark_interval(ctx.plan.watermark_s))
    return timed.select("card_id", "merchant", "amount", "time", "event_time").groupBy("card_id") \
        .transformWithStateInPandas(statefulProcessor=CardTesting(), outputStructType=ROW, outputMode="Append",
                                    timeMode="EventTime")


MERCHANTS = ("grocer", "fuel", "books", "cafe", "pharmacy", "cinema")
LARGE_MERCHANTS = ("jeweller", "electronics", "travel")


@dataclass
class PaymentGenerator:
    """Cards paying everyday amounts; now and then a card test: a tiny payment, then a large one 1 to 45 s later
    (a quarter of them about 30 s later, at the edge of the pattern's window)."""

    seed: int = 42
    cards: int = 12
    testing: float = 0.1
    pending: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)

    def events(self, now_ms: int, count: int) -> dict[str, list[dict[str, Any]]]:
        rng, out = self.random, []
        for _ in range(count):
            card, time, draw = f"card-{rng.randrange(self.cards):03d}", now_ms - rng.randint(0, 1500), rng.random()
            if draw < self.testing:
                amount = round(rng.uniform(0.5, 1.99), 2)
                later = time + rng.choice((rng.randint(1_000, 25_000), rng.randint(1_000, 25_000),
                                           rng.randint(29_000, 31_000), rng.randint(31_000, 45_000)))
                self.pending.append((later, {"card_id": card, "merchant": rng.choice(LARGE_MERCHANTS),
                                             "amount": round(rng.uniform(500, 3000), 2), "time": later}))
            elif draw < self.testing * 1.5:
                amount = round(rng.uniform(500, 3000), 2)
            else:
                amount = round(rng.uniform(3, 300), 2)
            out.append({"card_id": card, "merchant": rng.choice(MERCHANTS), "amount": amount, "time": time})
        out += [payment for at, payment in self.pending if at <= now_ms]
        self.pending = [(at, payment) for at, payment in self.pending if at > now_ms]
        return {STREAM: out}


generator = PaymentGenerator
