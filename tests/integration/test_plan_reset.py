"""A cleanly stopped plan in ``tandem status``, and ``tandem plan reset``, on real PostgreSQL and Delta (no Spark).

Two nodes of a pizza_shop instance each run as ACTIVE in turn (the role controller of a driver, its instance row and
liveness beat) and publish through the plan's real sinks (a table, events, an aggregation of facts, to PostgreSQL and
Delta), then stop cleanly as a driver does. Status must read "stopped", with no node ACTIVE; a reset is refused while
a node holds the lease or a driver beats, and afterwards nothing of the plan is left but its input (and one RESET
event per instance), while another plan's rows are untouched.
"""

from __future__ import annotations

import dataclasses
import io
import socket
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
import pyarrow as pa
import pytest
from psycopg2 import sql

from tandem import cli
from tandem.config import load_cluster, load_plan
from tandem.aggregation.spec import spec_for
from tandem.errors import PlanChanged, PlanRunning
from tandem.layout import checkpoint_dir, delta_table_dir, landing_dir, snapshot_dir
from tandem.outputs import sink_for
from tandem.outputs.base import BatchInfo
from tandem.plan_reset import reset_plan
from tandem.plan_shape import check_unchanged, record_shape
from tandem.presenter.views import plan_status
from tandem.process_start import start_since_boot
from tandem.runtime.node import RunResult, release_reason
from tandem.runtime.roles import RoleController
from tandem.store import Database, migrate
from tandem.store.heartbeats import beat
from tandem.store.leases import try_acquire
from tandem.store.registry import InstanceKey, record_start, record_status, register_nodes

pytestmark = pytest.mark.integration
UTC = timezone.utc
PLAN, INSTANCE = "pizza_shop", "shop-1"
T0 = datetime(2026, 1, 1, 10, tzinfo=UTC)


def orders(numbers: range) -> pa.Table:
    """Rows as the pizza shop's query gives them to its outputs (one per order's outcome)."""
    times = [T0 + timedelta(seconds=n) for n in numbers]
    return pa.table({"order_no": [f"o{n}" for n in numbers], "customer_name": [f"c{n % 3}" for n in numbers],
                     "delivered": pa.array([n % 2 for n in numbers], pa.int64()),
                     "order_time": pa.array(times, pa.timestamp("us", tz="UTC")),
                     "expiry_time": pa.array([t + timedelta(seconds=30) for t in times], pa.timestamp("us", tz="UTC"))})


class Typed(io.StringIO):
    """A terminal's standard input where ``text`` is typed."""

    def isatty(self) -> bool:
        return True


def count(db: Database, table: str, plan: str = PLAN) -> int:
    return db.run(lambda c: (c.execute(sql.SQL("SELECT count(*) AS n FROM {} WHERE plan = %s").format(
        sql.Identifier(table)), (plan,)), c.fetchone()["n"])[1])


def run_and_stop(cluster, plan, node: str, numbers: range, batch_id: int) -> None:
    """One run of a driver on ``node``: announce, take the lease as ACTIVE, publish ``numbers`` to every output, then
    stop as :func:`tandem.runtime.node.run_instance` does (lease released, status STOPPED)."""
    key = InstanceKey(PLAN, INSTANCE, node)
    me = psutil.Process()
    with Database(cluster.database_url) as db:
        record_start(db, key, host=socket.gethostname(), pid=me.pid, pid_started_at=start_since_boot(me.pid),
                     ancestors=[], spark_app_id="local-test", trigger_interval_s=1.0,
                     checkpoint_root=str(checkpoint_dir(cluster, PLAN, INSTANCE, node, "")))
        roles = RoleController(key, cluster.database_url, plan.heartbeat.timeout_s)
        roles.start(wants_active=True)
        assert roles.epoch is not None
        record_status(db, key, "RUNNING")
        beat(db, key.id, socket.gethostname(), me.pid, T0)
        for output in ("delivered_orders", "overdue_orders", "order_stats"):
            sink = sink_for(plan, output, key, cluster.database_url, delta_table_dir(cluster, PLAN, output))
            assert sink.publish(orders(numbers), BatchInfo(key, batch_id, roles.epoch, datetime.now(UTC))) > 0
        record_shape(cluster, plan, INSTANCE, node)
        (checkpoint_dir(cluster, PLAN, INSTANCE, node, "orders") / "offsets").mkdir(parents=True)
        (checkpoint_dir(cluster, PLAN, INSTANCE, node, "orders") / "offsets" / "0").write_text("v1\n{}\n")
        with pytest.raises(PlanRunning, match=f"{node} holds the lease of instance {INSTANCE}"):
            reset_plan(cluster, plan)
        roles.stop(release_reason(RunResult("STOPPED"), None))  # the end of run_instance
        with pytest.raises(PlanRunning, match=f"{PLAN}/{INSTANCE}/{node} is RUNNING: its driver beat"):
            reset_plan(cluster, plan)  # the lease is free, but the driver is still there
        record_status(db, key, "STOPPED")


