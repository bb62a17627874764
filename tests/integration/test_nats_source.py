"""The ``nats`` source kind with a real nats-server (JetStream), Spark and PostgreSQL.

The trades plan's stream is declared ``source: nats``; events are published to its partition
subjects with message ids, and each instance reads its partitions in sequence ranges of at most
``max_events_per_trigger``. Outputs are compared with the test's own aggregates of what it
published; bad messages are quarantined with their subject and sequence; a message retention dropped
before an instance read it stops the instance with an error that names the stream and the range. Trades the
watermark dropped are recomputed by a backfill from the messages the stream holds; once retention dropped messages
published since a range's start, a backfill of it is refused.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from _ha import expected_aggregates, fetch
from _nats import use_nats
from tandem.batch.backfill import check_backfill, run_backfill
from tandem.config import load_cluster, load_plan
from tandem.declarations import partition_of
from tandem.errors import BackfillRefused, ConfigError, SnapshotRefused
from tandem.lake.tables import read_table
from tandem.layout import checkpoint_dir, delta_table_dir
from tandem.messaging import JetStream, StreamSpec, ensure_declared, stream_name
from tandem.messaging.server import EmbeddedServer
from tandem.producer import Destinations
from tandem.runtime.node import run_instance
from tandem.snapshots.restore import restore_instance
from tandem.snapshots.take import take_snapshot
from tandem.store import Database
from tandem.supervisor.observe import unread_messages_since
from tandem.reading import read_output

pytestmark = pytest.mark.integration
UTC = timezone.utc
T0 = int(datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC).timestamp() * 1000)
ALL_TIME = (datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))



def trades(seed: int, count: int, start_ms: int = T0) -> list[dict]:
    """Trades in time order (a batch boundary then never makes one later than the plan's 10 s watermark)."""
    rng = random.Random(seed)
    return sorted(({"symbol": rng.choice(["IBM", "WSO2", "ORCL", "SAP", "MSFT"]), "price": round(rng.uniform(1, 500), 2),
                    "quantity": rng.randint(1, 1000), "timestamp": start_ms + rng.randint(0, 90_000)}
                   for _ in range(count)), key=lambda e: e["timestamp"])


def publish(out: Destinations, events: list[dict], partitions: int, extra: dict[int, list[str]] | None = None) -> None:
    by_partition: dict[int, list[str]] = {}
    for event in events:
        by_partition.setdefault(partition_of(event["symbol"], partitions), []).append(json.dumps(event))
    for partition, lines in (extra or {}).items():
        by_partition.setdefault(partition, []).extend(lines)
    for partition, lines in sorted(by_partition.items()):
        out.write("trades", partition, lines)


def merged(cluster, granularity: str, source: str = "postgres") -> dict[tuple, dict]:
    rows = read_output(cluster, "trades", granularity, *ALL_TIME, source=source)
    return {(r["bucket_start"], r["symbol"]): {c: r[c] for c in ("price_sum", "trade_count", "quantity_sum",
                                                                 "price_min", "price_max")} for r in rows}


def reference(events: list[dict], granularity: str) -> dict[tuple, dict]:
    return expected_aggregates([(e["timestamp"], e["symbol"], e["price"], e["quantity"]) for e in events], granularity)


def assert_exact(cluster, events: list[dict]) -> None:
    for granularity in ("second", "minute", "year"):
        expected = reference(events, granularity)
        for source in ("postgres", "delta"):
            got = merged(cluster, granularity, source)
            assert set(got) == set(expected), f"{source} {granularity}: buckets differ"
            for key, values in expected.items():
                for column, value in values.items():
                    assert got[key][column] == pytest.approx(value, rel=1e-9), f"{source} {granularity} {key} {column}"


def committed_batches(cluster, instance: str) -> list[int]:
    commits = checkpoint_dir(cluster, "trades", instance, "node-a", "aggregates") / "commits"
    return sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit())


