"""The temperature plan on real Spark and PostgreSQL: every output equals the test's own reference.

The test writes readings through the partition layout (out of order within the watermark, with
bad lines), runs group-1 (one instance, stateful window and pattern) and both instances of
group-2, and computes what each output must hold with plain Python: brute force over all
readings, not the plan's functions.
"""

from __future__ import annotations

import json
import os
import random
from datetime import datetime, timedelta, timezone

import psycopg2
import psycopg2.extras
import pytest
from _references import temperature_reference, temperature_row
from tandem.batch.backfill import check_backfill
from tandem.batch.reconcile import reconcile
from tandem.batch.reconciliations import summary
from tandem.config import load_cluster, load_plan
from tandem.errors import BackfillRefused
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir, instance_landing_dir, landing_dir
from tandem.producer import advance_watermark, partitioned
from tandem.sources.files import write_atomically
from tandem.runtime.node import run_instance
from tandem.store import Database
from tandem.outputs.events import read_events_lake

pytestmark = pytest.mark.integration
UTC = timezone.utc
T0 = int(datetime(2025, 6, 1, 12, 0, tzinfo=UTC).timestamp() * 1000)


def make_readings(seed: int, count: int) -> list[dict]:
    """Readings every ~3 s across rooms 100-119, drifting with jumps; each within 4 s of the time order."""
    rng = random.Random(seed)
    temps = {room: 20.0 for room in range(100, 120)}
    readings = []
    for i in range(count):
        room = rng.choice(list(temps))
        temps[room] = round(temps[room] + (rng.uniform(5, 9) if rng.random() < 0.15 else rng.uniform(-1, 1)), 2)
        if temps[room] > 48:
            temps[room] = 21.0
        readings.append({"room_no": room, "device_id": f"d{room}-{rng.randint(1, 2)}", "temp": temps[room],
                         "time": T0 + i * 3000 + rng.randint(0, 999)})
    shuffled = sorted(readings, key=lambda r: r["time"] + rng.randint(-4000, 4000))  # out of order within 4 s
    return shuffled


def published(database_url: str, output: str) -> list[dict]:
    with psycopg2.connect(database_url) as conn, conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute("SELECT event_id, instance, payload FROM tandem.output_events WHERE plan = 'temperatures' "
                    "AND output = %s", (output,))
        return cur.fetchall()


def test_every_output_equals_the_reference_with_two_groups_and_three_instances(project, database_url, spark) -> None:
    cluster = load_cluster()
    plan = load_plan("temperatures", cluster)
    readings = make_readings(7, 900)
    bad = ['{"room_no": 101, "device_id": "x", "temp": "hot", "time": %d}' % T0, "{oops",
           '{"room_no": -4, "device_id": "x", "temp": 20.0, "time": %d}' % T0,
           # Spark reads 1e999 as Infinity: it passed greater_than and failed the events COPY of both groups (issue 24)
           '{"room_no": 101, "device_id": "x", "temp": 1e999, "time": %d}' % (T0 + 3000)]
    lines = [(r, json.dumps(r)) for r in readings]
    for start in range(0, len(lines), 150):
        for (stream, partition), chunk in partitioned(plan, {"temps": lines[start:start + 150]}).items():
            write_atomically(landing_dir(cluster, stream, partition), chunk)
    write_atomically(landing_dir(cluster, "temps", 0), bad)
    advance_watermark(cluster, plan, T0 + 3_600_000)  # a reading an hour later in every partition: all final

    assert plan.instances == ("group-1-1", "group-2-1", "group-2-2")
    for instance in plan.instances:  # available-now ends with a no-data batch: the sentinel's watermark fires the timers
        result = run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True)
        assert result.status == "STOPPED", result.error

    assert_outputs_equal_the_reference(cluster, plan, database_url, readings)
    reasons = read_table(delta_table_dir(cluster, plan.name, "quarantine")).column("reason").to_pylist()
    assert len(reasons) == 4 and any("field 'temp' is not a number" in r for r in reasons), reasons
    assert any("field 'temp' must be a finite number" in r for r in reasons), reasons
    reconcile_by_arrival(cluster, plan, database_url, spark)


def reconcile_by_arrival(cluster, plan, database_url: str, spark) -> None:
    """group-2 keeps no state, so no watermark: its instances are closed by what they have read (issue 27 §2). The
    readings' range reconciles with no difference in any group; a file that landed inside it and is not read yet
    makes it open again (refused, naming the instance)."""
    start = datetime.fromtimestamp(T0 / 1000, tz=UTC)
    end = start + timedelta(minutes=55)  # group-1's watermark: the sentinel an hour later, less 10 s
    with Database(database_url) as db:
        outcomes = reconcile(cluster, plan, db, spark, start, end, run_id="temperatures-by-arrival")
        assert summary(outcomes) == {"late": 0, "extra": 0, "different": 0}, [o.row() for o in outcomes]
        compared = {(o.instance, o.output): o.compared for o in outcomes}
        assert compared[("group-2-1", "high_temps")] and compared[("group-2-2", "high_temps")], compared

        pending = instance_landing_dir(cluster, plan, "group-2-1") / "late.jsonl"
        pending.write_text(json.dumps({"room_no": 101, "device_id": "d101-1", "temp": 45.0, "time": T0}) + "\n")
        landed_at = start + timedelta(minutes=30)
        os.utime(pending, (landed_at.timestamp(), landed_at.timestamp()))
        with pytest.raises(BackfillRefused, match="not closed.*instance group-2-1's watermark 2025-06-01T12:29:50"):
            check_backfill(cluster, plan, db, start, end, ["group-2-1", "group-2-2"])
        check_backfill(cluster, plan, db, start, landed_at - timedelta(seconds=10), ["group-2-1", "group-2-2"])


def assert_outputs_equal_the_reference(cluster, plan, database_url: str, readings: list[dict]) -> None:
    """Every output, in PostgreSQL and Delta, is the reference of ``readings``, each row once."""
    expected = temperature_reference(readings)
    assert expected["temp_alerts"] and expected["high_temps"], "the input must exercise every output"
    assert_outputs_hold(cluster, plan, database_url, expected)
    instances = {row["instance"] for row in published(database_url, "high_temps")}
    assert instances == {"group-2-1", "group-2-2"}, "both parallel instances of group-2 publish their rooms"


def assert_outputs_hold(cluster, plan, database_url: str, expected: dict[str, set[tuple]]) -> None:
    """Every output, in PostgreSQL and Delta, holds exactly its ``expected`` rows (as ``temperature_row`` gives
    them), each once."""
    for output, rows in expected.items():
        got = published(database_url, output)
        payloads = [temperature_row(output, row["payload"]) for row in got]
        assert len(payloads) == len(set(payloads)), f"{output}: a row published twice"
        assert set(payloads) == rows, f"{output}: missing {sorted(rows - set(payloads))[:3]}, " \
                                      f"extra {sorted(set(payloads) - rows)[:3]}"
        lake = read_events_lake(delta_table_dir(cluster, plan.name, output))  # no columns when nothing was published
        in_lake = lake.column("event_id").to_pylist() if lake.num_rows else []
        assert sorted(in_lake) == sorted(row["event_id"] for row in got), output