def test_a_stopped_plan_reads_stopped_and_a_reset_leaves_nothing_but_its_input(project: Path, capsys, monkeypatch):
    cluster = load_cluster()
    plan = load_plan(PLAN, cluster)
    with Database(cluster.database_url) as db:
        migrate(db)
        register_nodes(db, cluster)
        try_acquire(db, "trades", "shard-1", "node-a", 30.0)  # another plan's rows, which a reset leaves alone
    landing = landing_dir(cluster, "orders", 0)
    landing.mkdir(parents=True)
    (landing / "events-1.jsonl").write_text('{"order_no": "o1", "customer_name": "c1", "time": 1}\n')
    snapshot = snapshot_dir(cluster, PLAN, "s1")
    snapshot.mkdir(parents=True)
    (snapshot / "cut").write_text("x")

    run_and_stop(cluster, plan, "node-a", range(0, 6), 0)
    run_and_stop(cluster, plan, "node-b", range(6, 10), 0)  # the standby took over, then stopped too

    with Database(cluster.database_url) as db:
        status = plan_status(db, cluster, plan).instances[0]
        assert [(n.node, n.status, n.role) for n in status.nodes] == [("node-a", "STOPPED", None),
                                                                      ("node-b", "STOPPED", None)]
        assert (status.lease.holder, status.lease.epoch, status.lease.state, status.lease.vacancy) == (
            "node-b", 2, "stopped", "stopped: instance stopped")
        vacant_for = (plan_status(db, cluster, plan).observed_at - status.lease.vacant_since).total_seconds()
        assert 0 <= vacant_for < 60
        assert count(db, "output_events") == 10 and count(db, "output_contributions") == 20
        assert db.run(lambda c: (c.execute("SELECT count(*) AS n FROM pizza_shop_order_stats WHERE plan = %s",
                                           (PLAN,)), c.fetchone())[1])["n"] > 0
    assert cli.main(["status", PLAN]) == 0
    shown = capsys.readouterr().out
    title = next(line for line in shown.splitlines() if f"{PLAN} / {INSTANCE}" in line)
    assert "lease: node-b at epoch 2, stopped " in title and " ago (instance stopped)" in title, title
    assert "expired" not in title, title
    rows = [line.split() for line in shown.splitlines() if f"{T0.year}" not in line and "STOPPED STOPPED" in
            " ".join(line.split())]  # the node rows of shop-1: node, role, epoch, status, health, ...
    assert [row[:5] for row in rows] == [["node-a", "-", "1", "STOPPED", "STOPPED"],
                                         ["node-b", "-", "2", "STOPPED", "STOPPED"]], shown

    serving = spec_for(plan, "order_stats").table
    changed = dataclasses.replace(plan, groups={"shop": plan.groups["shop"].model_copy(update={"parallel": 1})})
    with pytest.raises(PlanChanged):  # what a reset is for: the checkpoints were built for two instances
        check_unchanged(cluster, changed, INSTANCE, "node-a")

    monkeypatch.setattr(sys, "stdin", io.StringIO(PLAN + "\n"))  # no terminal: a confirmation is refused
    assert cli.main(["plan", "reset", PLAN]) == 2
    assert "pass --yes" in capsys.readouterr().err
    assert (delta_table_dir(cluster, PLAN, "overdue_orders")).is_dir(), "nothing removed without a confirmation"

    monkeypatch.setattr(sys, "stdin", Typed("trades\n"))  # a terminal, where another plan's name is typed
    assert cli.main(["plan", "reset", PLAN]) == 1
    asked = capsys.readouterr()
    assert "A reset removes:" in asked.out and str(delta_table_dir(cluster, PLAN, "overdue_orders").parent) in asked.out
    assert "not reset: 'trades' is not 'pizza_shop'" in asked.err
    assert (delta_table_dir(cluster, PLAN, "overdue_orders")).is_dir(), "nothing removed without a confirmation"

    assert cli.main(["plan", "reset", PLAN, "--yes"]) == 0
    said = capsys.readouterr().out
    assert "output overdue_orders: 10 events (output_events)" in said, said
    assert "output order_stats:" in said and "dropped" in said, said
    for folder in ("checkpoints", "delta", "snapshots"):
        assert str(cluster.storage_root / folder / PLAN) in said, said
        assert not (cluster.storage_root / folder / PLAN).exists()
    assert (landing / "events-1.jsonl").is_file(), "the input is kept"

    with Database(cluster.database_url) as db:
        for table in ("plan_instances", "heartbeats", "publish_log", "leases", "snapshots", "output_events",
                      "output_table_rows", "output_contributions", "output_streams"):
            assert count(db, table) == 0, table
        events = db.run(lambda c: (c.execute("SELECT instance, kind FROM failover_events WHERE plan = %s ORDER BY 1",
                                             (PLAN,)), c.fetchall())[1])
        assert [(e["instance"], e["kind"]) for e in events] == [(s, "RESET") for s in sorted(plan.instances)]
        table = db.run(lambda c: (c.execute("SELECT to_regclass(%s) AS t", (serving,)), c.fetchone())[1])
        assert table["t"] is None, "dropped: the next publish creates it with the measures declared then"
        assert count(db, "leases", "trades") == 1, "another plan's rows are left alone"
    check_unchanged(cluster, changed, INSTANCE, "node-a")  # no shape recorded any more: the changed plan may start
    monkeypatch.setattr(sys, "stdin", Typed(f"{PLAN}\n"))
    assert cli.main(["plan", "reset", PLAN]) == 0  # again, confirmed: finds nothing to remove but the RESET events
    again = capsys.readouterr().out
    assert "output overdue_orders: 0 events" in again and str(cluster.storage_root) not in again, again
    with Database(cluster.database_url) as db:  # the next run starts from nothing: its first epoch again
        assert try_acquire(db, PLAN, INSTANCE, "node-a", 30.0) == 1
