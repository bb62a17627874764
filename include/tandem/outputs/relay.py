"""An events output published to a NATS stream, exactly once (``outputs.<name>.stream``).

Purpose
    Other groups, other plans and outside consumers read a plan's events from the messaging layer, as
    the seeds' execution groups feed each other through topics. Every event must reach the stream once,
    across kill -9, SIGSTOP and partition failovers, with no window that expires.

How it works
    PostgreSQL's ``output_events`` is the outbox: the sinks write each event there once, fenced (see
    :mod:`tandem.outputs.events`), and its ``(xid, event_id)`` order lists every event exactly once
    and without gaps (migration 006). A relay publishes the events in that order, each message with
    the event id as ``Nats-Msg-Id`` and the event's position as the header ``Tandem-Position``.

    One round: read the stream's last sequence ``L`` and the position ``P`` of the message at ``L``
    (:func:`tail_of`; PostgreSQL's ``output_streams`` when retention dropped that message), read the
    events after ``P``, and publish the ``i``-th of them with ``Nats-Expected-Last-Sequence: L + i - 1``.
    JetStream stores a message only when the stream's last sequence is the one it expects, so the
    message at sequence ``L + i`` is always the ``i``-th event after ``P``, whoever publishes it:
    the ACTIVE of every instance may relay at the same time, and an old ACTIVE frozen in the middle
    of a publish and resumed after the failover is refused (its expected sequence is behind) instead of
    storing an event twice. This check does not expire; the ``Nats-Msg-Id`` duplicate window (two minutes)
    only helps consumers that also deduplicate.

What it does not do
    It shares its stream with nobody: a message another publisher stored would shift the count, so
    producers and the receiver refuse a stream an output publishes to, and a message without the
    header stops the relay with an error naming the stream. A stream deleted and created again starts
    over: the output's events are published again from the first (its readers' checkpoints then
    fail with a :class:`~tandem.errors.DataLoss`, loudly).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from tandem.config import NatsConfig, PlanConfig
from tandem.declarations import StreamConfig, partition_of
from tandem.errors import TandemError
from tandem.messaging import JetStream, ensure_declared, partition_subject, stream_name
from tandem.messaging.wire import Message
from tandem.store.db import Database
from tandem.store.output_streams import record_relayed, relayed
from tandem.store.outputs import START, EventPosition, events_after

log = logging.getLogger(__name__)
POSITION_HEADER = "Tandem-Position"
EXPECTED_LAST_SEQUENCE = "Nats-Expected-Last-Sequence"
WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code for a message whose ``Nats-Expected-Last-Sequence`` is not the stream's last sequence."""
PAGE = 2_000
"""Events read from PostgreSQL and published in one pipelined call."""


class RelayError(TandemError):
    """The stream of an events output cannot say how far publishing got (a message not published by Tandem,
    or its last message gone and not recorded): the relay publishes nothing until an operator looks."""


@dataclass(frozen=True)
class Tail:
    """The stream's last sequence and the position of the event it holds there (``START`` when empty)."""

    sequence: int
    position: EventPosition


def position_header(position: EventPosition) -> str:
    return f"{position[0]}/{position[1]}"


def parse_position(text: str) -> EventPosition:
    xid, _, event_id = text.partition("/")
    return int(xid), event_id


def tail_of(stream: str, last_sequence: int, last_headers: Mapping[str, str] | None,
            recorded: tuple[int, EventPosition] | None) -> Tail:
    """Where publishing got to (pure): the position the stream's last message carries, else the one PostgreSQL
    recorded for that very sequence (``last_headers`` ``None``: retention dropped the message).

    Raises:
        RelayError: the last message carries no position, or it is gone and was not recorded.
    """
    if last_sequence == 0:
        return Tail(0, START)
    if last_headers is not None:
        text = last_headers.get(POSITION_HEADER)
        if not text:
            raise RelayError(f"JetStream stream {stream}: message {last_sequence} has no {POSITION_HEADER} header: "
                             "something other than Tandem published to a stream an output owns")
        return Tail(last_sequence, parse_position(text))
    if recorded is not None and recorded[0] == last_sequence:
        return Tail(last_sequence, recorded[1])
    raise RelayError(f"JetStream stream {stream}: its last message {last_sequence} is gone (retention) and PostgreSQL "
                     f"recorded sequence {recorded[0] if recorded else 'none'}: which event it held cannot be known")


def epoch_millis(value: Any) -> Any:
    """A payload's time as epoch milliseconds (ISO text as :func:`tandem.store.outputs.to_json` writes it; naive: UTC)
    (pure)."""
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return value  # the reader quarantines it, with its reason
        moment = moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)
        return round(moment.timestamp() * 1000)
    return value


