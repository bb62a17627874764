"""The receiver behind real sockets: ``tandem receive`` processes (uvicorn) in front of a real nats-server.

Each receiver serves a private copy of conf/ whose ``trades`` stream is fed over NATS, with the global token,
a tokens file of scoped tokens and a small body cap (the module's: a 2 s header timeout and 4 connections too).
Requests go over plain sockets when a test must control how the body is sent (a 25 MB body without a token, a
``Content-Length`` and no body, a chunked body), or when it sends nothing or its head a byte at a time.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from _project import PROJECT
from tandem.messaging import JetStream, stream_name
from tandem.messaging.server import EmbeddedServer, free_port, start_server
from tandem.receiver import MAX_DEPTH, MAX_EVENTS

pytestmark = pytest.mark.integration
TOKEN = "global-7f3a9c1e5b2d4a6f"
SCOPED = "scoped-trades-0c8e2b4d6f1a3c5e"  # trades/trades only
PLAN_WIDE = "plan-wide-9d1f3b5a7c2e4f6a"  # trades/*
WRONG = "not-a-token-4e6a8c0b2d"
MAX_BODY = 256 * 1024
HEADER_TIMEOUT_S = 2
MAX_CONNECTIONS = 4
EVENTS = "/v1/plans/trades/streams/trades/events"
T0 = 1_740_830_400_000


@dataclass
class Receiver:
    """A running ``tandem receive``: where it answers, its process, its log and the subject prefix it publishes to."""

    url: str
    port: int
    process: subprocess.Popen
    log: Path
    prefix: str
    nats_url: str

    def post(self, body: object, token: str | None = TOKEN, **params: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.post(self.url + EVENTS, json=body, headers=headers, params=params, timeout=30)

    def stored(self) -> list[tuple[dict[str, str], dict]]:
        """``(headers, event)`` of every message the trades stream holds."""
        name = stream_name(self.prefix, "trades")
        with JetStream([self.nats_url]) as js:
            bounds = js.bounds(name)
            found = [js.message(name, sequence) for sequence in range(bounds.first, bounds.last + 1)]
        return [(headers, json.loads(payload)) for headers, payload in filter(None, found)]


def trade(number: int, **extra: object) -> dict:
    return {"symbol": "IBM", "price": 1.5, "quantity": number + 1, "timestamp": T0 + number, **extra}


def receiver_environment(root: Path, nats_url: str) -> tuple[dict[str, str], str]:
    """A private conf/ under ``root`` whose ``trades`` stream is fed over NATS at ``nats_url``, and the environment
    of a ``tandem receive`` serving it (no database: the receiver never opens one); returns it and the prefix."""
    shutil.copytree(PROJECT / "conf", root / "conf")
    prefix = f"t{uuid.uuid4().hex[:10]}"
    cluster_path = root / "conf" / "cluster.yaml"
    cluster = yaml.safe_load(cluster_path.read_text())
    cluster["nats"] = {"servers": [nats_url], "prefix": prefix}
    cluster_path.write_text(yaml.safe_dump(cluster))
    plan_path = root / "conf" / "plans" / "trades.yaml"
    plan = yaml.safe_load(plan_path.read_text())
    for stream in plan["streams"].values():
        stream.pop("max_files_per_trigger", None)
        stream["source"] = "nats"
    plan_path.write_text(yaml.safe_dump(plan))
    tokens = root / "receiver-tokens"
    tokens.write_text(f"# token scope\n{SCOPED} trades/trades\n\n{PLAN_WIDE} trades/*\n")
    environment = {**os.environ, "TANDEM_HOME": str(PROJECT), "TANDEM_CONF_DIR": str(root / "conf"),
                   "TANDEM_STORAGE_ROOT": str(root / "data"), "TANDEM_SCRATCH_DIR": str(root / "scratch"),
                   "TANDEM_DATABASE_URL": "postgresql://nobody@127.0.0.1:9/unused", "TANDEM_NATS_URL": nats_url,
                   "TANDEM_RECEIVER_TOKEN": TOKEN, "TANDEM_RECEIVER_TOKENS": str(tokens)}
    environment.pop("TANDEM_AIRFLOW_URL", None)
    return environment, prefix


def start_receiver(root: Path, nats_url: str, *options: str, scheme: str = "http",
                   verify: ssl.SSLContext | bool = True) -> Receiver:
    """``tandem receive`` on a free port with ``options``; returns once its health check answers."""
    environment, prefix = receiver_environment(root, nats_url)
    port = free_port()
    log = root / "receiver.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "tandem.cli", "receive", "--port", str(port), *options],
                                   env=environment, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    receiver = Receiver(f"{scheme}://127.0.0.1:{port}", port, process, log, prefix, nats_url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"tandem receive exited with {process.returncode}: {log.read_text()[-3000:]}")
        try:
            if httpx.get(receiver.url + "/v1/health", verify=verify, timeout=2).status_code == 200:
                return receiver
        except httpx.HTTPError:
            time.sleep(0.2)
    stop(receiver)
    raise RuntimeError(f"tandem receive did not answer within 60 s: {log.read_text()[-3000:]}")


def stop(receiver: Receiver) -> None:
    if receiver.process.poll() is None:
        os.killpg(receiver.process.pid, signal.SIGTERM)
        try:
            receiver.process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(receiver.process.pid, signal.SIGKILL)
            receiver.process.wait(15)


@pytest.fixture(scope="module")
def receiver(nats_server: EmbeddedServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    started = start_receiver(tmp_path_factory.mktemp("receiver"), nats_server.url, "--max-body-bytes", str(MAX_BODY),
                             "--header-timeout", str(HEADER_TIMEOUT_S), "--max-connections", str(MAX_CONNECTIONS))
    try:
        yield started
    finally:
        stop(started)


# --- plain sockets ---------------------------------------------------------------------------------------------

def exchange(port: int, head: str, body: Iterable[bytes] = (), timeout_s: float = 10.0) -> tuple[int, bytes]:
    """Send a request's head, then its body from another thread, and read the answer as soon as it comes:
    ``(status, body)``. A server that answers before the body is all sent may stop reading it."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)

    def send_body() -> None:
        try:
            for chunk in body:
                sock.sendall(chunk)
        except OSError:
            pass

    sock.sendall(head.encode())
    sender = threading.Thread(target=send_body, daemon=True)
    sender.start()
    try:
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed without an answer: {answer!r}")
            answer += chunk
        head_part, _, rest = answer.partition(b"\r\n\r\n")
        lines = head_part.decode("latin-1").split("\r\n")
        length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
        while len(rest) < length:
            rest += sock.recv(65536)
        sender.join(60)
        return int(lines[0].split()[1]), rest[:length]
    finally:
        sock.close()


