"""No name or recorded path leads outside the storage root; instances and nodes must belong to the plan (issue 9, item 7)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.config import load_cluster, load_plan
from tandem.errors import ConfigError, PathOutsideRoot
from tandem.layout import checkpoint_dir, landing_dir, retained_twin, snapshot_dir, under_root
from tandem.snapshots.take import prune_snapshots, take_snapshot
from tandem.store.db import Database
from tandem.store.migrations import migrate
from tandem.supervisor.reconcile import OpsRefused, run_ops_action

pytestmark = pytest.mark.integration
HOSTILE = "../../../../../x"


@pytest.mark.parametrize("name", ["..", ".", "", "a/b", "/etc", HOSTILE, "x\\..\\y", "nul\0byte"])
def test_no_place_is_built_from_a_name_that_is_not_one_folder(project: Path, name: str) -> None:
    cluster = load_cluster()
    for build in (lambda: landing_dir(cluster, name, 0), lambda: checkpoint_dir(cluster, "trades", name, "n"),
                  lambda: snapshot_dir(cluster, "trades", name)):
        with pytest.raises(PathOutsideRoot, match="cannot name a folder under the storage root"):
            build()


def test_a_landing_file_retires_to_its_twin_under_retained_and_nothing_else_does(project: Path) -> None:
    cluster = load_cluster()
    landed = landing_dir(cluster, "trades", 1) / "t-1.jsonl"
    assert retained_twin(cluster, landed) == cluster.storage_root / "retained" / "trades" / "1" / "t-1.jsonl"
    for other in (checkpoint_dir(cluster, "trades", "shard-1", "node-a") / "x", landing_dir(cluster, "trades", 1),
                  cluster.storage_root / "landing" / "trades" / "x" / "t-1.jsonl", Path("/etc/landing/trades/1/t")):
        with pytest.raises(PathOutsideRoot):
            retained_twin(cluster, other)


def test_a_recorded_path_is_used_only_under_the_root(project: Path) -> None:
    cluster = load_cluster()
    inside = cluster.storage_root / "snapshots" / "trades" / "s1"
    assert under_root(cluster, inside) == inside
    for outside in (cluster.storage_root.parent, cluster.storage_root / ".." / "elsewhere", "/etc",
                    str(cluster.storage_root) + "-sibling"):
        with pytest.raises(PathOutsideRoot, match="outside the storage root"):
            under_root(cluster, outside)


def test_a_snapshot_of_a_instance_outside_the_plan_is_refused_before_anything_is_read_or_recorded(project: Path) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    with Database(cluster.database_url) as db:
        migrate(db)
        for instance, node in ((HOSTILE, "node-a"), ("shard-9", None), ("shard-1", "node-z")):
            with pytest.raises(ConfigError, match=r"trades.yaml: (groups|nodes): .* is not an? (instance|node) of plan"):
                take_snapshot(cluster, plan, instance, spark=None, node=node, db=db)
        rows = db.run(lambda cursor: (cursor.execute("SELECT count(*) AS n FROM snapshots"), cursor.fetchone())[1])
    assert rows["n"] == 0
    assert not (cluster.storage_root / "snapshots").exists()


def test_pruning_never_deletes_where_a_catalog_row_points_outside_the_root(project: Path, tmp_path: Path,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("not Tandem's")
    (cluster.storage_root / "snapshots" / "trades").mkdir(parents=True)  # so that the OS can walk the `..`s
    hostile_id = os.path.relpath(outside, cluster.storage_root / "snapshots" / "trades")
    assert ".." in hostile_id
    with Database(cluster.database_url) as db:
        migrate(db)
        # a TAKING row two days old is given up (BAD) before pruning; a newer BAD one is the one kept for inspection
        db.run(lambda cursor: cursor.execute(
            """INSERT INTO snapshots (id, plan, instance, instance_id, node, taken_at, checkpoint_path, status)
               VALUES (%s, 'trades', 'shard-1', 'trades/shard-1/node-a', 'node-a', now() - interval '2 days', %s,
                       'TAKING'),
                      ('shard-1-newer', 'trades', 'shard-1', 'trades/shard-1/node-a', 'node-a',
                       now() - interval '1 day', %s, 'BAD')""",
            (hostile_id, str(outside), str(cluster.storage_root / "snapshots" / "trades" / "shard-1-newer"))))
        prune_snapshots(cluster, plan, db=db)
        status = db.run(lambda cursor: (cursor.execute("SELECT status FROM snapshots WHERE id = %s", (hostile_id,)),
                                        cursor.fetchone())[1])["status"]
    assert (outside / "keep.txt").read_text() == "not Tandem's"
    assert status == "BAD", "a snapshot that was not deleted must not be marked PRUNED"
    assert "not pruning snapshot" in caplog.text and "cannot name a folder" in caplog.text


def test_tandem_run_refuses_an_unknown_instance_with_one_line_before_starting_spark(project: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tandem.cli", "run", "--plan", "trades", "--node", "node-a",
                           "--instance", "shard-9"], env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {Path(os.environ['TANDEM_CONF_DIR']) / 'plans' / 'trades.yaml'}: groups: 'shard-9' is not an "
        "instance of plan trades (instances: shard-1, shard-2)"]


def test_ops_actions_refuse_a_instance_or_node_of_another_plan(project: Path) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    with pytest.raises(OpsRefused, match="'shard-9' is not an instance of plan trades"):
        run_ops_action(cluster, plan, "failover_now", None, ["shard-9"], launched_by="test")
    with pytest.raises(OpsRefused, match="'node-z' is not a node of plan trades"):
        run_ops_action(cluster, plan, "failover_now", "node-z", ["shard-1"], launched_by="test")


def test_landing_retention_never_trusts_a_recorded_cut_outside_the_root(project: Path, tmp_path: Path) -> None:
    """A GOOD row pointing outside the root (a forged source log there) must not decide what input is deleted."""
    from tandem.snapshots.landing import clean_plan_landing

    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    landing = landing_dir(cluster, "trades", 0)
    landing.mkdir(parents=True)
    (landing / "events-1.jsonl").write_text("{}\n")
    with Database(cluster.database_url) as db:
        migrate(db)
        db.run(lambda cursor: cursor.execute(
            """INSERT INTO snapshots (id, plan, instance, instance_id, node, batch_id, taken_at, completed_at,
                                      checkpoint_path, status, query_batches)
               VALUES ('forged', 'trades', 'shard-1', 'trades/shard-1/node-a', 'node-a', 0, now(), now(), %s,
                       'GOOD', '{"aggregates": 0}')""", (str(tmp_path / "forged"),)))
        with pytest.raises(PathOutsideRoot, match="outside the storage root"):
            clean_plan_landing(cluster, plan, instance="shard-1", db=db)
    assert (landing / "events-1.jsonl").exists()
