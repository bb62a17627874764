"""The pizza-shop plan (reference seed 000): orders delivered on time, and overdue orders.

Streams ``orders {order_no, customer_name, time}`` and ``deliveries {order_no, time}``, both
partitioned by ``order_no``, so an order and its delivery reach the same instance. An order
expires 30 s (event time) after it was placed. At expiry it is delivered on time if a delivery of
the same order has a time in ``[order time, order time + 30 s]``, otherwise it is overdue.

- ``delivered_orders`` (table, key ``customer_name``): the number of orders delivered on time per
  customer; a customer's orders fall into several partitions, so reads add up the instances' counts.
- ``overdue_orders`` (events): one per overdue order.
- ``last_orders`` (latest, key ``customer_name``): each customer's latest order by order time, with its
  outcome.
- ``order_stats`` (aggregation, second … year of the order time): orders, orders delivered on
  time, and distinct customers (an HLL sketch). Each order's outcome is a fact added once by the
  sink: Spark refuses to aggregate rows a ``transformWithState`` emits older than the watermark.

The expiry is an event-time timer: it fires once the watermark passes it, when no delivery that
could count can still arrive, so every replica decides every order the same way.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import ArrayType, LongType, StringType, StructField, StructType

from tandem.config import spark_interval
from tandem.plans import PlanContext, query

EXPIRY_MS = 30_000
CUSTOMERS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy")
ORDER = StructType([StructField("customer_name", StringType()), StructField("time", LongType()),
                    StructField("deliveries", ArrayType(LongType()))])
"""One order's state: the order (null until it arrives) and the times of its deliveries so far."""
OUTCOME = StructType([
    StructField("outcome", StringType()), StructField("order_no", StringType()),
    StructField("customer_name", StringType()), StructField("order_time", LongType()),
    StructField("expiry_time", LongType()), StructField("delivered", LongType()),
])


def outcome(order_time: int, deliveries: list[int]) -> str:
    """``delivered`` if a delivery lies in ``[order time, order time + 30 s]``, else ``overdue`` (pure)."""
    return "delivered" if any(order_time <= d <= order_time + EXPIRY_MS for d in deliveries) else "overdue"


class OrderExpiry(StatefulProcessor):
    """Per order: the order, its deliveries, and a timer at the order's expiry.

    The whole state of an order is one value, read and written once per batch and per timer: every
    state call is a round trip between the Python worker and the JVM.
    """

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.state = handle.getValueState("order", ORDER)

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:
        frame = pd.concat(list(rows))
        stored = self.state.get()
        customer, order_time, deliveries = stored if stored is not None else (None, None, [])
        deliveries = [int(d) for d in deliveries or []]
        orders = frame[frame["kind"] == "order"]
        if len(orders):
            first = orders.loc[orders["time"].idxmin()]  # an order placed twice counts from the first
            if order_time is None or int(first["time"]) < int(order_time):
                customer, order_time = str(first["customer_name"]), int(first["time"])
                self.handle.registerTimer(order_time + EXPIRY_MS)
        delivered = [int(t) for t in frame.loc[frame["kind"] != "order", "time"]]
        if delivered:
            deliveries += delivered
            self.handle.registerTimer(max(delivered) + EXPIRY_MS)  # forget them once no order can match them
        self.state.update((customer, None if order_time is None else int(order_time), deliveries))
        return iter([])

    def handleExpiredTimer(self, key: Any, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:
        now = expiredTimerInfo.getExpiryTimeInMs()
        stored = self.state.get()
        if stored is None:
            return
        customer, order_time, deliveries = stored
        deliveries = [int(d) for d in deliveries or []]
        rows = []
        if order_time is not None and int(order_time) + EXPIRY_MS <= now:
            order_time = int(order_time)
            result = outcome(order_time, deliveries)
            rows.append((result, str(key[0]), str(customer), order_time, order_time + EXPIRY_MS,
                         1 if result == "delivered" else 0))
            customer, order_time = None, None
        deliveries = [d for d in deliveries if d + EXPIRY_MS > now]
        if order_time is None and not deliveries:
            self.state.clear()
        else:
            self.state.update((customer, order_time, deliveries))
        if rows:
            yield pd.DataFrame(rows, columns=[f.name for f in OUTCOME.fields])

    def close(self) -> None:
        pass


def order_outcomes(orders: DataFrame, deliveries: DataFrame, watermark_s: float) -> DataFrame:
    """One row per order at its expiry: ``delivered`` (on time) or ``overdue``."""
    both = orders.select(F.lit("order").alias("kind"), "order_no", "customer_name", "time", "event_time").unionByName(
        deliveries.select(F.lit("delivery").alias("kind"), "order_no", F.lit(None).cast("string").alias("customer_name"),
                          "time", "event_time"))
    return both.withWatermark("event_time", spark_interval(watermark_s)).groupBy("order_no") \
        .transformWithStateInPandas(statefulProcessor=OrderExpiry(), outputStructType=OUTCOME, outputMode="Append",
                                    timeMode="EventTime")


@query(route_by="outcome", routes={"delivered": "delivered_orders", "overdue": "overdue_orders",
                                   "*": ["order_stats", "last_orders"]})
def orders(ctx: PlanContext) -> DataFrame:
    """Each order's outcome at its expiry: delivered orders and overdue orders, and every outcome as a fact."""
    return order_outcomes(ctx.events("orders"), ctx.events("deliveries"), ctx.plan.watermark_s)


@dataclass
class PizzaGenerator:
    """Orders, and for each a delivery on time (within 30 s), late, or never; order times a little out of order."""

    seed: int = 42
    on_time: float = 0.7
    late: float = 0.2
    pending: list[tuple[int, dict[str, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.random = random.Random(self.seed)
        self.counter = 0
        self.run_ms: int | None = None  # order numbers of two runs (two `tandem produce`, two demos) never meet

    def events(self, now_ms: int, count: int) -> dict[str, list[dict[str, Any]]]:
        orders = []
        for _ in range(count):
            self.counter += 1
            self.run_ms = self.run_ms or now_ms
            order = {"order_no": f"o{self.run_ms}-{self.counter}", "customer_name": self.random.choice(CUSTOMERS),
                     "time": now_ms - self.random.randint(0, 2000)}
            orders.append(order)
            draw = self.random.random()
            if draw < self.on_time + self.late:
                delay = self.random.randint(1000, 28000) if draw < self.on_time else self.random.randint(32000, 60000)
                self.pending.append((order["time"] + delay, {"order_no": order["order_no"],
                                                             "time": order["time"] + delay}))
        due = [delivery for at, delivery in self.pending if at <= now_ms]
        self.pending = [(at, delivery) for at, delivery in self.pending if at > now_ms]
        return {"orders": orders, "deliveries": due}


generator = PizzaGenerator
