"""The receiver: an authenticated HTTP endpoint that turns events from outside into messages of a ``nats`` stream.

Purpose
    The seeds' receiver nodes turn an outside source (HTTP, Thrift) into messages of the messaging
    layer. A service that cannot speak NATS POSTs its events here; ``tandem receive`` serves it.

How it works
    Every request but ``GET /v1/health`` carries ``Authorization: Bearer <token>``: the global token
    (``TANDEM_RECEIVER_TOKEN``: every stream) or a scoped one from the file ``TANDEM_RECEIVER_TOKENS`` names
    (``<token> <plan>/<stream>`` or ``<token> <plan>/*`` a line: :func:`parse_tokens_file`). :class:`Gate`, an
    ASGI middleware in front of the app, answers before the app reads a byte of the body: ``401`` without a
    valid token (logged with the client's address and the path, never the token given), ``413`` for a
    ``Content-Length`` over ``max_body_bytes`` (:data:`MAX_BODY_BYTES` unless ``--max-body-bytes`` says
    otherwise); a body without one is counted as it arrives and refused with ``413`` once over it. A scoped
    token used for another stream gets ``403``; without a token, health answers ``{"status": "ok"}`` only.

    ``POST /v1/plans/{plan}/streams/{stream}/events`` takes a JSON array of events, parsed on a worker
    thread (a big body does not stall the other requests) one event at a time (:func:`parse_events`): the one past
    :data:`MAX_EVENTS` ends the parse with ``413``; an event Python cannot read as it is (nested over
    :data:`MAX_DEPTH` levels, an integer of more digits than Python converts) is refused alone. Every event is
    checked against the stream's declaration (:func:`tandem.event_checks.event_problems`, a key given twice
    included), its id too when ``id_field`` names one (:func:`tandem.event_checks.id_problem`: no control
    character, at most 256 characters), that it is standard JSON (no NaN or infinity anywhere:
    :func:`tandem.event_checks.non_finite_problems`), and its message (payload and headers) against the NATS
    server's ``max_payload``. The good
    ones are published to their partition subjects, each with a message id (the client's ``id`` for the
    event, else :func:`tandem.client.content_id`), and the answer comes only once JetStream acknowledged
    every one: ``200 {"published": n, "sequences": [...]}``, or ``rejected: [{"index", "reasons"}]`` for
    the bad ones with ``400`` (``413`` when every refused event is refused only for being over
    ``max_payload``). The good ones of the request are published all the same: sending the whole request
    again is safe, the message ids make JetStream store each event once within its duplicate window.

    At start it logs a warning for each ``nats`` stream whose ``max_line_bytes`` lets through events the NATS
    server cannot carry (its ``max_payload`` less :data:`HEADER_ROOM`); such events are refused with ``413``.

    A connection without a complete request head :data:`HEADER_TIMEOUT_S` after it opened or after its last answer
    is closed (:func:`head_timed_protocol`); with :data:`MAX_CONNECTIONS` open, a request on one more gets ``503``
    (``--header-timeout``, ``--max-connections``). Connections wait on uvicorn's event loop, not a thread each.

What it does not do
    It keeps nothing: an event is either acknowledged by JetStream before the answer, or the
    answer is an error (``502``: NATS did not acknowledge) and the client sends it again. TLS is
    uvicorn's (``--ssl-certfile``, ``--ssl-keyfile``); there are no client certificates.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path as FilePath
from typing import Annotated, Any, NoReturn

from fastapi import FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message as AsgiMessage, Receive, Scope, Send

from tandem.client import content_id
from tandem.config import ClusterConfig, NatsConfig, PlanConfig, load_plans_and_errors
from tandem.declarations import partition_of
from tandem.errors import ConfigError, TandemError
from tandem.event_checks import (JSON_STRING, MAX_DEPTH, MAX_ID_CHARS, depth_of, event_problems, id_problem, leaves,
                                 load_json_at, non_finite_problems)
from tandem.logs import configure_logging, log_format
from tandem.messaging import JetStream, partition_subject
from tandem.messaging.wire import Message
from tandem.sources import SOURCE_KINDS, source_of

log = logging.getLogger(__name__)
TOKEN_VARIABLE = "TANDEM_RECEIVER_TOKEN"
TOKENS_FILE_VARIABLE = "TANDEM_RECEIVER_TOKENS"
MAX_EVENTS = 10_000
"""Events in one request at most (a larger batch is refused with 413, once the parse reaches the one past it)."""
MAX_BODY_BYTES = 16 * 1024 * 1024
"""Bytes of a request's body at most unless ``tandem receive --max-body-bytes`` says otherwise (413 past it)."""
HEADER_TIMEOUT_S = 10.0
"""Seconds a connection has for a request's head (request line and headers) unless ``tandem receive
--header-timeout`` says otherwise, from when it opened or its last answer was sent: then it is closed (``408`` when
part of a head came)."""
MAX_CONNECTIONS = 100
"""Connections open at once that the receiver serves unless ``tandem receive --max-connections`` says otherwise: a
request on one more is answered ``503``."""
HEADER_ROOM = 1024
"""Bytes of a NATS message kept for its headers (the message id: at most 256 characters) when a stream's
``max_line_bytes`` is checked against the server's ``max_payload`` at start."""
HEALTH_PATH = "/v1/health"
EVENTS_PATH = "/v1/plans/{plan}/streams/{stream}/events"
_ACCESS = "tandem_receiver_access"
_SCOPE = re.compile(r"[^/\s]+/[^/\s]+")
_EVENTS_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "array", "maxItems": MAX_EVENTS, "items": {"type": "object"}}}}}}


