"""Plain-Python references of the plans' semantics, computed by brute force over the events a test wrote.

They restate the plans' rules (docs/plans.md) without the plans' code: an integration test that
compares Tandem's outputs with these fails when the plan, the runtime or a failover gets one wrong.
"""

from __future__ import annotations

ORDER_EXPIRY_MS = 30_000
AVERAGE_WINDOW_MS = 120_000
ALERT_WITHIN_MS = 600_000


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
