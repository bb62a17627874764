"""The supervision trigger and sensor: serialization, an async run() against a real PostgreSQL, deferral."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
import yaml

from tandem.airflow.sensors import StreamHealthSensor
from tandem.airflow.triggers import StreamHealthTrigger
from tandem.config import load_cluster
from tandem.layout import landing_dir
from tandem.store import Database, migrate
from tandem.store.registry import register_nodes


@pytest.fixture
def world(project: Path, database_url: str):
    """The temp project with a one-instance trades plan, and a helper that writes instance rows."""
    path = project / "conf" / "plans" / "trades.yaml"
    plan = yaml.safe_load(path.read_text())
    plan["groups"]["shard"]["parallel"] = 1
    path.write_text(yaml.safe_dump(plan))
    cluster = load_cluster()
    db = Database(database_url)
    migrate(db)
    register_nodes(db, cluster)

    def instance(node: str, status: str = "RUNNING", beat_age_s: float | None = 0.2, role: str = "PASSIVE",
                 error: str | None = None, started_age_s: float = 60.0) -> None:
        def work(cur):
            cur.execute("""INSERT INTO plan_instances (instance_id, plan, instance, node, role, status, error,
                                                       launched_at, started_at, host, pid)
                           VALUES (%s, 'trades', 'shard-1', %s, %s, %s, %s, now() - make_interval(secs => %s),
                                   now() - make_interval(secs => %s), 'elsewhere', 1)""",
                        (f"trades/shard-1/{node}", node, role, status, error, started_age_s + 5, started_age_s))
            if beat_age_s is not None:
                cur.execute("""INSERT INTO liveness (instance_id, host, pid, beat_at, started_at)
                               VALUES (%s, 'elsewhere', 1, now() - make_interval(secs => %s), now())""",
                            (f"trades/shard-1/{node}", beat_age_s))
        db.run(work)

    def lease(holder: str, epoch: int = 1, valid: bool = True) -> None:
        db.run(lambda cur: cur.execute(
            """INSERT INTO leases (plan, instance, holder, epoch, ttl_s, expires_at)
               VALUES ('trades', 'shard-1', %s, %s, 3, now() + make_interval(secs => %s))""",
            (holder, epoch, 60 if valid else -5)))

    yield cluster, instance, lease
    db.close()


def first_event(trigger: StreamHealthTrigger, timeout_s: float = 30.0) -> dict:
    async def take():
        async for event in trigger.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    return asyncio.run(asyncio.wait_for(take(), timeout_s))


def trigger_for(cluster, deadline_in_s: float = 20.0) -> StreamHealthTrigger:
    return StreamHealthTrigger(plan="trades", deadline=time.time() + deadline_in_s, cluster_config=str(cluster.path),
                               poll_interval_s=0.2)


def test_serialize_round_trip():
    trigger = StreamHealthTrigger(plan="trades", deadline=1_900_000_000.5, cluster_config="/x/cluster.yaml",
                                  poll_interval_s=2.0)
    classpath, kwargs = trigger.serialize()
    assert classpath == "tandem.airflow.triggers.StreamHealthTrigger"
    assert kwargs == {"plan": "trades", "deadline": 1_900_000_000.5, "cluster_config": "/x/cluster.yaml",
                      "poll_interval_s": 2.0}
    from airflow.sdk.module_loading import import_string

    assert import_string(classpath)(**kwargs).serialize() == (classpath, kwargs)


def test_run_fires_on_a_dead_passive_with_the_evidence(world):
    cluster, instance, lease = world
    instance("node-a", role="ACTIVE")
    instance("node-b", beat_age_s=9.0)
    lease("node-a")
    event = first_event(trigger_for(cluster))
    assert event["status"] == "unhealthy"
    assert (event["plan"], event["instance"], event["node"], event["health"]) == ("trades", "shard-1", "node-b", "DEAD")
    assert "last liveness beat 9." in event["evidence"] and "heartbeat timeout 3s" in event["evidence"]
    assert event["instances"]["node-a"]["state"] == "HEALTHY"
    assert event["lease"]["holder"] == "node-a" and event["lease"]["valid"] is True
    assert event["decisions"][0].startswith("stop node-b") and "launch node-b as PASSIVE after re-sync from node-a" \
        in event["decisions"][1]


def test_run_fires_on_a_failed_instance(world):
    cluster, instance, lease = world
    instance("node-a", role="ACTIVE")
    instance("node-b", status="FAILED", beat_age_s=100.0, error="query aggregates failed: boom")
    lease("node-a")
    event = first_event(trigger_for(cluster))
    assert (event["node"], event["health"]) == ("node-b", "FAILED")
    assert "boom" in event["evidence"]


def test_run_fires_on_a_stalled_instance_with_waiting_input(world):
    cluster, instance, lease = world
    instance("node-a", role="ACTIVE", started_age_s=300.0)
    instance("node-b", started_age_s=300.0)
    lease("node-a")
    landing = landing_dir(cluster, "trades", 0)
    landing.mkdir(parents=True)
    waiting = landing / "events-1.jsonl"
    waiting.write_text("{}\n")
    # no micro-batch since it started: judged by the launch timeout (180 s), which the waiting input passed
    os.utime(waiting, (time.time() - 245, time.time() - 245))
    event = first_event(trigger_for(cluster))
    assert event["health"] == "STALLED" and event["node"] == "node-a"
    assert "input has waited 24" in event["evidence"] and "launch timeout" in event["evidence"]


def test_run_waits_while_the_hot_standby_takes_the_expired_lease_and_ends_quietly_at_its_deadline(world):
    cluster, instance, lease = world
    instance("node-a", status="STOPPED", role="ACTIVE", beat_age_s=None)  # stopped cleanly ...
    instance("node-b")                                                       # ... the passive takes over
    lease("node-a", valid=False)
    started = time.monotonic()
    event = first_event(trigger_for(cluster, deadline_in_s=1.5))
    # node-a is STOPPED and the lease expired 5 s ago (< 2 ttl + 10 s): waiting for node-b is not actionable
    assert event["status"] == "quiet" and event["polls"] >= 2
    assert time.monotonic() - started < 10


def test_run_fires_when_nothing_runs(world):
    cluster, *_ = world
    event = first_event(trigger_for(cluster))
    assert event["health"] == "MISSING" and event["node"] == "node-a"
    assert event["decisions"] == ["launch node-a as ACTIVE: no node runs the instance"]


def test_sensor_defers_to_the_trigger_while_healthy(world):
    from airflow.sdk.exceptions import TaskDeferred

    cluster, instance, lease = world
    instance("node-a", role="ACTIVE")
    instance("node-b")
    lease("node-a")
    sensor = StreamHealthSensor(task_id="watch", plan="trades", max_watch=120, poll_interval=0.5,
                                cluster_config=str(cluster.path))
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context={})
    trigger = deferred.value.trigger
    assert isinstance(trigger, StreamHealthTrigger) and deferred.value.method_name == "execute_complete"
    assert trigger.plan == "trades" and trigger.poll_interval_s == 0.5
    assert 100 < trigger.deadline - time.time() <= 120
    assert deferred.value.timeout.total_seconds() == sensor.timeout > 120
    event = {"status": "unhealthy", "plan": "trades", "instance": "shard-1", "node": "node-b", "health": "DEAD",
             "evidence": "x", "decisions": []}
    assert sensor.execute_complete(context={}, event=event) == event


def test_sensor_returns_at_once_when_a_problem_is_already_there(world):
    cluster, instance, lease = world
    instance("node-a", role="ACTIVE")
    instance("node-b", status="FAILED", error="boom")
    lease("node-a")
    sensor = StreamHealthSensor(task_id="watch", plan="trades", cluster_config=str(cluster.path))
    event = sensor.execute(context={})
    assert event["health"] == "FAILED" and event["node"] == "node-b"