# --- the decisions (pure) ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Access:
    """What a request's token may do: send to every stream (the global token) or to its scopes
    (``plan/stream``, ``plan/*``)."""

    everything: bool = False
    scopes: frozenset[str] = frozenset()

    def allows(self, plan: str, stream: str) -> bool:
        return self.everything or f"{plan}/{stream}" in self.scopes or f"{plan}/*" in self.scopes

    def allows_plan(self, plan: str) -> bool:
        return self.everything or any(scope.partition("/")[0] == plan for scope in self.scopes)


@dataclass(frozen=True)
class Tokens:
    """The receiver's tokens: the global one (``""``: none) and scoped ones, ``(token, scope)`` pairs."""

    everything: str = ""
    scoped: tuple[tuple[str, str], ...] = ()

    def access(self, given: str | None) -> Access | None:
        """What the token ``given`` may do; ``None`` when it is none of them (every token compared in constant
        time)."""
        if not given:
            return None
        presented = given.encode()
        everything = bool(self.everything) and hmac.compare_digest(presented, self.everything.encode())
        scopes = frozenset([scope for token, scope in self.scoped if hmac.compare_digest(presented, token.encode())])
        return Access(everything, scopes) if everything or scopes else None


def bearer_token(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; ``None`` for another scheme or none."""
    scheme, _, given = authorization.strip().partition(" ")
    return (given.strip() or None) if scheme.lower() == "bearer" else None


def parse_tokens_file(text: str, source: str) -> tuple[tuple[str, str], ...]:
    """The scoped tokens of a tokens file: ``(token, scope)`` for each ``<token> <plan>/<stream>`` or
    ``<token> <plan>/*`` line (a token may have several lines); blank lines and ``#`` lines aside.

    Raises:
        ConfigError: a line is not one of them (it names the line, never its text).
    """
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) != 2 or not _SCOPE.fullmatch(words[1]):
            raise ConfigError(source, f"line {number}", "expected '<token> <plan>/<stream>' or '<token> <plan>/*'")
        found.append((words[0], words[1]))
    return tuple(found)


def body_too_large(max_body_bytes: int) -> str:
    return (f"the body is over the receiver's limit of {max_body_bytes} bytes (tandem receive --max-body-bytes): "
            "send fewer events a request")


def declared_size_problem(content_length: str | None, max_body_bytes: int) -> str | None:
    """Why a body of ``Content-Length: content_length`` is refused before it is read; ``None``: it is not (no
    header, or one the HTTP server refuses itself)."""
    if content_length is None or not content_length.strip().isdigit():
        return None
    return body_too_large(max_body_bytes) if int(content_length) > max_body_bytes else None


def payload_problem(size: int, max_payload: int) -> str | None:
    """Why a NATS message of ``size`` bytes (headers and payload) cannot be published; ``None``: it can."""
    return f"message of {size} bytes is over the NATS server's max_payload ({max_payload})" \
        if size > max_payload else None


def answer_status(rejected: int, over_max_payload: int) -> int:
    """The status of an answer that refused ``rejected`` events, ``over_max_payload`` of them only for their size:
    ``200`` (none), ``413`` (all of them for their size) or ``400``."""
    if not rejected:
        return 200
    return 413 if over_max_payload == rejected else 400


def line_room_problem(max_line_bytes: int, max_payload: int) -> str | None:
    """Why a stream's ``max_line_bytes`` lets through events a NATS server of ``max_payload`` cannot carry;
    ``None``: it does not."""
    room = max_payload - HEADER_ROOM
    if max_line_bytes <= room:
        return None
    return (f"{max_line_bytes} bytes is more than a message of the NATS server carries: its max_payload is "
            f"{max_payload}, less {HEADER_ROOM} bytes kept for headers; the receiver refuses events over that (413). "
            f"Declare max_line_bytes: {room} or less, or raise the server's max_payload")


def line_room_warnings(plans: Mapping[str, PlanConfig], max_payload: int) -> list[str]:
    """A warning naming the plan file and field for each stream the receiver publishes to whose ``max_line_bytes``
    is over what a NATS message carries (:func:`line_room_problem`)."""
    return [f"{plan.path}: streams.{name}.max_line_bytes: {problem}"
            for plan in plans.values() for name, stream in plan.streams.items()
            if source_of(plan, name).receivable and name in plan.input_streams
            and (problem := line_room_problem(stream.max_line_bytes, max_payload))]


@dataclass(frozen=True)
class Unreadable:
    """An element of a request's array that Python cannot take as it is, and why: it is refused alone."""

    reason: str


class TooManyEvents(ValueError):
    """A request's array holds more than :data:`MAX_EVENTS` elements (found before the rest of it is parsed)."""

    def __init__(self, max_events: int) -> None:
        super().__init__(f"more than {max_events} events in one request: send at most {max_events}")


_WHITESPACE = re.compile(r"[ \t\n\r]*")
_BRACKETS = re.compile(JSON_STRING + r"|[\[{]+|[\]}]+", re.DOTALL)
"""A JSON string (skipped: its brackets are text), or a run of opening or of closing brackets."""
_STARTS = {"{": "an object", '"': "a string", "t": "true", "f": "false", "n": "null"}


def parse_events(body: bytes, max_events: int = MAX_EVENTS) -> list[Any]:
    """The events of a request's body, a JSON array, each element parsed on its own (an object holding a key twice
    comes out marked: :func:`tandem.event_checks.load_json`). An element Python cannot read as it is comes as
    :class:`Unreadable`: nested over :data:`MAX_DEPTH` levels, or holding an integer of more digits than Python
    converts (``sys.get_int_max_str_digits()``). The count is checked as the array is parsed: the element past
    ``max_events`` ends the parse (pure).

    Raises:
        ValueError: the body is not a JSON array (:class:`TooManyEvents`: of more than ``max_events`` elements).
    """
    try:
        text = body.decode(json.detect_encoding(body), "surrogatepass")  # as json.loads reads bytes
    except UnicodeDecodeError as exc:
        raise _not_an_array(str(exc)) from None
    position = _WHITESPACE.match(text).end()
    if not text.startswith("[", position):
        raise _not_an_array(_what_starts(text[position:position + 1]))
    events: list[Any] = []
    position = _WHITESPACE.match(text, position + 1).end()
    if text.startswith("]", position):
        return _ended(text, position, events)
    while True:
        if len(events) == max_events:
            raise TooManyEvents(max_events)
        event, position = _element(text, position)
        events.append(event)
        position = _WHITESPACE.match(text, position).end()
        if text.startswith("]", position):
            return _ended(text, position, events)
        if not text.startswith(",", position):
            raise _not_an_array(f"expected ',' or ']' at character {position}")
        position = _WHITESPACE.match(text, position + 1).end()


def _ended(text: str, closing: int, events: list[Any]) -> list[Any]:
    """``events``, those of an array closed at ``closing``: nothing but whitespace may follow it."""
    if _WHITESPACE.match(text, closing + 1).end() != len(text):
        raise _not_an_array(f"text after the array's end at character {closing + 1}")
    return events


def _not_an_array(why: str) -> ValueError:
    return ValueError(f"the body is not a JSON array of events: {why}")


def _what_starts(first: str) -> str:
    if not first:
        return "it is empty"
    return f"it is {_STARTS.get(first, 'a number' if first in '-0123456789' else 'not JSON')}"


def _element(text: str, start: int) -> tuple[Any, int]:
    """The element of the array at ``start`` (or :class:`Unreadable`) and where it ends."""
    try:
        event, end = load_json_at(text, start)
    except json.JSONDecodeError as exc:
        raise _not_an_array(str(exc)) from None
    except RecursionError:  # nested past Python's recursion limit, so past MAX_DEPTH
        depth, end = nesting(text, start)
        return Unreadable(_too_deep(depth)), end
    except ValueError as exc:  # an integer of more digits than Python converts
        return _long_integer(text, start, exc)
    if text.count("[", start, end) + text.count("{", start, end) > MAX_DEPTH:  # else it cannot nest deeper
        depth = depth_of(text[start:end])
        if depth > MAX_DEPTH:
            return Unreadable(_too_deep(depth)), end
    return event, end


class _Digits(str):
    """An integer's digits, as the parse of an element holding one of more digits than Python converts keeps it."""


_DIGITS_KEPT = json.JSONDecoder(parse_int=_Digits)


def _long_integer(text: str, start: int, error: ValueError) -> tuple[Unreadable, int]:
    """The element at ``start``, whose parse failed with ``error`` for an integer of more digits than Python
    converts: why it is refused (the first such integer's path and length) and where it ends."""
    try:
        element, end = _DIGITS_KEPT.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        raise _not_an_array(str(exc)) from None
    except RecursionError:
        depth, end = nesting(text, start)
        return Unreadable(_too_deep(depth)), end
    limit = sys.get_int_max_str_digits()
    found = next(((path, len(value.lstrip("-"))) for path, value in leaves(element)
                  if isinstance(value, _Digits) and len(value.lstrip("-")) > limit), None)
    if found is None:
        return Unreadable(f"event cannot be read: {error}"), end
    path, digits = found
    where = f"field '{path}'" if path else "event"
    return Unreadable(f"{where} holds an integer of {digits} digits: the receiver reads at most {limit} (send it as "
                      "a string)"), end


def nesting(text: str, start: int) -> tuple[int, int]:
    """How deep the JSON array or object at ``start`` of ``text`` nests (itself: 1) and where it ends, from its
    brackets outside strings (its syntax otherwise unchecked; iterative, however deep it nests) (pure).

    Raises:
        ValueError: there is no array or object at ``start``, or it does not end.
    """
    if not text.startswith(("[", "{"), start):
        raise _not_an_array(f"expected an array or object at character {start}")
    depth = deepest = 0
    for token in _BRACKETS.finditer(text, start):
        run = token.group()
        if run[0] in "[{":
            depth += len(run)
            deepest = max(deepest, depth)
        elif run[0] in "]}":
            depth -= len(run)
            if depth <= 0:
                return deepest, token.end() + depth  # the run may close what is around the value too
    raise _not_an_array(f"the array or object at character {start} does not end")


def _too_deep(depth: int) -> str:
    return f"event nested {depth} levels deep: the receiver takes at most {MAX_DEPTH}"


# --- the gate (ASGI) --------------------------------------------------------------------------------------------

class _BodyTooLarge(Exception):
    """More bytes of a body arrived than the receiver takes."""


class Gate:
    """ASGI middleware in front of the receiver's app: who may ask, and how big a body may be, decided before the
    app reads a byte of it.

    Every path but :data:`HEALTH_PATH` needs a token (the API's description too): ``401`` without one. ``413``
    for a declared ``Content-Length`` over ``max_body_bytes``, and for a body without one as soon as that many
    bytes came. The token's :class:`Access` (``None`` for health without a token) is left in the request's
    scope for the app (:func:`access_of`).
    """

    def __init__(self, app: ASGIApp, tokens: Tokens, max_body_bytes: int) -> None:
        self.app = app
        self.tokens = tokens
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        access = self.tokens.access(bearer_token(headers.get("authorization", "")))
        if access is None and scope["path"] != HEALTH_PATH:
            log.warning("receiver: refused %s %s from %s: no valid bearer token", scope["method"], _path(scope),
                        _client(scope))
            await _refuse(scope, receive, send, 401, "send Authorization: Bearer <a token of this receiver>",
                          {"WWW-Authenticate": "Bearer"})
            return
        problem = declared_size_problem(headers.get("content-length"), self.max_body_bytes)
        if problem:
            await _refuse(scope, receive, send, 413, problem)
            return
        scope.setdefault("state", {})[_ACCESS] = access
        await self._counting(scope, receive, send)

    async def _counting(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app, with a ``413`` in its place once the body it reads is over ``max_body_bytes``."""
        received = 0
        answered = False

        async def counted() -> AsgiMessage:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _BodyTooLarge
            return message

        async def noted(message: AsgiMessage) -> None:
            nonlocal answered
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, noted)
        except _BodyTooLarge:
            if answered:
                raise
            await _refuse(scope, receive, send, 413, body_too_large(self.max_body_bytes))


async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, detail: str,
                  headers: Mapping[str, str] | None = None) -> None:
    await JSONResponse({"detail": detail}, status_code=status, headers=headers)(scope, receive, send)


def _path(scope: Scope) -> str:
    """The path as the client sent it (percent-encoded: a log line cannot be split by it)."""
    raw = scope.get("raw_path") or scope["path"].encode("utf-8", "backslashreplace")
    return raw.decode("ascii", "backslashreplace")


def _client(scope: Scope) -> str:
    host, port = scope.get("client") or ("unknown", 0)
    return f"{host}:{port}"


def access_of(request: Request) -> Access | None:
    """What the request's token may do (the :class:`Gate` decided); ``None``: no valid token (health only)."""
    return request.scope.get("state", {}).get(_ACCESS)


# --- the app ----------------------------------------------------------------------------------------------------

def receiver_app(cluster: ClusterConfig, tokens: Tokens | str, *, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The receiver's ASGI app for the plans of ``cluster``; clients authenticate with ``tokens`` (a string: the
    global token)."""
    tokens = Tokens(tokens) if isinstance(tokens, str) else tokens
    if not tokens.everything and not tokens.scoped:
        raise ValueError(f"the receiver needs a token: set {TOKEN_VARIABLE} or {TOKENS_FILE_VARIABLE}")
    if cluster.nats is None:
        raise ValueError(f"the receiver needs the messaging layer: a nats: section in {cluster.path} or TANDEM_NATS_URL")
    plans, _broken = load_plans_and_errors(cluster)
    nats = cluster.nats
    _warn_of_lines_nats_cannot_carry(nats, plans)
    local = threading.local()
    ready: set[tuple[str, str]] = set()
    app = FastAPI(title="Tandem receiver", version="1")
    app.add_middleware(Gate, tokens=tokens, max_body_bytes=max_body_bytes)

    def connection() -> JetStream:
        if getattr(local, "js", None) is None:
            local.js = JetStream(nats, name="tandem-receiver")
        return local.js

    def publish(messages: list[Message]) -> list[dict[str, Any]]:
        """Publish on this thread's connection; one more try on a new one when it broke."""
        try:
            return connection().publish(messages)
        except (ConnectionError, OSError):
            local.js = None
            return connection().publish(messages)

    def declared(plan_name: str, stream_name: str) -> tuple[PlanConfig, str]:
        plan = plans.get(plan_name)
        if plan is None or stream_name not in plan.streams:
            raise HTTPException(404, f"no stream {stream_name!r} in plan {plan_name!r}")
        kind = source_of(plan, stream_name)
        if not kind.receivable:
            receivable = " or ".join(name for name, other in SOURCE_KINDS.items() if other.receivable)
            raise HTTPException(409, f"stream {stream_name} of plan {plan_name} is a {kind.name} stream: the receiver "
                                     f"publishes to {receivable} streams only")
        publisher = plan.publisher_of(stream_name)
        if publisher is not None:
            raise HTTPException(409, f"stream {stream_name} of plan {plan_name} is published by its output "
                                     f"{publisher}: only Tandem writes to it")
        if plan.from_plan(stream_name) is not None:
            raise HTTPException(409, f"stream {stream_name} of plan {plan_name} is plan "
                                     f"{plan.from_plan(stream_name)}'s (from_plan): send its events to that plan")
        if (plan_name, stream_name) not in ready:
            kind.prepare(cluster, plan, stream_name)
            ready.add((plan_name, stream_name))
        return plan, stream_name

    def handle(plan_name: str, stream_name: str, id_field: str | None, body: bytes) -> JSONResponse:
        """A request's events checked, the good ones published (on a worker thread: it parses and blocks)."""
        declaration, name = declared(plan_name, stream_name)
        try:
            events = parse_events(body)
        except TooManyEvents as exc:
            raise HTTPException(413, str(exc)) from None
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        config = declaration.streams[name]
        id_of: Callable[[dict[str, Any]], str] = (lambda e: str(e[id_field])) if id_field else content_id
        try:
            max_payload = connection().connection.max_payload
        except (ConnectionError, OSError) as exc:
            _not_acknowledged(plan_name, stream_name, len(events), exc)
        rejected, messages, over_max_payload = [], [], 0
        for index, event in enumerate(events):
            problems = [event.reason] if isinstance(event, Unreadable) else event_problems(config, event)
            if id_field and not problems:
                problems = [problem] if (problem := id_problem(id_field, event.get(id_field))) else []
            line = None if problems else _line(event)
            if line is None and not problems:  # not standard JSON
                problems = non_finite_problems(event)
            if problems:
                rejected.append({"index": index, "reasons": problems})
                continue
            subject = partition_subject(nats.prefix, name, partition_of(config.value_at(event, config.key),
                                                                        config.partitions))
            message = Message(subject, line, id_of(event))
            too_large = payload_problem(len(message.header_block()) + len(message.payload), max_payload)
            if too_large:
                rejected.append({"index": index, "reasons": [too_large]})
                over_max_payload += 1
                continue
            messages.append(message)
        try:
            acks = publish(messages) if messages else []
        except Exception as exc:  # noqa: BLE001 - the client is told to send again; nothing was promised
            _not_acknowledged(plan_name, stream_name, len(messages), exc)
        answer: dict[str, Any] = {"published": len(acks), "sequences": [ack["seq"] for ack in acks]}
        if rejected:
            answer["rejected"] = rejected
        return JSONResponse(answer, status_code=answer_status(len(rejected), over_max_payload))

    @app.get(HEALTH_PATH)
    def health(request: Request) -> dict[str, Any]:
        access = access_of(request)
        if access is None:
            return {"status": "ok"}
        return {"status": "ok", "plans": sorted(name for name in plans if access.allows_plan(name))}

    @app.post(EVENTS_PATH, openapi_extra=_EVENTS_BODY)
    async def receive(request: Request, plan: Annotated[str, Path()], stream: Annotated[str, Path()],
                      id_field: Annotated[str | None, Query(description="the event field that is its id (message id, "
                                                                        f"at most {MAX_ID_CHARS} characters)")]
                      = None) -> JSONResponse:
        access = access_of(request)
        if access is None or not access.allows(plan, stream):
            raise HTTPException(403, f"this token may not send to stream {stream} of plan {plan}")
        body = await request.body()
        return await run_in_threadpool(handle, plan, stream, id_field, body)

    return app


# --- the connections (uvicorn) ----------------------------------------------------------------------------------

def head_timed_protocol(header_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools, else h11) that closes a connection whose request head (request line and
    headers) is not complete ``header_timeout_s`` after the connection opened or its last answer was sent; a client
    that sent part of one gets ``408`` first. uvicorn alone waits for a head without end: its keep-alive timeout
    starts after an answer and stops at the first byte of the next request, so a client that sends nothing, or its
    headers a byte at a time, would keep its connection (and a place under ``--max-connections``) for ever."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    timeout_answer = _timeout_answer(header_timeout_s)

    class HeadTimedProtocol(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _head_timer: asyncio.TimerHandle | None = None
        _cycle_before_head: Any = None
        _head_begun = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._wait_for_head()

        def data_received(self, data: bytes) -> None:
            self._head_begun = True
            super().data_received(data)
            if self.cycle is not self._cycle_before_head:  # a request's head is complete
                self._stop_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._wait_for_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_head_timer()
            super().connection_lost(exc)

        def _wait_for_head(self) -> None:
            self._stop_head_timer()
            self._cycle_before_head, self._head_begun = self.cycle, False
            self._head_timer = self.loop.call_later(header_timeout_s, self._head_timed_out)

        def _stop_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_timed_out(self) -> None:
            self._head_timer = None
            serving = self.cycle is not None and not self.cycle.response_complete  # a pipelined request
            if self.transport.is_closing() or serving or self.cycle is not self._cycle_before_head:
                return
            if self._head_begun:
                host, port = self.client or ("unknown", 0)
                log.warning("receiver: closed the connection from %s:%s: no complete request head within %g s",
                            host, port, header_timeout_s)
                self.transport.write(timeout_answer)
            self.transport.close()

    return HeadTimedProtocol


def _timeout_answer(header_timeout_s: float) -> bytes:
    body = json.dumps({"detail": f"no complete request head within {header_timeout_s:g} s "
                                 "(tandem receive --header-timeout)"}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: %d\r\n\r\n" % len(body)) + body


def _not_acknowledged(plan: str, stream: str, count: int, exc: Exception) -> NoReturn:
    log.warning("receiver: publishing %d events of %s/%s failed: %s", count, plan, stream, exc)
    raise HTTPException(502, f"NATS did not acknowledge the events ({type(exc).__name__}): send them again") from None


def _line(event: dict[str, Any]) -> bytes | None:
    """The event as the message's payload; ``None`` when it holds a number standard JSON has not (NaN, an infinity:
    :func:`tandem.event_checks.non_finite_problems` says where)."""
    try:
        return json.dumps(event, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except ValueError:  # json.dumps's only ValueError with allow_nan=False
        return None


def _warn_of_lines_nats_cannot_carry(nats: NatsConfig, plans: Mapping[str, PlanConfig]) -> None:
    """Log :func:`line_room_warnings` for the NATS server the receiver publishes to (a warning when it is out of
    reach: the check is skipped, each event is still checked against its ``max_payload``)."""
    try:
        with JetStream(nats, name="tandem-receiver", timeout_s=5) as js:
            max_payload = js.connection.max_payload
    except ConnectionError as exc:
        log.warning("receiver: NATS is out of reach (%s): the streams' max_line_bytes are not checked against its "
                    "max_payload now", exc)
        return
    for warning in line_room_warnings(plans, max_payload):
        log.warning("receiver: %s", warning)


def tokens_from_environment(environ: Mapping[str, str] = os.environ) -> Tokens:
    """The global token (``TANDEM_RECEIVER_TOKEN``) and the scoped tokens of the file ``TANDEM_RECEIVER_TOKENS``.

    Raises:
        TandemError: there is neither (:class:`ConfigError`: the tokens file cannot be read or holds a bad line).
    """
    path = environ.get(TOKENS_FILE_VARIABLE)
    scoped: tuple[tuple[str, str], ...] = ()
    if path:
        try:
            text = FilePath(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(path, "", f"cannot read the receiver's tokens ({TOKENS_FILE_VARIABLE}): "
                                        f"{exc.strerror or exc}") from None
        scoped = parse_tokens_file(text, path)
    tokens = Tokens(environ.get(TOKEN_VARIABLE, ""), scoped)
    if not tokens.everything and not tokens.scoped:
        raise TandemError(f"the receiver needs a token: set {TOKEN_VARIABLE} (every stream), or "
                          f"{TOKENS_FILE_VARIABLE} to a file of '<token> <plan>/<stream>' lines (clients send it as a "
                          "Bearer token)")
    return tokens


def serve(cluster: ClusterConfig, host: str, port: int, *, max_body_bytes: int = MAX_BODY_BYTES,
          header_timeout_s: float = HEADER_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS,
          ssl_certfile: str | None = None, ssl_keyfile: str | None = None) -> None:
    """Serve the receiver until interrupted (``tandem receive``); the tokens come from the environment, HTTPS when
    ``ssl_certfile`` is given. A connection without a complete request head ``header_timeout_s`` after it opened (or
    after its last answer) is closed (:func:`head_timed_protocol`); with ``max_connections`` open, a request on one
    more is answered ``503``. Connections wait on one event loop, never a thread each: a request's parse and publish
    take a worker thread. Its lines are text or JSON (``TANDEM_LOG_FORMAT``, :mod:`tandem.logs`), uvicorn's too."""
    import uvicorn
    from uvicorn.config import LOGGING_CONFIG

    fmt = log_format()
    configure_logging(fmt)
    app = receiver_app(cluster, tokens_from_environment(), max_body_bytes=max_body_bytes)
    # without a config of its own, uvicorn's loggers go through the root logger's JSON handler
    # uvicorn refuses once the open connections, the asking one included, reach limit_concurrency
    uvicorn.run(app, host=host, port=port, log_level="info", log_config=None if fmt == "json" else LOGGING_CONFIG,
                ssl_certfile=ssl_certfile, ssl_keyfile=ssl_keyfile, http=head_timed_protocol(header_timeout_s),
                limit_concurrency=max_connections + 1)
