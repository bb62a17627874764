"""``tandem status``: nodes, roles, epoch, health, beat age, lease and events from a real PostgreSQL."""

from __future__ import annotations

import re

from pathlib import Path

import yaml

from tandem.cli import main
from tandem.config import load_cluster
from tandem.store import Database, migrate
from tandem.store.leases import record_event
from tandem.store.registry import register_nodes


def test_status_shows_roles_health_lease_and_events(project: Path, database_url: str, capsys) -> None:
    path = project / "conf" / "plans" / "trades.yaml"
    plan = yaml.safe_load(path.read_text())
    plan["groups"]["shard"]["parallel"] = 1
    path.write_text(yaml.safe_dump(plan))
    with Database(database_url) as db:
        migrate(db)
        register_nodes(db, load_cluster())

        def work(cur):
            for node, role, epoch, beat in (("node-a", "ACTIVE", 4, 0.3), ("node-b", "PASSIVE", 0, 12.0)):
                cur.execute("""INSERT INTO plan_instances (instance_id, plan, instance, node, role, epoch, status,
                                                           started_at, pid)
                               VALUES (%s, 'trades', 'shard-1', %s, %s, %s, 'RUNNING', now(), 4242)""",
                            (f"trades/shard-1/{node}", node, role, epoch))
                cur.execute("""INSERT INTO liveness (instance_id, host, pid, beat_at, started_at)
                               VALUES (%s, 'h', 4242, now() - make_interval(secs => %s), now())""",
                            (f"trades/shard-1/{node}", beat))
            cur.execute("""INSERT INTO leases (plan, instance, holder, epoch, ttl_s, expires_at)
                           VALUES ('trades', 'shard-1', 'node-a', 4, 3, now() + interval '2 seconds')""")
            record_event(cur, "trades", "shard-1", "PROMOTED", "PASSIVE took the lease: lease expired",
                         node="node-a", previous_node="node-b", epoch=4)

        db.run(work)
    assert main(["status", "trades"]) == 0
    out = capsys.readouterr().out
    assert "trades / shard-1 (hot standby) - lease: node-a at epoch 4, expires in" in out
    lines: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.strip().startswith("node-"):
            lines.setdefault(line.split()[0], line.split())  # the table row comes before the note
    assert lines["node-a"][1:5] == ["ACTIVE", "4", "RUNNING", "HEALTHY"]
    assert lines["node-b"][1:5] == ["PASSIVE", "0", "RUNNING", "DEAD"]
    # 12 s when the beat was written; more when the host is slow to get from there to the status
    assert re.search(r"node-b DEAD: RUNNING, last liveness beat 1[2-9]\.\d", out), out
    assert "due: stop node-b" in out
    assert "PROMOTED" in out and "lease expired" in out


def test_status_without_schema_says_what_to_do(project: Path, database_url: str, capsys) -> None:
    assert main(["status"]) == 2
    assert "run `tandem migrate`" in capsys.readouterr().err
