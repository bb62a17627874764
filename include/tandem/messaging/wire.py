"""The NATS protocol over one blocking socket: JetStream API requests, pipelined publishing, sequence ranges.

Purpose
    Tandem talks to NATS from plain synchronous code (Spark readers on executors, producers, the
    receiver's request threads, sinks) and moves many small messages. nats-py is asyncio only and
    moves about 10,000 (pull) to 40,000 (push) JetStream messages a second into Python, and about
    10,000 acknowledged publishes, with an asyncio step and a parsed header block per message.
    :class:`Connection` speaks the documented text protocol (``INFO``/``CONNECT``/``SUB``/``PUB``/
    ``HPUB``/``MSG``/``HMSG``/``PING``) with one blocking socket and parses frames out of a buffer:
    several times faster, and nothing to bridge.

How it works
    A request is a ``PUB`` with a reply subject under the connection's inbox (one wildcard
    subscription). :meth:`Connection.publish` pipelines ``HPUB`` frames (the ``Nats-Msg-Id`` header,
    and any other a :class:`Message` carries) with a window of outstanding ones and matches each
    acknowledgement to its message by its reply subject. :meth:`Connection.read` creates an
    ephemeral pull consumer (``AckNone``, deliver by start sequence, the subject as filter) and fetches
    batches of it into an inbox of this connection (``no_wait``: a fetch ends when nothing more is
    there), taking the stream sequence and the consumer's pending count from each message's reply
    subject (``$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>``).
    The server reads the stream only while a fetch runs, so a slow reader is never overtaken unseen:
    after each fetch with a gap, the stream's first sequence tells whether retention may have dropped
    what the server skipped (:func:`skipped_by_retention`). It stops at the first sequence past the
    range or when nothing is pending, and deletes the consumer. Headers of delivered messages are
    skipped, never parsed (:meth:`tandem.messaging.JetStream.message` reads one message with its headers).

    Credentials (:class:`ConnectOptions`): a user and password or a token in the URL, an NKEY seed file or a
    ``.creds`` file (the server's nonce signed: :mod:`tandem.messaging.nkeys`); TLS when the URL's scheme is
    ``tls``, the server requires it, or a CA or client certificate is configured, the server's certificate
    and host name always checked.

What it does not do
    No reconnects (a broken connection fails the call; the nats source and the relay open a new
    one), no TLS before ``INFO`` (``handshake_first``), no WebSocket.
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
import socket
import ssl
from collections import deque
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

from tandem.messaging.nkeys import NkeyError, read_creds_file, read_seed_file
from tandem.redaction import redact_url

CRLF = b"\r\n"
MSG_ID = "Nats-Msg-Id"
DEFAULT_INBOX_PREFIX = "_INBOX"
DEFAULT_MAX_PAYLOAD = 1024 * 1024
"""The largest message (headers and payload) a NATS server takes unless it says otherwise (``max_payload``)."""
_READ_SIZE = 1 << 20
FETCH_MESSAGES = 10_000
"""The most messages one fetch of a range's read asks for."""
FETCH_BYTES = 32 * 1024 * 1024
"""The most bytes one fetch of a range's read asks for (at least four of the server's largest messages): what a
reader holds at once, and how far the server may read ahead of it (nothing, between fetches)."""
_BREAKS_A_HEADER = re.compile(r"[\r\n\0]")
_BREAKS_A_HEADER_NAME = re.compile(r"[\r\n\0:\s]")
_BREAKS_A_SUBJECT = re.compile(r"[\r\n\0\s]")


class ProtocolError(Exception):
    """The server answered with ``-ERR`` or something this reader does not understand."""


class NotHeld(Exception):
    """A range's read skipped sequences the stream no longer held: ``first .. held_from - 1`` went (its retention
    dropped them, or they were deleted) before the server read them, when its consumer started or, ``while_read``,
    at a later fetch (:func:`skipped_by_retention`)."""

    def __init__(self, first: int, held_from: int, *, while_read: bool = False) -> None:
        super().__init__(f"sequences {first}..{held_from - 1} are no longer held")
        self.first, self.held_from, self.while_read = first, held_from, while_read


