"""Plain-Python references of the plans' semantics, computed by brute force over the events a test wrote.

They restate the plans' rules (docs/plans.md) without the plans' code: an integration test that
compares Tandem's outputs with these fails when the plan, the runtime or a failover gets one wrong.
"""

from __future__ import annotations

import random
import time
from datetime import datetime, timezone

from tandem.plans.pizza_shop import CUSTOMERS

ORDER_EXPIRY_MS = 30_000
AVERAGE_WINDOW_MS = 120_000
ALERT_WITHIN_MS = 600_000


def iso_of_millis(millis: int) -> str:
    """Epoch milliseconds as an output's read gives a time: ISO 8601 text in UTC (``2026-11-26T10:00:00+00:00``,
    ``…T10:00:00.250000+00:00``), worked out with the C library's ``gmtime`` rather than Tandem's code."""
    seconds, fraction = divmod(millis, 1000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    return f"{text}.{fraction:03d}000+00:00" if fraction else f"{text}+00:00"


PIZZA_T0 = int(datetime(2025, 3, 1, 18, 0, tzinfo=timezone.utc).timestamp() * 1000)


def make_orders(seed: int, count: int) -> tuple[list[dict], list[dict]]:
    """Orders 0.7 s apart from PIZZA_T0 and their deliveries: on time (both edges), late, before the order, or never."""
    rng = random.Random(seed)
    orders, deliveries = [], []
    for i in range(count):
        order = {"order_no": f"o-{i}", "customer_name": rng.choice(CUSTOMERS), "time": PIZZA_T0 + i * 700}
        orders.append(order)
        draw = rng.random()
        if draw < 0.55:
            offset = rng.choice([0, 30_000, rng.randint(1, 29_999)])  # both edges count as on time
        elif draw < 0.8:
            offset = rng.choice([30_001, rng.randint(30_001, 90_000), -rng.randint(1, 5_000)])  # late, or before
        else:
            continue  # never delivered
        deliveries.append({"order_no": order["order_no"], "time": order["time"] + offset})
    return orders, deliveries


def arrival_order(events: list[dict], rng: random.Random) -> list[dict]:
    """The events in the order a producer sends them: by time, out of order within 3 s."""
    return sorted(events, key=lambda e: e["time"] + rng.randint(-3_000, 3_000))  # out of order within 3 s


def pizza_reference(orders: list[dict], deliveries: list[dict]) -> tuple[dict[str, int], set[str]]:
    """Orders delivered on time per customer, and the overdue order numbers."""
    delivered_by_order: dict[str, list[int]] = {}
    for d in deliveries:
        delivered_by_order.setdefault(d["order_no"], []).append(d["time"])
    per_customer: dict[str, int] = {}
    overdue = set()
    for o in orders:
        if any(o["time"] <= t <= o["time"] + ORDER_EXPIRY_MS for t in delivered_by_order.get(o["order_no"], [])):
            per_customer[o["customer_name"]] = per_customer.get(o["customer_name"], 0) + 1
        else:
            overdue.add(o["order_no"])
    return per_customer, overdue


def last_orders_reference(orders: list[dict], deliveries: list[dict]) -> dict[str, dict]:
    """Per customer, their latest order (by order time; a tie: the higher id of its order number, as the plan's
    ``last_orders`` declares ``id: [order_no]``) with its outcome, as the output's JSON rows (the order time, the
    output's ``time``, as ISO 8601 text: :func:`iso_of_millis`)."""
    from tandem.declarations import event_id

    delivered_by_order: dict[str, list[int]] = {}
    for d in deliveries:
        delivered_by_order.setdefault(d["order_no"], []).append(d["time"])
    latest: dict[str, tuple] = {}
    for o in orders:
        on_time = any(o["time"] <= t <= o["time"] + ORDER_EXPIRY_MS for t in delivered_by_order.get(o["order_no"], []))
        rank = (o["time"], event_id("pizza_shop", "last_orders", {"order_no": o["order_no"]}))
        if o["customer_name"] not in latest or rank > latest[o["customer_name"]][0]:
            latest[o["customer_name"]] = (rank, {"customer_name": o["customer_name"],
                                                 "order_time": iso_of_millis(o["time"]),
                                                 "order_no": o["order_no"],
                                                 "outcome": "delivered" if on_time else "overdue",
                                                 "delivered": int(on_time)})
    return {customer: row for customer, (_, row) in latest.items()}


def decided_orders(orders: list[dict], watermark_ms: int) -> list[dict]:
    """The orders an instance has decided once its watermark is at ``watermark_ms``: an order is decided at its
    expiry (order time + 30 s), when the watermark reaches it."""
    return [o for o in orders if o["time"] + ORDER_EXPIRY_MS <= watermark_ms]


def temperature_reference(readings: list[dict]) -> dict[str, set[tuple]]:
    """Each temperature output's rows (as :func:`temperature_row` gives them).

    An average is kept as its window's sum, rounded to cents, with the count: temperatures have two
    decimals, so the sum is exact, where an average rounded to 6 places flips with the order of the
    additions when it ends in a 5 (a window of 32 readings: 0.01 / 32 = 0.0003125)."""
    by_room: dict[int, list[dict]] = {}
    for r in readings:
        by_room.setdefault(r["room_no"], []).append(r)
    averages, alerts = set(), set()
    for room, rows in by_room.items():
        for e in rows:
            window = [x["temp"] for x in rows if e["time"] - AVERAGE_WINDOW_MS < x["time"] <= e["time"]]
            averages.add((room, e["device_id"], e["temp"], e["time"], round(sum(window), 2), len(window)))
        for e1 in rows:
            later = sorted((x["time"], x["device_id"], x["temp"]) for x in rows
                           if e1["time"] < x["time"] <= e1["time"] + ALERT_WITHIN_MS and x["temp"] >= e1["temp"] + 5)
            if later:
                t, device, temp = later[0]
                alerts.add((room, e1["device_id"], e1["temp"], e1["time"], device, temp, t))
    high = {(r["room_no"], r["device_id"], r["temp"], r["time"]) for r in readings
            if 100 <= r["room_no"] < 110 and r["temp"] > 40}
    return {"avg_temps": averages, "temp_alerts": alerts, "high_temps": high}


def temperature_row(output: str, payload: dict) -> tuple:
    """A published temperature event as the reference's tuple."""
    if output == "avg_temps":
        return (payload["room_no"], payload["device_id"], payload["temp"], payload["time"],
                round(payload["avg_temp"] * payload["readings"], 2), payload["readings"])
    if output == "temp_alerts":
        return (payload["room_no"], payload["initial_device_id"], payload["initial_temp"], payload["initial_time"],
                payload["final_device_id"], payload["final_temp"], payload["final_time"])
    return (payload["room_no"], payload["device_id"], payload["temp"], payload["time"])


def temperature_reference_at(readings: list[dict], watermarks: dict[str, int]) -> dict[str, set[tuple]]:
    """The temperature outputs once ``readings`` are read and the watermark of each stateful output is at
    ``watermarks[output]``: a reading's average, and an alert at its warmer reading, once the watermark reaches
    their time; every high temperature at once (a filter, without state)."""
    expected = temperature_reference(readings)
    return {"avg_temps": {row for row in expected["avg_temps"] if row[3] <= watermarks["avg_temps"]},
            "temp_alerts": {row for row in expected["temp_alerts"] if row[6] <= watermarks["temp_alerts"]},
            "high_temps": expected["high_temps"]}
