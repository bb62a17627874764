"""Two execution groups linked by a NATS stream (issue 26 §4), in one Spark session with a real nats-server.

The plan ``hot_rooms`` (``tests/integration/hot_rooms/``): stage 1 (one instance) reads readings from
landing files and publishes the hot ones as an events output that is also the NATS stream ``hot``;
stage 2 (two instances, partitioned by device, not by room) reads ``hot`` and keeps per-room minute
statistics, merged on read. Stage 2's statistics must equal a plain-Python reference of both stages
over the readings the test wrote; a second input round goes through both stages again.
"""

from __future__ import annotations

import json
import random
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest
from _ha import fetch
from _nats import messaging_layer, stream_lines
from tandem import aggregation
from tandem.config import load_cluster, load_plan
from tandem.declarations import partition_of
from tandem.messaging.server import EmbeddedServer
from tandem.producer import Destinations
from tandem.runtime.node import run_instance

pytestmark = pytest.mark.integration
PLAN = "hot_rooms"
PLAN_FILES = Path(__file__).parent / PLAN
HOT_AT_LEAST = 30.0
T0 = int(datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc).timestamp() * 1000)
ALL_TIME = (datetime(2000, 1, 1, tzinfo=timezone.utc), datetime(2100, 1, 1, tzinfo=timezone.utc))



def readings(seed: int, count: int, start_ms: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"room_no": 100 + rng.randrange(10), "device_id": f"d-{rng.randrange(8)}",
             "temp": round(rng.uniform(20, 40), 1), "time": start_ms + i * 150} for i in range(count)]


def write(cluster, plan, events: list[dict]) -> None:
    by_partition: dict[int, list[str]] = {}
    for event in events:
        by_partition.setdefault(partition_of(event["room_no"], 4), []).append(json.dumps(event))
    with Destinations(cluster, plan) as out:
        for partition, lines in sorted(by_partition.items()):
            out.write("temps", partition, lines)


def reference(events: list[dict]) -> dict[tuple, tuple[int, float]]:
    """Both stages in plain Python: the hot readings (once each), then per (minute, room) their count and maximum."""
    hot = {(e["room_no"], e["device_id"], e["time"], e["temp"]) for e in events if e["temp"] >= HOT_AT_LEAST}
    stats: dict[tuple, tuple[int, float]] = {}
    for room, _, time, temp in hot:
        minute = datetime.fromtimestamp(time // 60_000 * 60, timezone.utc)
        count, hottest = stats.get((minute, room), (0, float("-inf")))
        stats[(minute, room)] = (count + 1, max(hottest, temp))
    return stats


def test_a_group_reads_the_stream_another_group_publishes(project: Path, nats_server: EmbeddedServer,
                                                          monkeypatch: pytest.MonkeyPatch, spark) -> None:
    prefix = messaging_layer(project, nats_server, monkeypatch)
    for name in ("hot_rooms.yaml", "hot_rooms.py"):
        shutil.copy(PLAN_FILES / name, project / "conf" / "plans" / name)
    cluster = load_cluster()
    plan = load_plan(PLAN, cluster)
    assert plan.input_streams == ["temps"]

    def stage(group: str) -> None:
        for shard in (s for s in plan.shards if s.startswith(group)):
            result = run_instance(cluster, plan, "node-a", shard, spark=spark, available_now=True)
            assert result.status == "STOPPED", result.error

    def stats(source: str) -> dict[tuple, tuple[int, float]]:
        rows = aggregation.query(cluster, PLAN, "minute", *ALL_TIME, source=source)
        return {(r["bucket_start"], int(r["room_no"])): (r["readings"], r["hottest"]) for r in rows}  # keys are text

    written: list[dict] = []
    for round_no, start in enumerate((T0, T0 + 300_000)):
        events = readings(round_no, 1500, start)
        written += events
        write(cluster, plan, events)
        stage("readings")
        stage("rooms")
        expected = reference(written)
        assert expected and stats("postgres") == expected, f"round {round_no}"
        assert stats("delta") == expected, f"round {round_no}"

    hot = fetch(cluster.database_url, "SELECT event_id FROM output_events WHERE plan = %s AND output = 'hot_readings'",
                (PLAN,))
    lines = stream_lines(nats_server.url, prefix, "hot")
    assert len(lines) == len(hot) == sum(count for count, _ in reference(written).values()), \
        "the stream holds every hot reading once"
