"""Failover with real spark-submit processes, real signals and steady load (hot standby).

Every test runs the trades plan for shard-1 as an ACTIVE instance on one node and a hot PASSIVE
on the other (each its own detached ``spark-submit``, its own process group and checkpoint),
while a writer thread lands ~200 trade events/s with current timestamps. It then breaks
something with a real signal and finally checks that what was published equals the aggregates
the test computes itself from every event it wrote: all six granularities served from
PostgreSQL and the merged numbers read from Delta — nothing missing, nothing twice.

One test runs against a PostgreSQL cluster of its own (``PrivatePostgres``) and restarts it
mid-stream: the jobs reconnect and carry on, and no two nodes publish at once.

The last test needs no Spark: it drives two publishers in-process to check that a standby does
not trim rows an active that died between its PostgreSQL commit and its Delta append never
wrote to Delta.

``pytest -s`` prints the phases with their times and the measured take-over times; the timeouts
are generous because the machine is shared (the benchmark, bench/failover.py, measures).
"""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from _ha import (
    ROLE_CHANGES,
    SHARD,
    Pair,
    PrivatePostgres,
    TradeWriter,
    configure_one_shard,
    failover_events,
    fetch,
    free_port,
    group_alive,
    instance_row,
    lease,
    mismatches,
    pause_inside_publish,
    publish_log,
    published_total,
    split_brain,
    wait_for,
)
from tandem.config import load_cluster, load_plan
from tandem.lake.tables import committed_version
from tandem.layout import checkpoint_dir, delta_table_dir, landing_dir
from tandem.packaging import build_dist
from tandem.runtime.publisher import BatchInfo, checkpoint_lineage
from tandem.store.registry import InstanceKey
from tandem.supervisor import stop_instance
from tandem.supervisor.reconcile import Supervisor

pytestmark = pytest.mark.integration
TAKEOVER_TIMEOUT_S = 20  # lease ttl 3 s + one 1 s heartbeat, with room for a loaded 2-core machine


def one_shard_pair(project: Path, process_groups: list[int]) -> Pair:
    """The temp project on shard-1 with local[1] nodes, as a Pair of node-a / node-b."""
    configure_one_shard(project)
    cluster = load_cluster()
    return Pair(cluster, load_plan("trades", cluster), build_dist(project), process_groups)


@pytest.fixture
def pair(project: Path, database_url: str, process_groups: list[int]) -> Pair:
    return one_shard_pair(project, process_groups)


