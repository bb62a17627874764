"""Every output kind exactly once across failovers, with real spark-submit processes under load.

The pizza-shop plan writes an ``events`` output (overdue orders) and a ``table`` output (orders
delivered on time per customer). One instance (``shop-1``) runs ACTIVE on node-a and hot PASSIVE
on node-b while orders and deliveries stream in. node-a is killed with SIGKILL (node-b takes
over), relaunched as PASSIVE, then node-b is frozen with SIGSTOP past its lease (node-a takes
over) and resumed with SIGCONT (it must fence itself). At the end PostgreSQL and Delta hold every
overdue order exactly once and the table equals the test's reference; no epoch was published by
two nodes and nothing was published under an epoch after the next one was granted. The
``aggregation`` output (order stats, computed from each order's outcome) counts every order once.
"""

from __future__ import annotations

import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml
from _ha import Pair, PlanWriter, failover_events, fetch, lease, one_core_nodes, split_brain, wait_for
from tandem import aggregation
from tandem.config import load_cluster, load_plan
from tandem.layout import delta_table_dir
from tandem.packaging import build_dist
from tandem.producer import advance_watermark
from tandem.runtime.sinks import read_events_lake, read_table_lake

pytestmark = pytest.mark.integration
PLAN, SHARD = "pizza_shop", "shop-1"
TAKEOVER_TIMEOUT_S = 20


def reference(events: dict[str, list[dict]]) -> tuple[dict[str, int], set[str]]:
    """Delivered-on-time counts per customer and the overdue order numbers (plain Python)."""
    deliveries: dict[str, list[int]] = {}
    for d in events["deliveries"]:
        deliveries.setdefault(d["order_no"], []).append(d["time"])
    per_customer: dict[str, int] = {}
    overdue = set()
    for order in events["orders"]:
        if any(order["time"] <= t <= order["time"] + 30_000 for t in deliveries.get(order["order_no"], [])):
            per_customer[order["customer_name"]] = per_customer.get(order["customer_name"], 0) + 1
        else:
            overdue.add(order["order_no"])
    return per_customer, overdue


def configure(project: Path) -> None:
    """One instance of group shop reading all four partitions; both nodes on local[1]."""
    path = project / "conf" / "plans" / f"{PLAN}.yaml"
    plan = yaml.safe_load(path.read_text())
    plan["groups"]["shop"]["parallel"] = 1
    path.write_text(yaml.safe_dump(plan))
    one_core_nodes(project)


def published(url: str) -> tuple[list[str], dict[str, int]]:
    overdue = [r["order_no"] for r in fetch(url, "SELECT payload->>'order_no' AS order_no FROM output_events "
                                                 "WHERE plan = %s AND output = 'overdue_orders'", (PLAN,))]
    table = {r["customer"]: int(r["n"]) for r in fetch(
        url, "SELECT key->>'customer_name' AS customer, sum((value->>'delivered')::numeric) AS n "
             "FROM output_table_rows WHERE plan = %s AND output = 'delivered_orders' GROUP BY 1", (PLAN,))}
    return overdue, table


def test_events_and_table_outputs_exactly_once_across_kill_and_pause(project: Path, database_url: str,
                                                                     process_groups: list[int]) -> None:
    configure(project)
    cluster = load_cluster()
    plan = load_plan(PLAN, cluster)
    pair = Pair(cluster, plan, build_dist(project), process_groups, shard=SHARD)
    url = cluster.database_url
    writer = PlanWriter(cluster, plan, rate=20)
    try:
        pair.start_pair("node-a", "node-b")
        writer.start()  # after the start: the first batches are not a backlog of the launch time
        wait_for(lambda: published(url)[0], 240, "the first overdue orders", detail=lambda: pair.log_tail("node-a"))

        before = lease(url, PLAN, SHARD)
        pair.kill("node-a", signal.SIGKILL)
        promoted = wait_for(lambda: pair.promoted("node-b", before["epoch"]), TAKEOVER_TIMEOUT_S,
                            "node-b to take over from the killed node-a", detail=lambda: pair.log_tail("node-b"))
        pair.note(f"SIGKILL node-a -> node-b PROMOTED at epoch {promoted['epoch']}")
        pair.wait_group_gone("node-a")
        pair.launch("node-a", "PASSIVE")
        pair.wait_running("node-a")
        time.sleep(15)  # node-a processes the backlog as a standby, holding what it would publish

        before = lease(url, PLAN, SHARD)
        pair.kill("node-b", signal.SIGSTOP)
        try:
            promoted = wait_for(lambda: pair.promoted("node-a", before["epoch"]), TAKEOVER_TIMEOUT_S,
                                "node-a to take over from the paused node-b", detail=lambda: pair.log_tail("node-a"))
            pair.note(f"SIGSTOP node-b -> node-a PROMOTED at epoch {promoted['epoch']}")
            time.sleep(5)
        finally:
            pair.kill("node-b", signal.SIGCONT)
        wait_for(lambda: [e for e in failover_events(url, plan=PLAN, shard=SHARD)
                          if e["kind"] == "DEMOTED" and e["node"] == "node-b"], 30,
                 "the resumed node-b to fence itself", detail=lambda: pair.log_tail("node-b"))
        time.sleep(5)
    finally:
        events = writer.stop()
    # an event an hour later in every partition: the watermark passes every real order's expiry
    advance_watermark(cluster, plan, int(time.time() * 1000) + 3_600_000)

    per_customer, overdue = reference(events)
    assert overdue and per_customer
    wait_for(lambda: (lambda got: sorted(got[0]) == sorted(overdue) and got[1] == per_customer)(published(url)),
             240, "every order decided", detail=lambda: f"{len(published(url)[0])} of {len(overdue)} overdue\n"
                                                         f"{pair.log_tail('node-a')}")
    got_overdue, got_table = published(url)
    assert len(got_overdue) == len(set(got_overdue)) == len(overdue)
    assert got_table == per_customer
    lake_events = read_events_lake(delta_table_dir(cluster, PLAN, "overdue_orders"))
    assert sorted(lake_events.column("order_no").to_pylist()) == sorted(overdue)
    lake_table = {r["customer_name"]: int(r["delivered"]) for r in read_table_lake(
        delta_table_dir(cluster, PLAN, "delivered_orders"), plan.outputs["delivered_orders"])}
    assert lake_table == per_customer
    for source in ("postgres", "delta"):  # the aggregation of facts: every order counted once
        days = aggregation.query(cluster, PLAN, "day", datetime(2000, 1, 1, tzinfo=timezone.utc),
                                 datetime(2100, 1, 1, tzinfo=timezone.utc), source=source)  # its coarsest bucket
        assert sum(r["orders"] for r in days) == len(events["orders"]), source
        assert sum(r["on_time"] for r in days) == sum(per_customer.values()), source
    assert split_brain(url, PLAN, SHARD) == []
    assert lease(url, PLAN, SHARD)["holder"] == "node-a"
