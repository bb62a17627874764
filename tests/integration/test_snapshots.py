"""Snapshots with real Spark and PostgreSQL: cuts of a running query, state export, validation, retention, restore.

The expected values are the test's own: the events in the landing files a cut had read (from the
cut's file-source log) give the state and the outputs at the cut.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import yaml
from pyspark.sql import functions as F
from _ha import (
    PLAN,
    INSTANCE,
    UTC,
    Pair,
    TradeWriter,
    configure_one_instance,
    expected_aggregates,
    fetch,
    instance_row,
    lease,
    mismatches,
    wait_for,
)
import pyarrow.dataset as ds

from tandem import cli
from _project import TRADES
from tandem.checkpoints import GUARD_WINDOW_S, CheckpointError, committed_batch, cut_checkpoint, query_dirs
from tandem.config import load_cluster, load_plan
from tandem.errors import SnapshotRefused
from tandem.lake.tables import read_table
from tandem.layout import checkpoint_dir, delta_table_dir, instance_landing_dir
from tandem.packaging import build_dist
from tandem.resync import resync_recorded
from tandem.runtime.node import run_instance
from tandem.snapshots import landing_file_key, processed_files
from tandem.snapshots.landing import clean_plan_landing
from tandem.outputs.aggregation import newest_per_key
from tandem.snapshots.restore import restore_instance
from tandem.snapshots.state_export import STATE_TABLE, read_state, spark_state
from tandem.snapshots.take import prune_snapshots, take_snapshot
from tandem.store import Database, snapshots as catalog
from tandem.store.registry import get_instance
from tandem.store.supervision import RESTORING, mark
from tandem.supervisor import stop_instance

pytestmark = pytest.mark.integration


def events_in(files: frozenset[str]) -> list[tuple[int, str, float, int]]:
    """(timestamp ms, symbol, price, quantity) of every event in the given landing files (``file:`` URIs)."""
    events = []
    for uri in files:
        for line in Path(landing_file_key(uri)).read_text().splitlines():
            e = json.loads(line)
            events.append((e["timestamp"], e["symbol"], e["price"], e["quantity"]))
    return events


def keep_snapshots(project: Path, keep: int) -> None:
    path = project / "conf" / "plans" / "trades.yaml"
    plan = yaml.safe_load(path.read_text())
    plan["snapshot"]["keep"] = keep
    path.write_text(yaml.safe_dump(plan))


def assert_cut_consistent(cluster, snapshot: catalog.SnapshotRecord) -> None:
    """The exported state and the Delta output at the snapshot's version agree with the input the cut had read."""
    cut = Path(snapshot.checkpoint_path) / "aggregates"
    assert committed_batch(cut) == snapshot.batch_id == snapshot.query_batches["aggregates"]
    # the batch of the cut was committed before the snapshot started: a restore replays what began after that
    assert snapshot.taken_at - timedelta(minutes=2) < snapshot.replay_from <= snapshot.taken_at
    seen = events_in(processed_files(cut))
    seconds = expected_aggregates(seen, "second")

    state = read_state(delta_table_dir(cluster, PLAN, STATE_TABLE), snapshot.id, query="aggregates")
    assert len(state) == snapshot.state_rows > 0
    for row in state:
        key = (datetime.fromisoformat(row["key"]["window"]["start"].replace("Z", "+00:00")), row["key"]["symbol"])
        want = seconds[key]
        got = row["value"]
        assert (got["trade_count"], got["quantity_sum"], got["price_min"], got["price_max"]) == (
            want["trade_count"], want["quantity_sum"], want["price_min"], want["price_max"]), key
        assert got["price_sum"] == pytest.approx(want["price_sum"], rel=1e-9)
        assert row["batch_id"] == snapshot.batch_id

    version = snapshot.output_versions["trade_aggregates"]
    rows = read_table(delta_table_dir(cluster, PLAN, "trade_aggregates"),
                      (ds.field("instance") == INSTANCE) & (ds.field("granularity") == "second"), version=version)
    latest = newest_per_key(rows, TRADES).to_pylist()
    assert max(r["batch_id"] for r in latest) <= snapshot.batch_id
    published = {(r["bucket_start"].astimezone(UTC), r["symbol"]): r for r in latest}
    assert set(published) == set(seconds), "the output at the cut's version is not the input the cut had read"
    for key, want in seconds.items():
        assert published[key]["trade_count"] == want["trade_count"], key