def test_trades_over_nats_are_exact_in_bounded_batches_and_bad_messages_are_quarantined(
        project: Path, nats_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch, spark) -> None:
    prefix = use_nats(project, nats_server, monkeypatch, "trades", max_events_per_trigger=150)
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    first = trades(1, 700)
    second = [e for e in trades(2, 300, T0 + 90_000) if partition_of(e["symbol"], 2) == 0]  # for shard-1 only
    bad = ['{"symbol": "IBM", "price": -3, "quantity": 1, "timestamp": %d}' % T0, "not json at all"]
    with Destinations(cluster, plan) as out:
        publish(out, first, 2, extra={0: bad})
        for instance in plan.instances:
            result = run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True)
            assert result.status == "STOPPED", result.error
        assert_exact(cluster, first)
        # the stream holds 702 sequences; 150 a batch at most, over two partitions' subjects
        assert len(committed_batches(cluster, "shard-1")) >= 4

        publish(out, second, 2)  # more events: the instance goes on from its offset in its checkpoint
        assert run_instance(cluster, plan, "node-a", "shard-1", spark=spark, available_now=True).status == "STOPPED"
    assert_exact(cluster, first + second)

    quarantined = read_table(delta_table_dir(cluster, "trades", "quarantine")).to_pylist()
    assert sorted(r["raw"] for r in quarantined) == sorted(bad)
    assert all(r["source_file"].startswith(f"nats:{prefix}.trades.0:") and r["instance"] == "shard-1"
               for r in quarantined), quarantined
    with JetStream([nats_server.url]) as js:
        sequences = {int(r["source_file"].rsplit(":", 1)[1]) for r in quarantined}
        assert len(sequences) == 2 and max(sequences) <= js.bounds(stream_name(prefix, "trades")).last
        # when the first message of a subject after an offset was published (a stateless instance's closed range)
        last = js.bounds(stream_name(prefix, "trades")).last
        assert js.published_after(stream_name(prefix, "trades"), f"{prefix}.trades.0", last) is None
        oldest = js.published_after(stream_name(prefix, "trades"), f"{prefix}.trades.1", 0)
        assert oldest is not None and abs(datetime.now(UTC) - oldest) < timedelta(minutes=10), oldest

    # trades of the first minute published now are behind both watermarks: the stream drops them, a backfill of that
    # minute recomputes it from the messages the stream still holds (issue 27 §1)
    late = trades(5, 80, T0)
    late = [e for e in late if e["timestamp"] < T0 + 60_000]
    # the supervisor sees input waiting for an instance that reads only NATS streams (no landing folder): the
    # oldest message its queries have not read, until they read it
    assert unread_messages_since(cluster, plan, "shard-1", "node-a") is None, "read to the end"
    published_at = datetime.now(UTC).timestamp()
    with Destinations(cluster, plan) as out:
        publish(out, late, 2)
    waiting = unread_messages_since(cluster, plan, "shard-1", "node-a")
    assert waiting is not None and published_at - 1 <= waiting <= datetime.now(UTC).timestamp() + 1, waiting
    assert unread_messages_since(cluster, plan, "shard-1", "node-b") is None, "node-b never ran: judged by its start"
    for instance in plan.instances:
        assert run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True).status == "STOPPED"
    assert unread_messages_since(cluster, plan, "shard-1", "node-a") is None
    assert_exact(cluster, first + second)  # the late trades were dropped
    start = datetime.fromtimestamp(T0 / 1000, tz=UTC)
    with Database(cluster.database_url) as db:
        done = run_backfill(cluster, plan, db, spark, start, start + timedelta(minutes=1))
    assert done.status == "DONE", done.error
    assert_exact(cluster, first + second + late)


