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

    An event whose message would be over the server's ``max_payload`` is left out (:func:`split_round`):
    it takes no sequence, and goes to the plan's quarantine with the reason (:class:`RelayQuarantine`).
    Whether it is left out depends on the event and ``max_payload`` only (its size is judged with the
    widest expected sequence), so every relay decides the same, and ``L + i`` is the ``i``-th event after
    ``P`` that a message can carry. (Servers of one cluster with different ``max_payload`` could decide
    differently; the count still holds, as each relay goes on from the stream's tail, but an event could then
    be both quarantined and published.)

What it does not do
    It shares its stream with nobody: a message another publisher stored would shift the count, so
    producers and the receiver refuse a stream an output publishes to (and another plan's, :func:`tandem.config.
    shared_stream_errors`), and a message without the header, or with a malformed one, stops the relay with a
    :class:`RelayError` naming the stream (the relay thread records it and tries again with back-off:
    :mod:`tandem.runtime.relays`). A stream deleted and created again starts
    over: the output's events are published again from the first (its readers' checkpoints then
    fail with a :class:`~tandem.errors.DataLoss`, loudly).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa

from tandem.config import NatsConfig, PlanConfig
from tandem.declarations import TIME_TYPES, StreamConfig, partition_of
from tandem.errors import TandemError
from tandem.lake.tables import append_once, committed_version
from tandem.messaging import JetStream, ensure_declared, partition_subject, stream_name
from tandem.messaging.wire import Message
from tandem.outputs.quarantine import QUARANTINE_SCHEMA
from tandem.store.db import Database
from tandem.store.leases import check_fence
from tandem.store.output_streams import lock_relay_quarantine, record_relayed, relayed
from tandem.store.outputs import START, EventPosition, events_after
from tandem.store.registry import InstanceKey

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
    """The position a ``Tandem-Position`` header carries (pure).

    Raises:
        ValueError: it is not ``<xid>/<event id>``.
    """
    xid, slash, event_id = text.partition("/")
    if not slash or not (xid.isascii() and xid.isdigit()) or len(xid) > 20:
        raise ValueError(f"{text[:80]!r} is not <xid>/<event id>")
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
        try:
            return Tail(last_sequence, parse_position(text))
        except ValueError as exc:
            raise RelayError(f"JetStream stream {stream}: message {last_sequence} has a malformed {POSITION_HEADER} "
                             f"header ({exc}): something other than Tandem published to a stream an output owns") \
                from None
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
    """The event as a line of ``stream``: its declared fields, each at the key it reads (its ``from``), times as
    epoch milliseconds (pure). A field the event lacks is left out, so the stream's reader quarantines the line with
    the reason instead of this relay stopping."""
    values = {}
    for name, declared in stream.fields.items():
        if payload.get(name) is not None:
            values[name] = epoch_millis(payload[name]) if declared.type in TIME_TYPES else payload[name]
    return stream.event_of(values)


def messages_after(tail: Tail, events: Sequence[Mapping[str, Any]], prefix: str, stream: str,
                   declared: StreamConfig) -> list[Message]:
    """The messages that publish ``events`` (rows of :func:`~tandem.store.outputs.events_after`) after ``tail``
    (pure): the ``i``-th expects the stream's last sequence to be ``tail.sequence + i``."""
    return split_round(tail, events, prefix, stream, declared, None).messages


@dataclass(frozen=True)
class PlannedRound:
    """What one publishing call does with a page of events (:func:`split_round`): the messages, the events they
    publish (in order), and the events no message can carry, each with the reason (for the plan's quarantine)."""

    messages: list[Message]
    published: list[Mapping[str, Any]]
    too_large: list[tuple[Mapping[str, Any], str]]


_WIDEST_SEQUENCE = str(2 ** 64 - 1)
"""The longest ``Nats-Expected-Last-Sequence`` value: an event's size is judged with it, whatever the tail."""


def split_round(tail: Tail, events: Sequence[Mapping[str, Any]], prefix: str, stream: str, declared: StreamConfig,
                max_payload: int | None) -> PlannedRound:
    """The messages that publish ``events`` after ``tail``, leaving out each event whose message is over
    ``max_payload`` (``None``: no limit) (pure).

    The ``i``-th message expects the stream's last sequence to be ``tail.sequence + i``: an event left out takes
    no sequence, so the stream's invariant holds (the message at ``L + i`` is the ``i``-th event after ``L``'s that
    a message can carry). Whether an event is left out depends on the event and ``max_payload`` only (its size is
    judged with the widest expected sequence), so every relay decides the same for it.

    Raises:
        RelayError: an event's id or position would not make a header line (CR, LF or NUL in it).
    """
    messages, published, too_large = [], [], []
    for event in events:
        line = stream_message(declared, event["payload"])
        subject = partition_subject(prefix, stream, partition_of(declared.value_at(line, declared.key),
                                                                 declared.partitions))
        position = position_header((int(event["xid"]), event["event_id"]))
        payload = json.dumps(line, separators=(",", ":")).encode()
        widest = Message(subject, payload, event["event_id"], ((EXPECTED_LAST_SEQUENCE, _WIDEST_SEQUENCE),
                                                                (POSITION_HEADER, position)))
        try:
            size = len(widest.header_block()) + len(payload)
        except ValueError as exc:
            raise RelayError(f"event {event['event_id'][:80]!r} of stream {stream}: a malformed header: {exc}") \
                from None
        if max_payload is not None and size > max_payload:
            too_large.append((event, f"the message of {size} bytes (payload and headers) is over the NATS server's "
                                     f"max_payload ({max_payload}): not published to stream {stream}"))
            continue
        headers = ((EXPECTED_LAST_SEQUENCE, str(tail.sequence + len(messages))), (POSITION_HEADER, position))
        messages.append(Message(subject, payload, event["event_id"], headers))
        published.append(event)
    return PlannedRound(messages, published, too_large)


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


RELAY_SOURCE = "relay:"
"""The source of a quarantined event the relay could not publish: ``relay:<output>/<event id>``."""


class RelayQuarantine:
    """Where a relay puts the events no NATS message can carry: the plan's quarantine (Delta), one row each, with
    the reason; written by an ACTIVE, fenced at its epoch.

    Every ACTIVE relays every event, so several may find the same event too large at once: each checks and
    writes under one PostgreSQL lock of the output (in the transaction that checks its lease), and each event is
    a Delta transaction of its own application id (``relay/<output>/<event id>``, version 1), which the next
    relay finds committed: the event is quarantined once, whoever finds it, and a relay dying mid-write leaves
    it to the next (the lock goes with its session; the Delta commit is whole or absent).
    """

    def __init__(self, path: Path, instance: InstanceKey, db: Database, epoch: Callable[[], int | None]) -> None:
        self.path, self.instance, self.db, self.epoch = path, instance, db, epoch

    def __call__(self, output: str, refused: Sequence[tuple[Mapping[str, Any], str]]) -> int:
        """Quarantine each ``(event, reason)``; return how many this call wrote.

        Raises:
            FencedError: this instance no longer holds the lease at its epoch.
            RelayError: it is not ACTIVE any more.
        """
        epoch = self.epoch()
        if epoch is None:
            raise RelayError(f"output {output}: this instance is not ACTIVE any more: it quarantines nothing")
        key = self.instance

        def write(cursor) -> int:
            lock_relay_quarantine(cursor, key.plan, output)
            check_fence(cursor, key.plan, key.instance, key.node, epoch)
            written = 0
            for event, reason in refused:
                app_id = f"relay/{output}/{event['event_id']}"
                if committed_version(self.path, app_id) is not None:
                    continue
                row = pa.table({
                    "raw": [json.dumps(event["payload"], default=str, sort_keys=True, ensure_ascii=False)],
                    "source_file": [f"{RELAY_SOURCE}{output}/{event['event_id']}"],
                    "reason": [f"output {output}: {reason}"], "plan": [key.plan], "instance": [key.instance],
                    "node": [key.node], "batch_id": [0], "quarantined_at": [datetime.now(timezone.utc)],
                    "plan_version": [None]},  # the relay refused it, no version of the plan's checks
                    schema=QUARANTINE_SCHEMA)
                written += append_once(self.path, row, app_id=app_id, version=1, merge_schema=True)
            return written

        return self.db.run(write)


class Relay:
    """Publishes one events output's events to its stream (one thread: it holds one NATS connection).

    ``quarantine`` takes the events no message can carry (over the server's ``max_payload``); without one, such
    an event stops the relay with a :class:`RelayError`.
    """

    def __init__(self, plan: PlanConfig, output: str, nats: NatsConfig, db: Database,
                 quarantine: Callable[[str, Sequence[tuple[Mapping[str, Any], str]]], int] | None = None) -> None:
        stream = plan.outputs[output].stream
        if stream is None:
            raise ValueError(f"output {output} of plan {plan.name} is published to no stream")
        self.plan, self.output, self.stream, self.nats, self.db = plan, output, stream, nats, db
        self.quarantine = quarantine
        self.jetstream_name = stream_name(nats.prefix, stream)
        self._js: JetStream | None = None
        self._passed: tuple[Tail, EventPosition] | None = None
        """``(tail, position)``: every event after the tail's position up to ``position`` was too large (and is
        quarantined), so while the stream's tail is still ``tail`` the next events are those after ``position``."""

    def close(self) -> None:
        if self._js is not None:
            self._js.close()
            self._js = None

    def _connection(self) -> JetStream:
        if self._js is None:
            ensure_declared(self.nats, self.plan, self.stream)
            self._js = JetStream(self.nats, name=f"tandem-relay-{self.plan.name}-{self.output}")
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
                after = tail.position
                if self._passed is not None and self._passed[0] == tail:
                    after = max(after, self._passed[1])
                events = self.db.run(lambda c: events_after(c, self.plan.name, self.output, after, PAGE))
                if not events:
                    return total
                js = self._connection()
                planned = split_round(tail, events, self.nats.prefix, self.stream, self.plan.streams[self.stream],
                                      js.connection.max_payload)
                if planned.too_large:
                    self._quarantine(planned.too_large)
                acks = js.publish(planned.messages, refusals=(WRONG_LAST_SEQUENCE,)) if planned.messages else []
                result = round_result(planned.published, acks)
                total += result.stored
                if result.last is not None:
                    sequence, position = result.last
                    self.db.run(lambda c: record_relayed(c, self.plan.name, self.output, self.jetstream_name,
                                                         sequence, position))
                if result.overtaken:
                    log.info("%s/%s: another publisher got ahead in %s; going on from the new tail", self.plan.name,
                             self.output, self.jetstream_name)
                    continue
                self._passed = None
                if planned.published[-1:] != events[-1:]:  # the page ends with events too large: go on after them
                    now_at = Tail(*result.last) if result.last else tail
                    self._passed = (now_at, _position_of(events[-1]))
                if len(events) < PAGE:
                    return total
        except (ConnectionError, OSError):
            self.close()
            raise

    def _quarantine(self, refused: Sequence[tuple[Mapping[str, Any], str]]) -> None:
        for event, reason in refused:
            log.warning("%s/%s: event %s goes to the quarantine: %s", self.plan.name, self.output, event["event_id"],
                        reason)
        if self.quarantine is None:
            event, reason = refused[0]
            raise RelayError(f"output {self.output}: event {event['event_id']}: {reason}, and this relay has no "
                             "quarantine to put it in")
        self.quarantine(self.output, refused)


def _position_of(event: Mapping[str, Any]) -> EventPosition:
    return int(event["xid"]), event["event_id"]