def stream_message(stream: StreamConfig, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The event as a line of ``stream``: its declared fields (pure). A field the event lacks is left out, so the
    stream's reader quarantines the line with the reason instead of this relay stopping."""
    line = {}
    for name, declared in stream.fields.items():
        if payload.get(name) is not None:
            line[name] = epoch_millis(payload[name]) if declared.type == "epoch_millis" else payload[name]
    return line


def messages_after(tail: Tail, events: Sequence[Mapping[str, Any]], prefix: str, stream: str,
                   declared: StreamConfig) -> list[Message]:
    """The messages that publish ``events`` (rows of :func:`~tandem.store.outputs.events_after`) after ``tail``
    (pure): the ``i``-th expects the stream's last sequence to be ``tail.sequence + i``."""
    out = []
    for i, event in enumerate(events):
        line = stream_message(declared, event["payload"])
        subject = partition_subject(prefix, stream, partition_of(line.get(declared.key), declared.partitions))
        headers = ((EXPECTED_LAST_SEQUENCE, str(tail.sequence + i)),
                   (POSITION_HEADER, position_header((int(event["xid"]), event["event_id"]))))
        out.append(Message(subject, json.dumps(line, separators=(",", ":")).encode(), event["event_id"], headers))
    return out


@dataclass(frozen=True)
class RoundResult:
    """What one publishing call did: messages stored by it, the last stored ``(sequence, position)``, and whether
    another publisher got ahead (the rest waits for the next round, from the new tail)."""

    stored: int
    last: tuple[int, EventPosition] | None
    overtaken: bool


def round_result(events: Sequence[Mapping[str, Any]], acks: Sequence[Mapping[str, Any]]) -> RoundResult:
    """Read the acknowledgements of :func:`messages_after`'s messages (pure)."""
    stored, last, overtaken = 0, None, False
    for event, ack in zip(events, acks):
        if ack.get("error"):
            overtaken = True
        elif not ack.get("duplicate"):
            stored += 1
            last = (int(ack["seq"]), (int(event["xid"]), event["event_id"]))
    return RoundResult(stored, last, overtaken)


class Relay:
    """Publishes one events output's events to its stream (one thread: it holds one NATS connection)."""

    def __init__(self, plan: PlanConfig, output: str, nats: NatsConfig, db: Database) -> None:
        stream = plan.outputs[output].stream
        if stream is None:
            raise ValueError(f"output {output} of plan {plan.name} is published to no stream")
        self.plan, self.output, self.stream, self.nats, self.db = plan, output, stream, nats, db
        self.jetstream_name = stream_name(nats.prefix, stream)
        self._js: JetStream | None = None

    def close(self) -> None:
        if self._js is not None:
            self._js.close()
            self._js = None

    def _connection(self) -> JetStream:
        if self._js is None:
            ensure_declared(self.nats, self.plan, self.stream)
            self._js = JetStream(self.nats.servers, name=f"tandem-relay-{self.plan.name}-{self.output}")
        return self._js

    def tail(self) -> Tail:
        js = self._connection()
        last = js.bounds(self.jetstream_name).last
        found = js.message(self.jetstream_name, last) if last else None
        recorded = None if found else self.db.run(
            lambda c: relayed(c, self.plan.name, self.output, self.jetstream_name))
        return tail_of(self.jetstream_name, last, found[0] if found else None, recorded)

    def publish_pending(self) -> int:
        """Publish every event not in the stream yet; return how many this call stored.

        Raises:
            RelayError: the stream cannot say how far publishing got.
            ConnectionError, StoreError: NATS or PostgreSQL unreachable (nothing is lost: the next call goes on).
        """
        total = 0
        try:
            while True:
                tail = self.tail()
                events = self.db.run(lambda c: events_after(c, self.plan.name, self.output, tail.position, PAGE))
                if not events:
                    return total
                messages = messages_after(tail, events, self.nats.prefix, self.stream, self.plan.streams[self.stream])
                acks = self._connection().publish(messages, refusals=(WRONG_LAST_SEQUENCE,))
                result = round_result(events, acks)
                total += result.stored
                if result.last is not None:
                    sequence, position = result.last
                    self.db.run(lambda c: record_relayed(c, self.plan.name, self.output, self.jetstream_name,
                                                         sequence, position))
                if result.overtaken:
                    log.info("%s/%s: another publisher got ahead in %s; going on from the new tail", self.plan.name,
                             self.output, self.jetstream_name)
                elif len(events) < PAGE:
                    return total
        except (ConnectionError, OSError):
            self.close()
            raise
