"""The ``nats`` source kind: a stream's partitions are the subjects ``<prefix>.<stream>.<partition>`` of one JetStream
stream (``<prefix>_<stream>``) of the messaging layer (read by PySpark's Python data source:
:mod:`tandem.sources.nats_reader`).

Producers and the receiver publish each event with a message id of its own (a retry within the stream's duplicate
window is not a second event); an events output may publish to it. A query's position is the stream sequence it read
to (``{"stream", "seq"}`` in its checkpoint's offsets); the stream's retention drops the oldest messages, and a
reader that still needs one fails loudly (:class:`tandem.errors.DataLoss`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tandem.checkpoints import committed_batch, source_offsets
from tandem.config import nats_of
from tandem.declarations import SOURCE_RULES, StreamConfig
from tandem.messaging import JetStream, ensure_declared, partition_subject, stream_name
from tandem.messaging.jetstream import dropped_since, lost_after, unread_since
from tandem.messaging.wire import ProtocolError
from tandem.sources.base import UNBOUNDED, SourceKind

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tandem.config import ClusterConfig, PlanConfig


class NatsWriter:
    """A producer's messages: published to the partition's subject, each acknowledged by JetStream before the call
    returns; a stream is created (or checked) before its first write. Holds one connection until closed."""

    def __init__(self, cluster: ClusterConfig, plan: PlanConfig) -> None:
        self.cluster = cluster
        self.plan = plan
        self._js: JetStream | None = None
        self._ready: set[str] = set()

    def write(self, stream: str, partition: int, lines: Sequence[str], ids: Sequence[str] | None = None) -> str:
        nats = nats_of(self.cluster, self.plan, stream)
        if stream not in self._ready:
            KIND.prepare(self.cluster, self.plan, stream)
            self._ready.add(stream)
        if self._js is None:
            self._js = JetStream(nats, name=f"tandem-producer-{self.plan.name}")
        subject = partition_subject(nats.prefix, stream, partition)
        ids = ids or [uuid.uuid4().hex for _ in lines]
        acks = self._js.publish([(subject, line.encode(), msg_id) for line, msg_id in zip(lines, ids)])
        return f"nats:{subject}:{acks[0]['seq']}..{acks[-1]['seq']}" if acks else f"nats:{subject}"

    def close(self) -> None:
        if self._js is not None:
            self._js.close()
            self._js = None


class Nats(SourceKind):
    name = "nats"
    rules = SOURCE_RULES[name]
    receivable = True

    def lines(self, spark: SparkSession, cluster: ClusterConfig, plan: PlanConfig, instance: str, stream: str,
              folders: list[Path] | None = None) -> DataFrame:
        """The messages of the instance's partitions, as lines; the JetStream stream is created first, or checked."""
        from tandem.sources.nats_reader import read

        self.prepare(cluster, plan, stream)
        return read(spark, nats_of(cluster, plan, stream), plan, instance, stream)

    def prepare(self, cluster: ClusterConfig, plan: PlanConfig, stream: str) -> None:
        """Create the JetStream stream as declared, or check it (:func:`tandem.messaging.ensure_declared`)."""
        ensure_declared(nats_of(cluster, plan, stream), plan, stream)

    def writer(self, cluster: ClusterConfig, plan: PlanConfig) -> NatsWriter:
        return NatsWriter(cluster, plan)

    def unread_published(self, cluster: ClusterConfig, plan: PlanConfig, instance: str, stream: str,
                         committed: list[list[Any]]) -> list[float]:
        """The first unread message of each partition subject, for each query whose offsets name the stream; none
        when NATS does not answer (the source itself waits for it, and fails the query if it stays away)."""
        if not plan.partitions(instance, stream):
            return []
        nats = nats_of(cluster, plan, stream)
        readers = [offsets for offsets in committed
                   if any(isinstance(o, dict) and o.get("stream") == stream_name(nats.prefix, stream) for o in offsets)]
        if not readers:
            return []
        found: list[float] = []
        try:  # one connection per stream, whatever the number of queries reading it
            with JetStream(nats, name="tandem-observe", timeout_s=5.0) as js:
                for offsets in readers:
                    found += [t.timestamp() for t in unread_since(js, nats.prefix, stream,
                                                                  plan.partitions(instance, stream), offsets)]
        except (OSError, ProtocolError):
            return []
        return found

    def pending_arrivals(self, cluster: ClusterConfig, plan: PlanConfig, instance: str, stream: str,
                         query_dir: Path) -> list[int]:
        """Per partition subject, when the first message after the query's committed offset was published."""
        if not plan.partitions(instance, stream):
            return []
        offsets = source_offsets(query_dir / "offsets" / str(committed_batch(query_dir)))
        nats = nats_of(cluster, plan, stream)
        with JetStream(nats, name="tandem-backfill-check") as js:
            return [int(published.timestamp() * 1000) for published in
                    unread_since(js, nats.prefix, stream, plan.partitions(instance, stream), offsets)]

    def backfill_refusal(self, cluster: ClusterConfig, plan: PlanConfig, instances: list[str], stream: str,
                         start: datetime) -> str | None:
        """Whether retention dropped messages published at or after ``start``
        (:func:`tandem.messaging.jetstream.dropped_since`); a message is published after the events it holds."""
        if not any(plan.partitions(instance, stream) for instance in instances):
            return None
        nats = nats_of(cluster, plan, stream)
        jetstream = stream_name(nats.prefix, stream)
        with JetStream(nats, name="tandem-backfill-check") as js:
            info = js.stream_info(jetstream)
        if info is None:
            return f"JetStream stream {jetstream} of {stream} does not exist"
        return dropped_since(jetstream, info["state"], start)

    def unbounded(self, config: StreamConfig) -> StreamConfig:
        return config.model_copy(update={"max_events_per_trigger": UNBOUNDED})

    def lost_input(self, cluster: ClusterConfig, offsets: list[Any]) -> list[str]:
        """The offsets of ``nats`` sources whose stream's retention dropped messages after them
        (:func:`tandem.messaging.jetstream.lost_after`)."""
        return [] if cluster.nats is None else lost_after(cluster.nats, offsets)

    def drop_published(self, cluster: ClusterConfig, plan: PlanConfig, stream: str) -> list[str]:
        """Delete the JetStream stream (a plan reading it with ``from_plan`` then fails with DataLoss)."""
        nats = nats_of(cluster, plan, stream)
        name = stream_name(nats.prefix, stream)
        with JetStream(nats, name=f"tandem-reset-{plan.name}") as js:
            deleted = js.delete_stream(name)
        return [f"NATS stream {name} (output {plan.publisher_of(stream)} publishes to it; a plan reading it with "
                "from_plan fails its next read with DataLoss: reset that plan too)"] if deleted else []


KIND = Nats()