@pytest.fixture
def private_postgres(project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The temp project pointed at a PostgreSQL cluster of its own, which the test may restart."""
    server = PrivatePostgres(tmp_path / "pg", free_port())
    monkeypatch.setenv("TANDEM_DATABASE_URL", server.start())
    yield server
    server.destroy()


@pytest.fixture
def private_pair(project: Path, private_postgres: PrivatePostgres, process_groups: list[int]) -> Pair:
    """Like ``pair``, on the private cluster (its processes are killed before the cluster is removed)."""
    return one_shard_pair(project, process_groups)


@pytest.fixture
def writer(pair: Pair):
    """~200 events/s into shard-1's landing directory, started by ``start_hot_pair`` once both instances run."""
    writer = TradeWriter(landing_dir(pair.cluster, "trades", SHARD), rate=200)
    yield writer
    writer.stopping.set()
    writer.join(timeout=10)


def start_hot_pair(pair: Pair, writer: TradeWriter, active: str = "node-a", passive: str = "node-b") -> None:
    """Both instances running, then the load: the passive has no backlog to catch up with at start."""
    pair.start_pair(active, passive)
    writer.start()
    pair.wait_caught_up(passive)
    wait_for(lambda: pair.first_publish(active, lease(pair.url)["epoch"]), 90, f"{active} to publish",
             detail=lambda: pair.log_tail(active))
    pair.note(f"{passive} has caught up, {active} publishes")


def finish_and_compare(pair: Pair, writer) -> int:
    """Stop the writer, wait until the active has published every event, compare every output."""
    events = writer.stop()
    pair.note(f"writer stopped after {len(events)} events")
    wait_for(lambda: published_total(pair.url) >= len(events), 120,
             f"all {len(events)} events to be published",
             detail=lambda: f"published {published_total(pair.url)}; lease {lease(pair.url)}")
    pair.note("every event is published")
    deadline = time.monotonic() + 30  # Delta is appended right after the PostgreSQL commit
    while (problems := mismatches(pair.cluster, events)) and time.monotonic() < deadline:
        time.sleep(2)
    assert not problems, "\n".join(problems)
    pair.note("outputs compared")
    return len(events)


@pytest.mark.slow  # three failovers, each followed by a relaunch that has to catch up: ~3-5 min
def test_killing_the_active_three_times_in_a_row_loses_and_duplicates_nothing(pair: Pair, writer) -> None:
    url = pair.url
    start_hot_pair(pair, writer, "node-a", "node-b")
    active, standby = "node-a", "node-b"
    for round_ in range(1, 4):
        before = lease(url)
        assert before["holder"] == active, before
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
        if round_ < 3:  # the killed node rejoins as the hot standby of the next round
            pair.launch(active, "PASSIVE")
            pair.wait_running(active)
            pair.note(f"{active} relaunched as PASSIVE")
            pair.wait_caught_up(active)
            pair.note(f"{active} has caught up")
            active, standby = standby, active

    total = finish_and_compare(pair, writer)
    kinds = [(e["kind"], e["node"], e["epoch"]) for e in failover_events(url)]
    assert kinds == [("PROMOTED", "node-a", 1), ("PROMOTED", "node-b", 2), ("PROMOTED", "node-a", 3),
                     ("PROMOTED", "node-b", 4)], kinds
    assert lease(url)["holder"] == "node-b" and lease(url)["epoch"] == 4
    assert total >= 200 * 60, f"only {total} events: the load was not steady"
    assert split_brain(url) == []


def test_a_paused_active_publishes_nothing_after_the_epoch_moved(pair: Pair, writer) -> None:
    url = pair.url
    start_hot_pair(pair, writer, "node-a", "node-b")
    before = lease(url)
    delta_path = delta_table_dir(pair.cluster, "trades", "trade_aggregates")
    lineage = checkpoint_lineage(checkpoint_dir(pair.cluster, "trades", "shard-1", "node-a", "aggregates"))
    app_id = BatchInfo(InstanceKey("trades", "shard-1", "node-a"), 0, 0, datetime.now(UTC), lineage).app_id(
        "trade_aggregates")  # node-a's Delta application transaction
    assert committed_version(delta_path, app_id) is not None, app_id
    # Pause it inside a publishing transaction if possible: it then holds the lease row FOR SHARE.
    paused_at, open_transaction = pause_inside_publish(pair, "node-a")
    try:
        promoted = wait_for(lambda: pair.promoted("node-b", before["epoch"]), TAKEOVER_TIMEOUT_S,
                            "node-b to take over from the paused node-a",
                            detail=lambda: f"lease {lease(url)}; paused inside {open_transaction}\n"
                                           f"{pair.log_tail('node-b')}")
        assert promoted["epoch"] == before["epoch"] + 1 and promoted["previous_node"] == "node-a"
        # What node-a published, frozen while it cannot run.
        frozen = {(r["output"], r["batch_id"]): (r["epoch"], r["rows"]) for r in publish_log(url, "node-a")}
        delta_frozen = committed_version(delta_path, app_id)
        wait_for(lambda: pair.first_publish("node-b", promoted["epoch"]), TAKEOVER_TIMEOUT_S,
                 "node-b to publish", detail=lambda: pair.log_tail("node-b"))
        time.sleep(max(0.0, paused_at + 8 - time.time()))  # past the lease timeout, under load
        wait_for(lambda: len([r for r in publish_log(url, "node-b") if r["epoch"] == promoted["epoch"]]) >= 3,
                 30, "node-b to publish live batches")
    finally:
        pair.kill("node-a", signal.SIGCONT)
    pair.note(f"SIGSTOP node-a (inside a publish transaction: {bool(open_transaction)}) -> PROMOTED node-b "
          f"{promoted['happened_at'].timestamp() - paused_at:.2f}s")

    demoted = wait_for(lambda: [e for e in failover_events(url) if e["kind"] == "DEMOTED" and e["node"] == "node-a"],
                       30, "the resumed node-a to demote itself", detail=lambda: pair.log_tail("node-a"))
    assert demoted[0]["epoch"] == before["epoch"], demoted
    time.sleep(8)  # the demoted instance runs on as a standby under load
    finish_and_compare(pair, writer)

    after = {(r["output"], r["batch_id"]): (r["epoch"], r["rows"]) for r in publish_log(url, "node-a")}
    assert after == frozen, "node-a published after the epoch moved on"
    late = [r for r in publish_log(url, "node-a") if r["published_at"] >= promoted["happened_at"]]
    assert late == [], late
    assert all(r["epoch"] == promoted["epoch"] for r in publish_log(url, "node-b"))
    # A Delta append that had passed its epoch check before the pause may still commit (its rows
    # were accepted by PostgreSQL before the epoch moved and lose to the newer epoch on read).
    delta_after = committed_version(delta_path, app_id)
    assert (delta_after or -1) <= (delta_frozen or -1) + 1, (delta_frozen, delta_after)
    row = instance_row(url, "node-a")
    assert (row["role"], row["epoch"], row["status"]) == ("PASSIVE", 0, "RUNNING"), row
    assert group_alive(pair.pgids["node-a"]), "the fenced instance should run on as a standby"
    assert lease(url)["holder"] == "node-b" and lease(url)["epoch"] == promoted["epoch"]


def test_killing_the_passive_leaves_the_active_undisturbed(pair: Pair, writer) -> None:
    url = pair.url
    start_hot_pair(pair, writer, "node-a", "node-b")
    before = lease(url)
    role_changes = len(failover_events(url, kinds=ROLE_CHANGES))
    killed_at = datetime.now(UTC)
    pair.kill("node-b", signal.SIGKILL)
    pair.wait_group_gone("node-b")
    time.sleep(3 * pair.plan.heartbeat.timeout_s)  # three lease periods without a standby

    now = lease(url)
    assert (now["holder"], now["epoch"]) == ("node-a", before["epoch"]), now
    assert len(failover_events(url, kinds=ROLE_CHANGES)) == role_changes, failover_events(url)
    live = [r for r in publish_log(url, "node-a") if r["published_at"] > killed_at]
    assert len(live) >= 3, f"the active stopped publishing: {live}"
    assert {r["epoch"] for r in live} == {before["epoch"]}
    pair.note(f"node-b killed; node-a published {len(live)} batches since, lease unchanged")

    # The supervisor brings the passive back: DEAD -> stop what is left -> re-sync its checkpoint
    # from a cut of the active's -> relaunch as PASSIVE; it holds what it would publish.
    with Supervisor(pair.cluster, pair.plan, launched_by="test_failover", py_files=pair.dist,
                    running_timeout_s=240) as supervisor:
        wait_for(lambda: supervisor.observe(SHARD).view.health("node-b").state == "DEAD", 30, "node-b to be DEAD")
        report = supervisor.reconcile(SHARD, cause="test: passive killed")
    row = instance_row(url, "node-b")
    pair.groups.append(row["submit_pid"])
    pair.pgids["node-b"], pair.launched_at["node-b"] = row["submit_pid"], datetime.now(UTC)
    assert report.converged, report.lines()
    assert [(s.action.kind, s.action.node) for s in report.steps] == [("STOP", "node-b"), ("LAUNCH", "node-b")]
    launch = report.steps[1]
    assert (launch.action.role, launch.action.resync_from) == ("PASSIVE", "node-a")
    assert launch.data["cut"]["aggregates"]["batch_id"] is not None, "node-b was not re-synced from a committed batch"
    pair.wait_caught_up("node-b")
    assert publish_log(url, "node-b") == []
    assert instance_row(url, "node-b")["role"] == "PASSIVE"
    assert len(failover_events(url, kinds=ROLE_CHANGES)) == role_changes
    assert (lease(url)["holder"], lease(url)["epoch"]) == ("node-a", before["epoch"])
    pair.note(f"node-b re-synced from node-a at batch {launch.data['cut']['aggregates']['batch_id']}, "
              "relaunched as PASSIVE and caught up without publishing")

    # Hand over cleanly: what the re-synced standby held, trimmed by the active's position, must
    # complete the outputs exactly, with nothing published twice.
    handover_at = datetime.now(UTC)
    stop = stop_instance(pair.cluster, "trades", "shard-1", "node-a", timeout_s=60)
    assert stop.status == "STOPPED", stop
    promoted = wait_for(lambda: pair.promoted("node-b", before["epoch"]), TAKEOVER_TIMEOUT_S,
                        "node-b to take the released lease", detail=lambda: pair.log_tail("node-b"))
    kinds = [(e["kind"], e["node"]) for e in failover_events(url, since=handover_at, kinds=ROLE_CHANGES)]
    assert kinds == [("RELEASED", "node-a"), ("PROMOTED", "node-b")], kinds
    wait_for(lambda: pair.first_publish("node-b", promoted["epoch"]), TAKEOVER_TIMEOUT_S, "node-b to publish")
    pair.note("node-a stopped cleanly, node-b took the released lease and publishes")
    time.sleep(4)
    finish_and_compare(pair, writer)
    assert split_brain(url) == []


def test_restarting_postgresql_mid_stream_loses_nothing_and_never_splits_the_brain(
        private_postgres: PrivatePostgres, private_pair: Pair) -> None:
    """PostgreSQL goes away for longer than the lease lasts and comes back: both jobs reconnect and
    go on (no process dies), one of them holds the lease, and the outputs are exact."""
    pair, url = private_pair, private_pair.url
    writer = TradeWriter(landing_dir(pair.cluster, "trades", SHARD), rate=200)
    try:
        start_hot_pair(pair, writer, "node-a", "node-b")
        time.sleep(5)
        before = lease(url)
        private_postgres.stop()
        pair.note("PostgreSQL stopped (fast shutdown: every connection cut)")
        time.sleep(2 * pair.plan.heartbeat.timeout_s)  # the lease runs out while nobody can renew it
        private_postgres.start()
        restarted_at = datetime.now(UTC)
        pair.note("PostgreSQL started again")

        for node in ("node-a", "node-b"):  # both reconnect: their listeners record batches again
            wait_for(lambda: fetch(url, "SELECT 1 FROM heartbeats WHERE node = %s AND recorded_at > %s",
                                   (node, restarted_at)), 120, f"{node} to record progress after the restart",
                     detail=lambda: pair.log_tail(node))
        wait_for(lambda: [r for r in publish_log(url) if r["published_at"] > restarted_at], 60,
                 "publishing to resume", detail=lambda: f"lease {lease(url)}")
        pair.note(f"both jobs reconnected; lease {lease(url)['holder']} at epoch {lease(url)['epoch']} "
                  f"(was {before['holder']} at {before['epoch']})")
        time.sleep(10)  # steady load after the restart
        finish_and_compare(pair, writer)
    finally:
        writer.stopping.set()

    assert all(group_alive(pair.pgids[node]) for node in ("node-a", "node-b")), "a job died with PostgreSQL"
    rows = {node: instance_row(url, node) for node in ("node-a", "node-b")}
    assert all(row["status"] == "RUNNING" for row in rows.values()), rows
    holder = lease(url)["holder"]
    assert {node: row["role"] for node, row in rows.items()} == {
        holder: "ACTIVE", ({"node-a", "node-b"} - {holder}).pop(): "PASSIVE"}, rows
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
    from tandem.aggregation.spec import TRADES
    from tandem.runtime.publisher import AggregateSink
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
