"""The pizza-shop plan on real Spark and PostgreSQL: outputs equal the test's own reference.

Orders and deliveries are written through the partition layout (deliveries on time, late, never,
before the order, out of order within the watermark, bad lines), the two instances of group
``shop`` run, and the test computes delivered-on-time counts per customer and the overdue orders
with plain Python.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone

import psycopg2
import psycopg2.extras
import pytest
from _references import last_orders_reference, PIZZA_T0 as T0
from _references import ORDER_EXPIRY_MS, arrival_order, iso_of_millis, make_orders, pizza_reference
from tandem.aggregation.granularity import bucket_start
from tandem.config import load_cluster, load_plan
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir, landing_dir
from tandem.plan_version import plan_version
from tandem.producer import advance_watermark, partitioned
from tandem.sources.files import write_atomically
from tandem.runtime.node import run_instance
from tandem.outputs.events import read_events_lake
from tandem.outputs.table import read_table_lake
from tandem.store import Database
from tandem.store.outputs import read_table_rows
from tandem.reading import read_output

pytestmark = pytest.mark.integration
UTC = timezone.utc


def test_delivered_counts_and_overdue_orders_equal_the_reference(project, database_url, spark) -> None:
    cluster = load_cluster()
    plan = load_plan("pizza_shop", cluster)
    orders, deliveries = make_orders(3, 400)
    rng = random.Random(9)
    streams = {"orders": [(e, json.dumps(e)) for e in arrival_order(orders, rng)],
               "deliveries": [(e, json.dumps(e)) for e in arrival_order(deliveries, rng)]}
    for start in range(0, 400, 100):
        chunk = {name: lines[start:start + 100] for name, lines in streams.items()}
        for (stream, partition), lines in partitioned(plan, chunk).items():
            write_atomically(landing_dir(cluster, stream, partition), lines)
    advance_watermark(cluster, plan, T0 + 3_600_000)  # an hour later in every partition: every order decided
    write_atomically(landing_dir(cluster, "deliveries", 1), ['{"order_no": "o-1"}', '{"order_no": "", "time": 5}'])
    write_atomically(landing_dir(cluster, "orders", 2), ['{"order_no": "o-x", "time": 5}'])  # one query, both streams
    # PostgreSQL refuses U+0000 in text and jsonb: this order stopped shop-2 with exit 1 (issue 24)
    poison = {"order_no": "o-poison", "customer_name": "cust\u0000x", "time": T0 + 1_000}
    [(_, partition)] = partitioned(plan, {"orders": [(poison, "")]})
    write_atomically(landing_dir(cluster, "orders", partition), [json.dumps(poison)])

    for instance in plan.instances:  # available-now ends with a no-data batch: the sentinel's watermark fires the timers
        result = run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True)
        assert result.status == "STOPPED", result.error

    per_customer, overdue = assert_outputs_equal_the_reference(cluster, plan, database_url, orders, deliveries)
    reasons = read_table(delta_table_dir(cluster, plan.name, "quarantine")).column("reason").to_pylist()
    assert sorted(reasons) == ["field 'customer_name' must not contain NUL (U+0000) (got \"cust\\u0000x\")",
                               "field 'order_no' must not be empty (got \"\")", "missing field 'customer_name'",
                               "missing field 'time'"], reasons

    # the CLI reads both kinds, from PostgreSQL and from Delta
    for source in ("postgres", "delta"):
        table = run_cli("query", "pizza_shop", "delivered_orders", "--json", "--source", source)
        assert {row["customer_name"]: int(row["delivered"]) for row in table} == per_customer, source
    events = run_cli("query", "pizza_shop", "overdue_orders", "--json", "--start", "2025-01-01T00:00:00")
    assert sorted(e["order_no"] for e in events) == sorted(overdue)
    placed = {o["order_no"]: o["time"] for o in orders}  # the payload's times read as ISO text, as event_time does
    assert [(e["order_time"], e["expiry_time"]) for e in events] == [
        (iso_of_millis(placed[e["order_no"]]), iso_of_millis(placed[e["order_no"]] + ORDER_EXPIRY_MS)) for e in events]
    one = sorted(overdue)[0]
    assert [e["order_no"] for e in run_cli("query", "pizza_shop", "overdue_orders", "--json", "--source", "delta",
                                           "--start", "2025-01-01T00:00:00") if e["order_no"] == one] == [one]
    # ... every kind: the latest (each customer's last order, its outcome), filtered by key, and the quarantine
    last_orders = last_orders_reference(orders, deliveries)
    for source in ("postgres", "delta"):
        latest = run_cli("query", "pizza_shop", "last_orders", "--json", "--source", source)
        assert {row["customer_name"]: {k: v for k, v in row.items() if k != "instance"} for row in latest} \
            == last_orders, source
    customer = sorted(last_orders)[0]
    assert run_cli("query", "pizza_shop", "last_orders", "--json", "--key", f"customer_name={customer}") == [
        {**last_orders[customer], "instance": next(r["instance"] for r in latest if r["customer_name"] == customer)}]
    quarantined = run_cli("query", "pizza_shop", "quarantine", "--json")
    assert sorted(row["reason"] for row in quarantined) == sorted(reasons)
    assert {row["plan_version"] for row in quarantined} == {plan_version(plan)}  # the version that refused each


def assert_outputs_equal_the_reference(cluster, plan, database_url: str, orders: list[dict],
                                       deliveries: list[dict]) -> tuple[dict[str, int], set[str]]:
    """Every output, in PostgreSQL and Delta, is the reference of the orders and deliveries, each row once;
    returns the reference (on-time orders per customer, overdue order numbers)."""
    per_customer, overdue = pizza_reference(orders, deliveries)
    assert overdue and len(per_customer) > 3, "the input must exercise both outcomes"
    with Database(database_url) as db:
        merged = db.run(lambda cursor: read_table_rows(cursor, "pizza_shop", "delivered_orders", ["delivered"]))
    assert {row["key"]["customer_name"]: int(row["delivered"]) for row in merged} == per_customer
    assert max(row["instances"] for row in merged) == 2, "a customer's orders are counted in both instances"
    lake = {row["customer_name"]: int(row["delivered"])
            for row in read_table_lake(delta_table_dir(cluster, plan.name, "delivered_orders"),
                                       plan.outputs["delivered_orders"])}
    assert lake == per_customer

    with psycopg2.connect(database_url) as conn, conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute("SELECT payload FROM tandem.output_events WHERE plan = 'pizza_shop' AND output = 'overdue_orders'")
        published = [row["payload"] for row in cur.fetchall()]
    assert sorted(p["order_no"] for p in published) == sorted(overdue)
    by_order = {o["order_no"]: o for o in orders}
    for p in published:
        order = by_order[p["order_no"]]
        assert (p["customer_name"], p["order_time"], p["expiry_time"]) == (
            order["customer_name"], order["time"], order["time"] + 30_000)
    lake_events = read_events_lake(delta_table_dir(cluster, plan.name, "overdue_orders"))
    assert sorted(lake_events.column("order_no").to_pylist()) == sorted(overdue)

    # order_stats: per minute of order time, orders, on time and distinct customers, from both stores
    window = (datetime(2025, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC))
    by_minute: dict[datetime, list[dict]] = {}
    delivered = {o["order_no"] for o in orders} - overdue
    for o in orders:
        by_minute.setdefault(bucket_start(datetime.fromtimestamp(o["time"] / 1000, UTC), "minute"), []).append(o)
    for source in ("postgres", "delta"):
        stats = read_output(cluster, "pizza_shop", "minute", *window, output="order_stats", source=source)
        assert {r["bucket_start"]: (r["orders"], r["on_time"], r["customers"]) for r in stats} == {
            minute: (len(os), sum(o["order_no"] in delivered for o in os), len({o["customer_name"] for o in os}))
            for minute, os in by_minute.items()}, source
        assert {r["instances"] for r in stats} == {2}
        by_day = read_output(cluster, "pizza_shop", "day", *window, output="order_stats", source=source)  # rolled up from minutes
        assert [(r["orders"], r["on_time"], r["customers"]) for r in by_day] == [
            (len(orders), len(delivered), len({o["customer_name"] for o in orders}))], source

    return per_customer, overdue


def run_cli(*argv: str) -> list[dict]:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "tandem.cli", *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    text = done.stdout.strip()
    return json.loads(text) if text.startswith("[") else [json.loads(line) for line in text.splitlines() if line]
