"""``tandem status``: nodes, roles, epoch, health, beat age, lease and events from a real PostgreSQL."""

from __future__ import annotations

import re

from pathlib import Path

import pytest
import yaml

from tandem.cli import main
from tandem.config import load_cluster
from tandem.store import Database, migrate
from tandem.store.leases import record_event
from tandem.store.registry import register_nodes


def test_status_shows_roles_health_lease_and_events(project: Path, database_url: str, capsys,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the tables laid out whole, whatever terminal runs the tests
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


def _one_instance(project: Path) -> None:
    path = project / "conf" / "plans" / "trades.yaml"
    plan = yaml.safe_load(path.read_text())
    plan["groups"]["shard"]["parallel"] = 1
    path.write_text(yaml.safe_dump(plan))


def test_status_json_has_instances_lag_and_the_take_over_time(project: Path, database_url: str, capsys,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``tandem status --json``: one JSON document on stdout; a take-over's time in seconds and its event's time to
    the microsecond; a watermark ahead of the clock lags 0 s and says how far ahead it is (never a negative lag)."""
    monkeypatch.setenv("COLUMNS", "200")  # the tables laid out whole, whatever terminal runs the tests
    import json
    from datetime import datetime, timedelta, timezone

    from tandem.store.heartbeats import BatchProgress, record_progress
    from tandem.store.leases import try_acquire

    _one_instance(project)
    with Database(database_url) as db:
        migrate(db)
        register_nodes(db, load_cluster())

        def work(cur):
            for node in ("node-a", "node-b"):
                cur.execute("""INSERT INTO plan_instances (instance_id, plan, instance, node, role, epoch, status,
                                                           started_at, pid)
                               VALUES (%s, 'trades', 'shard-1', %s, 'PASSIVE', 0, 'RUNNING', now(), 4242)""",
                            (f"trades/shard-1/{node}", node))
                cur.execute("""INSERT INTO liveness (instance_id, host, pid, beat_at, started_at)
                               VALUES (%s, 'h', 4242, now(), now())""", (f"trades/shard-1/{node}",))
            # node-a held the lease at epoch 3, renewed it last 2.5 s ago, and it expired
            cur.execute("""INSERT INTO leases (plan, instance, holder, epoch, ttl_s, expires_at, renewed_at)
                           VALUES ('trades', 'shard-1', 'node-a', 3, 3, now() - interval '1 second',
                                   now() - interval '2.5 seconds')""")

        db.run(work)
        assert try_acquire(db, "trades", "shard-1", "node-b", 3.0, reason="node-b (PASSIVE standby) took the lease: "
                                                                          "lease expired or handed over") == 4
        ahead = datetime.now(timezone.utc) + timedelta(seconds=30)
        record_progress(db, BatchProgress(
            instance_id="trades/shard-1/node-b", plan="trades", instance="shard-1", node="node-b",
            query_name="aggregates", query_id="00000000-0000-0000-0000-000000000001",
            run_id="00000000-0000-0000-0000-000000000002", batch_id=7, input_rows=10, input_rows_per_s=None,
            processed_rows_per_s=None, batch_duration_ms=5, watermark=ahead, state_rows=None, late_rows=None,
            quarantined_rows=None))
    capsys.readouterr()
    assert main(["status", "trades", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["broken"] == {}
    [plan] = document["plans"]
    [instance] = plan["instances"]
    assert instance["lease"]["holder"] == "node-b" and instance["lease"]["epoch"] == 4
    nodes = {node["node"]: node for node in instance["nodes"]}
    assert nodes["node-b"]["role"] == "ACTIVE" and nodes["node-b"]["status"] == "RUNNING"
    assert nodes["node-b"]["lag_s"] == 0.0 and 25 < nodes["node-b"]["ahead_of_clock_s"] <= 30
    assert nodes["node-a"]["lag_s"] is None and nodes["node-a"]["ahead_of_clock_s"] is None
    [promoted] = [event for event in plan["events"] if event["kind"] == "PROMOTED"]
    assert promoted["node"] == "node-b" and promoted["previous_node"] == "node-a"
    assert 2.5 <= promoted["took_over_s"] < 10  # from node-a's last renewal, 2.5 s before the take-over
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)", promoted["happened_at"])

    assert main(["status", "trades"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"took over in {promoted['took_over_s']:.2f} s after node-a's last renewal" in out
    assert "ahead of clock" in out and "-" + "30" not in out
    shown_at = datetime.fromisoformat(promoted["happened_at"]).astimezone(timezone.utc)
    assert shown_at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] in out


def test_an_instance_nobody_launched_is_not_due_but_not_launched(project: Path, database_url: str, capsys) -> None:
    _one_instance(project)
    with Database(database_url) as db:
        migrate(db)
    assert main(["status", "trades"]) == 0
    out = capsys.readouterr().out
    assert "not launched: `tandem launch trades shard-1 node-a` starts it" in " ".join(out.split())
    assert "due:" not in out


def test_a_lease_given_up_is_started_again_not_taken_over(database_url: str) -> None:
    """A clean stop released the lease 10 minutes ago: the next launch takes nothing over (no take-over time: it
    was 600 s 'after the last renewal'); an expired one is taken over, in the seconds since its last renewal."""
    from tandem.store.leases import release, try_acquire

    with Database(database_url) as db:
        migrate(db)
        db.run(lambda cur: cur.execute(
            """INSERT INTO leases (plan, instance, holder, epoch, ttl_s, expires_at, renewed_at)
               VALUES ('trades', 'shard-1', 'node-a', 3, 3, now() + interval '3 seconds', now() - interval '600 s'),
                      ('trades', 'shard-2', 'node-a', 5, 3, now() - interval '597 s', now() - interval '600 s')"""))
        assert release(db, "trades", "shard-1", "node-a", 3, "instance stopped")
        assert try_acquire(db, "trades", "shard-1", "node-b", 3.0, reason="r") == 4
        assert try_acquire(db, "trades", "shard-2", "node-b", 3.0, reason="r") == 6
        rows = db.run(lambda cur: (cur.execute(
            "SELECT instance, detail FROM failover_events WHERE kind = 'PROMOTED'"), cur.fetchall())[1])
    details = {row["instance"]: row["detail"] for row in rows}
    assert details["shard-1"] == {}
    assert 600 <= details["shard-2"]["took_over_s"] < 660
