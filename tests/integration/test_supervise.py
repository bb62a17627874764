"""The supervisor with real spark-submit processes and PostgreSQL (no Airflow scheduler).

kill -9 an instance → observation says DEAD → reconcile stops what is left of it, re-syncs it
from the active and relaunches it as PASSIVE; warm mode starts the plan on the passive node
from a cut of the failed active, and again from the newest checkpoint when both nodes die; the
operator's failover / drain / restart move roles cleanly.

The hot kill test and the operator test share one plan (``TestHotSupervision``): the second starts
from the pair the first leaves running. Teardown kills the launched process groups (no graceful
stop: the database is dropped right after).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import psycopg2.extras
import pytest
from _ha import (TradeFeed, configure_one_shard, fetch, mismatches, published_total, split_brain, start_writer,
                 wait_for)
from _project import create_database, drop_database, kill_groups, use_project

from tandem.config import load_cluster, load_plan
from tandem.layout import instance_landing_dir
from tandem.store import Database
from tandem.store.leases import read_lease
from tandem.supervisor.reconcile import Supervisor
from tandem.packaging import build_dist

pytestmark = pytest.mark.integration
SHARD = "shard-1"


def make_supervisor(project: Path, dist: Path, standby: str) -> Supervisor:
    configure_one_shard(project, standby)
    cluster = load_cluster()
    return Supervisor(cluster, load_plan("trades", cluster), launched_by="test_supervise", py_files=dist,
                      running_timeout_s=300)


def kill_launched(supervisor: Supervisor, process_groups: list[int]) -> None:
    """SIGKILL the process group of each node's last launch (earlier launches were killed by the test
    or stopped by the supervisor), then close the supervisor. No graceful stop: the database goes next."""
    for node in supervisor.plan.nodes:
        try:
            row = instance(supervisor, node)
        except Exception:  # noqa: BLE001 - the database may be gone; kill what is known
            row = None
        if row and row["submit_pid"]:
            process_groups.append(row["submit_pid"])
    kill_groups(process_groups)
    supervisor.close()


@pytest.fixture
def supervised(project: Path, database_url: str, process_groups: list[int]):
    """A supervisor over the temp project; every process it launched is killed after the test."""
    dist = build_dist(project)
    made: list[Supervisor] = []

    def make(standby: str) -> Supervisor:
        made.append(make_supervisor(project, dist, standby))
        return made[-1]

    yield make
    for supervisor in made:
        kill_launched(supervisor, process_groups)


@dataclass
class HotPlan:
    """A hot-standby supervisor shared by the tests of ``TestHotSupervision`` and the feed they write."""

    supervisor: Supervisor
    feed: TradeFeed


@pytest.fixture(scope="class")
def hot_plan(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HotPlan]:
    """One temp project and database, one hot supervisor, for the whole class; nothing launched yet
    (the first test's reconcile launches the pair). Every process it launched is killed afterwards."""
    root = tmp_path_factory.mktemp("hot-plan")
    url = create_database()
    supervisor = None
    try:
        with pytest.MonkeyPatch.context() as monkeypatch:
            project = use_project(root / "project", url, monkeypatch)
            supervisor = make_supervisor(project, build_dist(project), "hot")
            try:
                landing = instance_landing_dir(supervisor.cluster, load_plan("trades", supervisor.cluster), SHARD)
                yield HotPlan(supervisor, TradeFeed(landing))
            finally:
                kill_launched(supervisor, [])
    finally:
        drop_database(url)


def instance(supervisor: Supervisor, node: str) -> dict | None:
    with psycopg2.connect(supervisor.cluster.database_url) as conn, \
            conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute("SELECT * FROM tandem.plan_instances WHERE instance_id = %s", (f"trades/{SHARD}/{node}",))
        row = cur.fetchone()
    conn.close()
    return row


def events(supervisor: Supervisor) -> list[dict]:
    with psycopg2.connect(supervisor.cluster.database_url) as conn, \
            conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute("SELECT kind, node, previous_node, epoch, reason, detail FROM tandem.failover_events ORDER BY id")
        rows = cur.fetchall()
    conn.close()
    return rows


def health(supervisor: Supervisor, node: str) -> str:
    return supervisor.observe(SHARD).view.health(node).state


def kill9(supervisor: Supervisor, node: str) -> None:
    os.killpg(instance(supervisor, node)["submit_pid"], signal.SIGKILL)


def assert_all_published(supervisor: Supervisor, feed: TradeFeed) -> None:
    url = supervisor.cluster.database_url
    wait_for(lambda: feed.all_published(url), 120,
             f"{feed.count} trades to be published (have {feed.published(url)})")


def test_warm_losing_both_nodes_restarts_the_plan_from_the_checkpoint(supervised) -> None:
    """kill -9 the warm active under steady load: the supervisor starts the plan on the standby node
    from a cut of the dead active's checkpoint (the standby did not run before; it resumes after the
    cut's batch). Then kill -9 that node as soon as it ran a batch: for a while no node of the plan
    runs. The supervisor starts the plan again after the newest committed batch of the last
    checkpoint; every event is published once, by one publisher per epoch."""
    supervisor = supervised("warm")
    url = supervisor.cluster.database_url
    writer = start_writer(supervisor.cluster, rate=100)
    try:
        report = supervisor.reconcile(SHARD, cause="test bootstrap")
        assert [(s.action.kind, s.action.node) for s in report.steps] == [("LAUNCH", "node-a")], report.lines()
        wait_for(lambda: len(fetch(url, "SELECT 1 FROM publish_log WHERE instance_id LIKE '%%/node-a'")) >= 3, 120,
                 "node-a to publish")

        kill9(supervisor, "node-a")
        wait_for(lambda: health(supervisor, "node-a") == "DEAD", 30, "node-a to be DEAD")
        report = supervisor.reconcile(SHARD, cause="test: warm active killed")
        assert report.converged, report.lines()
        assert [(s.action.kind, s.action.node) for s in report.steps] == [("STOP", "node-a"), ("LAUNCH", "node-b")], \
            report.lines()
        launch = report.steps[1]
        assert (launch.action.role, launch.action.resync_from) == ("ACTIVE", "node-a")
        cut_of_a = launch.data["cut"]["aggregates"]["batch_id"]
        assert cut_of_a is not None
        assert read_lease(Database(url), "trades", SHARD).holder == "node-b"
        assert instance(supervisor, "node-a")["status"] == "STOPPED", "the failed node stays down as the warm standby"
        assert first_batch(url, "node-b") == cut_of_a + 1, "node-b did not resume after node-a's last committed batch"
        kill9(supervisor, "node-b")  # the second node dies as soon as the plan ran a batch there
        wait_for(lambda: health(supervisor, "node-b") == "DEAD", 30, "node-b to be DEAD")
        assert health(supervisor, "node-a") == "STOPPED"  # no node of the plan runs now

        relaunched_at = fetch(url, "SELECT clock_timestamp() AS t")[0]["t"]
        report = supervisor.reconcile(SHARD, cause="test: both nodes killed")
        assert report.converged, report.lines()
        assert [s.action.kind for s in report.steps] == ["STOP", "LAUNCH"], report.lines()
        launch = report.steps[1]
        assert (launch.action.node, launch.action.role, launch.action.resync_from) == ("node-a", "ACTIVE", "node-b")
        cut = launch.data["cut"]["aggregates"]["batch_id"]
        wait_for(lambda: len(fetch(url, "SELECT 1 FROM publish_log WHERE instance_id LIKE %s AND published_at > %s",
                                   ("%/node-a", relaunched_at))) >= 5, 120,
                 "the restarted node-a to publish under steady load")
    finally:
        events_written = writer.stop()

    wait_for(lambda: published_total(url) >= len(events_written), 180,
             f"all {len(events_written)} events to be published (have {published_total(url)})")
    deadline = time.monotonic() + 30  # Delta is appended right after the PostgreSQL commit
    while (problems := mismatches(supervisor.cluster, events_written)) and time.monotonic() < deadline:
        time.sleep(2)
    assert not problems, "\n".join(problems)
    assert split_brain(url) == []
    promotions = [(e["kind"], e["node"], e["epoch"]) for e in events(supervisor) if e["kind"] == "PROMOTED"]
    assert promotions == [("PROMOTED", "node-a", 1), ("PROMOTED", "node-b", 2), ("PROMOTED", "node-a", 3)], promotions
    first = first_batch(url, "node-a", since=relaunched_at)
    assert cut is not None and first == cut + 1, f"node-a restarted at batch {first}, not after node-b's committed {cut}"


def first_batch(url: str, node: str, since=None, timeout_s: float = 90) -> int:
    """The first aggregates batch the node completed (since ``since``), once its listener recorded it."""
    sql = ("SELECT min(batch_id) AS b FROM heartbeats WHERE node = %s AND query_name = 'aggregates' "
           "AND (%s::timestamptz IS NULL OR recorded_at > %s)")
    rows = wait_for(lambda: [r["b"] for r in fetch(url, sql, (node, since, since)) if r["b"] is not None], timeout_s,
                    f"{node}'s first batch")
    return rows[0]


class TestHotSupervision:
    """One hot-standby plan for both tests: the ops test starts from the pair the first test leaves
    running (ACTIVE and PASSIVE, whichever node holds the lease), so the nodes are named by role."""

    def test_hot_kill_passive_then_active_each_comes_back_as_passive_after_resync(self, hot_plan: HotPlan) -> None:
        supervisor, feed = hot_plan.supervisor, hot_plan.feed
        feed.write()
        report = supervisor.reconcile(SHARD, cause="test bootstrap")
        assert report.converged, report.lines()
        assert [(s.action.kind, s.action.node, getattr(s.action, "role", None)) for s in report.steps] == [
            ("LAUNCH", "node-a", "ACTIVE"), ("LAUNCH", "node-b", "PASSIVE")]
        assert (instance(supervisor, "node-a")["role"], instance(supervisor, "node-b")["role"]) == ("ACTIVE", "PASSIVE")
        assert_all_published(supervisor, feed)

        # kill -9 the passive: DEAD within the heartbeat timeout, the active is not disturbed
        active_pid = instance(supervisor, "node-a")["pid"]
        kill9(supervisor, "node-b")
        wait_for(lambda: health(supervisor, "node-b") == "DEAD", 30, "node-b to be DEAD")
        feed.write()
        report = supervisor.reconcile(SHARD, cause="test: passive killed")
        assert report.converged, report.lines()
        assert [s.action.kind for s in report.steps] == ["STOP", "LAUNCH"]
        launch = report.steps[1]
        assert (launch.action.node, launch.action.role, launch.action.resync_from) == ("node-b", "PASSIVE", "node-a")
        assert launch.data["cut"]["aggregates"]["batch_id"] is not None, "node-b was not re-synced from a committed batch"
        row = instance(supervisor, "node-b")
        assert (row["status"], row["role"]) == ("RUNNING", "PASSIVE")
        assert instance(supervisor, "node-a")["pid"] == active_pid
        assert read_lease(Database(supervisor.cluster.database_url), "trades", SHARD).holder == "node-a"
        assert_all_published(supervisor, feed)

        # kill -9 the active: the passive takes the lease by itself; the supervisor brings node-a back as PASSIVE
        epoch = read_lease(Database(supervisor.cluster.database_url), "trades", SHARD).epoch
        kill9(supervisor, "node-a")
        wait_for(lambda: read_lease(Database(supervisor.cluster.database_url), "trades", SHARD).holder == "node-b", 30,
                 "node-b to take the lease")
        feed.write()
        report = supervisor.reconcile(SHARD, cause="test: active killed")
        assert report.converged, report.lines()
        kinds = [s.action.kind for s in report.steps]
        assert kinds[0] == "STOP" and kinds[-1] == "LAUNCH"
        launch = report.steps[-1].action
        assert (launch.node, launch.role, launch.resync_from) == ("node-a", "PASSIVE", "node-b")
        lease = read_lease(Database(supervisor.cluster.database_url), "trades", SHARD)
        assert lease.holder == "node-b" and lease.epoch > epoch
        assert (instance(supervisor, "node-a")["role"], instance(supervisor, "node-b")["role"]) == ("PASSIVE", "ACTIVE")
        assert_all_published(supervisor, feed)

        recorded = [(e["kind"], e["node"]) for e in events(supervisor)]
        assert ("RESYNC", "node-b") in recorded and ("RESYNC", "node-a") in recorded
        assert ("PROMOTED", "node-b") in recorded
        assert all(e["reason"] for e in events(supervisor))

    def test_ops_failover_now_drain_and_restart(self, hot_plan: HotPlan) -> None:
        supervisor, feed = hot_plan.supervisor, hot_plan.feed
        seen = len(events(supervisor))
        feed.write()
        assert supervisor.reconcile(SHARD).converged  # launches the pair unless the test before left it running
        active = read_lease(Database(supervisor.cluster.database_url), "trades", SHARD).holder
        passive = ({"node-a", "node-b"} - {active}).pop()
        assert (instance(supervisor, active)["role"], instance(supervisor, passive)["role"]) == ("ACTIVE", "PASSIVE")
        pids = {n: instance(supervisor, n)["pid"] for n in ("node-a", "node-b")}

        # failover now: a lease handover; nothing restarts, the old active stays on as PASSIVE
        report = supervisor.fail_over_now(SHARD)
        assert report.converged, report.lines()
        assert [s.action.kind for s in report.steps] == ["HANDOVER", "AWAIT"]
        assert read_lease(Database(supervisor.cluster.database_url), "trades", SHARD).holder == passive
        wait_for(lambda: instance(supervisor, active)["role"] == "PASSIVE", 10, f"{active} to demote itself")
        assert {n: instance(supervisor, n)["pid"] for n in pids} == pids
        feed.write()
        assert_all_published(supervisor, feed)

        # drain the new active: handed back to the old one, then the drained node stops and stays down
        report = supervisor.drain(SHARD, passive)
        assert report.converged, report.lines()
        assert [s.action.kind for s in report.steps] == ["HANDOVER", "AWAIT", "STOP"]
        assert read_lease(Database(supervisor.cluster.database_url), "trades", SHARD).holder == active
        assert instance(supervisor, passive)["status"] == "STOPPED"
        assert supervisor.reconcile(SHARD).steps == [], "a drained node must stay down"
        feed.write()
        assert_all_published(supervisor, feed)

        # restart the drained node: undrained, re-synced from the active, back as PASSIVE
        report = supervisor.restart(SHARD, passive)
        assert report.converged, report.lines()
        launch = report.steps[-1].action
        assert (launch.kind, launch.node, launch.role, launch.resync_from) == ("LAUNCH", passive, "PASSIVE", active)
        assert (instance(supervisor, passive)["status"], instance(supervisor, passive)["role"]) == ("RUNNING", "PASSIVE")
        kinds = [e["kind"] for e in events(supervisor)[seen:]]
        assert {"FAILOVER_NOW", "HANDOVER", "DRAINED", "UNDRAINED", "RESTARTED", "RESYNC"} <= set(kinds)
