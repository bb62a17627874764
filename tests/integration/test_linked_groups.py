"""Two execution groups linked by a NATS stream, under supervision, through two kill -9 failovers (issue 26 §4).

The bundled plan ``hot_rooms`` (``conf/plans/hot_rooms.yaml``), with a real nats-server: readings come in
over NATS (the stream ``temps``); stage 1 (group ``readings``, one instance) publishes every hot reading as
the events output ``hot_readings``, which is also the NATS stream ``hot``; stage 2 (group ``rooms``, two
instances, partitioned by device, not by room) reads ``hot`` and keeps per-room minute statistics, merged
on read.

Tandem's supervisor launches ``readings-1`` and ``rooms-1`` each as an ACTIVE on node-a and a re-synced
hot PASSIVE on node-b (four spark-submit jobs) while readings stream in. The ACTIVE of stage 1 is killed
with ``kill -9`` first; once its PASSIVE has taken over and relayed new hot readings to ``hot``, the
ACTIVE of stage 2's ``rooms-1``; the input goes on a little longer. ``rooms-2`` starts only after the input ended, in the test's Spark session, and reads
``hot`` from its first message (a NATS stream is replayable: a late node misses nothing).

Then stage 2's statistics (PostgreSQL and Delta) must equal a plain-Python reference of both stages over
every reading the test published; the stream ``hot`` must hold every hot reading exactly once; no epoch
of either instance was published by two nodes.
"""

from __future__ import annotations

import signal
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from _ha import (Pair, PlanWriter, Reconciling, fetch, launched, lease, one_core_nodes, register_last_launches,
                 split_brain, wait_for)
from _nats import messaging_layer, stream_lines
from tandem.config import load_cluster, load_plan
from tandem.messaging.server import EmbeddedServer
from tandem.packaging import build_dist
from tandem.plans.hot_rooms import HOT_AT_LEAST
from tandem.runtime.node import run_instance
from tandem.store import Database, migrate
from tandem.supervisor.health import DEAD
from tandem.supervisor.reconcile import Supervisor
from tandem.reading import read_output

pytestmark = pytest.mark.integration
PLAN, STAGE_1, STAGE_2, LATE = "hot_rooms", "readings-1", "rooms-1", "rooms-2"
ALL_TIME = (datetime(2000, 1, 1, tzinfo=timezone.utc), datetime(2100, 1, 1, tzinfo=timezone.utc))
TAKEOVER_TIMEOUT_S = 30


