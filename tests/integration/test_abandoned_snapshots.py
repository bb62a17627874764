"""A TAKING snapshot whose taker is gone holds nothing back (issue 60), against a real PostgreSQL: PostgreSQL
retention first gives up the TAKING snapshots of a plan whose taker died (its process on this host) or stopped
beating (on another host, silent for ten minutes), so the contribution ids only their replays needed go; a snapshot
being taken by a live, beating taker still keeps what its replay needs, and snapshot pruning waits for it."""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from tandem.batch.trim import trim_plan_rows
from tandem.config import load_cluster, load_plan
from tandem.host_identity import this_host_id
from tandem.process_start import start_since_boot
from tandem.snapshots.take import prune_snapshots
from tandem.snapshots.takers import this_taker
from tandem.store import Database, migrate
from tandem.store import snapshots as catalog
from tandem.store.snapshots import Taker

pytestmark = pytest.mark.integration
DAY = timedelta(days=1)


def dead_taker() -> Taker:
    """A process of this host that took a snapshot and was killed."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = start_since_boot(process.pid)
    process.kill()
    process.wait()
    return Taker(socket.gethostname(), this_host_id(), process.pid, started)


def test_a_snapshot_whose_taker_is_gone_no_longer_keeps_what_its_replay_would_need(project: Path) -> None:
    cluster, plan = load_cluster(), load_plan("trades")
    with Database(cluster.database_url) as db:
        migrate(db)
        now = catalog.database_now(db)

        def begin(instance: str, taker: Taker, replay_days: float) -> catalog.SnapshotRecord:
            record = catalog.begin_snapshot(db, plan="trades", instance=instance, node="node-a",
                                            snapshots_dir=project / "data" / "snapshots", taker=taker)
            return catalog.record_contents(db, record.id, replay_from_age_s=replay_days * 86400)

        dead = begin("shard-1", dead_taker(), 45)
        working = begin("shard-1", this_taker(), 35)
        silent = begin("shard-2", Taker(socket.gethostname(), "0ther0machine/another-boot/1", 4242, 12.5), 45)
        db.run(lambda c: c.execute("UPDATE snapshots SET progress_at = clock_timestamp() - interval '10 minutes' "
                                   "WHERE id = %s", (silent.id,)))
        catalog.record_progress(db, working.id)
        ages = {"s1-40d": ("shard-1", 40), "s1-33d": ("shard-1", 33), "s2-40d": ("shard-2", 40),
                "s2-29d": ("shard-2", 29)}
        for name, (instance, days) in ages.items():
            db.run(lambda c, n=name, i=instance, d=days: c.execute(
                """INSERT INTO output_contributions (plan, output, contribution_id, instance, key, in_lake, applied_at)
                   VALUES ('trades', 'orders', %s, %s, '{}', true, %s)""", (n, i, now - d * DAY)))

        trim_plan_rows(plan, db)

        left = db.run(lambda c: (c.execute("SELECT contribution_id FROM output_contributions"), c.fetchall())[1])
        assert sorted(r["contribution_id"] for r in left) == ["s1-33d", "s2-29d"], \
            "ids only the replays of snapshots with a taker gone needed were kept"
        status = {r.id: r for r in catalog.list_snapshots(db, "trades")}
        assert status[working.id].status == catalog.TAKING, "a live, beating taker's snapshot was given up"
        assert status[dead.id].status == catalog.BAD
        assert f"its taker (pid {dead.taker_pid} on {socket.gethostname()}) is gone" in status[dead.id].reason
        assert status[silent.id].status == catalog.BAD and "no progress from its taker" in status[silent.id].reason

        decisions = {d.snapshot_id: d.action for d in prune_snapshots(cluster, plan, db=db).decisions}
        assert decisions[working.id] == "WAIT"