def test_snapshots_of_a_running_query_are_consistent_pruned_and_restorable(project: Path, database_url: str,
                                                                          spark, capsys) -> None:
    configure_one_instance(project)
    keep_snapshots(project, 2)
    cluster = load_cluster()
    plan = load_plan(PLAN, cluster)
    live = checkpoint_dir(cluster, PLAN, INSTANCE, "node-a", "aggregates")
    writer = TradeWriter(instance_landing_dir(cluster, load_plan(PLAN, cluster), INSTANCE), rate=200)
    stop = threading.Event()
    result: list = []
    runner = threading.Thread(target=lambda: result.append(run_instance(
        cluster, plan, "node-a", INSTANCE, spark=spark, trigger_interval_s=0.3, stop=stop)))
    taken = []
    writer.start()
    runner.start()
    try:
        wait_for(lambda: (committed_batch(live) or 0) >= 2, 180, "the first batches", poll_s=0.3)
        # snapshots while the writer writes and the query commits batch after batch (each after a new commit: a
        # loaded host may take longer for a batch than for a snapshot)
        while len(taken) < 4:
            if taken:
                wait_for(lambda: (committed_batch(live) or 0) > taken[-1].record.batch_id, 120, "a batch after the cut",
                         poll_s=0.1)
            taken.append(take_snapshot(cluster, plan, INSTANCE, spark))
    finally:
        writer.stop()
        stop.set()
        runner.join(timeout=120)
    assert result and result[0].status == "STOPPED", result
    batches = [t.record.batch_id for t in taken]
    print(*[t.summary() for t in taken], *[t.validation.summary() for t in taken], sep="\n")
    assert all(t.good for t in taken), [t.summary() for t in taken]
    assert batches == sorted(batches) and len(set(batches)) >= 3, f"the query did not commit between cuts: {batches}"
    for t in taken:
        assert_cut_consistent(cluster, t.record)
        assert t.record.node == "node-a" and t.validation.rows == t.record.state_rows

    # "what was the running total of IBM at snapshot S": the CLI's reader and Spark agree
    state_path = delta_table_dir(cluster, PLAN, STATE_TABLE)
    ibm = read_state(state_path, taken[1].record.id, key_contains={"symbol": "IBM"})
    from_spark = spark_state(spark, state_path, taken[1].record.id).where(
        F.get_json_object("key", "$.symbol") == "IBM").collect()
    assert ibm and sorted(json.loads(r["value"])["trade_count"] for r in from_spark) == sorted(
        r["value"]["trade_count"] for r in ibm)
    capsys.readouterr()
    assert cli.main(["snapshots", PLAN, "--state", taken[1].record.id, "--key", "symbol=IBM", "--json"]) == 0
    assert sorted(r["value"]["trade_count"] for r in json.loads(capsys.readouterr().out)) == sorted(
        r["value"]["trade_count"] for r in ibm)
    assert cli.main(["snapshots", PLAN, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in listed] == [t.record.id for t in reversed(taken)]
    assert all(r["status"] == "GOOD" and r["batch_id"] == t.record.batch_id for r, t in zip(listed, reversed(taken)))

    # a state file of the newest snapshot goes missing: validation fails and restore refuses it
    newest = taken[-1].record
    partition = Path(newest.checkpoint_path) / "aggregates" / "state" / "0" / "0"
    newest_state, = [f for f in partition.iterdir() if f.name.split(".")[0] == str(newest.batch_id + 1)
                     and f.suffix in (".delta", ".zip", ".changelog")]
    newest_state.unlink()
    with pytest.raises(SnapshotRefused, match="state 0/0 version"):
        restore_instance(cluster, plan, INSTANCE, snapshot_id=newest.id, start=False)
    capsys.readouterr()
    assert cli.main(["restore", PLAN, "--snapshot", newest.id]) == 2
    assert f"snapshot {newest.id} is BAD" in capsys.readouterr().err.replace("\n", "")
    restored = taken[2].record
    # a file is inside a cut when every query of the cut had read it (the quarantine triggers less often)
    oldest_kept_cut = set.intersection(*({landing_file_key(f) for f in processed_files(Path(
        taken[1].record.checkpoint_path) / query)} for query in ("aggregates", "quarantine")))
    at_cut = events_in(processed_files(Path(restored.checkpoint_path) / "aggregates"))
    landing = instance_landing_dir(cluster, load_plan(PLAN, cluster), INSTANCE)
    before = {str(p) for p in landing.iterdir() if p.is_file()}
    assert oldest_kept_cut < before
    # node-b: the first snapshot's cut, unchanged for longer than the guard window (a cold standby killed long ago,
    # not the lease holder): it holds no landing file back, and a failed re-sync does not start it from there
    stale = checkpoint_dir(cluster, PLAN, INSTANCE, "node-b", "")
    for query in ("aggregates", "quarantine"):
        cut_checkpoint(Path(taken[0].record.checkpoint_path) / query, stale / query)
    assert not oldest_kept_cut <= processed_files(stale / "aggregates")
    long_ago = time.time() - GUARD_WINDOW_S - 60
    for directory in [stale, *[d / sub for d in query_dirs(stale).values() for sub in ("", "offsets", "commits")]]:
        os.utime(directory, (long_ago, long_ago))
    broken = checkpoint_dir(cluster, PLAN, INSTANCE, "node-x", "aggregates") / "commits"
    broken.mkdir(parents=True)
    (broken / "0").write_text("v1\n{}\n")
    with Database(cluster.database_url, "test") as db:
        assert catalog.get_snapshot(db, newest.id).status == catalog.BAD
        with pytest.raises(CheckpointError, match="landing retention no longer keeps the input it has not read"):
            resync_recorded(db, cluster, plan, INSTANCE, "node-x", "node-b")

        # retention keeps exactly the newest 2 good ones (and the newest bad one, for inspection) ...
        prune_snapshots(cluster, plan, db=db)
        status = {r.id: r.status for r in catalog.list_snapshots(db, PLAN)}
        clean_plan_landing(cluster, plan, db=db)
    assert status == {taken[0].record.id: catalog.PRUNED, taken[1].record.id: catalog.GOOD,
                      taken[2].record.id: catalog.GOOD, newest.id: catalog.BAD}
    assert not Path(taken[0].record.checkpoint_path).exists()
    assert read_state(delta_table_dir(cluster, PLAN, STATE_TABLE), taken[0].record.id) == []
    assert Path(taken[1].record.checkpoint_path).is_dir()
    # landing retention deletes the input files inside the oldest kept cut (node-a processed everything, node-b is
    # left behind), no other
    assert {str(p) for p in landing.iterdir() if p.is_file()} == before - oldest_kept_cut

    # restore the newest good snapshot: outputs roll back to the cut, then the rest of the input adds up exactly
    everything = writer.snapshot()
    report = restore_instance(cluster, plan, INSTANCE, start=False)
    assert report.snapshot.id == restored.id
    assert len(at_cut) < len(everything)
    assert mismatches(cluster, at_cut) == [], "outputs were not rolled back to the snapshot's cut"
    for node in ("node-a", "node-b"):
        assert committed_batch(checkpoint_dir(cluster, PLAN, INSTANCE, node, "aggregates")) == restored.batch_id
    assert run_instance(cluster, plan, "node-b", INSTANCE, spark=spark, available_now=True).status == "STOPPED"
    assert mismatches(cluster, everything) == []
    first = fetch(cluster.database_url, """SELECT min(batch_id) AS b FROM tandem.heartbeats
                                          WHERE node = 'node-b' AND query_name = 'aggregates'""")[0]["b"]
    assert first == restored.batch_id + 1


def test_a_whole_cluster_crash_is_restored_from_the_latest_good_snapshot(project: Path, database_url: str,
                                                                         process_groups: list[int], spark) -> None:
    """Every instance killed (-9) and its checkpoints lost: the restore from the latest good snapshot,
    after reprocessing the input since its cut, leaves the outputs of an uninterrupted run."""
    configure_one_instance(project, standby="cold")  # one running instance: the whole cluster of the plan
    cluster = load_cluster()
    plan = load_plan(PLAN, cluster)
    dist = build_dist(project)
    pair = Pair(cluster, plan, dist, process_groups)
    live = checkpoint_dir(cluster, PLAN, INSTANCE, "node-a", "aggregates")
    writer = TradeWriter(instance_landing_dir(cluster, load_plan(PLAN, cluster), INSTANCE), rate=200)
    try:
        pair.launch("node-a", "ACTIVE")
        pair.wait_running("node-a")
        writer.start()
        wait_for(lambda: (committed_batch(live) or 0) >= 3, 180, "node-a's first batches",
                 detail=lambda: pair.log_tail("node-a"))
        snapshot = take_snapshot(cluster, plan, INSTANCE, spark).record
        assert snapshot.status == catalog.GOOD, snapshot.reason
        cut = snapshot.batch_id
        old_epoch = lease(cluster.database_url)["epoch"]
        wait_for(lambda: committed_batch(live) >= cut + 3, 120, "batches after the snapshot were published")
        pair.note(f"snapshot at batch {cut}; killing node-a at batch {committed_batch(live)}")

        pair.kill("node-a")
        pair.wait_group_gone("node-a")
        writer.stopping.wait(2.0)  # input keeps arriving while nothing runs
        events = writer.stop()
        shutil.rmtree(checkpoint_dir(cluster, PLAN, INSTANCE, "node-a", "").parent)  # every live checkpoint is lost
        restored_at = datetime.now(UTC)

        report = restore_instance(cluster, plan, INSTANCE, launched_by="test_snapshots", py_files=dist)
        with Database(cluster.database_url, "test") as db:
            process_groups.append(get_instance(db, "trades/shard-1/node-a")["submit_pid"])
        assert report.snapshot.id == snapshot.id and report.node == "node-a"
        wait_for(lambda: not mismatches(cluster, events), 240, "the outputs to equal an uninterrupted run's", poll_s=3,
                 detail=lambda: "\n".join(mismatches(cluster, events)[:6]) + "\n" + pair.log_tail("node-a"))
        assert mismatches(cluster, events) == []

        resumed = fetch(cluster.database_url, """SELECT min(batch_id) AS first FROM tandem.heartbeats
                        WHERE node = 'node-a' AND query_name = 'aggregates' AND recorded_at > %s""", (restored_at,))
        assert resumed[0]["first"] == cut + 1, "the restored instance did not resume right after the cut"
        rows = read_table(delta_table_dir(cluster, PLAN, "trade_aggregates"), ds.field("instance") == INSTANCE).to_pylist()
        assert not [r for r in rows if r["epoch"] == old_epoch and r["batch_id"] > cut], \
            "Delta still holds what the crashed instance published after the cut"
        # The node was launched before the rollback ended (its JVM started meanwhile) and waited for it: it resumed at
        # the cut, though its checkpoints were gone when it was launched.
        [restored] = fetch(cluster.database_url, """SELECT happened_at FROM tandem.failover_events
                           WHERE kind = 'RESTORED' AND happened_at > %s""", (restored_at,))
        launched_at = instance_row(cluster.database_url, "node-a")["launched_at"]
        assert launched_at < restored["happened_at"], "the restore launched the node only after the rollback"

        # A restore that died half-way (a RESTORING event, no RESTORED after it): no launch runs on what it left.
        with Database(cluster.database_url, "test") as db:
            mark(db, PLAN, INSTANCE, RESTORING, "test: a restore that died half-way", node="node-a")
        stop_instance(cluster, plan, INSTANCE, "node-a", timeout_s=20)
        pair.launch("node-a", "ACTIVE")
        failed = wait_for(lambda: (row := instance_row(cluster.database_url, "node-a"))["status"] == "FAILED" and row,
                          180, "the launch after a half-way restore to fail", detail=lambda: pair.log_tail("node-a"))
        assert "did not finish" in failed["failure"] and "tandem restore trades" in failed["failure"], failed["failure"]
        assert fetch(cluster.database_url, """SELECT count(*) AS n FROM tandem.heartbeats WHERE node = 'node-a'
                     AND recorded_at > %s""", (failed["launched_at"],))[0]["n"] == 0, "it ran a batch"
    finally:
        writer.stopping.set()
        stop_instance(cluster, plan, INSTANCE, "node-a", timeout_s=20)

