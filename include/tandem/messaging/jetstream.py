"""NATS JetStream for Tandem: the streams it owns, publishing with message ids, reading a sequence range back.

Purpose
    One small client for every part of Tandem that talks to the messaging layer: the ``nats``
    source kind (on the driver and the executors), producers, the receiver, and the events
    outputs published to NATS. It is synchronous (:mod:`tandem.messaging.wire` speaks the protocol).

How it works
    A Tandem stream is one JetStream stream (Limits retention, file storage) named
    :func:`stream_name` whose subjects are ``<prefix>.<stream>.<partition>``
    (:func:`partition_subject`). :meth:`JetStream.ensure_stream` creates it with the declared
    retention, or checks an existing one against the declaration (one Tandem created is brought to
    the declaration; one it did not create is refused when it differs). :meth:`JetStream.read`
    reads the messages of one subject whose stream sequence lies in a closed range, through an
    ephemeral consumer that acknowledges nothing: the same range gives the same messages every time
    while the stream holds them, and no reader takes anything away from another.

What it does not do
    It does not decide what a gap means: the source kind compares the range it needs with the
    stream's first sequence (:meth:`JetStream.bounds`) and says which messages are gone.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tandem.config import NatsConfig, PlanConfig
from tandem.declarations import StreamConfig
from tandem.errors import ConfigError, DataLoss
from tandem.messaging.wire import ConnectOptions, Connection, Message, NotHeld, ProtocolError, parse_headers
from tandem.redaction import redact_url

OWNER = "tandem"
"""The ``description`` prefix of the JetStream streams Tandem created (and may bring to their declaration)."""
DEFAULT_DUPLICATE_WINDOW_S = 120.0
"""JetStream's own default: a producer's retry with the same message id within it is not stored twice."""
_NS = 1_000_000_000


def stream_name(prefix: str, stream: str) -> str:
    """The JetStream stream of a Tandem stream (JetStream names take no ``.``: ``tandem_trades``)."""
    return f"{prefix}_{stream}".replace(".", "_")


def partition_subject(prefix: str, stream: str, partition: int) -> str:
    """The subject of one partition of a Tandem stream: ``<prefix>.<stream>.<partition>``."""
    return f"{prefix}.{stream}.{partition}"


@dataclass(frozen=True)
class StreamSpec:
    """What a Tandem stream declares of its JetStream stream (``None``: no limit)."""

    name: str
    subjects: tuple[str, ...]
    max_age_s: float | None = None
    max_bytes: int | None = None
    max_messages: int | None = None
    duplicate_window_s: float = DEFAULT_DUPLICATE_WINDOW_S

    def config(self) -> dict[str, Any]:
        """The JetStream stream configuration (the API's JSON)."""
        return {"name": self.name, "description": f"{OWNER}: the stream {self.name}", "subjects": list(self.subjects),
                "retention": "limits", "storage": "file", "discard": "old", "num_replicas": 1,
                "max_age": int((self.max_age_s or 0) * _NS), "max_bytes": self.max_bytes or -1,
                "max_msgs": self.max_messages or -1, "duplicate_window": int(self.duplicate_window_s * _NS)}

    def differences(self, config: dict[str, Any]) -> list[str]:
        """How an existing stream's configuration (the API's JSON) differs from this declaration (``[]``: none)."""
        wanted = self.config()
        keys = ("subjects", "retention", "max_age", "max_bytes", "max_msgs", "duplicate_window")
        found = {**config, "subjects": sorted(config.get("subjects") or [])}
        wanted["subjects"] = sorted(wanted["subjects"])
        return [f"{key} {found.get(key)!r} (declared {wanted[key]!r})" for key in keys if found.get(key) != wanted[key]]


@dataclass(frozen=True)
class Bounds:
    """The sequences a stream holds: ``first`` to ``last`` (``first == last + 1`` when it holds none); ``created``:
    when the stream was made (the server's text, ``""`` when unknown): a stream deleted and made again under the
    same name starts its sequences again."""

    first: int
    last: int
    messages: int
    created: str = ""


def nats_offset(offset: Any) -> tuple[str, int, str | None] | None:
    """``(stream, sequence read to, when the stream read was made)`` of a ``nats`` source's Spark offset
    (``{"stream", "seq", "created"}``; ``created`` is ``None`` in one written before offsets carried it), ``None``
    for any other offset (pure)."""
    if not isinstance(offset, dict) or set(offset) not in ({"stream", "seq"}, {"stream", "seq", "created"}):
        return None
    return str(offset["stream"]), int(offset["seq"]), offset.get("created")


def check_not_lost(stream: str, covered: int, bounds: Bounds, made_at: str | None = None) -> None:
    """Raise :class:`DataLoss` unless the stream still holds every message after sequence ``covered`` (pure).

    Lost: the stream is not the one ``covered`` was read from (made at ``made_at``; ``None``: not known), its
    last sequence is before ``covered`` (either way it was deleted or purged and started again: its sequences no
    longer mean what the offset says), or its first is past ``covered + 1`` (retention dropped messages not read
    yet).
    """
    if made_at and bounds.created and bounds.created != made_at:
        raise DataLoss(f"JetStream stream {stream} was made again at {bounds.created} (it holds sequences "
                       f"{bounds.first}..{bounds.last}), but sequences up to {covered} were read from the stream made "
                       f"at {made_at}: its sequences no longer mean what the offset says. Start the reading plan "
                       "over (tandem plan reset) or restore it from a snapshot taken since")
    if bounds.last < covered:
        raise DataLoss(f"JetStream stream {stream} holds sequences up to {bounds.last}, but {covered} were read: "
                       "it was deleted or reset after they were read")
    if bounds.first > covered + 1:
        raise DataLoss(f"JetStream stream {stream}: messages {covered + 1}..{bounds.first - 1} are gone (its "
                       f"retention dropped them; it holds {bounds.first}..{bounds.last}) before they were read")


def check_not_reset(stream: str, read_to: int, bounds: Bounds, made_at: str | None = None) -> None:
    """Raise :class:`DataLoss` when the stream is no longer the one made at ``made_at`` (``None``: not known), or
    its last sequence is before ``read_to``, which a read just covered (pure): it was deleted or purged and started
    again while it was read (a stream's last sequence never goes back otherwise), so what the read returned may not
    be what the range meant."""
    if bounds.last < read_to:
        raise DataLoss(f"JetStream stream {stream} holds sequences up to {bounds.last}, but a read covered {read_to}: "
                       "it was deleted or reset while it was read")
    if made_at and bounds.created and bounds.created != made_at:
        raise DataLoss(f"JetStream stream {stream} was made again at {bounds.created} while a read up to {read_to} "
                       f"of the stream made at {made_at} ran")


def dropped_since(stream: str, state: Mapping[str, Any], since: datetime) -> str | None:
    """Why the stream may no longer hold every message published at or after ``since`` (pure; ``state``: the stream
    info's ``first_seq``, ``first_ts``, ``messages``), or ``None``: its retention dropped messages, and the oldest
    one it still holds was published after ``since`` (or it holds none)."""
    first = int(state["first_seq"])
    if first <= 1:
        return None
    if int(state["messages"]) == 0:
        return (f"JetStream stream {stream} holds no message any more (its retention dropped sequences "
                f"1..{first - 1}): messages published at or after {since.isoformat()} may be among them")
    oldest = datetime.fromisoformat(str(state["first_ts"]))
    if oldest <= since:
        return None
    return (f"JetStream stream {stream} no longer holds sequences 1..{first - 1} (its retention dropped them; the "
            f"oldest it holds, {first}, was published at {oldest.isoformat()}): messages published at or after "
            f"{since.isoformat()} may be among them")


def connect_options(nats: NatsConfig) -> ConnectOptions:
    """How Tandem's connections to the messaging layer ``nats`` connect (its inbox prefix, TLS files, credentials)."""
    return ConnectOptions(inbox_prefix=nats.inbox_prefix, tls_ca_file=nats.tls_ca_file,
                          tls_cert_file=nats.tls_cert_file, tls_key_file=nats.tls_key_file,
                          nkey_seed_file=nats.nkey_seed_file, creds_file=nats.creds_file)


def lost_after(servers: Sequence[str] | NatsConfig, offsets: Iterable[Any]) -> list[str]:
    """Of Spark source offsets (a checkpoint's), those of ``nats`` sources (:func:`nats_offset`) whose stream no
    longer holds every message after them, or is not the stream they were read from: a :class:`DataLoss` message
    each (``[]``: nothing is lost). Connects
    only when there is such an offset."""
    wanted = [found for o in offsets if (found := nats_offset(o)) is not None]
    if not wanted:
        return []
    lost = []
    with JetStream(servers, name="tandem-offsets-check") as js:
        for stream, covered, made_at in wanted:
            try:
                check_not_lost(stream, covered, js.bounds(stream), made_at)
            except DataLoss as exc:
                lost.append(str(exc))
            except LookupError as exc:
                lost.append(f"{exc}: the stream is gone")
    return lost


class StreamMismatch(Exception):
    """An existing JetStream stream that Tandem did not create differs from the declaration."""


class JetStream:
    """A connection to the first reachable of ``servers`` (not thread-safe: one per thread): server URLs, or the
    messaging layer's configuration (its servers, inbox prefix, TLS files and credentials)."""

    def __init__(self, servers: Sequence[str] | NatsConfig, *, name: str = "tandem", timeout_s: float = 30.0,
                 options: ConnectOptions | None = None) -> None:
        if isinstance(servers, NatsConfig):
            options, servers = options or connect_options(servers), servers.servers
        options = options or ConnectOptions()
        problems = []
        for server in servers:
            try:
                self.connection = Connection(server, timeout_s=timeout_s, name=name, options=options)
                self.server = server
                break
            except ConnectionError as exc:
                problems.append(str(exc))
        else:
            raise ConnectionError("; ".join(problems) or "no NATS server configured")

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> JetStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"JetStream({redact_url(self.server)})"

    # --- streams ---------------------------------------------------------------------------------------------

    def ensure_stream(self, spec: StreamSpec) -> str:
        """Create the stream, or check an existing one: ``created``, ``unchanged`` or ``updated``.

        Raises:
            StreamMismatch: the stream exists, was not created by Tandem, and differs from ``spec``.
        """
        info = self.stream_info(spec.name)
        if info is None:
            self.connection.request(f"$JS.API.STREAM.CREATE.{spec.name}", spec.config())
            return "created"
        differences = spec.differences(info["config"])
        if not differences:
            return "unchanged"
        if not (info["config"].get("description") or "").startswith(f"{OWNER}:"):
            raise StreamMismatch(f"JetStream stream {spec.name} exists, was not created by Tandem, and differs from "
                                 f"the declaration: {'; '.join(differences)}")
        self.connection.request(f"$JS.API.STREAM.UPDATE.{spec.name}", spec.config())
        return "updated"

    def stream_info(self, stream: str) -> dict[str, Any] | None:
        """The stream's configuration and state (the API's JSON), ``None`` when there is no such stream."""
        try:
            return self.connection.request(f"$JS.API.STREAM.INFO.{stream}", {})
        except ProtocolError as exc:
            if "not found" in str(exc):
                return None
            raise

    def bounds(self, stream: str) -> Bounds:
        """The first and last sequence the stream holds now.

        Raises:
            LookupError: there is no such stream.
        """
        info = self.stream_info(stream)
        if info is None:
            raise LookupError(f"no JetStream stream {stream}")
        state = info["state"]
        return Bounds(first=state["first_seq"], last=state["last_seq"], messages=state["messages"],
                      created=str(info.get("created") or ""))

    def delete_stream(self, stream: str) -> bool:
        """Delete the stream (tests, clean-ups); ``False`` when there was none."""
        try:
            return bool(self.connection.request(f"$JS.API.STREAM.DELETE.{stream}", {}).get("success"))
        except ProtocolError as exc:
            if "not found" in str(exc):
                return False
            raise

    # --- messages --------------------------------------------------------------------------------------------

    def publish(self, messages: Sequence[Message | tuple[str, bytes, str | None]],
                refusals: Sequence[int] = ()) -> list[dict[str, Any]]:
        """Publish each message (``(subject, payload, message id)`` or a :class:`Message`); return once JetStream
        stored every one (its acks).

        A message whose id JetStream stored within the stream's duplicate window is not stored again
        (its ack says ``duplicate``). A refusal whose error code is in ``refusals`` is returned as its ack
        (``{"error": {...}}``) instead of raised.
        """
        return self.connection.publish(messages, refusals=refusals)

    def message(self, stream: str, sequence: int) -> tuple[dict[str, str], bytes] | None:
        """``(headers, payload)`` of the message the stream holds at ``sequence``; ``None`` when it holds none there."""
        try:
            answer = self.connection.request(f"$JS.API.STREAM.MSG.GET.{stream}", {"seq": sequence})
        except ProtocolError as exc:
            if "no message found" in str(exc):
                return None
            raise
        found = answer["message"]
        headers = parse_headers(base64.b64decode(found["hdrs"])) if found.get("hdrs") else {}
        return headers, base64.b64decode(found.get("data") or b"")

    def published_after(self, stream: str, subject: str, sequence: int) -> datetime | None:
        """When the stream's first message of ``subject`` after ``sequence`` was published; ``None``: none yet."""
        try:
            answer = self.connection.request(f"$JS.API.STREAM.MSG.GET.{stream}",
                                             {"seq": sequence + 1, "next_by_subj": subject})
        except ProtocolError as exc:
            if "no message found" in str(exc):
                return None
            raise
        return datetime.fromisoformat(answer["message"]["time"])

    def read(self, stream: str, subject: str, first: int, last: int) -> Iterator[list[tuple[int, bytes]]]:
        """``(sequence, payload)`` of the messages of ``subject`` with ``first <= sequence <= last``, in order, in
        chunks.

        Raises:
            DataLoss: the stream no longer held ``first`` when the read began (its retention dropped messages
                between a caller's check of its bounds and the read), or it dropped messages the read had not
                reached yet while it ran (a slow reader, checked after every fetch): they are gone, never
                silently skipped.
        """
        try:
            yield from self.connection.read(stream, subject, first, last)
        except NotHeld as exc:
            when = (f"while {subject} was read: it holds {exc.held_from}.. now" if exc.while_read else
                    f"the read of {subject} from {exc.first} began at {exc.held_from}")
            raise DataLoss(f"JetStream stream {stream}: messages {exc.first}..{exc.held_from - 1} are gone (its "
                           f"retention dropped them; {when}) before they were read") from None


def unread_since(js: JetStream, prefix: str, stream: str, partitions: Iterable[int], offsets: Iterable[Any]) -> \
        list[datetime]:
    """When the first message of each partition subject of the Tandem stream ``stream`` that a query has not read
    was published (none for a partition it has read to the end). ``offsets``: the query's committed source offsets
    (:func:`tandem.checkpoints.source_offsets`); a NATS source's is ``{"stream", "seq", "created"}``
    (:func:`nats_offset`), the stream sequence it read to; without one of this stream, nothing of it was read."""
    name = stream_name(prefix, stream)
    read = [found[1] for o in offsets if (found := nats_offset(o)) is not None and found[0] == name]
    found = (js.published_after(name, partition_subject(prefix, stream, p), min(read, default=0)) for p in partitions)
    return [published for published in found if published is not None]


def stream_spec(nats: NatsConfig, name: str, stream: StreamConfig) -> StreamSpec:
    """The JetStream stream of the Tandem stream ``name`` as it declares it: every partition's subject, its retention."""
    retention = stream.retention
    return StreamSpec(stream_name(nats.prefix, name), (f"{nats.prefix}.{name}.*",), max_age_s=retention.max_age_s,
                      max_bytes=retention.max_bytes, max_messages=retention.max_messages)


def ensure_declared(nats: NatsConfig, plan: PlanConfig, stream: str) -> str:
    """Create the JetStream stream of ``stream`` as declared, or check it: ``created``, ``unchanged`` or ``updated``.

    Raises:
        ConfigError: it exists, Tandem did not create it, and it differs from the declaration.
    """
    with JetStream(nats, name=f"tandem-{plan.name}") as js:
        try:
            return js.ensure_stream(stream_spec(nats, stream, plan.streams[stream]))
        except StreamMismatch as exc:
            raise ConfigError(str(plan.path), f"streams.{stream}.retention", str(exc)) from None