def skipped_by_retention(cursor: int, delivered: Sequence[int], examined: int, head: int) -> tuple[int, int] | None:
    """The sequences one fetch of a range's read may have skipped because they were gone before the server read
    them (pure): ``(first, last)``, or ``None``.

    The fetch read the stream from ``cursor`` through ``examined`` and delivered ``delivered`` (the sequences of
    its subject, in order); ``head`` is the stream's first sequence after it. A server whose next sequence is no
    longer held goes on from the stream's first, silently. Retention drops a stream's oldest messages: a
    sequence the fetch did not deliver is suspect only below the head, and then it was another subject's, deleted
    on purpose, or dropped before the server read it. Which one cannot be known once it is gone, so from the first
    such sequence up to the head (at most ``examined``) counts as lost. A gap above the head (a message deleted on
    purpose, another subject's) is not a loss.
    """
    expected = cursor
    for sequence in delivered:
        if sequence != expected:
            break
        expected = sequence + 1
    upto = min(head - 1, examined)
    return (expected, upto) if expected <= upto else None


class MessageTooLarge(ProtocolError):
    """A message is over the server's ``max_payload``: it was not sent (the server would drop the connection)."""


def check_header(name: str, value: str) -> None:
    """Raise ``ValueError`` unless ``name: value`` is one header line (pure): CR, LF or NUL in either would end
    the line and let the rest be read as other headers; a name takes no ``:`` or space either."""
    if not name or _BREAKS_A_HEADER_NAME.search(name):
        raise ValueError(f"NATS header name {name[:100]!r}: a name is not empty and holds no CR, LF, NUL, ':' or space")
    if _BREAKS_A_HEADER.search(value):
        raise ValueError(f"NATS header {name}: its value {value[:100]!r} holds CR, LF or NUL")


def check_subject(subject: str) -> None:
    """Raise ``ValueError`` unless ``subject`` is one protocol token (pure): not empty, no space, CR, LF or NUL."""
    if not subject or _BREAKS_A_SUBJECT.search(subject):
        raise ValueError(f"NATS subject {subject[:100]!r}: a subject is not empty and holds no space, CR, LF or NUL")


class Message(NamedTuple):
    """A message to publish: its subject, payload, ``Nats-Msg-Id`` (``None``: none) and other headers."""

    subject: str
    payload: bytes
    msg_id: str | None = None
    headers: tuple[tuple[str, str], ...] = ()

    def header_block(self) -> bytes:
        """The ``NATS/1.0`` header block (``b""`` when the message has no header).

        Raises:
            ValueError: a header name or value holds CR, LF or NUL (:func:`check_header`).
        """
        pairs = ([(MSG_ID, self.msg_id)] if self.msg_id else []) + list(self.headers)
        if not pairs:
            return b""
        for name, value in pairs:
            check_header(name, value)
        return ("NATS/1.0\r\n" + "".join(f"{name}: {value}\r\n" for name, value in pairs) + "\r\n").encode()


def parse_headers(block: bytes) -> dict[str, str]:
    """The headers of a ``NATS/1.0`` header block (pure; a header given twice keeps its first value)."""
    headers: dict[str, str] = {}
    for line in block.decode("utf-8", "replace").split("\r\n")[1:]:
        name, colon, value = line.partition(":")
        if colon and name.strip():
            headers.setdefault(name.strip(), value.strip())
    return headers


class Frame(NamedTuple):
    """One delivered message: its subject, the subscription it came through, its reply subject, header bytes
    (raw) and payload."""

    subject: str
    sid: int
    reply: str
    headers: bytes
    payload: bytes


MAX_CONTROL_LINE = 64 * 1024
"""The longest control line (``INFO`` with its cluster URLs, ``-ERR``, a ``MSG`` line) a server may send: past it
without a CRLF the connection is broken (nothing a server sends is that long)."""
FRAME_HEADER_ROOM = 64 * 1024
"""What a delivered message may carry beyond ``max_payload``: headers the server adds (JetStream statuses)."""
_MAX_DIGITS = 19
_MESSAGE_OPERATIONS = {b"MSG": 4, b"HMSG": 5}
"""A message line's operation and its fields without the optional reply subject."""


