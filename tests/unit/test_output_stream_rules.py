"""An events output published to a NATS stream: the declaration's rules, and the relay's pure parts (where the
stream's tail is, the messages that publish events after it, what their acknowledgements say)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _conf import edit_yaml
from tandem.config import load_cluster, load_plan
from tandem.declarations import StreamConfig, partition_of
from tandem.errors import ConfigError
from tandem.messaging.wire import Message, parse_headers
from tandem.outputs.relay import (EXPECTED_LAST_SEQUENCE, POSITION_HEADER, RelayError, Tail, messages_after,
                                  round_result, stream_message, tail_of)
from tandem.producer import Destinations, DeclaredGenerator
from tandem.store.outputs import START

OVERDUE = StreamConfig.model_validate({
    "source": "nats", "partitions": 3, "key": "order_no", "event_time": "expiry_time",
    "fields": {"order_no": {"type": "string"}, "expiry_time": {"type": "epoch_millis"}}})


def event(xid: int, event_id: str, order_no: str = "o-1", expiry: object = "2026-11-26T10:00:01.500000+00:00") -> dict:
    return {"xid": xid, "event_id": event_id, "payload": {"order_no": order_no, "expiry_time": expiry, "extra": 1}}


def test_a_message_holds_the_streams_fields_with_times_as_epoch_millis() -> None:
    assert stream_message(OVERDUE, event(1, "a")["payload"]) == {"order_no": "o-1", "expiry_time": 1795687201500}
    assert stream_message(OVERDUE, {"order_no": "o-1", "expiry_time": "2026-11-26T10:00:00"}) == \
        {"order_no": "o-1", "expiry_time": 1795687200000}, "a naive time is UTC"
    assert stream_message(OVERDUE, {"order_no": "o-2"}) == {"order_no": "o-2"}, \
        "a missing field is left out: the reader quarantines the line with the reason"


def test_the_ith_event_after_the_tail_expects_the_tail_plus_i_as_the_streams_last_sequence() -> None:
    events = [event(7, "a", "o-1"), event(7, "b", "o-2"), event(9, "c", "o-3")]
    messages = messages_after(Tail(41, (5, "z")), events, "t", "overdue", OVERDUE)
    assert [dict(m.headers)[EXPECTED_LAST_SEQUENCE] for m in messages] == ["41", "42", "43"]
    assert [dict(m.headers)[POSITION_HEADER] for m in messages] == ["7/a", "7/b", "9/c"]
    assert [m.msg_id for m in messages] == ["a", "b", "c"]
    assert [m.subject for m in messages] == [f"t.overdue.{partition_of(f'o-{n}', 3)}" for n in (1, 2, 3)]
    assert json.loads(messages[2].payload) == {"order_no": "o-3", "expiry_time": 1795687201500}


def test_the_header_block_carries_the_id_and_headers_and_parses_back() -> None:
    message = Message("s.1", b"{}", "id-1", (("Nats-Expected-Last-Sequence", "4"), ("Tandem-Position", "3/x")))
    assert message.header_block() == (b"NATS/1.0\r\nNats-Msg-Id: id-1\r\nNats-Expected-Last-Sequence: 4\r\n"
                                      b"Tandem-Position: 3/x\r\n\r\n")
    assert parse_headers(message.header_block()) == {"Nats-Msg-Id": "id-1", "Nats-Expected-Last-Sequence": "4",
                                                     "Tandem-Position": "3/x"}
    assert Message("s.1", b"{}").header_block() == b""


def test_the_tail_is_the_last_messages_position_or_the_one_recorded_for_that_sequence() -> None:
    assert tail_of("s", 0, None, None) == Tail(0, START)
    assert tail_of("s", 12, {POSITION_HEADER: "99/ev-1"}, (11, (98, "ev-0"))) == Tail(12, (99, "ev-1"))
    assert tail_of("s", 12, None, (12, (99, "ev-1"))) == Tail(12, (99, "ev-1")), "retention dropped the message"
    with pytest.raises(RelayError, match="message 12 is gone .* recorded sequence 11"):
        tail_of("s", 12, None, (11, (98, "ev-0")))
    with pytest.raises(RelayError, match="message 12 has no Tandem-Position header"):
        tail_of("s", 12, {"Nats-Msg-Id": "x"}, None)


def test_a_round_counts_what_it_stored_and_stops_where_another_publisher_got_ahead() -> None:
    events = [event(1, "a"), event(1, "b"), event(2, "c")]
    assert round_result(events, [{"seq": 5}, {"seq": 6}, {"seq": 7}]).last == (7, (2, "c"))
    overtaken = round_result(events, [{"seq": 5}, {"error": {"err_code": 10071}}, {"error": {"err_code": 10071}}])
    assert (overtaken.stored, overtaken.last, overtaken.overtaken) == (1, (5, (1, "a")), True)
    duplicate = round_result(events[:1], [{"seq": 5, "duplicate": True}])
    assert (duplicate.stored, duplicate.last, duplicate.overtaken) == (0, None, False)


def with_published_stream(plan: dict) -> None:
    plan["streams"]["overdue"] = {"source": "nats", "partitions": 2, "key": "order_no", "event_time": "expiry_time",
                                  "fields": {"order_no": {"type": "string"}, "expiry_time": {"type": "epoch_millis"}}}
    plan["outputs"]["overdue_orders"]["stream"] = "overdue"


def test_any_stream_name_may_be_published_to(conf: Path) -> None:
    def hyphenated(plan: dict) -> None:
        with_published_stream(plan)
        plan["streams"]["overdue-orders"] = plan["streams"].pop("overdue")
        plan["outputs"]["overdue_orders"]["stream"] = "overdue-orders"

    edit_yaml(conf / "plans" / "pizza_shop.yaml", hyphenated)
    plan = load_plan("pizza_shop", load_cluster(conf / "cluster.yaml"))
    assert plan.publisher_of("overdue-orders") == "overdue_orders"


def test_an_events_output_publishes_to_one_nats_stream_of_the_plan_that_producers_do_not_write(conf: Path) -> None:
    path = conf / "plans" / "pizza_shop.yaml"
    edit_yaml(path, with_published_stream)
    plan = load_plan("pizza_shop", load_cluster(conf / "cluster.yaml"))
    assert plan.publisher_of("overdue") == "overdue_orders" and plan.publisher_of("orders") is None
    assert sorted(plan.input_streams) == ["deliveries", "orders"]
    assert set(DeclaredGenerator(plan).events(0, 2)) == {"orders", "deliveries"}
    with pytest.raises(ConfigError, match=r"outputs\.overdue_orders\.stream: stream overdue is published by output "
                                          r"overdue_orders: only Tandem writes to it"):
        Destinations(load_cluster(conf / "cluster.yaml"), plan).write("overdue", 0, ["{}"])

    cases = [
        (lambda p: p["outputs"]["overdue_orders"].update(stream="nowhere"),
         r"outputs\.overdue_orders\.stream: no stream 'nowhere' is declared"),
        (lambda p: p["streams"]["overdue"].update(source="files"),
         r"outputs\.overdue_orders\.stream: stream 'overdue' must be a nats stream"),
        (lambda p: p["outputs"]["delivered_orders"].update(stream="overdue"),
         r"outputs\.delivered_orders.*stream: not a setting of a table output \(stream: events\)"),
    ]
    for change, problem in cases:
        edit_yaml(path, with_published_stream)
        edit_yaml(path, change)
        with pytest.raises(ConfigError, match=problem):
            load_plan("pizza_shop", load_cluster(conf / "cluster.yaml"))


def test_an_event_too_large_for_a_message_takes_no_sequence_whatever_the_tail() -> None:
    from tandem.outputs.relay import split_round

    events = [event(7, "a", "o-1"), event(7, "b", "o-" + "x" * 300), event(9, "c", "o-3"), event(9, "d", "o-4")]
    for tail in (Tail(0, START), Tail(9, (5, "z")), Tail(10**12, (5, "z"))):
        planned = split_round(tail, events, "t", "overdue", OVERDUE, 300)
        assert [e["event_id"] for e in planned.published] == ["a", "c", "d"], "the same events, whatever the tail"
        assert [dict(m.headers)[EXPECTED_LAST_SEQUENCE] for m in planned.messages] == [
            str(tail.sequence + i) for i in range(3)], "consecutive sequences: the large one takes none"
        [(large, reason)] = planned.too_large
        assert large["event_id"] == "b" and reason.startswith("the message of ") and \
            "over the NATS server's max_payload (300): not published to stream overdue" in reason
    assert all(len(m.header_block()) + len(m.payload) <= 300 for m in planned.messages)
    assert split_round(Tail(0, START), events, "t", "overdue", OVERDUE, None).too_large == [], "no limit: none"


def test_a_malformed_header_is_a_relay_error() -> None:
    from tandem.outputs.relay import split_round

    with pytest.raises(RelayError, match=r"event 'a\\r\\nX: 1' of stream overdue: a malformed header"):
        split_round(Tail(0, START), [event(7, "a\r\nX: 1")], "t", "overdue", OVERDUE, None)
    for text in ("not a position", "12", "x/y", "-1/a", ""):
        with pytest.raises(RelayError, match=r"message 8 has (a malformed|no) Tandem-Position header"):
            tail_of("s", 8, {POSITION_HEADER: text}, None)
