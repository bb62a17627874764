"""A partition's read over NATS finds messages gone since the check before it (issue 46 §3.4): retention (here
the JetStream API deleting the oldest messages, deterministically between the reader's check and its read)
makes it a ``DataLoss`` naming the stream and the range, never a silent skip; the source reader is the one the
executors run, against a real nats-server."""

from __future__ import annotations

import json
import uuid

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from tandem.errors import DataLoss
from tandem.messaging import JetStream, StreamSpec
from tandem.messaging.jetstream import lost_after
from tandem.messaging.server import EmbeddedServer
from tandem.messaging.wire import NotHeld
from tandem.sources.nats_reader import NatsStreamReader

pytestmark = pytest.mark.integration


def stream_of(server: EmbeddedServer, count: int) -> tuple[str, str]:
    """A new stream of ``count`` messages alternating between partitions 0 and 1: its name and prefix."""
    prefix = f"r{uuid.uuid4().hex[:8]}"
    name = f"{prefix}_s"
    with JetStream([server.url]) as js:
        js.ensure_stream(StreamSpec(name, (f"{prefix}.s.*",), max_messages=1000))
        js.publish([(f"{prefix}.s.{n % 2}", json.dumps({"n": n}).encode(), None) for n in range(1, count + 1)])
    return name, prefix


def reader_of(server: EmbeddedServer, name: str, prefix: str) -> NatsStreamReader:
    return NatsStreamReader({"servers": server.url, "stream": name, "subjects": json.dumps([f"{prefix}.s.0"]),
                             "max_events_per_trigger": "1000", "connect": "{}"})


def drop_after_the_check(monkeypatch: pytest.MonkeyPatch, change) -> None:
    """The first ``JetStream.bounds`` (the read's check) answers, then ``change(js)`` happens to the stream."""
    bounds, done = JetStream.bounds, []

    def bounds_then_change(js: JetStream, stream: str):
        found = bounds(js, stream)
        if not done:
            done.append(change(js, stream))
        return found
    monkeypatch.setattr(JetStream, "bounds", bounds_then_change)


