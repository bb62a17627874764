"""The supervisor with real spark-submit processes and PostgreSQL (no Airflow scheduler).

kill -9 an instance → observation says DEAD → reconcile stops what is left of it, re-syncs it
from the active and relaunches it as PASSIVE; in warm mode the WARM standby takes over by itself
from a cut of the failed active, and the supervisor starts the plan again from the newest
checkpoint when both nodes die; the operator's failover / drain / restart move roles cleanly.

The hot kill test and the operator test share one plan (``TestHotSupervision``): the second starts
from the pair the first leaves running. Teardown kills the launched process groups (no graceful
stop: the database is dropped right after).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg2
import psycopg2.extras
import pytest
from _ha import (TradeFeed, configure_one_instance, fetch, mismatches, published_total, split_brain, start_writer,
                 wait_for)
from _monitoring import monitoring_stack
from _project import create_database, drop_database, kill_groups, use_project

from tandem.config import load_cluster, load_plan
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir, instance_landing_dir
from tandem.store import Database, migrate
from tandem.store.leases import read_lease
from tandem.packaging import build_dist
from tandem.supervisor.reconcile import Supervisor

pytestmark = pytest.mark.integration
INSTANCE = "shard-1"


def make_supervisor(project: Path, dist: Path, standby: str) -> Supervisor:
    configure_one_instance(project, standby)
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
                landing = instance_landing_dir(supervisor.cluster, load_plan("trades", supervisor.cluster), INSTANCE)
                yield HotPlan(supervisor, TradeFeed(landing))
            finally:
                kill_launched(supervisor, [])
    finally:
        drop_database(url)


def instance(supervisor: Supervisor, node: str) -> dict | None:
    with psycopg2.connect(supervisor.cluster.database_url) as conn, \
            conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute("SELECT * FROM tandem.plan_instances WHERE instance_id = %s", (f"trades/{INSTANCE}/{node}",))
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
    return supervisor.observe(INSTANCE).view.health(node).state


def kill9(supervisor: Supervisor, node: str) -> None:
    os.killpg(instance(supervisor, node)["submit_pid"], signal.SIGKILL)


def assert_all_published(supervisor: Supervisor, feed: TradeFeed) -> None:
    url = supervisor.cluster.database_url
    wait_for(lambda: feed.all_published(url), 120,
             f"{feed.count} trades to be published (have {feed.published(url)})")


def test_warm_standby_takes_over_by_itself_and_losing_both_nodes_restarts_from_the_checkpoint(supervised) -> None:
    """Warm mode under steady load: node-b runs as the WARM standby (its Spark session built, no query).
    kill -9 the active: node-b takes the lease by itself, without a supervisor round, copies a cut of
    node-a's checkpoint over its own and resumes after the cut's batch. Then kill -9 node-b as soon as
    it ran a batch: no node of the plan runs. The supervisor starts the plan on node-a after the newest
    committed batch of node-b's checkpoint, and node-b comes back WARM; every event is published once,
    by one publisher per epoch."""
    supervisor = supervised("warm")
    url = supervisor.cluster.database_url
    writer = start_writer(supervisor.cluster, rate=100)
    try:
        report = supervisor.reconcile(INSTANCE, cause="test bootstrap")
        assert [(s.action.kind, s.action.node, s.action.role) for s in report.steps] == [
            ("LAUNCH", "node-a", "ACTIVE"), ("LAUNCH", "node-b", "WARM")], report.lines()
        wait_for(lambda: len(fetch(url, "SELECT 1 FROM publish_log WHERE instance_id LIKE '%%/node-a'")) >= 3, 120,
                 "node-a to publish")
        assert (instance(supervisor, "node-b")["role"], health(supervisor, "node-b")) == ("WARM", "HEALTHY")
        assert fetch(url, "SELECT count(*) AS n FROM heartbeats WHERE node = 'node-b'")[0]["n"] == 0, \
            "a warm standby runs no query"

        kill9(supervisor, "node-a")
        wait_for(lambda: read_lease(Database(url), "trades", INSTANCE).holder == "node-b", 60,
                 "node-b to take the lease by itself")
        # the lease first, then the cut of node-a's checkpoint (its RESYNC event), then the queries
        [resync] = wait_for(lambda: [e for e in events(supervisor) if e["kind"] == "RESYNC"], 60,
                            "node-b to copy a cut of node-a's checkpoint")
        assert (resync["node"], resync["previous_node"]) == ("node-b", "node-a"), resync
        cut_of_a = resync["detail"]["aggregates"]["batch_id"]
        assert cut_of_a is not None
        assert first_batch(url, "node-b") == cut_of_a + 1, "node-b did not resume after node-a's last committed batch"
        kill9(supervisor, "node-b")  # the second node dies as soon as the plan ran a batch there
        wait_for(lambda: health(supervisor, "node-b") == "DEAD" and health(supervisor, "node-a") == "DEAD", 30,
                 "both nodes to be DEAD")

        relaunched_at = fetch(url, "SELECT clock_timestamp() AS t")[0]["t"]
        report = supervisor.reconcile(INSTANCE, cause="test: both nodes killed")
        assert report.converged, report.lines()
        assert [(s.action.kind, s.action.node) for s in report.steps] == [
            ("STOP", "node-a"), ("STOP", "node-b"), ("LAUNCH", "node-a"), ("LAUNCH", "node-b")], report.lines()
        launch, warm = report.steps[2], report.steps[3]
        assert (launch.action.role, launch.action.resync_from) == ("ACTIVE", "node-b")
        assert (warm.action.role, warm.action.resync_from) == ("WARM", None)
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

    def test_hot_kill_passive_then_active_each_comes_back_as_passive_after_resync(self, hot_plan: HotPlan,
                                                                                  tmp_path: Path) -> None:
        """Also issue 49: Prometheus scrapes `tandem exporter` with the shipped rules, and the kill -9 of the ACTIVE
        reaches an Alertmanager webhook receiver as TandemFailover (the counter goes up by exactly one takeover)."""
        supervisor, feed = hot_plan.supervisor, hot_plan.feed
        feed.write()
        report = supervisor.reconcile(INSTANCE, cause="test bootstrap")
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
        report = supervisor.reconcile(INSTANCE, cause="test: passive killed")
        assert report.converged, report.lines()
        assert [s.action.kind for s in report.steps] == ["STOP", "LAUNCH"]
        launch = report.steps[1]
        assert (launch.action.node, launch.action.role, launch.action.resync_from) == ("node-b", "PASSIVE", "node-a")
        assert launch.data["cut"]["aggregates"]["batch_id"] is not None, "node-b was not re-synced from a committed batch"
        row = instance(supervisor, "node-b")
        assert (row["status"], row["role"]) == ("RUNNING", "PASSIVE")
        assert instance(supervisor, "node-a")["pid"] == active_pid
        assert read_lease(Database(supervisor.cluster.database_url), "trades", INSTANCE).holder == "node-a"
        assert_all_published(supervisor, feed)

        # kill -9 the active: the passive takes the lease by itself; the supervisor brings node-a back as PASSIVE
        epoch = read_lease(Database(supervisor.cluster.database_url), "trades", INSTANCE).epoch
        with monitoring_stack(tmp_path / "monitoring") as stack:
            at = f'plan="trades", plan_instance="{INSTANCE}"'
            stack.wait_scraped(f'tandem_instance_active{{{at}}} == 1 and on () '
                               f'count(tandem_failovers_total{{{at}, cause="takeover"}}) == 1')
            takeovers = float(stack.query(f'tandem_failovers_total{{{at}, cause="takeover"}}')[0]["value"][1])
            killed_at = time.time()
            kill9(supervisor, "node-a")
            wait_for(lambda: read_lease(Database(supervisor.cluster.database_url), "trades", INSTANCE).holder == "node-b",
                     30, "node-b to take the lease")
            alert = stack.wait_alert("TandemFailover", plan="trades", plan_instance=INSTANCE)
            print(f"kill -9 to TandemFailover at the webhook: {alert.at - killed_at:.1f} s")
            assert "a standby took over as ACTIVE" in alert.annotations["summary"]
            assert float(stack.wait_scraped(f'tandem_failovers_total{{{at}, cause="takeover"}} > {takeovers}')[0]
                         ["value"][1]) == takeovers + 1
            assert stack.query(f'tandem_node_role{{{at}, node="node-b", role="ACTIVE"}} == 1')
        feed.write()
        report = supervisor.reconcile(INSTANCE, cause="test: active killed")
        assert report.converged, report.lines()
        kinds = [s.action.kind for s in report.steps]
        assert kinds[0] == "STOP" and kinds[-1] == "LAUNCH"
        launch = report.steps[-1].action
        assert (launch.node, launch.role, launch.resync_from) == ("node-a", "PASSIVE", "node-b")
        lease = read_lease(Database(supervisor.cluster.database_url), "trades", INSTANCE)
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
        assert supervisor.reconcile(INSTANCE).converged  # launches the pair unless the test before left it running
        active = read_lease(Database(supervisor.cluster.database_url), "trades", INSTANCE).holder
        passive = ({"node-a", "node-b"} - {active}).pop()
        assert (instance(supervisor, active)["role"], instance(supervisor, passive)["role"]) == ("ACTIVE", "PASSIVE")
        pids = {n: instance(supervisor, n)["pid"] for n in ("node-a", "node-b")}

        # failover now: a lease handover; nothing restarts, the old active stays on as PASSIVE
        report = supervisor.fail_over_now(INSTANCE)
        assert report.converged, report.lines()
        assert [s.action.kind for s in report.steps] == ["HANDOVER", "AWAIT"]
        assert read_lease(Database(supervisor.cluster.database_url), "trades", INSTANCE).holder == passive
        wait_for(lambda: instance(supervisor, active)["role"] == "PASSIVE", 10, f"{active} to demote itself")
        assert {n: instance(supervisor, n)["pid"] for n in pids} == pids
        feed.write()
        assert_all_published(supervisor, feed)

        # drain the new active: handed back to the old one, then the drained node stops and stays down
        report = supervisor.drain(INSTANCE, passive)
        assert report.converged, report.lines()
        assert [s.action.kind for s in report.steps] == ["HANDOVER", "AWAIT", "STOP"]
        assert read_lease(Database(supervisor.cluster.database_url), "trades", INSTANCE).holder == active
        assert instance(supervisor, passive)["status"] == "STOPPED"
        assert supervisor.reconcile(INSTANCE).steps == [], "a drained node must stay down"
        feed.write()
        assert_all_published(supervisor, feed)

        # restart the drained node: undrained, re-synced from the active, back as PASSIVE
        report = supervisor.restart(INSTANCE, passive)
        assert report.converged, report.lines()
        launch = report.steps[-1].action
        assert (launch.kind, launch.node, launch.role, launch.resync_from) == ("LAUNCH", passive, "PASSIVE", active)
        assert (instance(supervisor, passive)["status"], instance(supervisor, passive)["role"]) == ("RUNNING", "PASSIVE")
        kinds = [e["kind"] for e in events(supervisor)[seen:]]
        assert {"FAILOVER_NOW", "HANDOVER", "DRAINED", "UNDRAINED", "RESTARTED", "RESYNC"} <= set(kinds)

    def test_poison_lines_under_load_stop_no_query_and_cause_no_failover(self, hot_plan: HotPlan) -> None:
        """Issue 24 §2: the supervised pair under load receives a poison line of each kind mid-stream, and a
        trade PostgreSQL refuses for a reason no validation knows (a trigger raising SQLSTATE 22023). No query
        dies, no failover happens, every poison line is quarantined with its reason, the refused trade's
        partial too, and every other output is exact."""
        supervisor, feed = hot_plan.supervisor, hot_plan.feed
        url = supervisor.cluster.database_url
        assert supervisor.reconcile(INSTANCE).converged  # the pair the tests before left running, or a new one
        feed.write()
        assert_all_published(supervisor, feed)
        lease = read_lease(Database(url), "trades", INSTANCE)
        pids = {n: instance(supervisor, n)["pid"] for n in ("node-a", "node-b")}
        seen = len(events(supervisor))
        fetch(url, """CREATE FUNCTION refuse_trade() RETURNS trigger LANGUAGE plpgsql AS $$
                      BEGIN IF NEW.symbol = 'REFUSED' THEN
                          RAISE EXCEPTION 'refused by the test''s trigger' USING ERRCODE = '22023'; END IF;
                      RETURN NEW; END $$;
                      CREATE TRIGGER refuse_trade BEFORE INSERT OR UPDATE ON trade_aggregates
                      FOR EACH ROW EXECUTE FUNCTION refuse_trade(); SELECT 1""")
        now = int(time.time() * 1000)
        trade = {"symbol": "IBM", "price": 10.5, "quantity": 3, "timestamp": now}
        poison = {  # line -> what its reason says
            json.dumps({**trade, "symbol": "IB\u0000M"}): "must not contain NUL",
            '{"symbol": "IB\\udc00M", "price": 10.5, "quantity": 3, "timestamp": %d}' % now: "unpaired UTF-16 surrogate",
            '{"symbol": "IBM", "price": 1e999, "quantity": 3, "timestamp": %d}' % now: "must be a finite number",
            '{"symbol": "IBM", "price": NaN, "quantity": 3, "timestamp": %d}' % now: "must be a finite number",
            json.dumps({**trade, "price": "Infinity"}): "must be a finite number",
            json.dumps({**trade, "quantity": 2 ** 64}): "outside the 64-bit integer range",
            json.dumps({**trade, "symbol": "S" * 300}): "must be at most 256 characters long",
        }
        huge = json.dumps({**trade, "note": "x" * (10 << 20)})  # a 10 MB line
        for i, (line, _) in enumerate(poison.items()):
            feed.write(extra_lines=[line] + ([huge] if i == 3 else []))
            time.sleep(0.5)
        not_utf8 = feed.directory / "not-utf8.jsonl"
        (feed.directory / ".not-utf8.tmp").write_bytes(b'{"symbol": "IB\xffM", "price": 1.0, "quantity": 1, '
                                                       b'"timestamp": %d}\n' % now)
        (feed.directory / ".not-utf8.tmp").rename(not_utf8)
        refused = {**trade, "symbol": "REFUSED", "timestamp": int(time.time() * 1000)}
        feed.write(extra_lines=[json.dumps(refused)])
        feed.write()
        assert_all_published(supervisor, feed)

        def quarantined() -> list[dict]:
            return read_table(delta_table_dir(supervisor.cluster, "trades", "quarantine")).to_pylist()

        wanted = len(poison) + 3  # the huge line, the bytes that are not UTF-8, the refused partial
        rows = wait_for(lambda: (lambda r: r if len(r) >= wanted else None)(quarantined()), 60,
                        f"{wanted} quarantined rows", detail=lambda: str([r["reason"] for r in quarantined()]))
        reasons = {r["raw"]: r["reason"] for r in rows}
        for line, fragment in poison.items():
            assert fragment in reasons[line], (line[:80], reasons.get(line))
        assert "over the stream's max_line_bytes" in reasons[huge[:4096]]
        assert [r["reason"] for r in rows if r["source_file"].endswith("not-utf8.jsonl")] == [
            "line is not valid UTF-8 (invalid bytes are kept as U+FFFD)"]
        by_store = [r for r in rows if r["source_file"].startswith("output:trade_aggregates/")]
        assert by_store and all(json.loads(r["raw"])["symbol"] == "REFUSED" for r in by_store), by_store
        assert all("SQLSTATE 22023: refused by the test's trigger" in r["reason"] for r in by_store), by_store
        assert len(rows) == len({(r["source_file"], r["raw"]) for r in rows}), "a row quarantined twice"

        problems = mismatches(supervisor.cluster, feed.events, sources=("postgres", "delta"))
        assert not problems, "\n".join(problems[:10])
        after = read_lease(Database(url), "trades", INSTANCE)
        assert (after.holder, after.epoch) == (lease.holder, lease.epoch), "a failover happened"
        assert {n: instance(supervisor, n)["pid"] for n in pids} == pids, "an instance was restarted"
        assert {instance(supervisor, n)["status"] for n in pids} == {"RUNNING"}
        kinds = [e["kind"] for e in events(supervisor)[seen:]]
        assert not {"PROMOTED", "DEMOTED", "LAUNCH", "STOP", "BLOCK"} & set(kinds), kinds


def test_a_batch_that_fails_the_same_way_again_blocks_the_instance_until_an_operator_restarts_it(
        project: Path, process_groups: list[int], capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """Issue 24 §2: an error that is not about the rows' values (here a trigger raising SQLSTATE P0001) and
    repeats on the same batch after a relaunch is a deterministic failure, not a crash: the supervisor stops
    relaunching, records the instance BLOCKED with the error's first line, and `tandem status` says so (and,
    issue 49, Prometheus' TandemInstanceBlocked reaches an Alertmanager webhook). The operator's restart (after
    the cause is gone) brings it back and nothing is lost."""
    import yaml

    configure_one_instance(project, "cold")
    plan_path = project / "conf" / "plans" / "trades.yaml"
    declared = yaml.safe_load(plan_path.read_text())
    declared["nodes"] = ["node-a"]  # one node: every relaunch is this node's
    plan_path.write_text(yaml.safe_dump(declared))
    cluster = load_cluster()
    supervisor = Supervisor(cluster, load_plan("trades", cluster), launched_by="test_supervise",
                            py_files=build_dist(project), running_timeout_s=300)
    url = cluster.database_url
    feed = TradeFeed(instance_landing_dir(cluster, supervisor.plan, INSTANCE))
    try:
        with Database(url) as db:
            migrate(db)
        fetch(url, """CREATE FUNCTION block_trade() RETURNS trigger LANGUAGE plpgsql AS $$
                      BEGIN IF NEW.symbol = 'BLOCKER' THEN RAISE EXCEPTION 'no BLOCKER here'; END IF;
                      RETURN NEW; END $$;
                      CREATE TRIGGER block_trade BEFORE INSERT OR UPDATE ON trade_aggregates
                      FOR EACH ROW EXECUTE FUNCTION block_trade(); SELECT 1""")
        blocker = {"symbol": "BLOCKER", "price": 1.0, "quantity": 1, "timestamp": int(time.time() * 1000)}
        feed.write(extra_lines=[json.dumps(blocker)])
        feed.events.append((blocker["timestamp"], "BLOCKER", 1.0, 1))
        feed.count, feed.quantity = feed.count + 1, feed.quantity + 1
        assert supervisor.reconcile(INSTANCE, cause="test bootstrap").steps[0].action.kind == "LAUNCH"

        for run in (1, 2):  # the first failure is relaunched; the second, at the same batch, blocks
            wait_for(lambda: instance(supervisor, "node-a")["status"] == "FAILED", 120, f"run {run} to fail")
            row = instance(supervisor, "node-a")
            assert row["failure_repeats"] == run and "SQLSTATE P0001: no BLOCKER here" in row["failure"], row
            report = supervisor.reconcile(INSTANCE, cause=f"test: failure {run}")
            kinds = [s.action.kind for s in report.steps]
            assert kinds == (["LAUNCH"] if run == 1 else ["BLOCK"]), report.lines()
        row = instance(supervisor, "node-a")
        assert row["status"] == "BLOCKED" and "SQLSTATE P0001: no BLOCKER here" in row["error"], row
        assert "batch" in row["error"] and "of checkpoint" in row["error"], row["error"]
        assert supervisor.reconcile(INSTANCE, cause="test: blocked").steps == [], "a BLOCKED instance is not relaunched"
        with monitoring_stack(tmp_path / "monitoring") as stack:
            alert = stack.wait_alert("TandemInstanceBlocked", plan="trades", plan_instance=INSTANCE, node="node-a")
            assert alert.labels["severity"] == "critical" and "is BLOCKED" in alert.annotations["summary"]
        assert [e["kind"] for e in events(supervisor)].count("BLOCK") == 1

        from tandem.cli import main

        assert main(["status", "trades"]) == 0
        shown = capsys.readouterr().out
        assert "BLOCKED" in shown and "no BLOCKER here" in shown, shown

        fetch(url, "DROP TRIGGER block_trade ON trade_aggregates; SELECT 1")  # the operator fixes the cause
        report = supervisor.restart(INSTANCE, "node-a")
        assert report.converged and report.steps[-1].action.kind == "LAUNCH", report.lines()
        assert_all_published(supervisor, feed)
        problems = mismatches(cluster, feed.events, sources=("postgres",))
        assert not problems, "\n".join(problems[:10])
    finally:
        kill_launched(supervisor, process_groups)