def test_messages_retention_dropped_before_they_were_read_stop_the_instance_and_refuse_the_restore(
        project: Path, nats_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch, spark) -> None:
    prefix = use_nats(project, nats_server, monkeypatch, "trades", retention={"max_messages": 100})
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    with Destinations(cluster, plan) as out:
        publish(out, trades(3, 60), 2)
        assert run_instance(cluster, plan, "node-a", "shard-1", spark=spark, available_now=True).status == "STOPPED"
        snapshot = take_snapshot(cluster, plan, "shard-1", spark, node="node-a")
        assert snapshot.good, snapshot.summary()
        publish(out, trades(4, 150, T0 + 90_000), 2)  # 210 published, 100 kept: sequences 61..110 are gone unread
    gone = f"JetStream stream {stream_name(prefix, 'trades')}: messages 61..110 are gone"

    checkpoint = checkpoint_dir(cluster, "trades", "shard-1", "node-a", "aggregates")
    before = committed_batches(cluster, "shard-1")
    with pytest.raises(SnapshotRefused, match=rf"snapshot {snapshot.record.id} cannot be restored: the input after "
                                              rf"its cut is gone: {gone}"):
        restore_instance(cluster, plan, "shard-1", snapshot_id=snapshot.record.id, start=False)
    assert committed_batches(cluster, "shard-1") == before and checkpoint.is_dir()  # refused before any change
    assert not fetch(cluster.database_url, "SELECT 1 FROM failover_events WHERE kind = 'RESTORED'")

    result = run_instance(cluster, plan, "node-a", "shard-1", spark=spark, available_now=True)
    assert result.status == "FAILED"
    assert gone in result.error, result.error
    start = datetime.fromtimestamp(T0 / 1000, tz=UTC)  # a backfill of shard-1's first 30 s needs messages since then
    with Database(cluster.database_url) as db, pytest.raises(
            BackfillRefused, match=rf"JetStream stream {stream_name(prefix, 'trades')} no longer holds sequences 1..110"):
        check_backfill(cluster, plan, db, start, start + timedelta(seconds=30), ["shard-1"])