def test_messages_dropped_between_the_check_and_the_read_are_data_loss(
        nats_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    name, prefix = stream_of(nats_server, 30)
    reader = reader_of(nats_server, name, prefix)
    start = reader.initialOffset()
    [partition] = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
    assert (partition.first, partition.last) == (1, 30)
    reader.stop()

    def delete_oldest(js: JetStream, stream: str) -> None:  # what retention does: the oldest go first
        for sequence in range(1, 11):
            js.connection.request(f"$JS.API.STREAM.MSG.DELETE.{stream}", {"seq": sequence, "no_erase": True})

    drop_after_the_check(monkeypatch, delete_oldest)
    with pytest.raises(DataLoss, match=rf"{name}: messages 1\.\.10 are gone .* before they were read"):
        list(reader.read(partition))


def test_a_stream_made_again_while_it_was_read_is_data_loss(
        nats_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> None:
    name, prefix = stream_of(nats_server, 30)
    reader = reader_of(nats_server, name, prefix)
    start = reader.initialOffset()
    [partition] = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
    reader.stop()

    def make_again(js: JetStream, stream: str) -> None:
        js.delete_stream(stream)
        js.ensure_stream(StreamSpec(stream, (f"{prefix}.s.*",)))
        js.publish([(f"{prefix}.s.0", b'{"n": "new"}', None) for _ in range(5)])

    drop_after_the_check(monkeypatch, make_again)
    with pytest.raises(DataLoss, match=rf"{name} holds sequences up to 5, but a read covered 30"):
        list(reader.read(partition))


def test_a_read_with_nothing_dropped_returns_every_message_of_its_partition(nats_server: EmbeddedServer) -> None:
    name, prefix = stream_of(nats_server, 30)
    reader = reader_of(nats_server, name, prefix)
    start = reader.initialOffset()
    [partition] = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
    reader.stop()
    lines = [line for batch in reader.read(partition) for line in batch.column("raw").to_pylist()]
    assert lines == [json.dumps({"n": n}) for n in range(2, 31, 2)]


def test_a_reader_whose_stream_was_made_again_since_its_offset_fails_naming_the_stream_and_offsets(
        nats_server: EmbeddedServer) -> None:
    """Issue 60: a plan reset deletes the streams its outputs publish to; a plan reading one (``from_plan``) that
    was down meanwhile finds the stream made again, with more messages than its offset. Its next batch and the
    relaunch's check (:func:`lost_after`) fail with ``DataLoss`` naming the stream, the offset and both streams'
    creation times: the new stream's sequences 1..30 are not the ones it read."""
    name, prefix = stream_of(nats_server, 30)
    reader = reader_of(nats_server, name, prefix)
    start = reader.initialOffset()
    read_to = reader.latestOffset(start, ReadAllAvailable())  # what the reader committed before it went down
    reader.stop()
    assert read_to["seq"] == 30
    with JetStream([nats_server.url]) as js:
        made = js.stream_info(name)["created"]
        js.delete_stream(name)  # tandem plan reset of the publishing plan
        js.ensure_stream(StreamSpec(name, (f"{prefix}.s.*",), max_messages=1000))  # its next run
        js.publish([(f"{prefix}.s.{n % 2}", json.dumps({"n": n}).encode(), None) for n in range(1, 51)])
        made_again = js.stream_info(name)["created"]
    assert made_again != made

    restarted = reader_of(nats_server, name, prefix)  # the reading plan's next run, from its checkpoint
    try:
        with pytest.raises(DataLoss) as lost:
            restarted.latestOffset(read_to, ReadAllAvailable())
    finally:
        restarted.stop()
    assert (f"JetStream stream {name} was made again at {made_again}" in str(lost.value)
            and f"up to 30 were read from the stream made at {made}" in str(lost.value)), str(lost.value)
    assert lost_after([nats_server.url], [read_to]) == [str(lost.value)]


def big_stream(server: EmbeddedServer, count: int, size: int) -> tuple[str, str]:
    """A new stream that keeps ``count`` messages, holding ``count`` of ``size`` bytes alternating between
    partitions 0 and 1 (sequence ``n`` is ``n`` repeated): its name and its subject prefix."""
    prefix = f"r{uuid.uuid4().hex[:8]}"
    name = f"{prefix}_s"
    with JetStream([server.url]) as js:
        js.ensure_stream(StreamSpec(name, (f"{prefix}.s.*",), max_messages=count))
        js.publish([(f"{prefix}.s.{(n + 1) % 2}", str(n).encode() * (size // len(str(n))), None)
                    for n in range(1, count + 1)])
    return name, prefix


def test_messages_retention_drops_during_a_throttled_read_are_data_loss(nats_server: EmbeddedServer) -> None:
    """Issue 60: a read that pauses between fetches (its consumer is slow) while producers push the stream's
    retention past what it has not read yet fails with the range, never skips it. A stream of 60 messages of
    100 kB (more than a server pushes ahead of a slow reader), partition 0 read in fetches of 5."""
    name, prefix = big_stream(nats_server, 60, 100_000)
    got: list[int] = []
    with JetStream([nats_server.url]) as js, JetStream([nats_server.url]) as producer:
        with pytest.raises(NotHeld) as lost:
            for fetched in js.connection.read(name, f"{prefix}.s.0", 1, 60, chunk=5):
                got += [sequence for sequence, _ in fetched]
                if len(got) == 5:  # the reader is slow: retention drops 1..60 meanwhile
                    producer.publish([(f"{prefix}.s.{n % 2}", b"new", None) for n in range(60)])
                    assert producer.bounds(name).first == 61
    assert got == [1, 3, 5, 7, 9], "the messages before the pause, and no other"
    assert (lost.value.first, lost.value.held_from) == (10, 61)


def test_a_throttled_read_that_retention_does_not_reach_returns_every_message_deleted_ones_left_out(
        nats_server: EmbeddedServer) -> None:
    """The same read, where retention drops only messages the read is past, and one message of the partition was
    deleted on purpose before: every other message of the partition, in order, and no error."""
    name, prefix = big_stream(nats_server, 60, 100_000)
    with JetStream([nats_server.url]) as js, JetStream([nats_server.url]) as producer:
        producer.connection.request(f"$JS.API.STREAM.MSG.DELETE.{name}", {"seq": 21, "no_erase": True})
        got: list[tuple[int, bytes]] = []
        for fetched in js.connection.read(name, f"{prefix}.s.0", 1, 60, chunk=5):
            got += fetched
            if len(got) == 5:  # 59 held: 9 more drop 1..8, which the read is past
                producer.publish([(f"{prefix}.s.{n % 2}", b"new", None) for n in range(9)])
                assert producer.bounds(name).first == 9
    assert [n for n, _ in got] == [n for n in range(1, 60, 2) if n != 21]
    assert all(payload == str(n).encode() * (100_000 // len(str(n))) for n, payload in got)