def _message_line(line: bytes, max_size: int) -> tuple[str, int, str, int, int]:
    """``(subject, sid, reply, header size, total size)`` of a ``MSG``/``HMSG`` line, every field checked (pure):
    fields are separated by spaces (a 2.9 server sends two where a message has no reply subject)."""
    parts = line.split()
    fields = _MESSAGE_OPERATIONS.get(parts[0]) if parts else None
    if fields is None:
        raise ProtocolError(f"unknown operation {line[:100]!r}")
    if len(parts) != fields and len(parts) != fields + 1:
        raise ProtocolError(f"a {parts[0].decode()} line has {len(parts)} fields, not {fields} or {fields + 1}: "
                            f"{line[:100]!r}")
    numbers = parts[-2:] if fields == 5 else parts[-1:]
    numbers.append(parts[2])
    for token in numbers:  # bytes.isdigit is ASCII only: no sign, no space, no "_"
        if not token.isdigit() or len(token) > _MAX_DIGITS:
            raise ProtocolError(f"a message's size or sid {token[:30]!r} is not a number: {line[:100]!r}")
    total = int(parts[-1])
    header_size = int(parts[-2]) if fields == 5 else 0
    if total > max_size:
        raise ProtocolError(f"a message of {total} bytes is over max_payload and header room ({max_size}): "
                            f"{line[:100]!r}")
    if header_size > total:
        raise ProtocolError(f"a message's header size {header_size} is over its size {total}: {line[:100]!r}")
    try:
        return (parts[1].decode(), int(parts[2]), parts[3].decode() if len(parts) > fields else "", header_size,
                total)
    except UnicodeDecodeError:
        raise ProtocolError(f"a message's subject or reply is not UTF-8: {line[:100]!r}") from None


def _check_header_block(block: bytes, line: bytes) -> None:
    if not block.startswith(b"NATS/1.0") or not block.endswith(b"\r\n\r\n") or len(block) < 12:
        raise ProtocolError(f"a message's header block is not a NATS/1.0 block ending in a blank line: "
                            f"{block[:60]!r} ({line[:100]!r})")


def parse_frames(buffer: bytearray, max_size: int = DEFAULT_MAX_PAYLOAD + FRAME_HEADER_ROOM
                 ) -> tuple[list[Frame | str], int]:
    """The complete frames at the start of ``buffer`` and how many bytes they took (pure).

    A frame is a :class:`Frame` (``MSG``/``HMSG``) or the control line itself (``PING``, ``PONG``,
    ``+OK``, ``-ERR ...``, ``INFO ...``). An incomplete frame at the end is left for the next read.

    Raises:
        ProtocolError: anything malformed, as soon as it is seen: an unknown operation, a missing field, a size
            or sid that is not a plain decimal number, a message declared over ``max_size`` bytes, headers larger
            than the message, a header block that is not ``NATS/1.0 ... CRLF CRLF``, a payload not followed by
            CRLF, a control line over :data:`MAX_CONTROL_LINE` bytes.
    """
    frames: list[Frame | str] = []
    append = frames.append
    find = buffer.find
    position = 0
    size = len(buffer)
    while position < size:
        end = find(CRLF, position, position + MAX_CONTROL_LINE + 2)
        if end < 0:
            if size - position > MAX_CONTROL_LINE:
                raise ProtocolError(f"no control line ends within {MAX_CONTROL_LINE} bytes: "
                                    f"{bytes(buffer[position:position + 60])!r}")
            break
        first = buffer[position]
        if first == 77 or first == 72:  # MSG <subject> <sid> [reply] <size> / HMSG ... <header size> <size>
            line = bytes(buffer[position:end])
            parts = line.split()
            fields = len(parts)
            if first == 77 and (fields == 5 or fields == 4) and parts[0] == b"MSG":  # the usual case, checked inline
                sizes = parts[-1]
                if not (sizes.isdigit() and parts[2].isdigit()) or len(sizes) > _MAX_DIGITS \
                        or len(parts[2]) > _MAX_DIGITS or int(sizes) > max_size:
                    _message_line(line, max_size)  # raises the error that says what is wrong
                total, header_size = int(sizes), 0
                try:
                    subject, sid, reply = parts[1].decode(), int(parts[2]), parts[3].decode() if fields == 5 else ""
                except UnicodeDecodeError:
                    _message_line(line, max_size)
            else:
                subject, sid, reply, header_size, total = _message_line(line, max_size)
            start = end + 2
            stop = start + total
            if stop + 2 > size:
                break
            if buffer[stop] != 13 or buffer[stop + 1] != 10:
                raise ProtocolError(f"a message's payload is not followed by its terminator CRLF: {line[:100]!r}")
            headers = bytes(buffer[start:start + header_size])
            if first == 72:
                _check_header_block(headers, line)
            append(Frame(subject, sid, reply, headers, bytes(buffer[start + header_size:stop])))
            position = stop + 2
        else:
            text = bytes(buffer[position:end]).decode("utf-8", "replace")
            if not (text in ("PING", "PONG", "+OK") or text.startswith(("-ERR", "INFO "))):
                raise ProtocolError(f"unknown operation {text[:100]!r}")
            append(text)
            position = end + 2
    return frames, position