def chunked(pieces: Iterable[bytes]) -> Iterator[bytes]:
    for piece in pieces:
        yield f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    yield b"0\r\n\r\n"


def memory_kb(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of a process, in kB."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {line.split(":")[0]: int(line.split()[1]) for line in lines if line.startswith(("VmRSS:", "VmHWM:"))}


# --- 1. authenticate, and cap the body, before reading it -------------------------------------------------------

def test_a_big_body_without_a_token_is_refused_before_a_byte_of_it_is_read(receiver: Receiver) -> None:
    """25 MB of events without a token: 401, and the receiver's peak RSS does not grow by the body (it read none
    of it); the refusal is logged with the client and path, never with the token given."""
    assert receiver.post([trade(0)]).status_code == 200  # every code path of a request has run once
    assert exchange(receiver.port, f"POST {EVENTS} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n", [b"[]"])[0] \
        == 401
    before = memory_kb(receiver.process.pid)
    thousand = b",".join([json.dumps(trade(1, pad="x" * 900)).encode()] * 1000)  # about 1 MB
    body = [b"[" + thousand] + [b"," + thousand] * 24 + [b"]"]
    head = (f"POST {EVENTS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {WRONG}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {sum(map(len, body))}\r\n\r\n")
    status, answer = exchange(receiver.port, head, body, timeout_s=60)
    assert status == 401, answer
    time.sleep(0.5)
    after = memory_kb(receiver.process.pid)
    assert after["VmHWM"] - before["VmHWM"] < 5 * 1024, (before, after)
    assert after["VmRSS"] - before["VmRSS"] < 5 * 1024, (before, after)
    log = receiver.log.read_text()
    assert f"refused POST {EVENTS} from 127.0.0.1" in log
    assert WRONG not in log and TOKEN not in log


def test_a_content_length_over_the_cap_is_refused_at_once(receiver: Receiver) -> None:
    """413 with the token and no byte of the body sent: the receiver does not wait for it."""
    head = (f"POST {EVENTS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n")
    status, answer = exchange(receiver.port, head, timeout_s=5)
    assert status == 413, answer
    assert str(MAX_BODY) in json.loads(answer)["detail"]


def test_a_chunked_body_over_the_cap_is_refused_and_nothing_of_it_is_published(receiver: Receiver) -> None:
    before = len(receiver.stored())
    line = json.dumps(trade(7, pad="y" * 500)).encode()
    pieces = [b"[" + line] + [b"," + line] * (2 * MAX_BODY // len(line)) + [b"]"]
    head = (f"POST {EVENTS} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    status, answer = exchange(receiver.port, head, chunked(pieces))
    assert status == 413, answer
    assert len(receiver.stored()) == before


def test_health_names_no_plan_and_the_api_description_is_not_served_without_a_token(receiver: Receiver) -> None:
    assert httpx.get(receiver.url + "/v1/health").json() == {"status": "ok"}
    assert httpx.get(receiver.url + "/v1/health", headers={"Authorization": f"Bearer {WRONG}"}).json() == \
        {"status": "ok"}
    with_token = httpx.get(receiver.url + "/v1/health", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    assert "trades" in with_token["plans"]
    for path in ("/docs", "/redoc", "/openapi.json", "/nowhere"):
        assert httpx.get(receiver.url + path).status_code == 401, path
    assert httpx.get(receiver.url + "/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


# --- 2. a key twice ---------------------------------------------------------------------------------------------

def test_an_event_with_a_key_twice_is_refused_and_the_others_are_published(receiver: Receiver) -> None:
    good = json.dumps(trade(20))
    twice = good[:-1] + ', "price": -3}'
    nested = good[:-1] + ', "extra": {"a": [1, {"b": 1, "b": 2}]}}'
    answer = httpx.post(receiver.url + EVENTS, content=f"[{twice}, {good}, {nested}]",
                        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["published"] == 1
    assert answer.json()["rejected"] == [{"index": 0, "reasons": ["duplicate key 'price'"]},
                                         {"index": 2, "reasons": ["duplicate key 'b'"]}]


def test_a_body_that_is_not_a_json_array_is_refused_whole(receiver: Receiver) -> None:
    for body in ('{"symbol": "IBM"}', "[{", ""):
        answer = httpx.post(receiver.url + EVENTS, content=body,
                            headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
        assert answer.status_code == 400 and "JSON array" in answer.json()["detail"], (body, answer.text)


# --- 3 and 4. ids: no control character, not too long, no header injection -------------------------------------

def test_ids_with_control_characters_or_too_long_are_refused_and_inject_no_header(receiver: Receiver) -> None:
    events = [trade(30, event_id="fine-1"), trade(31, event_id="x\r\nTandem-Position: 9"),
              trade(32, event_id="e" * 257), trade(33, event_id="tab\there"), trade(34, event_id="del\x7f"),
              trade(35, event_id="é" * 256)]
    answer = receiver.post(events, id_field="event_id")
    assert answer.status_code == 400, answer.text
    assert answer.json()["published"] == 2
    assert answer.json()["rejected"] == [
        {"index": 1, "reasons": ["id field 'event_id' holds a control character (U+000D)"]},
        {"index": 2, "reasons": ["id field 'event_id' is 257 characters long, over 256"]},
        {"index": 3, "reasons": ["id field 'event_id' holds a control character (U+0009)"]},
        {"index": 4, "reasons": ["id field 'event_id' holds a control character (U+007F)"]}]
    stored = receiver.stored()
    assert not [headers for headers, _ in stored if "Tandem-Position" in headers]
    assert {headers["Nats-Msg-Id"] for headers, event in stored if event["quantity"] in (31, 36)} == \
        {"fine-1", "é" * 256}


# --- 7. scoped tokens -------------------------------------------------------------------------------------------

def test_a_scoped_token_sends_to_its_streams_only(receiver: Receiver) -> None:
    assert receiver.post([trade(40)], token=SCOPED).status_code == 200
    assert receiver.post([trade(41)], token=PLAN_WIDE).status_code == 200
    assert receiver.post([trade(42)], token=WRONG).status_code == 401
    for token in (SCOPED, PLAN_WIDE):
        refused = httpx.post(receiver.url + "/v1/plans/pizza_shop/streams/orders/events", json=[trade(43)],
                             headers={"Authorization": f"Bearer {token}"})
        assert refused.status_code == 403, refused.text
    refused = httpx.post(receiver.url + "/v1/plans/trades/streams/other/events", json=[trade(44)],
                         headers={"Authorization": f"Bearer {SCOPED}"})
    assert refused.status_code == 403
    assert httpx.post(receiver.url + "/v1/plans/trades/streams/other/events", json=[trade(44)],
                      headers={"Authorization": f"Bearer {PLAN_WIDE}"}).status_code == 404
    assert httpx.get(receiver.url + "/v1/health", headers={"Authorization": f"Bearer {SCOPED}"}).json() == \
        {"status": "ok", "plans": ["trades"]}
    log = receiver.log.read_text()
    assert SCOPED not in log and PLAN_WIDE not in log


# --- issue 60: what Python alone cannot read is refused per event; time, connections and count are capped ----------

def strict_json(payload: bytes) -> object:
    """``payload`` parsed as standard JSON: ``NaN`` and the infinities refused (Python's parser takes them)."""
    def refuse(constant: str) -> object:
        raise ValueError(f"not standard JSON: {constant}")

    return json.loads(payload, parse_constant=refuse)


def test_an_event_python_cannot_read_is_refused_alone_and_the_others_are_published(receiver: Receiver) -> None:
    """100,000 levels of nesting in an undeclared field, 10**400 in a double and an integer of 5,000 digits: each
    refuses its own event with its reason (Spark quarantines such lines one by one); the events around them, one
    nested as deep as the receiver takes, are published."""
    good = [json.dumps(trade(number)) for number in range(80, 84)]
    deepest = json.dumps(trade(84))[:-1] + ', "extra": ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "}"
    too_deep = json.dumps(trade(85))[:-1] + ', "extra": ' + "[" * 100_000 + "]" * 100_000 + "}"
    huge_double = json.dumps(trade(86, price=10 ** 400))
    long_integer = json.dumps(trade(87))[:-1] + ', "extra": {"n": [' + "7" * 5000 + "]}}"
    events = [good[0], too_deep, good[1], huge_double, good[2], long_integer, good[3], deepest]
    answer = httpx.post(receiver.url + EVENTS, content="[" + ",".join(events) + "]", timeout=60,
                        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text[:2000]
    assert answer.json()["rejected"] == [
        {"index": 1, "reasons": [f"event nested 100001 levels deep: the receiver takes at most {MAX_DEPTH}"]},
        {"index": 3, "reasons": [f"field 'price' must be a finite number (got {str(10 ** 400)[:200]}…)"]},
        {"index": 5, "reasons": ["field 'extra.n[0]' holds an integer of 5000 digits: the receiver reads at most "
                                 f"{sys.get_int_max_str_digits()} (send it as a string)"]}]
    assert answer.json()["published"] == 5
    published = {event["quantity"]: event for _, event in receiver.stored()}
    assert {81, 82, 83, 84, 85} <= set(published) and not {86, 87, 88} & set(published)
    assert published[85]["extra"] == json.loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))


def test_nan_and_infinity_in_an_undeclared_field_are_refused_and_only_standard_json_is_published(
        receiver: Receiver) -> None:
    """Python reads ``NaN``, ``Infinity`` and ``1e400`` (as infinity) but standard JSON has no such number: the
    receiver refuses the event, naming the field, rather than publish text other readers refuse."""
    good = json.dumps(trade(90))
    events = [good[:-1] + ', "extra": {"ratio": NaN}}', good, good[:-1] + ', "extra": [1, -Infinity]}',
              good[:-1] + ', "big": 1e400}']
    answer = httpx.post(receiver.url + EVENTS, content="[" + ",".join(events) + "]",
                        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["published"] == 1
    none = "JSON has no such number"
    assert answer.json()["rejected"] == [
        {"index": 0, "reasons": [f"field 'extra.ratio' must be a finite number (got \"NaN\"): {none}"]},
        {"index": 2, "reasons": [f"field 'extra[1]' must be a finite number (got \"-Infinity\"): {none}"]},
        {"index": 3, "reasons": [f"field 'big' must be a finite number (got \"Infinity\"): {none}"]}]
    name = stream_name(receiver.prefix, "trades")
    with JetStream([receiver.nats_url]) as js:
        bounds = js.bounds(name)
        payloads = [found[1] for sequence in range(bounds.first, bounds.last + 1)
                    if (found := js.message(name, sequence))]
    assert [strict_json(payload) for payload in payloads]  # every message the receiver published is standard JSON


def test_more_events_than_the_limit_are_refused_before_the_rest_of_the_body_is_parsed(receiver: Receiver) -> None:
    """``MAX_EVENTS + 1`` events and then text that is not JSON: 413 for the count, not 400 for the text: the
    receiver stopped parsing at the event past the limit (a body of a million tiny events costs it no more)."""
    body = "[" + "{}," * (MAX_EVENTS + 1) + "not JSON at all" + "[" * 50_000
    answer = httpx.post(receiver.url + EVENTS, content=body,
                        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    assert answer.status_code == 413, answer.text
    assert answer.json()["detail"] == f"more than {MAX_EVENTS} events in one request: send at most {MAX_EVENTS}"
    within = receiver.post([trade(95)] * 3)
    assert within.status_code == 200 and within.json()["published"] == 3


def closed_within(sock: socket.socket, limit_s: float) -> tuple[float, bytes]:
    """Read ``sock`` until the server closes it: ``(seconds it took, what it sent)``; fails past ``limit_s``."""
    started = time.monotonic()
    sock.settimeout(limit_s)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except socket.timeout:
        pytest.fail(f"the receiver kept the connection open over {limit_s} s (got {received!r})")
    return time.monotonic() - started, received


def test_a_connection_that_sends_no_request_head_in_time_is_closed(receiver: Receiver) -> None:
    """Nothing sent: closed after ``--header-timeout``; a head sent a byte at a time: 408, then closed."""
    with socket.create_connection(("127.0.0.1", receiver.port)) as idle:
        took, received = closed_within(idle, HEADER_TIMEOUT_S + 8)
    assert received == b"" and HEADER_TIMEOUT_S - 0.5 < took, took

    slow = socket.create_connection(("127.0.0.1", receiver.port))
    stop_sending = threading.Event()

    def trickle() -> None:
        try:
            for byte in f"GET /v1/health HTTP/1.1\r\nHost: x\r\nX-Padding: {'p' * 200}".encode():
                if stop_sending.wait(0.1):
                    return
                slow.sendall(bytes([byte]))
        except OSError:
            pass

    sender = threading.Thread(target=trickle, daemon=True)
    sender.start()
    try:
        took, received = closed_within(slow, HEADER_TIMEOUT_S + 8)
    finally:
        stop_sending.set()
        sender.join(5)
        slow.close()
    assert received.startswith(b"HTTP/1.1 408 "), received
    assert b"no complete request head within" in received
    assert took < HEADER_TIMEOUT_S + 3, took
    assert receiver.post([trade(96)]).status_code == 200


def threads_of(pid: int) -> int:
    return int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("Threads:")))


def test_connections_over_the_cap_are_refused_and_idle_ones_hold_no_thread(receiver: Receiver) -> None:
    """``--max-connections`` idle connections open: a request on one more gets 503; fifty idle connections wait
    on the event loop without a thread each; once they are gone a request is served."""
    assert receiver.post([trade(97)]).status_code == 200  # the worker threads a request needs are started
    threads = threads_of(receiver.process.pid)
    idle = [socket.create_connection(("127.0.0.1", receiver.port)) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)  # the receiver took them
        refused = receiver.post([trade(98)])
        assert refused.status_code == 503, refused.text
        idle += [socket.create_connection(("127.0.0.1", receiver.port)) for _ in range(50)]
        time.sleep(0.3)
        assert threads_of(receiver.process.pid) <= threads + 1
    finally:
        for sock in idle:
            sock.close()
    deadline = time.monotonic() + 10
    while (answer := receiver.post([trade(99)])).status_code == 503 and time.monotonic() < deadline:
        time.sleep(0.1)  # the receiver sees the closes
    assert answer.status_code == 200, answer.text
    assert 99 not in {event["quantity"] for _, event in receiver.stored()}


# --- 5. NATS's max_payload --------------------------------------------------------------------------------------

SMALL_PAYLOAD = 8192


@pytest.fixture(scope="module")
def small_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    started = start_server(tmp_path_factory.mktemp("small-nats") / "jetstream", max_payload=SMALL_PAYLOAD)
    try:
        yield started
    finally:
        started.stop()


def test_events_over_the_servers_max_payload_are_refused_with_413_naming_the_limit(
        small_nats: EmbeddedServer, tmp_path: Path) -> None:
    receiver = start_receiver(tmp_path, small_nats.url)
    try:
        big = trade(50, pad="z" * SMALL_PAYLOAD)
        answer = receiver.post([trade(51), big])
        assert answer.status_code == 413, answer.text
        assert answer.json()["published"] == 1
        [rejected] = answer.json()["rejected"]
        assert rejected["index"] == 1
        [reason] = rejected["reasons"]
        assert reason.startswith("message of ") and reason.endswith(
            f" bytes is over the NATS server's max_payload ({SMALL_PAYLOAD})")
        mixed = receiver.post([big, trade(52, price=-1)])
        assert mixed.status_code == 400 and len(mixed.json()["rejected"]) == 2
        assert receiver.post([trade(53)]).status_code == 200  # the receiver's connection is fine
        assert sorted(event["quantity"] for _, event in receiver.stored()) == [52, 54]
        log = receiver.log.read_text()  # the declaration allows lines this server cannot carry: said at start
        assert "trades.yaml: streams.trades.max_line_bytes" in log and f"max_payload is {SMALL_PAYLOAD}" in log
    finally:
        stop(receiver)


# --- 6. TLS -----------------------------------------------------------------------------------------------------

def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key: ``(certificate file, key file)``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tandem receiver test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                   .sign(key, hashes.SHA256()))
    cert_file, key_file = folder / "receiver.crt", folder / "receiver.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


def test_the_receiver_serves_https_with_the_certificate_it_is_given(nats_server: EmbeddedServer,
                                                                   tmp_path: Path) -> None:
    cert_file, key_file = self_signed(tmp_path)
    trusted = ssl.create_default_context(cafile=str(cert_file))
    receiver = start_receiver(tmp_path / "tls", nats_server.url, "--ssl-certfile", str(cert_file),
                              "--ssl-keyfile", str(key_file), scheme="https", verify=trusted)
    try:
        answer = httpx.post(receiver.url + EVENTS, json=[trade(60)], headers={"Authorization": f"Bearer {TOKEN}"},
                            verify=trusted)
        assert answer.status_code == 200, answer.text
        with pytest.raises(httpx.HTTPError):  # not plain HTTP
            httpx.get(f"http://127.0.0.1:{receiver.port}/v1/health", timeout=5)
        with pytest.raises(httpx.ConnectError):  # a client that does not trust the certificate
            httpx.get(receiver.url + "/v1/health", timeout=5)
    finally:
        stop(receiver)