def test_a_stream_is_created_as_declared_and_one_tandem_did_not_create_is_checked(
        project: Path, nats_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = use_nats(project, nats_server, monkeypatch, "trades", retention={"max_age": "1 hour"})
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    assert ensure_declared(cluster.nats, plan, "trades") == "created"
    assert ensure_declared(cluster.nats, plan, "trades") == "unchanged"
    with JetStream([nats_server.url]) as js:
        config = js.stream_info(stream_name(prefix, "trades"))["config"]
        assert (config["subjects"], config["max_age"], config["retention"]) == (
            [f"{prefix}.trades.*"], 3600 * 10**9, "limits")

    path = project / "conf" / "plans" / "trades.yaml"
    declared = yaml.safe_load(path.read_text())
    declared["streams"]["trades"]["retention"] = {"max_age": "2 hours"}
    path.write_text(yaml.safe_dump(declared))
    assert ensure_declared(cluster.nats, load_plan("trades", cluster), "trades") == "updated"  # Tandem's own

    with JetStream([nats_server.url]) as js:  # a stream someone else made, for the subjects of another stream
        js.connection.request(f"$JS.API.STREAM.CREATE.{prefix}_orders", {
            "name": f"{prefix}_orders", "subjects": [f"{prefix}.orders.*"], "retention": "limits", "storage": "file",
            "max_age": 0, "num_replicas": 1})
    declared["streams"]["orders"] = {**declared["streams"]["trades"]}
    path.write_text(yaml.safe_dump(declared))
    with pytest.raises(ConfigError, match=r"trades\.yaml: streams\.orders\.retention: JetStream stream \w+_orders "
                                          r"exists, was not created by Tandem, and differs .*max_age 0"):
        ensure_declared(cluster.nats, load_plan("trades", cluster), "orders")


def test_a_spec_names_what_differs() -> None:
    spec = StreamSpec("s", ("p.s.*",), max_age_s=60.0)
    assert spec.differences(spec.config()) == []
    assert spec.differences({**spec.config(), "max_msgs": 10, "subjects": ["x"]}) == [
        "subjects ['x'] (declared ['p.s.*'])", "max_msgs 10 (declared -1)"]


# --- the receiver and its checks ------------------------------------------------------------------------------

EDGE_EVENTS = [
    {"symbol": "IBM", "price": 10.5, "quantity": 3, "timestamp": T0},
    {"symbol": "IBM", "price": 10, "quantity": 3, "timestamp": T0},  # an integer is a number
    {"symbol": "IBM", "quantity": 3, "timestamp": T0},
    {"symbol": "IBM", "price": None, "quantity": 3, "timestamp": T0},
    {"symbol": "IBM", "price": "10", "quantity": 3, "timestamp": T0},
    {"symbol": "IBM", "price": -1, "quantity": 0, "timestamp": T0},
    {"symbol": "   ", "price": 1.0, "quantity": 1, "timestamp": T0},
    {"symbol": "a\u0000b", "price": 1.0, "quantity": 1, "timestamp": T0},
    {"symbol": "x" * 300, "price": 1.0, "quantity": 1, "timestamp": T0},
    {"symbol": {"nested": True}, "price": 1.0, "quantity": 1, "timestamp": T0},
    {"symbol": "IBM", "price": 1.0, "quantity": 2**63, "timestamp": T0},
    {"symbol": "IBM", "price": 1.0, "quantity": 1.5, "timestamp": T0},
    {"symbol": "IBM", "price": 1.0, "quantity": True, "timestamp": -5},
    {"symbol": "IBM", "price": 1.0, "quantity": 1, "timestamp": T0, "extra": {"deep": [1, 2, {"x": None}]}},
]


def test_the_receivers_checks_say_what_spark_says(spark) -> None:
    """The receiver answers with the reasons the runtime would quarantine the same events for."""
    from pyspark.sql import functions as F
    from tandem.event_checks import event_problems
    from tandem.runtime.records import parse_and_validate, record_schema

    stream = load_plan("trades", load_cluster(Path(__file__).resolve().parents[2] / "conf" / "cluster.yaml")) \
        .streams["trades"]
    frame = spark.createDataFrame([(i, json.dumps(e)) for i, e in enumerate(EDGE_EVENTS)], "i long, raw string")
    rows = parse_and_validate(frame.select("i", "raw", F.lit("f").alias("source_file")), record_schema(stream)) \
        .orderBy("i").collect()
    for event, row in zip(EDGE_EVENTS, rows):
        problems = event_problems(stream, event)
        assert (not problems) == row["valid"], (event, problems, row["reason"])
        assert "; ".join(problems) == (row["reason"] or ""), event


def test_the_receiver_publishes_good_events_once_and_answers_400_with_the_reasons_for_bad_ones(
        project: Path, nats_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient
    from tandem.receiver import receiver_app

    prefix = use_nats(project, nats_server, monkeypatch, "trades")
    cluster = load_cluster()
    client = TestClient(receiver_app(cluster, "t0ken"))
    url = "/v1/plans/trades/streams/trades/events"
    good = trades(5, 20)
    assert client.post(url, json=good).status_code == 401
    assert client.post(url, json=good, headers={"Authorization": "Bearer wrong"}).status_code == 401
    auth = {"Authorization": "Bearer t0ken"}
    answer = client.post(url, json=good, headers=auth)
    assert answer.status_code == 200 and answer.json()["published"] == 20, answer.text

    again = client.post(url, json=[*good[:5], EDGE_EVENTS[5], "not an object"], headers=auth)  # a client's retry
    assert again.status_code == 400
    assert again.json()["rejected"] == [
        {"index": 5, "reasons": ["field 'price' must be > 0 (got -1)", "field 'quantity' must be > 0 (got 0)"]},
        {"index": 6, "reasons": ["not a JSON object (got a string)"]}]
    assert client.post("/v1/plans/trades/streams/nope/events", json=good, headers=auth).status_code == 404

    with JetStream([nats_server.url]) as js:
        name = stream_name(prefix, "trades")
        assert js.bounds(name).messages == 20  # the retried five were not stored again
        stored = sorted((json.loads(payload) for partition in range(2)
                         for chunk in js.read(name, f"{prefix}.trades.{partition}", 1, js.bounds(name).last)
                         for _, payload in chunk), key=lambda e: json.dumps(e, sort_keys=True))
        assert stored == sorted(good, key=lambda e: json.dumps(e, sort_keys=True))
        for partition in range(2):  # each event on the subject of its key's partition
            for chunk in js.read(name, f"{prefix}.trades.{partition}", 1, js.bounds(name).last):
                assert all(partition_of(json.loads(p)["symbol"], 2) == partition for _, p in chunk)