def ack_sequence(reply: str) -> tuple[int, int] | None:
    """``(stream sequence, pending)`` of a JetStream delivery's reply subject (pure); ``None`` for another reply.

    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>`` (v1), or the v2 form with
    ``<domain>.<account hash>`` after ``$JS.ACK`` and a random token at the end.
    """
    tokens = reply.split(".")
    if len(tokens) < 9 or tokens[0] != "$JS" or tokens[1] != "ACK":
        return None
    if len(tokens) >= 12:  # v2: $JS.ACK.<domain>.<hash>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<time>.<pending>.<token>
        sequence, pending = tokens[7], tokens[10]
    else:
        sequence, pending = tokens[5], tokens[8]
    if not (_is_number(sequence) and _is_number(pending)):
        return None
    return int(sequence), int(pending)


def _is_number(token: str) -> bool:
    return token.isascii() and token.isdigit() and len(token) <= 20


def _json(data: bytes | str, what: str) -> Any:
    """``data`` as JSON (an object), or a :class:`ProtocolError` naming ``what`` it was."""
    try:
        found = json.loads(data)
    except ValueError:
        raise ProtocolError(f"{what} is not JSON: {bytes(data[:100]) if isinstance(data, bytes) else data[:100]!r}") \
            from None
    if not isinstance(found, dict):
        raise ProtocolError(f"{what} is not a JSON object: {str(found)[:100]!r}")
    return found


@dataclass(frozen=True)
class ConnectOptions:
    """How to connect besides the URL (which may carry a user and password or a token)."""

    inbox_prefix: str = DEFAULT_INBOX_PREFIX
    """Where replies and deliveries come: ``<inbox_prefix>.<random>.>`` (a server's permissions may allow a user only
    its own prefix)."""
    tls_ca_file: str | None = None
    """The CA certificates the server's is checked against (``None``: the system's, or ``SSL_CERT_FILE`` /
    ``SSL_CERT_DIR``). Any TLS setting makes the connection require TLS."""
    tls_cert_file: str | None = None
    """This client's certificate (PEM), for a server that verifies clients (``tls { verify: true }``)."""
    tls_key_file: str | None = None
    """Its private key (PEM)."""
    nkey_seed_file: str | None = None
    """A user's NKEY seed: the connection signs the server's nonce with it (``authorization { users = [{nkey:
    U...}] }``)."""
    creds_file: str | None = None
    """A ``.creds`` file (a user JWT and its seed) of an operator's account."""

    @property
    def tls(self) -> bool:
        return bool(self.tls_ca_file or self.tls_cert_file)


def tls_context(options: ConnectOptions) -> ssl.SSLContext:
    """The client side of TLS: the server's certificate checked (against ``tls_ca_file``, else the system's
    CAs or ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``) and its host name verified; this client's certificate when
    one is configured."""
    context = ssl.create_default_context(cafile=options.tls_ca_file)
    if options.tls_cert_file:
        context.load_cert_chain(options.tls_cert_file, options.tls_key_file)
    return context


def credentials(options: ConnectOptions, nonce: str) -> dict[str, str]:
    """The ``CONNECT`` fields of an NKEY seed or a ``.creds`` file: the server's nonce signed (``{}``: neither)."""
    if options.creds_file:
        jwt, key = read_creds_file(options.creds_file)
        return {"jwt": jwt, "sig": key.sign_nonce(nonce)}
    if options.nkey_seed_file:
        key = read_seed_file(options.nkey_seed_file)
        return {"nkey": key.public_key, "sig": key.sign_nonce(nonce)}
    return {}


