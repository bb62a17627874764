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
from tandem.messaging.server import EmbeddedServer
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
