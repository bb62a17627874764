"""Failover with real spark-submit processes, real signals and steady load (hot standby).

The first four tests share one running pair (``TestOneHotPairUnderLoad``): the trades plan for
shard-1 as an ACTIVE instance on one node and a hot PASSIVE on the other (each its own detached
``spark-submit``, its own process group and checkpoint), against a PostgreSQL cluster of the
class's own (``PrivatePostgres``) so that one test can restart it mid-stream. Before each test
the ``live`` fixture makes sure both nodes run (relaunching as PASSIVE a node an earlier test left
down), starts a writer thread landing ~200 trade events/s with current timestamps and waits until
the standby has caught up and the active publishes. Each test then breaks something with a real
signal (or stops PostgreSQL) and finally checks that what was published equals the aggregates the
test computes itself from every event written so far (by this test and the earlier ones): all
six granularities served from PostgreSQL and the merged numbers read from Delta — nothing
missing, nothing twice — and that no two nodes ever published at once. Which node is ACTIVE when
a test starts depends on the tests before it, so the tests name the nodes by role.

The last test needs no Spark: it drives two publishers in-process to check that a standby does
not trim rows an active that died between its PostgreSQL commit and its Delta append never
wrote to Delta.

``pytest -s`` prints the phases with their times and the measured take-over times; the timeouts
are generous because the machine is shared (the benchmark, bench/failover.py, measures).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from _ha import (
    HotPair,
    ROLE_CHANGES,
    INSTANCE,
    Pair,
    PrivatePostgres,
    configure_one_instance,
    db_now,
    failover_events,
    fetch,
    free_port,
    group_alive,
    instance_row,
    latest_watermark,
    lease,
    mismatches,
    pause_inside_publish,
    publish_log,
    split_brain,
    under_load,
    wait_for,
)
from _project import ProcessGroups, kill_groups, use_project
from tandem.checkpoints import checkpoint_lineage
from tandem.config import load_cluster, load_plan
from tandem.lake.tables import committed_version
from tandem.layout import checkpoint_dir, delta_table_dir
from tandem.outputs.base import BatchInfo
from tandem.packaging import build_dist
from tandem.store.registry import InstanceKey
from tandem.supervisor import stop_instance
from tandem.supervisor.reconcile import Supervisor

pytestmark = pytest.mark.integration
TAKEOVER_TIMEOUT_S = 20  # lease ttl 3 s + one 1 s heartbeat, with room for a loaded 2-core machine
NODES = ("node-a", "node-b")


def one_instance_pair(project: Path, process_groups: list[int]) -> Pair:
    """The temp project on shard-1 with local[1] nodes, as a Pair of node-a / node-b."""
    configure_one_instance(project)
    cluster = load_cluster()
    return Pair(cluster, load_plan("trades", cluster), build_dist(project), process_groups)


@pytest.fixture(scope="class")
def hot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HotPair]:
    """node-a ACTIVE and node-b PASSIVE on a PostgreSQL cluster of their own, for the whole class.
    Every process group launched is killed afterwards (before the cluster is removed), whatever happened."""
    root = tmp_path_factory.mktemp("hot-pair")
    groups = ProcessGroups()
    server = PrivatePostgres(root / "pg", free_port())
    shared: HotPair | None = None
    with pytest.MonkeyPatch.context() as monkeypatch:
        try:
            use_project(root / "project", server.start(), monkeypatch)
            pair = one_instance_pair(root / "project", groups)
            shared = HotPair(pair, server)
            pair.start_pair("node-a", "node-b")
            yield shared
        finally:
            if shared is not None and shared.writer is not None:
                shared.writer.stopping.set()
            kill_groups(groups)
            server.destroy()


@pytest.fixture
def live(hot: HotPair) -> Iterator[HotPair]:
    """The shared pair ready for a test (:func:`under_load`); afterwards the load is stopped and its events kept."""
    hot.server.start()  # a no-op unless an earlier test failed while it was stopped
    with under_load(hot):
        yield hot


class TestOneHotPairUnderLoad:
    """One ACTIVE / hot PASSIVE pair for these tests, in this order (each leaves both nodes running
    except the last two, whose stopped or killed node ``live`` relaunches for the next test)."""

    def test_a_paused_active_publishes_nothing_after_the_epoch_moved(self, live: HotPair) -> None:
        pair, url = live.pair, live.url
        active, standby = live.roles()
        since = db_now(url)
        before = lease(url)
        delta_path = delta_table_dir(pair.cluster, "trades", "trade_aggregates")
        lineage = checkpoint_lineage(checkpoint_dir(pair.cluster, "trades", INSTANCE, active, "aggregates"))
        app_id = BatchInfo(InstanceKey("trades", INSTANCE, active), 0, 0, datetime.now(UTC), lineage).app_id(
            "trade_aggregates")  # the active's Delta application transaction
        assert committed_version(delta_path, app_id) is not None, app_id
        # Pause it inside a publishing transaction if possible: it then holds the lease row FOR KEY SHARE.
        paused_at, open_transaction = pause_inside_publish(pair, active)
        try:
            promoted = wait_for(lambda: pair.promoted(standby, before["epoch"]), TAKEOVER_TIMEOUT_S,
                                f"{standby} to take over from the paused {active}",
                                detail=lambda: f"lease {lease(url)}; paused inside {open_transaction}\n"
                                               f"{pair.log_tail(standby)}")
            assert promoted["epoch"] == before["epoch"] + 1 and promoted["previous_node"] == active
            # What the paused node published, frozen while it cannot run.
            frozen = {(r["output"], r["batch_id"]): (r["epoch"], r["rows"]) for r in publish_log(url, active)}
            delta_frozen = committed_version(delta_path, app_id)
            wait_for(lambda: pair.first_publish(standby, promoted["epoch"]), TAKEOVER_TIMEOUT_S,
                     f"{standby} to publish", detail=lambda: pair.log_tail(standby))
            # The new active publishes live batches under load while the old one is still frozen.
            wait_for(lambda: len(live.publishes(standby, promoted["epoch"])) >= 3, 30,
                     f"{standby} to publish live batches")
        finally:
            pair.kill(active, signal.SIGCONT)
        resumed_at = db_now(url)
        pair.note(f"SIGSTOP {active} (inside a publish transaction: {bool(open_transaction)}) -> PROMOTED {standby} "
                  f"{promoted['happened_at'].timestamp() - paused_at:.2f}s")

        demoted = wait_for(lambda: [e for e in failover_events(url, since=since)
                                    if e["kind"] == "DEMOTED" and e["node"] == active],
                           30, f"the resumed {active} to demote itself", detail=lambda: pair.log_tail(active))
        assert demoted[0]["epoch"] == before["epoch"], demoted
        # The demoted instance runs on as a standby under load: it aggregates input written after it resumed.
        wait_for(lambda: (w := latest_watermark(url, active, resumed_at)) is not None
                 and w.timestamp() + pair.plan.watermark_s > resumed_at.timestamp(), 60,
                 f"the demoted {active} to process input written after it resumed",
                 detail=lambda: pair.log_tail(active))
        live.finish_and_compare()

        after = {(r["output"], r["batch_id"]): (r["epoch"], r["rows"]) for r in publish_log(url, active)}
        assert after == frozen, f"{active} published after the epoch moved on"
        late = [r for r in publish_log(url, active) if r["published_at"] >= promoted["happened_at"]]
        assert late == [], late
        assert all(r["epoch"] == promoted["epoch"] for r in live.publishes(standby, since=since))
        # A Delta append that had passed its epoch check before the pause may still commit (its rows
        # were accepted by PostgreSQL before the epoch moved and lose to the newer epoch on read).
        delta_after = committed_version(delta_path, app_id)
        # Versions are batch ids and start at 0, so "none yet" is -1, never a falsy 0.
        version_before, version_after = (-1 if v is None else v for v in (delta_frozen, delta_after))
        assert version_after <= version_before + 1, (delta_frozen, delta_after)
        row = instance_row(url, active)
        assert (row["role"], row["epoch"], row["status"]) == ("PASSIVE", 0, "RUNNING"), row
        assert group_alive(pair.pgids[active]), "the fenced instance should run on as a standby"
        assert lease(url)["holder"] == standby and lease(url)["epoch"] == promoted["epoch"]

    def test_restarting_postgresql_mid_stream_loses_nothing_and_never_splits_the_brain(self, live: HotPair) -> None:
        """PostgreSQL goes away for longer than the lease lasts and comes back: both jobs reconnect and
        go on (no process dies), one of them holds the lease, and the outputs are exact."""
        pair, url = live.pair, live.url
        wait_for(lambda: len(live.publishes(None, since=live.load_started_at)) >= 3, 60,
                 "steady publishing under load")
        before = lease(url)
        live.server.stop()
        pair.note("PostgreSQL stopped (fast shutdown: every connection cut)")
        time.sleep(2 * pair.plan.heartbeat.timeout_s)  # the lease runs out while nobody can renew it
        live.server.start()
        restarted_at = datetime.now(UTC)
        pair.note("PostgreSQL started again")

        for node in NODES:  # both reconnect: their listeners record batches again
            wait_for(lambda: fetch(url, "SELECT 1 FROM heartbeats WHERE node = %s AND recorded_at > %s",
                                   (node, restarted_at)), 120, f"{node} to record progress after the restart",
                     detail=lambda: pair.log_tail(node))
        wait_for(lambda: live.publishes(None, since=restarted_at), 60,
                 "publishing to resume", detail=lambda: f"lease {lease(url)}")
        pair.note(f"both jobs reconnected; lease {lease(url)['holder']} at epoch {lease(url)['epoch']} "
                  f"(was {before['holder']} at {before['epoch']})")
        # Steady load after the restart: both jobs go on completing batches, the active publishing them.
        for node in NODES:
            wait_for(lambda: len(fetch(url, "SELECT 1 FROM heartbeats WHERE node = %s AND query_name = 'aggregates' "
                                            "AND recorded_at > %s", (node, restarted_at))) >= 5, 60,
                     f"{node} to complete batches after the restart", detail=lambda: pair.log_tail(node))
        wait_for(lambda: len(live.publishes(None, since=restarted_at)) >= 5, 60, "steady publishing after the restart",
                 detail=lambda: f"lease {lease(url)}")
        live.finish_and_compare()

        assert all(group_alive(pair.pgids[node]) for node in NODES), "a job died with PostgreSQL"
        rows = {node: instance_row(url, node) for node in NODES}
        assert all(row["status"] == "RUNNING" for row in rows.values()), rows
        holder = lease(url)["holder"]
        assert {node: row["role"] for node, row in rows.items()} == {
            holder: "ACTIVE", ({"node-a", "node-b"} - {holder}).pop(): "PASSIVE"}, rows
        assert split_brain(url) == []

    def test_killing_the_passive_leaves_the_active_undisturbed(self, live: HotPair) -> None:
        pair, url = live.pair, live.url
        active, passive = live.roles()
        before = lease(url)
        role_changes = len(failover_events(url, kinds=ROLE_CHANGES))
        killed_at = db_now(url)
        pair.kill(passive, signal.SIGKILL)
        pair.wait_group_gone(passive)
        time.sleep(3 * pair.plan.heartbeat.timeout_s)  # three lease periods without a standby

        now = lease(url)
        assert (now["holder"], now["epoch"]) == (active, before["epoch"]), now
        assert len(failover_events(url, kinds=ROLE_CHANGES)) == role_changes, failover_events(url)
        live_batches = live.publishes(active, since=killed_at)
        assert len(live_batches) >= 3, f"the active stopped publishing: {live_batches}"
        assert {r["epoch"] for r in live_batches} == {before["epoch"]}
        pair.note(f"{passive} killed; {active} published {len(live_batches)} batches since, lease unchanged")

        # The supervisor brings the passive back: DEAD -> stop what is left -> re-sync its checkpoint
        # from a cut of the active's -> relaunch as PASSIVE; it holds what it would publish.
        with Supervisor(pair.cluster, pair.plan, launched_by="test_failover", py_files=pair.dist,
                        running_timeout_s=240) as supervisor:
            wait_for(lambda: supervisor.observe(INSTANCE).view.health(passive).state == "DEAD", 30,
                     f"{passive} to be DEAD")
            report = supervisor.reconcile(INSTANCE, cause="test: passive killed")
        row = instance_row(url, passive)
        pair.groups.append(row["submit_pid"])
        pair.pgids[passive], pair.launched_at[passive] = row["submit_pid"], datetime.now(UTC)
        assert report.converged, report.lines()
        assert [(s.action.kind, s.action.node) for s in report.steps] == [("STOP", passive), ("LAUNCH", passive)]
        launch = report.steps[1]
        assert (launch.action.role, launch.action.resync_from) == ("PASSIVE", active)
        assert launch.data["cut"]["aggregates"]["batch_id"] is not None, \
            f"{passive} was not re-synced from a committed batch"
        pair.wait_caught_up(passive)
        assert live.publishes(passive, since=killed_at) == []
        assert instance_row(url, passive)["role"] == "PASSIVE"
        assert len(failover_events(url, kinds=ROLE_CHANGES)) == role_changes
        assert (lease(url)["holder"], lease(url)["epoch"]) == (active, before["epoch"])
        pair.note(f"{passive} re-synced from {active} at batch {launch.data['cut']['aggregates']['batch_id']}, "
                  "relaunched as PASSIVE and caught up without publishing")

        # Hand over cleanly: what the re-synced standby held, trimmed by the active's position, must
        # complete the outputs exactly, with nothing published twice.
        handover_at = db_now(url)
        stop = stop_instance(pair.cluster, "trades", INSTANCE, active, timeout_s=60)
        assert stop.status == "STOPPED", stop
        promoted = wait_for(lambda: pair.promoted(passive, before["epoch"]), TAKEOVER_TIMEOUT_S,
                            f"{passive} to take the released lease", detail=lambda: pair.log_tail(passive))
        kinds = [(e["kind"], e["node"]) for e in failover_events(url, since=handover_at, kinds=ROLE_CHANGES)]
        assert kinds == [("RELEASED", active), ("PROMOTED", passive)], kinds
        wait_for(lambda: pair.first_publish(passive, promoted["epoch"]), TAKEOVER_TIMEOUT_S, f"{passive} to publish")
        pair.note(f"{active} stopped cleanly, {passive} took the released lease and publishes")
        wait_for(lambda: len(live.publishes(passive, promoted["epoch"])) >= 3, 30,
                 f"{passive} to publish live batches")  # under load after the hand-over
        live.finish_and_compare()
        assert split_brain(url) == []

    @pytest.mark.slow  # two failovers, the first followed by a relaunch that has to catch up
    def test_killing_the_active_twice_in_a_row_loses_and_duplicates_nothing(self, live: HotPair) -> None:
        pair, url = live.pair, live.url
        active, standby = live.roles()
        first_active, second_active, since = active, standby, db_now(url)
        epoch = lease(url)["epoch"]
        written_at_kill = []
        for round_ in (1, 2):
            before = lease(url)
            assert before["holder"] == active, before
            written_at_kill.append(live.writer.written)
            killed_at = pair.kill(active, signal.SIGKILL)
            pair.wait_group_gone(active)
            promoted = wait_for(lambda: pair.promoted(standby, before["epoch"]), TAKEOVER_TIMEOUT_S,
                                f"round {round_}: {standby} to take over from {active}",
                                detail=lambda: f"lease {lease(url)}\n{pair.log_tail(standby)}")
            assert promoted["epoch"] == before["epoch"] + 1 and promoted["previous_node"] == active, promoted
            assert promoted["happened_at"] >= before["expires_at"], "the standby took a lease that had not expired"
            first = wait_for(lambda: pair.first_publish(standby, promoted["epoch"]), TAKEOVER_TIMEOUT_S,
                             f"round {round_}: {standby} to publish at epoch {promoted['epoch']}",
                             detail=lambda: pair.log_tail(standby))
            pair.note(f"round {round_}: kill -9 {active} -> PROMOTED {standby} "
                      f"{promoted['happened_at'].timestamp() - killed_at:.2f}s, first publish "
                      f"{first['published_at'].timestamp() - killed_at:.2f}s")
            if round_ == 1:  # the killed node rejoins from its own checkpoint as the hot standby of round 2
                live.relaunch(active)
                pair.wait_caught_up(active)
                pair.note(f"{active} has caught up")
                active, standby = standby, active

        written_at_end = live.writer.written
        live.finish_and_compare()
        kinds = [(e["kind"], e["node"], e["epoch"]) for e in failover_events(url, since=since)]
        assert kinds == [("PROMOTED", second_active, epoch + 1), ("PROMOTED", first_active, epoch + 2)], kinds
        assert lease(url)["holder"] == first_active and lease(url)["epoch"] == epoch + 2
        assert 0 < written_at_kill[0] < written_at_kill[1] < written_at_end, \
            f"the load was not steady across the kills: {written_at_kill}, {written_at_end}"
        assert split_brain(url) == []


class Crash(Exception):
    """The active dies here (stands in for kill -9 between two steps of a publish)."""


def test_a_standby_does_not_trim_what_the_dead_active_never_appended_to_delta(project: Path, database_url: str,
                                                                               monkeypatch) -> None:
    """The active's published position must not cover rows that reached PostgreSQL but not Delta.

    The active publishes a catch-up batch spanning 30 s of event time (more than the 10 s
    watermark) and dies after the PostgreSQL commit, before its Delta append. The standby held
    the same rows; when it takes over it trims by the published position and publishes the rest.
    Every second bucket must end up in Delta with PostgreSQL's numbers.
    """
    import pyarrow as pa
    from tandem.aggregation import delta as agg_delta
    from _project import TRADES
    from tandem.outputs.aggregation import AggregateSink
    from tandem.store import Database, migrate
    from tandem.store.leases import try_acquire

    cluster = load_cluster()
    start_ms = int(datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC).timestamp() * 1000)
    events = [(start_ms + s * 1000 + i * 100, symbol, 10.0 + s + i, 1 + i)
              for s in range(30) for symbol in ("IBM", "ORCL") for i in range(3)]
    seconds = _ha_expected(events)
    rows = pa.table({
        "bucket_start": pa.array([k[0] for k in seconds], pa.timestamp("us", tz="UTC")),
        "symbol": [k[1] for k in seconds],
        **{c: [v[c] for v in seconds.values()] for c in ("price_sum", "trade_count", "quantity_sum",
                                                           "price_min", "price_max")},
    })
    delta_path = delta_table_dir(cluster, "trades", "trade_aggregates")
    node_a, node_b = (InstanceKey("trades", "shard-1", n) for n in ("node-a", "node-b"))
    active = AggregateSink(TRADES, node_a, database_url, delta_path, watermark_s=10)
    standby = AggregateSink(TRADES, node_b, database_url, delta_path, watermark_s=10)
    with Database(database_url) as db:
        migrate(db)
        epoch_a = try_acquire(db, "trades", "shard-1", "node-a", 3.0)

        def crash(*args, **kwargs):
            raise Crash

        monkeypatch.setattr(agg_delta, "append_rows", crash)
        with pytest.raises(Crash):
            active.publish(rows, BatchInfo(node_a, 7, epoch_a, datetime.now(UTC)))
        monkeypatch.undo()
        assert mismatches(cluster, events, ("postgres",)) == []

        standby.hold(rows, 5)
        db.run(lambda cursor: cursor.execute("UPDATE leases SET expires_at = now() - interval '1 second'"))
        epoch_b = try_acquire(db, "trades", "shard-1", "node-b", 3.0)
        assert epoch_b == epoch_a + 1
        standby.flush(BatchInfo(node_b, -1, epoch_b, datetime.now(UTC)))
    problems = mismatches(cluster, events)
    assert not problems, "\n".join(problems)


def _ha_expected(events):
    from _ha import expected_aggregates

    return expected_aggregates(events, "second")