class Connection:
    """One blocking connection to a NATS server (not thread-safe: one per thread)."""

    max_payload: int = DEFAULT_MAX_PAYLOAD
    """The largest message (headers and payload) the server takes, from its ``INFO``."""
    inbox_prefix: str = DEFAULT_INBOX_PREFIX

    def __init__(self, url: str, *, timeout_s: float = 30.0, name: str = "tandem",
                 options: ConnectOptions = ConnectOptions()) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.options = options
        self.inbox_prefix = inbox_prefix = options.inbox_prefix
        check_subject(inbox_prefix)
        parts = urlsplit(url)
        self._buffer = bytearray()
        self._parsed: deque[Frame | str] = deque()
        self._sid = 0
        self._inbox = f"{inbox_prefix}.{secrets.token_hex(8)}"
        self.max_payload = DEFAULT_MAX_PAYLOAD
        try:
            self._socket = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 4222), timeout_s)
            info = self._expect_info()
            max_payload = info.get("max_payload") or DEFAULT_MAX_PAYLOAD
            if not isinstance(max_payload, int) or max_payload <= 0:
                raise ProtocolError(f"the server's INFO says max_payload {max_payload!r}")
            self.max_payload = max_payload
            """The largest message (headers and payload) the server takes, from its ``INFO``."""
            if parts.scheme == "tls" or info.get("tls_required") or options.tls:
                if not (info.get("tls_required") or info.get("tls_available")):
                    raise ProtocolError("TLS is configured (a tls:// URL, a CA or client certificate) but the server "
                                        "offers none")
                self._socket = tls_context(options).wrap_socket(self._socket, server_hostname=parts.hostname)
            connect: dict[str, Any] = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True,
                                       "protocol": 1, "name": name, "lang": "python-tandem", "version": "1",
                                       **credentials(options, str(info.get("nonce") or ""))}
            if parts.username and parts.password is not None:
                connect.update(user=unquote(parts.username), **{"pass": unquote(parts.password)})
            elif parts.username:
                connect["auth_token"] = unquote(parts.username)
            self._send(b"CONNECT " + json.dumps(connect).encode() + CRLF + b"PING" + CRLF)
            self._until_pong()
            self._inbox_sid = self._subscribe(f"{self._inbox}.>")
        except (OSError, ProtocolError, NkeyError) as exc:
            self.close()
            raise ConnectionError(f"NATS at {redact_url(url)}: {type(exc).__name__}: "
                                  f"{str(exc).replace(url, redact_url(url))}") from None

    def close(self) -> None:
        sock = getattr(self, "_socket", None)
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the protocol ----------------------------------------------------------------------------------------

    def _send(self, data: bytes) -> None:
        self._socket.sendall(data)

    def _frames(self) -> Iterator[Frame | str]:
        """Frames as they arrive (parsed ones a caller left are kept for the next); answers the server's
        ``PING``; raises on ``-ERR``."""
        while True:
            while self._parsed:
                frame = self._parsed.popleft()
                if isinstance(frame, str):
                    if frame == "PING":
                        self._send(b"PONG" + CRLF)
                        continue
                    if frame.startswith("-ERR"):
                        raise ProtocolError(frame)
                yield frame
            chunk = self._socket.recv(_READ_SIZE)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self._buffer += chunk
            frames, used = parse_frames(self._buffer, self.max_payload + FRAME_HEADER_ROOM)
            if used:
                del self._buffer[:used]
            self._parsed.extend(frames)

    def _expect_info(self) -> dict[str, Any]:
        for frame in self._frames():
            if isinstance(frame, str) and frame.startswith("INFO "):
                return _json(frame[5:], "the server's INFO")
            raise ProtocolError(f"expected INFO, got {str(frame)[:100]!r}")
        raise ProtocolError("no INFO")

    def _until_pong(self) -> None:
        for frame in self._frames():
            if frame == "PONG":
                return

    def _subscribe(self, subject: str) -> int:
        self._sid += 1
        self._send(f"SUB {subject} {self._sid}".encode() + CRLF)
        return self._sid

    def request(self, subject: str, payload: dict[str, Any]) -> dict[str, Any]:
        """A JetStream API request (JSON in, JSON out); raises :class:`ProtocolError` on an API error."""
        reply = f"{self._inbox}.r{secrets.token_hex(4)}"
        data = json.dumps(payload).encode()
        self._send(f"PUB {subject} {reply} {len(data)}".encode() + CRLF + data + CRLF)
        others: list[Frame | str] = []  # a consumer may deliver before the answer that created it arrives
        for frame in self._frames():
            if not (isinstance(frame, Frame) and frame.subject == reply):
                others.append(frame)
                continue
            self._parsed.extendleft(reversed(others))
            if frame.headers.startswith(b"NATS/1.0 503"):
                raise ProtocolError(f"no JetStream responds to {subject} (is JetStream enabled?)")
            answer = _json(frame.payload, f"the answer to {subject}")
            if "error" in answer:
                raise ProtocolError(f"{subject}: {answer['error'].get('description', answer['error'])}")
            return answer
        raise ProtocolError(f"no answer to {subject}")

    def publish(self, messages: Sequence[Message | tuple[str, bytes, str | None]], *, window: int = 2_000,
                refusals: Collection[int] = ()) -> list[dict[str, Any]]:
        """Publish each message and return JetStream's acknowledgement of each (``{"stream", "seq",
        "duplicate"?}``), in order; at most ``window`` wait for theirs at a time.

        Raises :class:`ProtocolError` when JetStream refuses one (no stream for its subject, a limit), except for
        a refusal whose JetStream error code is in ``refusals``: its acknowledgement is then ``{"error": ...}``;
        :class:`MessageTooLarge` for a message over the server's ``max_payload`` and ``ValueError`` for a subject or
        header that would break the protocol's lines, before sending any message.
        """
        framed = [self._framed(Message(*message)) for message in messages]
        prefix = f"{self._inbox}.p{secrets.token_hex(4)}."
        acks: list[dict[str, Any] | None] = [None] * len(messages)
        frames = self._frames()
        waiting = 0
        sent = 0
        while sent < len(messages) or waiting:
            out = bytearray()
            while sent < len(messages) and waiting < window:
                subject, headers, payload = framed[sent]
                reply = f"{prefix}{sent}"
                if headers:
                    out += (f"HPUB {subject} {reply} {len(headers)} {len(headers) + len(payload)}"
                            .encode() + CRLF + headers + payload + CRLF)
                else:
                    out += f"PUB {subject} {reply} {len(payload)}".encode() + CRLF + payload + CRLF
                sent += 1
                waiting += 1
            if out:
                self._send(bytes(out))
            for frame in frames:
                if isinstance(frame, Frame) and frame.subject.startswith(prefix):
                    index = frame.subject[len(prefix):]
                    if not _is_number(index) or int(index) >= len(messages) or acks[int(index)] is not None:
                        raise ProtocolError(f"an acknowledgement for no message waiting for one: {frame.subject!r}")
                    index = int(index)
                    if frame.headers.startswith(b"NATS/1.0 503"):
                        raise ProtocolError(f"no JetStream stream takes subject {messages[index][0]!r}")
                    ack = _json(frame.payload, f"JetStream's acknowledgement of a message to {messages[index][0]!r}")
                    error = ack.get("error")
                    if error and error.get("err_code") not in refusals:
                        raise ProtocolError(f"publishing to {messages[index][0]!r}: {error.get('description', error)}")
                    acks[index] = ack
                    waiting -= 1
                    if not self._parsed or waiting == 0:
                        break
        return acks  # type: ignore[return-value]

    def _framed(self, message: Message) -> tuple[str, bytes, bytes]:
        """``(subject, header block, payload)`` of a message this server takes; raises as :meth:`publish` says."""
        check_subject(message.subject)
        headers = message.header_block()
        size = len(headers) + len(message.payload)
        if size > self.max_payload:
            raise MessageTooLarge(f"a message of {size} bytes to {message.subject!r} is over the NATS server's "
                                  f"max_payload ({self.max_payload})")
        return message.subject, headers, message.payload

    # --- ranges ----------------------------------------------------------------------------------------------

    def read(self, stream: str, subject: str, first: int, last: int, *,
             chunk: int = FETCH_MESSAGES) -> Iterator[list[tuple[int, bytes]]]:
        """``(stream sequence, payload)`` of the messages of ``subject`` with ``first <= sequence <= last``, in
        order, one list per fetch of at most ``chunk`` messages (and :data:`FETCH_BYTES`).

        Raises:
            NotHeld: the stream no longer held ``first`` when the read began (the consumer's start, as the server
                answers its creation, is past it), or a fetch went past sequences the stream no longer held
                (:func:`skipped_by_retention`, checked after every fetch): messages may be missing, never silently.
        """
        first = max(first, 1)  # sequences start at 1 (an empty stream's bounds say first 0)
        if last < first:
            return
        inbox = f"{self.inbox_prefix}.{secrets.token_hex(10)}"
        sid = self._subscribe(f"{inbox}.*")  # a reply subject per fetch: a status of an earlier one is not this one's
        created = self.request(f"$JS.API.CONSUMER.CREATE.{stream}", {"stream_name": stream, "config": {
            "deliver_policy": "by_start_sequence", "opt_start_seq": first, "ack_policy": "none",
            "filter_subject": subject, "inactive_threshold": 30_000_000_000, "mem_storage": True, "num_replicas": 1}})
        consumer = created["name"]
        try:
            started = (created.get("delivered") or {}).get("stream_seq")
            if isinstance(started, int) and started + 1 > first:  # the server moved the start to its first sequence
                raise NotHeld(first, started + 1)
            if created.get("num_pending", 0) == 0:
                return
            cursor = first  # the sequence the server reads next
            for fetch in itertools.count():
                fetched, ended = self._fetch(stream, consumer, sid, f"{inbox}.{fetch}", chunk)
                found = [message for message in fetched if message[0] <= last]
                ended = ended or len(found) < len(fetched) or (bool(found) and found[-1][0] == last)
                examined = last if ended else found[-1][0]
                delivered = [sequence for sequence, _ in found]
                if len(delivered) != examined - cursor + 1:  # a gap (sequences rise): was it retention's?
                    skipped = skipped_by_retention(cursor, delivered, examined, self._first_sequence(stream))
                    if skipped is not None:
                        raise NotHeld(skipped[0], skipped[1] + 1, while_read=True)
                if found:
                    yield found
                if ended:
                    return
                cursor = examined + 1
        finally:
            try:
                self._send(f"UNSUB {sid}".encode() + CRLF)
                self.request(f"$JS.API.CONSUMER.DELETE.{stream}.{consumer}", {})
            except (OSError, ProtocolError, ConnectionError):
                pass  # it expires by itself (inactive_threshold)

    def _fetch(self, stream: str, consumer: str, sid: int, reply: str, batch: int) -> tuple[list[tuple[int, bytes]],
                                                                                          bool]:
        """One fetch of the pull consumer into ``reply`` (of subscription ``sid``): ``(sequence, payload)`` of up to
        ``batch`` messages, and
        whether the server had no more (the fetch ended before the batch was full, or nothing of the subject is
        pending)."""
        request = json.dumps({"batch": batch, "max_bytes": max(FETCH_BYTES, 4 * self.max_payload),
                              "no_wait": True}).encode()
        self._send(f"PUB $JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer} {reply} {len(request)}".encode() + CRLF
                   + request + CRLF)
        found: list[tuple[int, bytes]] = []
        for frame in self._frames():
            if not isinstance(frame, Frame) or frame.sid != sid:
                continue
            if not frame.reply:  # a status (sent to the fetch's reply subject): the fetch ended
                if frame.subject != reply:  # an earlier fetch's, after its batch was full
                    continue
                status = frame.headers[9:12]
                if status in (b"404", b"408"):  # no more messages
                    return found, True
                if status == b"409" and (b"MaxBytes" in frame.headers or b"Batch Completed" in frame.headers) \
                        and found:
                    return found, False
                if status == b"100":  # a heartbeat
                    continue
                raise ProtocolError(f"a fetch of consumer {consumer} of {stream} ended with "
                                    f"{frame.headers[:100].decode('utf-8', 'replace').strip()!r}")
            parsed = ack_sequence(frame.reply)
            if parsed is None:
                raise ProtocolError(f"a delivery's reply subject does not parse: {frame.reply[:200]!r}")
            sequence, pending = parsed
            found.append((sequence, frame.payload))
            if pending == 0:
                return found, True
            if len(found) >= batch:
                return found, False
        raise ProtocolError(f"no answer to a fetch of consumer {consumer} of {stream}")

    def _first_sequence(self, stream: str) -> int:
        """The first sequence the stream holds now."""
        return int(self.request(f"$JS.API.STREAM.INFO.{stream}", {})["state"]["first_seq"])