def reference(readings: list[dict]) -> dict[tuple, tuple[int, float]]:
    """Both stages in plain Python: the hot readings (once each), then per (minute, room) their count and maximum."""
    hot = {(e["room_no"], e["device_id"], e["time"], e["temp"]) for e in readings if e["temp"] >= HOT_AT_LEAST}
    stats: dict[tuple, tuple[int, float]] = {}
    for room, _, time, temp in hot:
        minute = datetime.fromtimestamp(time // 60_000 * 60, timezone.utc)
        count, hottest = stats.get((minute, room), (0, float("-inf")))
        stats[(minute, room)] = (count + 1, max(hottest, temp))
    return stats


def stats(cluster, source: str) -> dict[tuple, tuple[int, float]]:
    """Stage 2's statistics as a reader gets them (every instance's partial aggregates merged)."""
    rows = read_output(cluster, PLAN, "minute", *ALL_TIME, output="room_stats", source=source)
    return {(r["bucket_start"], int(r["room_no"])): (r["readings"], r["hottest"]) for r in rows}  # keys are text


def kill_the_active(pair: Pair, supervisor: Supervisor) -> int:
    """kill -9 of the instance's ACTIVE (node-a): node-b takes the lease, publishes at its epoch, and the
    supervisor sees node-a DEAD. Returns the new epoch."""
    before = lease(pair.url, PLAN, pair.instance)
    assert before["holder"] == "node-a", before
    pair.kill("node-a", signal.SIGKILL)
    promoted = wait_for(lambda: pair.promoted("node-b", before["epoch"]), TAKEOVER_TIMEOUT_S,
                        f"node-b to take {pair.instance} over from the killed node-a",
                        detail=lambda: pair.log_tail("node-b"))
    pair.note(f"SIGKILL {pair.instance} node-a -> node-b PROMOTED at epoch {promoted['epoch']}")
    wait_for(lambda: pair.first_publish("node-b", promoted["epoch"]), 120, f"node-b to publish {pair.instance}",
             detail=lambda: pair.log_tail("node-b"))
    wait_for(lambda: supervisor.observe(pair.instance).view.health("node-a").state == DEAD, 30,
             f"the supervisor to see {pair.instance} on node-a DEAD")
    return promoted["epoch"]


def test_two_stages_linked_by_a_stream_are_exact_across_kills_of_each_active(
        project: Path, database_url: str, process_groups: list[int], nats_server: EmbeddedServer,
        monkeypatch: pytest.MonkeyPatch, spark) -> None:
    with Database(database_url) as db:
        migrate(db)
    prefix = messaging_layer(project, nats_server, monkeypatch)
    one_core_nodes(project)
    cluster = load_cluster()
    plan = load_plan(PLAN, cluster)
    assert plan.input_streams == ["temps"] and plan.publisher_of("hot") == "hot_readings"
    assert [s for s in plan.instances] == [STAGE_1, STAGE_2, LATE]
    dist = build_dist(project)
    pairs = {instance: Pair(cluster, plan, dist, process_groups, instance=instance) for instance in (STAGE_1, STAGE_2)}
    supervisors = {instance: Supervisor(cluster, plan, launched_by="test_linked_groups", py_files=dist,
                                     running_timeout_s=300) for instance in pairs}  # one database connection each
    writer = PlanWriter(cluster, plan, rate=20, seed=3)  # the temperature plan's readings: rooms drift, jump, run hot
    starts = {instance: Reconciling(supervisors[instance], instance, "test: start the pair") for instance in pairs}
    note = pairs[STAGE_1].note

    def in_stream() -> list[dict]:
        return [line for _, line in stream_lines(nats_server.url, prefix, "hot")]

    try:
        try:
            for start in starts.values():  # both instances at once: their JVM starts overlap
                start.start()
            for instance, start in starts.items():
                report = start.report(600)
                note("\n".join(report.lines()))
                assert report.converged and not report.failed, report.lines()
                assert launched(report, pairs[instance]) == [("node-a", "ACTIVE"), ("node-b", "PASSIVE")], report.lines()
            writer.start()
            for instance, pair in pairs.items():
                wait_for(lambda: pair.first_publish("node-a", lease(pair.url, PLAN, instance)["epoch"]), 240,
                         f"{instance} to publish", detail=lambda: pair.log_tail("node-a"))
            kill_the_active(pairs[STAGE_1], supervisors[STAGE_1])
            relayed = len(in_stream())
            wait_for(lambda: len(in_stream()) >= relayed + 5, 120, "stage 1's new ACTIVE to relay hot readings",
                     detail=lambda: pairs[STAGE_1].log_tail("node-b"))
            kill_the_active(pairs[STAGE_2], supervisors[STAGE_2])  # it had read what the new ACTIVE relayed
            time.sleep(5)  # stage 2's new ACTIVE reads the stream under input too
        finally:
            readings = writer.stop()["temps"]
        expected = reference(readings)
        hot_count = sum(count for count, _ in expected.values())
        assert hot_count >= 20, f"the input must hold hot readings: {hot_count} of {len(readings)}"
        note(f"{len(readings)} readings published, {hot_count} hot")
        wait_for(lambda: len(in_stream()) >= hot_count, 180, "stage 1 to relay every hot reading",
                 detail=lambda: f"{len(in_stream())} of {hot_count}\n{pairs[STAGE_1].log_tail('node-b')}")
        late = run_instance(cluster, plan, "node-a", LATE, spark=spark, available_now=True)
        assert late.status == "STOPPED", late.error
        wait_for(lambda: stats(cluster, "postgres") == expected, 180, "stage 2 to count every hot reading",
                 detail=lambda: f"{sum(c for c, _ in stats(cluster, 'postgres').values())} of {hot_count} counted\n"
                                f"{pairs[STAGE_2].log_tail('node-b')}")
        assert stats(cluster, "delta") == expected

        published = [(e["payload"]["room_no"], e["payload"]["device_id"], e["payload"]["time"], e["payload"]["temp"])
                     for e in fetch(database_url, "SELECT payload FROM output_events WHERE plan = %s "
                                                  "AND output = 'hot_readings' ORDER BY xid, event_id", (PLAN,))]
        consumed = [(e["room_no"], e["device_id"], e["time"], e["temp"]) for e in in_stream()]
        assert consumed == published, "the stream holds the outbox, in its order"
        assert len(set(consumed)) == len(consumed) == hot_count, "every hot reading once in the stream"
        for instance in pairs:
            assert split_brain(database_url, PLAN, instance) == [], instance
            assert lease(database_url, PLAN, instance)["holder"] == "node-b", instance
    finally:
        for start in starts.values():
            if start.is_alive():  # the test failed during a launch: let it end, then kill what it launched
                start.join(360)
        for pair in pairs.values():
            register_last_launches(pair)
        for supervisor in supervisors.values():
            supervisor.close()
