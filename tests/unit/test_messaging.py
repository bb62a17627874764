"""The messaging layer's pure parts: NATS frames, JetStream reply subjects, the nats source's offsets and
admission control against a fake stream, losses, and the declarations (no server, no Spark)."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest
import yaml
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from _conf import edit_yaml
from tandem.config import load_cluster, load_plan
from tandem.errors import ConfigError, DataLoss
from tandem.messaging.jetstream import Bounds, check_not_lost, dropped_since, nats_offset
from tandem.messaging.wire import Connection, Frame, ack_sequence, parse_frames, skipped_by_retention
from tandem.sources.nats_reader import NatsStreamReader, SubjectRange


def test_frames_are_parsed_whole_and_a_partial_one_is_left_for_the_next_read() -> None:
    buffer = bytearray(b"PING\r\nMSG a.b 3 _INBOX.x 5\r\nhello\r\nHMSG s.1 7 $JS.ACK.s.c.1.9.9.1.0 12 15\r\n"
                       b"NATS/1.0\r\n\r\nabc\r\nMSG a 1 10\r\n0123")
    frames, used = parse_frames(buffer)
    assert frames == ["PING", Frame("a.b", 3, "_INBOX.x", b"", b"hello"),
                      Frame("s.1", 7, "$JS.ACK.s.c.1.9.9.1.0", b"NATS/1.0\r\n\r\n", b"abc")]
    assert bytes(buffer[used:]) == b"MSG a 1 10\r\n0123"
    assert parse_frames(bytearray(b"MSG a 1 0\r\n\r\n")) == ([Frame("a", 1, "", b"", b"")], 13)


def test_a_payload_may_hold_crlf_and_spaces() -> None:
    frames, _ = parse_frames(bytearray(b"MSG a 1 _R 9\r\nx\r\ny z\r\nw\r\n"))
    assert frames == [Frame("a", 1, "_R", b"", b"x\r\ny z\r\nw")]


def test_the_stream_sequence_and_pending_come_from_the_reply_subject() -> None:
    assert ack_sequence("$JS.ACK.tandem_trades.Xy12.1.42.7.1795693234323659184.3") == (42, 3)
    assert ack_sequence("$JS.ACK.domain.hash.tandem_trades.Xy12.1.42.7.1795693234323659184.0.tok") == (42, 0)
    assert ack_sequence("_INBOX.abc") is None


@pytest.mark.parametrize("covered, bounds, lost", [
    (0, Bounds(0, 0, 0), None),            # a new, empty stream
    (0, Bounds(1, 50, 50), None),          # everything still there
    (10, Bounds(11, 50, 40), None),        # the first message it needs is the first held
    (50, Bounds(51, 50, 0), None),         # everything expired, but it had read everything
    (10, Bounds(31, 50, 20), "messages 11..30 are gone"),
    (10, Bounds(61, 60, 0), "messages 11..60 are gone"),  # all expired, some never read
    (80, Bounds(1, 50, 50), "holds sequences up to 50, but 80 were read"),  # deleted and made again
])
def test_a_loss_is_every_sequence_after_the_offset_that_the_stream_no_longer_holds(covered: int, bounds: Bounds,
                                                                                    lost: str | None) -> None:
    if lost is None:
        check_not_lost("s", covered, bounds)
    else:
        with pytest.raises(DataLoss, match=lost):
            check_not_lost("s", covered, bounds)


MADE = "2026-12-01T10:00:00.123456789Z"
"""When the fake stream was made."""


class FakeJetStream:
    """A stream's bounds, as the reader's driver side asks for them."""

    def __init__(self, first: int, last: int) -> None:
        self.held = Bounds(first, last, max(last - first + 1, 0), MADE)

    def bounds(self, stream: str) -> Bounds:
        return self.held

    def close(self) -> None:
        pass


def test_a_backfill_needs_every_message_published_since_its_start() -> None:
    from datetime import datetime, timezone

    start = datetime(2026, 11, 26, 10, tzinfo=timezone.utc)
    whole = {"first_seq": 1, "first_ts": "2026-11-26T09:00:00Z", "messages": 50}
    assert dropped_since("s", whole, start) is None, "nothing was ever dropped"
    older = {"first_seq": 40, "first_ts": "2026-11-26T09:59:59.999999999Z", "messages": 11}
    assert dropped_since("s", older, start) is None, "only messages published before the start were dropped"
    newer = {"first_seq": 40, "first_ts": "2026-11-26T10:00:00.5Z", "messages": 11}
    assert dropped_since("s", newer, start) == (
        "JetStream stream s no longer holds sequences 1..39 (its retention dropped them; the oldest it holds, 40, was "
        "published at 2026-11-26T10:00:00.500000+00:00): messages published at or after 2026-11-26T10:00:00+00:00 "
        "may be among them")
    empty = {"first_seq": 51, "first_ts": "0001-01-01T00:00:00Z", "messages": 0}
    assert "holds no message any more (its retention dropped sequences 1..50)" in dropped_since("s", empty, start)


def reader(first: int = 1, last: int = 1000, max_events: int = 100) -> NatsStreamReader:
    made = NatsStreamReader({"servers": "nats://127.0.0.1:1", "stream": "t_trades",
                             "subjects": '["t.trades.0", "t.trades.2"]', "max_events_per_trigger": str(max_events)})
    made._js = FakeJetStream(first, last)
    return made


def test_a_new_query_starts_at_the_first_message_held_and_batches_are_bounded() -> None:
    source = reader(first=201, last=1000, max_events=100)
    start = source.initialOffset()
    assert start == {"stream": "t_trades", "seq": 200, "created": MADE}
    assert source.getDefaultReadLimit() == ReadMaxRows(100)
    end = source.latestOffset(start, ReadMaxRows(100))
    assert end == {"stream": "t_trades", "seq": 300, "created": MADE}
    assert source.latestOffset(start, ReadAllAvailable()) == {"stream": "t_trades", "seq": 1000, "created": MADE}
    assert source.partitions(start, end) == [SubjectRange("t.trades.0", 201, 300, MADE),
                                             SubjectRange("t.trades.2", 201, 300, MADE)]
    assert source.partitions(end, end) == []


def test_available_now_stops_at_the_last_sequence_when_the_query_started() -> None:
    source = reader(first=1, last=500, max_events=1000)
    source.prepareForTriggerAvailableNow()
    source._js = FakeJetStream(1, 900)  # more was published since
    assert source.latestOffset({"stream": "t_trades", "seq": 0}, ReadAllAvailable())["seq"] == 500
    assert source.latestOffset({"stream": "t_trades", "seq": 500}, ReadAllAvailable())["seq"] == 500


def test_a_lost_range_fails_the_batch_before_it_is_planned() -> None:
    with pytest.raises(DataLoss, match=r"t_trades: messages 11\.\.99 are gone"):
        reader(first=100, last=200).latestOffset({"stream": "t_trades", "seq": 10}, ReadMaxRows(50))


def test_an_offset_of_a_stream_made_at_another_time_fails_the_batch_and_one_without_a_time_is_checked_by_sequence(
        ) -> None:
    """Issue 60: the stream was deleted and made again (it holds more than the offset, so its sequences alone do
    not show it); an offset from before offsets carried the time goes on by its sequences."""
    old = {"stream": "t_trades", "seq": 30, "created": "2026-11-30T08:00:00Z"}
    with pytest.raises(DataLoss, match=rf"t_trades was made again at {MADE} \(it holds sequences 1\.\.50\), but "
                                       r"sequences up to 30 were read from the stream made at 2026-11-30T08:00:00Z"):
        reader(first=1, last=50).latestOffset(old, ReadAllAvailable())
    unknown = {"stream": "t_trades", "seq": 30}
    assert reader(first=1, last=50).latestOffset(unknown, ReadAllAvailable()) == {
        "stream": "t_trades", "seq": 50, "created": MADE}
    assert nats_offset(old) == ("t_trades", 30, "2026-11-30T08:00:00Z")
    assert nats_offset(unknown) == ("t_trades", 30, None)
    assert nats_offset({"path": "x"}) is None and nats_offset([1]) is None


def test_a_range_read_past_what_retention_dropped_while_it_ran_is_data_loss_naming_the_range() -> None:
    from tandem.messaging import JetStream
    from tandem.messaging.wire import NotHeld

    class Dropped:
        def read(self, stream: str, subject: str, first: int, last: int):
            yield [(1, b"a")]
            raise NotHeld(10, 61, while_read=True)

    js = JetStream.__new__(JetStream)
    js.connection = Dropped()
    with pytest.raises(DataLoss, match=r"^JetStream stream s: messages 10\.\.60 are gone \(its retention dropped them; "
                                       r"while s\.0 was read: it holds 61\.\. now\) before they were read$"):
        list(js.read("s", "s.0", 1, 60))


@pytest.mark.parametrize(("cursor", "delivered", "examined", "head", "skipped"), [
    (10, [11, 13], 13, 1, None),           # gaps of other subjects, the head far behind
    (10, [11, 13], 13, 10, None),          # the head at the fetch's first sequence: nothing below it was skipped
    (10, [10, 11, 12], 12, 13, None),      # contiguous: nothing skipped, wherever the head is
    (10, [], 60, 61, (10, 60)),            # the server jumped past the rest of the range
    (10, [11, 61], 61, 40, (10, 39)),      # a gap below the head: from the first undelivered one to the head
    (10, [10, 12], 12, 100, (11, 12)),     # at most what the fetch read
    (10, [10, 11, 15], 15, 13, (12, 12)),  # 13, 14 are above the head: deleted on purpose or another subject's
])
def test_a_fetch_skipped_what_retention_dropped_only_below_the_streams_first_sequence(
        cursor: int, delivered: list[int], examined: int, head: int, skipped: tuple[int, int] | None) -> None:
    assert skipped_by_retention(cursor, delivered, examined, head) == skipped


def test_a_nats_stream_has_retention_and_event_limits_and_no_file_settings(conf: Path) -> None:
    def to_nats(plan: dict) -> None:
        stream = plan["streams"]["trades"]
        stream.pop("max_files_per_trigger")
        stream.update(source="nats", retention={"max_age": "2 hours", "max_messages": 5000},
                      max_events_per_trigger=500)

    edit_yaml(conf / "plans" / "trades.yaml", to_nats)
    stream = load_plan("trades", load_cluster(conf / "cluster.yaml")).streams["trades"]
    assert (stream.source, stream.retention.max_age_s, stream.retention.max_messages, stream.max_events_per_trigger) \
        == ("nats", 7200.0, 5000, 500)

    edit_yaml(conf / "plans" / "trades.yaml", lambda plan: plan["streams"]["trades"].update(max_files_per_trigger=5))
    with pytest.raises(ConfigError, match=r"trades\.yaml: streams\.trades.*max_files_per_trigger: not a setting of "
                                          r"a nats stream"):
        load_plan("trades", load_cluster(conf / "cluster.yaml"))


def test_a_nats_stream_needs_the_messaging_layer_and_credentials_stay_out_of_cluster_yaml(
        conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    edit_yaml(conf / "plans" / "trades.yaml", lambda plan: (plan["streams"]["trades"].pop("max_files_per_trigger"),
                                                           plan["streams"]["trades"].update(source="nats")))
    edit_yaml(conf / "cluster.yaml", lambda cluster: cluster.pop("nats"))
    with pytest.raises(ConfigError, match=r"trades\.yaml: streams\.trades\.source: a nats stream needs the messaging "
                                          r"layer"):
        load_plan("trades", load_cluster(conf / "cluster.yaml"))
    monkeypatch.setenv("TANDEM_NATS_URL", "tls://user:s3cret@10.0.0.1:4222, nats://10.0.0.2:4222")
    cluster = load_cluster(conf / "cluster.yaml")
    assert cluster.nats.servers == ("tls://user:s3cret@10.0.0.1:4222", "nats://10.0.0.2:4222")
    assert load_plan("trades", cluster).streams["trades"].source == "nats"

    monkeypatch.delenv("TANDEM_NATS_URL")
    edit_yaml(conf / "cluster.yaml", lambda cluster: cluster.update(nats={"servers": ["nats://u:s3cret@h:4222"]}))
    with pytest.raises(ConfigError) as refused:
        load_cluster(conf / "cluster.yaml")
    assert "cluster.yaml: nats.servers" in str(refused.value) and "TANDEM_NATS_URL" in str(refused.value)
    assert "s3cret" not in str(refused.value)


def test_the_shipped_cluster_names_a_nats_server_without_credentials() -> None:
    shipped = yaml.safe_load((Path(__file__).resolve().parents[2] / "conf" / "cluster.yaml").read_text())
    assert shipped["nats"]["servers"] and all("@" not in url for url in shipped["nats"]["servers"])


class FakeSocket:
    """What a server sends, in the chunks given; what the client sends, recorded."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)
        self.sent = bytearray()

    def recv(self, size: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""

    def sendall(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        pass


def connection_over(fake: FakeSocket) -> Connection:
    made = Connection.__new__(Connection)  # no server: the protocol state only
    made.url, made.timeout_s, made._socket = "nats://fake:4222", 1.0, fake
    made._buffer, made._parsed, made._sid, made._inbox = bytearray(), deque(), 1, "_INBOX.me"
    return made


def test_a_range_read_fetches_from_its_pull_consumer_until_nothing_is_pending_and_deletes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fetch's messages come with the stream sequence and what is still pending; a status left over from an
    earlier fetch (``409 Batch Completed``) is not the current fetch's; a gap (7, 8: another subject's) sends one
    look at the stream's first sequence, which is behind the read: nothing was skipped."""
    tokens = iter(["d" * 20, "c" * 8, "i" * 8, "e" * 8])  # inbox, create, stream info, delete requests
    monkeypatch.setattr("tandem.messaging.wire.secrets.token_hex", lambda n: next(tokens))

    def delivery(sequence: int, pending: int) -> bytes:
        reply = f"$JS.ACK.s.C1.1.{sequence}.{sequence}.1795693234323659184.{pending}"
        return f"MSG s.0 2 {reply} 1\r\n{sequence % 10}\r\n".encode()

    def answer(token: str, body: bytes) -> bytes:
        return f"MSG _INBOX.me.r{token} 1 {len(body)}\r\n".encode() + body + b"\r\n"

    done = b"NATS/1.0 409 Batch Completed\r\n\r\n"
    fake = FakeSocket(answer("c" * 8, b'{"name": "C1", "num_pending": 3}'),
                      delivery(5, 2) + delivery(6, 1),
                      f"HMSG _INBOX.{'d' * 20}.0 2 {len(done)} {len(done)}\r\n".encode() + done + b"\r\n"
                      + delivery(9, 0),
                      answer("i" * 8, b'{"state": {"first_seq": 3}}'), answer("e" * 8, b"{}"))
    got = list(connection_over(fake).read("s", "s.0", 5, 9, chunk=2))
    assert got == [[(5, b"5"), (6, b"6")], [(9, b"9")]]
    assert fake.sent.count(b"CONSUMER.MSG.NEXT.s.C1") == 2 and b"STREAM.INFO.s " in fake.sent
    assert b"CONSUMER.DELETE.s.C1" in fake.sent and b"UNSUB 2" in fake.sent


def test_the_client_sends_each_event_to_its_keys_partition_with_a_stable_id() -> None:
    from tandem.client import content_id

    assert content_id({"b": 1, "a": 2}) == content_id({"a": 2, "b": 1}) != content_id({"a": 2, "b": 2})
    assert len(content_id({"a": 1})) == 32


@pytest.mark.parametrize(("servers", "address"), [
    (("nats://127.0.0.1:4222",), ("127.0.0.1", 4222)),
    (("nats://10.1.2.3:4222", "nats://localhost:4333"), ("localhost", 4333)),
    (("tls://localhost",), ("localhost", 4222)),
    (("nats://nats.example.com:4222",), ("127.0.0.1", None)),
    ((), ("127.0.0.1", None)),
])
def test_an_embedded_server_takes_the_first_local_address_configured_else_a_free_port(
        servers: tuple[str, ...], address: tuple[str, int | None]) -> None:
    from tandem.messaging.server import embedded_address

    assert embedded_address(servers) == address


class FlakyReads:
    """JetStream connections whose ``read`` breaks once after the first chunk, as a partition would."""

    def __init__(self, messages: dict[int, bytes], chunk: int) -> None:
        self.messages, self.chunk, self.broken, self.connections = messages, chunk, False, 0

    def __call__(self, servers, name: str, options=None) -> "FlakyReads":
        self.connections += 1
        if self.connections == 2:  # the first retry finds the server unreachable
            raise ConnectionError("NATS at nats://127.0.0.1:1: TimeoutError: timed out")
        return self

    def __enter__(self) -> "FlakyReads":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def bounds(self, stream: str) -> Bounds:
        return Bounds(1, max(self.messages), len(self.messages))

    def read(self, stream: str, subject: str, first: int, last: int):
        held = [(s, p) for s, p in sorted(self.messages.items()) if first <= s <= last]
        for index in range(0, len(held), self.chunk):
            yield held[index:index + self.chunk]
            if not self.broken:
                self.broken = True
                raise TimeoutError("timed out")


def test_a_read_cut_off_from_nats_waits_and_goes_on_after_the_last_message_it_yielded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import tandem.sources.nats_reader as source_module

    messages = {seq: f'{{"n": {seq}}}'.encode() for seq in range(1, 11)}
    flaky = FlakyReads(messages, chunk=4)
    monkeypatch.setattr(source_module, "JetStream", flaky)
    monkeypatch.setattr(source_module.time, "sleep", lambda seconds: None)
    batches = list(reader().read(SubjectRange("t.trades.0", 1, 10)))
    assert [line for batch in batches for line in batch.column("raw").to_pylist()] == [
        p.decode() for p in messages.values()], "every message once, in order"
    assert flaky.connections == 3


def test_nats_unreachable_past_the_deadline_fails_the_query_naming_the_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    import tandem.sources.nats_reader as source_module

    def unreachable(servers, name: str, options=None):
        raise ConnectionError("NATS at nats://127.0.0.1:1: ConnectionRefusedError")

    clock = iter(range(0, 1000, 30))
    monkeypatch.setattr(source_module, "JetStream", unreachable)
    monkeypatch.setattr(source_module.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(source_module.time, "monotonic", lambda: next(clock))
    source = reader()
    source._js = None
    with pytest.raises(ConnectionError, match=r"t_trades: NATS did not answer for 120 s"):
        source.latestOffset({"stream": "t_trades", "seq": 0}, ReadMaxRows(10))


def test_messages_become_lines_with_their_subject_and_sequence_and_invalid_utf8_is_replaced() -> None:
    from tandem.sources.nats_reader import arrow_batch

    good = arrow_batch("nats:t.trades.0:", [(7, b'{"a": "\xc3\xa9"}'), (9, b"")])
    assert good.to_pydict() == {"raw": ['{"a": "é"}', ""], "source_file": ["nats:t.trades.0:7", "nats:t.trades.0:9"]}
    mixed = arrow_batch("nats:s.1:", [(1, b"ok"), (2, b"\xff\xfebad")])
    assert mixed.column("raw").to_pylist() == ["ok", "\ufffd\ufffdbad"]
    assert mixed.column("source_file").to_pylist() == ["nats:s.1:1", "nats:s.1:2"]
