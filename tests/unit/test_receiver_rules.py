"""The receiver's decisions (tokens and scopes, body and message sizes, ids, keys given twice) and the NATS wire
client's refusal of header and subject text that would break its lines: pure functions, no server."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from _conf import edit_yaml
from tandem.config import load_cluster, load_plan, load_plans_and_errors
from tandem.errors import ConfigError, TandemError
from tandem.event_checks import LISTED_NON_FINITE, MAX_ID_CHARS, event_problems, id_problem, leaves, load_json, \
    non_finite_problems
from tandem.messaging.wire import Message, check_header, check_subject
from tandem.receiver import (
    HEADER_ROOM,
    MAX_DEPTH,
    Access,
    TooManyEvents,
    Tokens,
    Unreadable,
    answer_status,
    bearer_token,
    declared_size_problem,
    depth_of,
    line_room_problem,
    line_room_warnings,
    nesting,
    parse_events,
    parse_tokens_file,
    payload_problem,
    tokens_from_environment,
)


# --- tokens -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("header, token", [
    ("Bearer abc", "abc"), ("bearer  abc ", "abc"), ("Basic abc", None), ("", None), ("Bearer", None),
    ("Bearer ", None), ("abc", None),
])
def test_the_bearer_token_is_the_word_after_bearer(header: str, token: str | None) -> None:
    assert bearer_token(header) == token


TOKENS = Tokens("global-token", (("scoped-a", "trades/trades"), ("scoped-a", "pizza/orders"),
                                 ("plan-wide", "trades/*")))


def test_the_global_token_sends_everywhere_and_a_scoped_one_to_its_scopes() -> None:
    assert TOKENS.access("global-token") == Access(everything=True)
    assert TOKENS.access("scoped-a") == Access(scopes=frozenset({"trades/trades", "pizza/orders"}))
    for given in ("", None, "global-toke", "global-token!", "trades/trades", "scoped-a "):
        assert TOKENS.access(given) is None, given
    assert Tokens("", (("only", "p/s"),)).access("") is None


@pytest.mark.parametrize("token, plan, stream, allowed", [
    ("global-token", "anything", "at-all", True),
    ("scoped-a", "trades", "trades", True),
    ("scoped-a", "pizza", "orders", True),
    ("scoped-a", "trades", "other", False),
    ("scoped-a", "pizza", "trades", False),
    ("plan-wide", "trades", "any", True),
    ("plan-wide", "trade", "any", False),
    ("plan-wide", "trades2", "any", False),
])
def test_a_scope_names_one_stream_or_every_stream_of_one_plan(token: str, plan: str, stream: str,
                                                             allowed: bool) -> None:
    access = TOKENS.access(token)
    assert access is not None and access.allows(plan, stream) is allowed


def test_a_scoped_token_sees_the_plans_of_its_scopes() -> None:
    access = TOKENS.access("scoped-a")
    assert access is not None
    assert [plan for plan in ("pizza", "temperatures", "trades") if access.allows_plan(plan)] == ["pizza", "trades"]


def test_a_tokens_file_is_a_token_and_a_scope_a_line() -> None:
    text = "# who may send where\n\nsecret-1 trades/trades\n  secret-1 pizza/*  \nsecret-2\ttrades/*\n"
    assert parse_tokens_file(text, "tokens") == (("secret-1", "trades/trades"), ("secret-1", "pizza/*"),
                                                 ("secret-2", "trades/*"))


@pytest.mark.parametrize("line", ["secret-9", "secret-9 trades", "secret-9 trades/a/b", "secret-9 a/b c/d",
                                  "secret-9 /trades", "secret-9 trades/"])
def test_a_bad_line_of_the_tokens_file_is_named_without_its_token(line: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_tokens_file(f"ok-token trades/trades\n{line}\n", "/etc/tandem/tokens")
    assert str(refused.value).startswith("/etc/tandem/tokens: line 2: expected")
    assert "secret-9" not in str(refused.value)


def test_the_tokens_come_from_the_environment_and_a_receiver_needs_one(tmp_path: Path) -> None:
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text("scoped-1 trades/trades\n")
    assert tokens_from_environment({"TANDEM_RECEIVER_TOKENS": str(tokens_file)}) == \
        Tokens("", (("scoped-1", "trades/trades"),))
    assert tokens_from_environment({"TANDEM_RECEIVER_TOKEN": "g"}) == Tokens("g")
    with pytest.raises(TandemError, match="needs a token"):
        tokens_from_environment({})
    with pytest.raises(ConfigError, match="cannot read the receiver's tokens"):
        tokens_from_environment({"TANDEM_RECEIVER_TOKEN": "g", "TANDEM_RECEIVER_TOKENS": str(tmp_path / "none")})


# --- sizes ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content_length, refused", [
    (None, False), ("0", False), ("1000", False), ("1001", True), (" 1001 ", True), ("-5", False), ("x", False),
])
def test_a_declared_body_over_the_cap_is_refused_before_reading(content_length: str | None, refused: bool) -> None:
    problem = declared_size_problem(content_length, 1000)
    assert (problem is not None) is refused
    if refused:
        assert "over the receiver's limit of 1000 bytes" in problem


def test_a_message_over_max_payload_is_refused_naming_the_limit() -> None:
    assert payload_problem(1000, 1000) is None
    assert payload_problem(1001, 1000) == "message of 1001 bytes is over the NATS server's max_payload (1000)"


@pytest.mark.parametrize("rejected, over_max_payload, status", [(0, 0, 200), (2, 2, 413), (2, 1, 400), (1, 0, 400)])
def test_the_answer_is_413_only_when_every_refusal_is_for_max_payload(rejected: int, over_max_payload: int,
                                                                        status: int) -> None:
    assert answer_status(rejected, over_max_payload) == status


def test_max_line_bytes_is_checked_against_max_payload_less_the_header_room() -> None:
    assert line_room_problem(8192 - HEADER_ROOM, 8192) is None
    problem = line_room_problem(8192 - HEADER_ROOM + 1, 8192)
    assert problem is not None and "max_payload is 8192" in problem and f"max_line_bytes: {8192 - HEADER_ROOM}" in \
        problem


def test_the_start_warnings_name_the_plan_file_and_field_of_the_streams_the_receiver_publishes_to(
        conf: Path) -> None:
    def to_nats(plan: dict) -> None:
        plan["streams"]["trades"].pop("max_files_per_trigger", None)
        plan["streams"]["trades"].update(source="nats", max_line_bytes=4000)

    edit_yaml(conf / "plans" / "trades.yaml", to_nats)
    plans, _ = load_plans_and_errors(load_cluster(conf / "cluster.yaml"))
    file_streams = [f"{plan.path}" for plan in plans.values() if all(s.source != "nats" for s in plan.streams.values())]
    warnings = line_room_warnings(plans, 8192)
    assert [w for w in warnings if "trades.yaml" in w] == []  # 4000 bytes fit
    warnings = line_room_warnings(plans, 4096)
    assert f"{conf / 'plans' / 'trades.yaml'}: streams.trades.max_line_bytes: 4000 bytes is more" in "\n".join(warnings)
    assert not [w for w in warnings for path in file_streams if w.startswith(path)]  # files: not the receiver's


# --- events: the body, keys given twice, ids --------------------------------------------------------------------

def test_the_body_is_a_json_array() -> None:
    assert parse_events(b'[{"a": 1}, 2]') == [{"a": 1}, 2]
    assert parse_events(b' [ ]\n') == [] and parse_events(b'[{"a": NaN}]')[0]["a"] != 0
    assert parse_events('[{"é": "\\u00e9"}]'.encode("utf-16")) == [{"é": "é"}]  # as json.loads reads bytes
    for body in (b'{"a": 1}', b"[{", b"", b"\xff\xfe[", b'"events"', b"[1,]", b"[1 2]", b"[1] x", b"[", b"[[[", b"12"):
        with pytest.raises(ValueError, match="the body is not a JSON array of events"):
            parse_events(body)


def nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_an_element_python_cannot_read_comes_with_its_reason_and_the_others_parse() -> None:
    """Issue 60: one event nested past Python's recursion limit or holding an integer past its digits limit failed
    the whole request (500, or 400 for the body); each is refused alone now."""
    limit = sys.get_int_max_str_digits()
    body = (f'[{{"a": 1}}, {{"x": {nested(100_000)}}}, {{"n": [2, {{"m": -{"7" * (limit + 1)}}}]}}, '
            f'{{"y": {nested(MAX_DEPTH - 1)}}}, {{"z": {nested(MAX_DEPTH)}}}, "]]]", 3]')
    events = parse_events(body.encode())
    assert events[0] == {"a": 1} and events[-2:] == ["]]]", 3]
    assert events[1] == Unreadable(f"event nested 100001 levels deep: the receiver takes at most {MAX_DEPTH}")
    assert events[2] == Unreadable(f"field 'n[1].m' holds an integer of {limit + 1} digits: the receiver reads at "
                                   f"most {limit} (send it as a string)")
    assert events[3] == {"y": json.loads(nested(MAX_DEPTH - 1))}  # as deep as it takes
    assert events[4] == Unreadable(f"event nested {MAX_DEPTH + 1} levels deep: the receiver takes at most {MAX_DEPTH}")


def test_the_count_is_checked_before_the_rest_of_the_body_is_parsed() -> None:
    assert len(parse_events(b"[" + b"{}," * 4 + b"{}]", max_events=5)) == 5
    with pytest.raises(TooManyEvents, match="more than 5 events in one request: send at most 5"):
        parse_events(b"[" + b"{}," * 6 + b"not JSON" + b"[" * 100_000, max_events=5)


@pytest.mark.parametrize("text, depth", [
    ("[]", 1), ("{}", 1), ('{"a": [1, {"b": []}]}', 4), ('["[[[[", "\\"]]]"]', 1), ('[[], [[]], {"k": "}"}]', 3),
    (nested(MAX_DEPTH + 1), MAX_DEPTH + 1), ("[" + "[], " * 5000 + "[]]", 2),
])
def test_the_depth_of_a_json_text_counts_brackets_outside_strings(text: str, depth: int) -> None:
    assert depth_of(text) == depth
    assert nesting(f"[{text}, 1]", 1) == (depth, len(text) + 1)


def test_nesting_needs_an_array_or_object_that_ends() -> None:
    assert nesting("[[1]]]", 1) == (1, 4)  # a run of closing brackets may close what is around the value too
    for text in ("[1", '["]"', "1"):
        with pytest.raises(ValueError, match="the body is not a JSON array of events"):
            nesting(text, 0)


def test_the_values_of_an_event_are_walked_with_their_paths_however_deep() -> None:
    assert list(leaves({"a": 1, "b": {"c": [2, {"d": None}]}, "e": []})) == [("a", 1), ("b.c[0]", 2),
                                                                              ("b.c[1].d", None)]
    deep: list = []
    holder = deep
    for _ in range(5000):
        holder.append([])
        holder = holder[0]
    holder.append(7)
    assert list(leaves(deep)) == [("[0]" * 5001, 7)]


def test_numbers_json_has_not_are_named_by_their_path() -> None:
    """Python reads NaN, Infinity and 1e400; the receiver publishes standard JSON only (issue 60)."""
    event = load_json('{"a": 1.5, "b": {"c": [NaN, 2]}, "d": -Infinity, "e": 1e400}')
    none = "JSON has no such number"
    assert non_finite_problems(event) == [
        f"field 'b.c[0]' must be a finite number (got \"NaN\"): {none}",
        f"field 'd' must be a finite number (got \"-Infinity\"): {none}",
        f"field 'e' must be a finite number (got \"Infinity\"): {none}"]
    assert non_finite_problems({"a": [1.0, 10 ** 400, "NaN"]}) == []
    many = non_finite_problems({"x": [float("nan")] * (LISTED_NON_FINITE + 3)})
    assert len(many) == LISTED_NON_FINITE + 1 and many[-1] == "and 3 more numbers that are not finite"


GOOD = '{"symbol": "IBM", "price": 1.5, "quantity": 2, "timestamp": 1740830400000'


@pytest.mark.parametrize("text, reason", [
    (GOOD + "}", None),
    (GOOD + ', "price": 3}', "duplicate key 'price'"),
    (GOOD + ', "symbol": "X", "price": 3, "price": 4}', "duplicate key 'price'; duplicate key 'symbol'"),
    (GOOD + ', "price": 3, "extra": {"a": 1, "a": 2}}', "duplicate key 'price'"),  # the event's own first
    (GOOD + ', "extra": {"a": 1, "a": 2}}', "duplicate key 'a'"),
    (GOOD + ', "extra": [[{"b": 1}, {"b": 1, "b": 2}]]}', "duplicate key 'b'"),
    (GOOD + ', "extra": {"deep": {"c": {"d": 1, "d": 1}}}}', "duplicate key 'd'"),
    (GOOD + ', "extra": [{"b": 1}, {"b": 2}]}', None),  # the same key in two objects
])
def test_a_key_given_twice_refuses_its_event(conf: Path, text: str, reason: str | None) -> None:
    stream = load_plan("trades", load_cluster(conf / "cluster.yaml")).streams["trades"]
    [event, other] = load_json(f"[{text}, {GOOD}}}]")
    assert event_problems(stream, event) == (reason.split("; ") if reason else [])
    assert event_problems(stream, other) == []
    assert type(other) is dict


@pytest.mark.parametrize("value, reason", [
    ("order-1", None), (42, None), ("é" * MAX_ID_CHARS, None), ("x" * MAX_ID_CHARS, None),
    (None, "no id: field 'id' is missing"), ("", "no id: field 'id' is missing"),
    ("x\r\nTandem-Position: 9", "id field 'id' holds a control character (U+000D)"),
    ("a\nb", "id field 'id' holds a control character (U+000A)"),
    ("nul\u0000", "id field 'id' holds a control character (U+0000)"),
    ("del\x7f", "id field 'id' holds a control character (U+007F)"),
    ("x" * (MAX_ID_CHARS + 1), f"id field 'id' is {MAX_ID_CHARS + 1} characters long, over {MAX_ID_CHARS}"),
])
def test_an_id_has_no_control_character_and_is_not_too_long(value: object, reason: str | None) -> None:
    assert id_problem("id", value) == reason


# --- the wire client --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, value", [
    ("Nats-Msg-Id", "x\r\nTandem-Position: 9"), ("Nats-Msg-Id", "x\ny"), ("Nats-Msg-Id", "x\ry"),
    ("Nats-Msg-Id", "x\u0000"), ("Bad\r\nName", "v"), ("Bad: Name", "v"), ("Bad Name", "v"), ("", "v"),
])
def test_a_header_that_would_break_its_line_is_refused(name: str, value: str) -> None:
    with pytest.raises(ValueError, match="NATS header"):
        check_header(name, value)
    with pytest.raises(ValueError, match="NATS header"):
        Message("s.1", b"{}", None, ((name, value),)).header_block()


def test_a_message_id_that_would_inject_a_header_is_refused_and_good_headers_pass() -> None:
    with pytest.raises(ValueError, match="CR, LF or NUL"):
        Message("s.1", b"{}", "x\r\nTandem-Position: 9").header_block()
    assert Message("s.1", b"{}", "id-é 1", (("Tandem-Position", "9"),)).header_block() == \
        "NATS/1.0\r\nNats-Msg-Id: id-é 1\r\nTandem-Position: 9\r\n\r\n".encode()
    assert Message("s.1", b"{}").header_block() == b""


@pytest.mark.parametrize("subject", ["", "a b", "a\r\nPUB x 1", "a\tb", "a\u0000"])
def test_a_subject_that_would_break_the_protocol_line_is_refused(subject: str) -> None:
    with pytest.raises(ValueError, match="NATS subject"):
        check_subject(subject)
    check_subject("tandem.trades.1")
