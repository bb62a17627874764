"""The NATS frame parser against hostile bytes (issue 46 §3.6): every size and field is checked, and anything
malformed is a ``ProtocolError``, never another exception, a wrong frame or a buffer that grows without end
(pure; hypothesis, derandomized)."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.messaging.wire import (
    MAX_CONTROL_LINE, Connection, Frame, ProtocolError, ack_sequence, parse_frames,
)

SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, database=None)
LIMIT = 1024


def frame_bytes(frame: Frame) -> bytes:
    """How a server sends ``frame``."""
    reply = f" {frame.reply}" if frame.reply else ""
    if frame.headers:
        return (f"HMSG {frame.subject} {frame.sid}{reply} {len(frame.headers)} "
                f"{len(frame.headers) + len(frame.payload)}\r\n").encode() + frame.headers + frame.payload + b"\r\n"
    return f"MSG {frame.subject} {frame.sid}{reply} {len(frame.payload)}\r\n".encode() + frame.payload + b"\r\n"


tokens = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FF, exclude_characters="\x7f"), min_size=1,
                 max_size=12)
header_blocks = st.one_of(st.just(b""), st.lists(st.tuples(st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,10}", fullmatch=True),
                                                           st.from_regex(r"[ -~]{0,20}", fullmatch=True)),
                                                 max_size=3).map(
    lambda pairs: ("NATS/1.0\r\n" + "".join(f"{n}: {v}\r\n" for n, v in pairs) + "\r\n").encode()))
frames = st.builds(Frame, st.lists(tokens, min_size=1, max_size=3).map(".".join), st.integers(1, 10**6),
                   st.one_of(st.just(""), tokens), header_blocks, st.binary(max_size=200))
controls = st.sampled_from(["PING", "PONG", "+OK", "-ERR 'Unknown Subject'", 'INFO {"max_payload": 1024}'])


@SETTINGS
@given(st.lists(st.one_of(frames, controls), max_size=8), st.data())
def test_well_formed_frames_come_back_whole_at_any_cut(sent: list, data: st.DataObject) -> None:
    stream = b"".join(frame_bytes(f) if isinstance(f, Frame) else f.encode() + b"\r\n" for f in sent)
    assert parse_frames(bytearray(stream), LIMIT) == (sent, len(stream))
    cut = data.draw(st.integers(0, len(stream)))
    first, used = parse_frames(bytearray(stream[:cut]), LIMIT)
    rest, _ = parse_frames(bytearray(stream[used:]), LIMIT)
    assert first + rest == sent, "a cut frame is left whole for the next read"


@SETTINGS
@given(st.binary(max_size=300))
def test_any_bytes_parse_or_raise_a_protocol_error(noise: bytes) -> None:
    try:
        parsed, used = parse_frames(bytearray(noise), LIMIT)
    except ProtocolError:
        return
    assert 0 <= used <= len(noise)
    for frame in parsed:
        assert isinstance(frame, str) or (frame.sid >= 0 and len(frame.headers) + len(frame.payload) <= LIMIT)


@SETTINGS
@given(frames, st.sampled_from(["size", "sid", "header size", "fields", "terminator", "operation"]),
       st.sampled_from([b"-1", b"x", b"1.5", b"+3", b"0x10", b"\xff", b"9" * 30, b"\xd9\xa1"]))
def test_a_frame_with_a_field_spoiled_is_refused(frame: Frame, spoiled: str, value: bytes) -> None:
    good = frame_bytes(frame)
    line, _, body = good.partition(b"\r\n")
    parts = line.split(b" ")
    if spoiled == "size":
        parts[-1] = value
    elif spoiled == "sid":
        parts[2] = value
    elif spoiled == "header size":
        parts[-2 if frame.headers else -1] = value
    elif spoiled == "fields":
        parts = parts[:2]
    elif spoiled == "terminator":
        body = body[:-2] + b"XY"
    else:
        parts[0] = parts[0].lower() if value == b"x" else b"MSGX"
    bad = b" ".join(parts) + b"\r\n" + body
    if bad == good:
        return
    try:
        parsed, _ = parse_frames(bytearray(bad), LIMIT)
    except ProtocolError:
        return
    assert parsed == [] or parsed == [frame], f"{bad!r} parsed as {parsed!r}"


@pytest.mark.parametrize("hostile, problem", [
    (b"MSG a 1 -5\r\n", "size"),
    (b"MSG a 1 five\r\nfive\r\n", "size"),
    (b"MSG a 1 +3\r\nabc\r\n", "size"),
    (b"MSG a 1 3 4 5 6\r\nabc\r\n", "fields"),
    (b"MSG a\r\n", "fields"),
    (b"MSG a x 3\r\nabc\r\n", "sid"),
    (b"MSG a 1 2000\r\n", "over"),                        # declared over max_payload and header room: no waiting
    (b"MSG a 1 " + b"9" * 5000 + b"\r\n", "size"),         # a number Python would refuse to convert
    (b"HMSG a 1 10 5\r\nNATS/1.0\r\n\r\n", "header"),      # headers larger than the whole
    (b"HMSG a 1 5 5\r\nabcde\r\n", "header"),              # not a NATS/1.0 block
    (b"HMSG a 1 12 12\r\nNATS/1.0\r\nXY\r\n", "header"),   # no blank line ending the block
    (b"MSG a 1 3\r\nabcXY", "terminator"),                 # the payload is not followed by CRLF
    (b"MSG \xff\xfe 1 3\r\nabc\r\n", "subject"),
    (b"NOPE\r\n", "operation"),
    (b"msg a 1 3\r\nabc\r\n", "operation"),
    (b"MSGA a 1 3\r\nabc\r\n", "operation"),
    (b"I" * (MAX_CONTROL_LINE + 10), "control line"),    # no CRLF ever: the buffer must not grow without end
])
def test_hostile_frames_are_protocol_errors(hostile: bytes, problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem):
        parse_frames(bytearray(hostile), LIMIT)


def test_fields_may_be_apart_by_more_than_one_space_as_a_29_server_sends_them() -> None:
    assert parse_frames(bytearray(b"MSG _INBOX.x.p1.0 1  23\r\n" + b"{" * 23 + b"\r\n"), LIMIT)[0] == [
        Frame("_INBOX.x.p1.0", 1, "", b"", b"{" * 23)]


@pytest.mark.parametrize("reply", ["$JS.ACK.s.c.1.x.9.1.0", "$JS.ACK.s.c.1.-4.9.1.0", "$JS.ACK.s.c.1.4.9.1.",
                                   "$JS.ACK.d.h.s.c.1.4.9.1.zz.tok"])
def test_a_reply_subject_that_does_not_parse_is_no_sequence(reply: str) -> None:
    assert ack_sequence(reply) is None


class FakeSocket:
    def __init__(self, *chunks: bytes) -> None:
        self.chunks, self.sent = list(chunks), bytearray()

    def recv(self, size: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def sendall(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        pass


def over(fake: FakeSocket, inbox_prefix: str = "_INBOX") -> Connection:
    made = Connection.__new__(Connection)
    made.url, made.timeout_s, made._socket, made.max_payload = "nats://fake:4222", 1.0, fake, LIMIT
    made._buffer, made._parsed, made._sid, made._inbox = bytearray(), deque(), 1, f"{inbox_prefix}.me"
    made.inbox_prefix = inbox_prefix
    return made


def test_a_delivery_whose_reply_does_not_parse_fails_the_read_instead_of_ending_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = iter(["d" * 20, "c" * 8, "e" * 8])
    monkeypatch.setattr("tandem.messaging.wire.secrets.token_hex", lambda n: next(tokens))
    answer = b'{"name": "C1", "num_pending": 2}'
    fake = FakeSocket(f"MSG _INBOX.me.r{'c' * 8} 1 {len(answer)}\r\n".encode() + answer + b"\r\n"
                      + b"MSG s.0 2 $JS.ACK.s.C1.1.NaN.5.179.1 1\r\n5\r\n")
    with pytest.raises(ProtocolError, match="reply"):
        list(over(fake).read("s", "s.0", 5, 9))


def test_an_answer_that_is_not_json_is_a_protocol_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tandem.messaging.wire.secrets.token_hex", lambda n: "c" * 8)
    fake = FakeSocket(b"MSG _INBOX.me.rcccccccc 1 5\r\n{nope\r\n")
    with pytest.raises(ProtocolError, match="JSON"):
        over(fake).request("$JS.API.INFO", {})


def test_an_acknowledgement_for_no_message_sent_is_a_protocol_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tandem.messaging.wire.secrets.token_hex", lambda n: "p" * 8)
    fake = FakeSocket(b"MSG _INBOX.me.ppppppppp.7 1 2\r\n{}\r\n")
    with pytest.raises(ProtocolError, match="acknowledgement"):
        over(fake).publish([("s.0", b"x", None)])


def test_the_inbox_prefix_is_the_connections_own(monkeypatch: pytest.MonkeyPatch) -> None:
    tokens = iter(["d" * 10, "c" * 8, "e" * 8])
    monkeypatch.setattr("tandem.messaging.wire.secrets.token_hex", lambda n: next(tokens))
    answer = b'{"name": "C1", "num_pending": 0}'
    fake = FakeSocket(f"MSG _TANDEM_IN.me.r{'c' * 8} 1 {len(answer)}\r\n".encode() + answer + b"\r\n",
                      b"MSG _TANDEM_IN.me.reeeeeeee 1 2\r\n{}\r\n")
    assert list(over(fake, "_TANDEM_IN").read("s", "s.0", 1, 9)) == []
    assert b"SUB _TANDEM_IN.dddddddddd.* 2" in fake.sent and b"_INBOX" not in fake.sent
