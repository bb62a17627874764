"""Fields real events carry (issue 47 §4): a ``boolean`` type, a field reading a JSON key of another name or a path
into nested objects (``from:``), and timestamps as ISO-8601 text or epoch milliseconds. Pure rules: the declaration,
the receiver's checks (on the cases the Spark test runs too: ``tests/support/_field_cases.py``), the producer's and
the relay's lines."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from _conf import edit_yaml
from _field_cases import CASES, LOGINS, T0, VALUES, Case
from tandem.client import _key_of
from tandem.config import json_schemas, load_cluster, load_plan
from tandem.declarations import MAX_EPOCH_MILLIS, FieldConfig, StreamConfig, key_path, partition_of
from tandem.errors import ConfigError
from tandem.event_checks import _NO_ZONE, _WRONG, event_problems, iso_millis, load_json, typed_value
from tandem.outputs.relay import Tail, messages_after, stream_message
from tandem.store.outputs import START
from tandem.producer import DeclaredGenerator, bad_line, event_line

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


# --- the receiver's checks: the cases the runtime's parse is held to ------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_receiver_reads_each_field_at_its_key_and_says_why_a_line_is_bad(case: Case) -> None:
    event = load_json(case.line)
    reason = case.receiver_reason or case.reason
    assert event_problems(LOGINS, event) == (reason.split("; ") if reason else [])
    if reason is None:
        given = {name: LOGINS.value_at(event, name) for name in LOGINS.fields}
        assert {name: config.default if given[name] is None else typed_value(config, given[name])
                for name, config in LOGINS.fields.items()} == case.values


def test_the_cases_cover_every_new_kind_of_value() -> None:
    reasons = " ".join(c.reason or "" for c in CASES)
    for fragment in ("is not a boolean", "without a zone", "is not a timestamp", "between 1970 and 9999",
                     "missing field 'auth.idp'", "duplicate key 'auth.idp'", "field 'a.b'", "'user-id'"):
        assert fragment in reasons, fragment
    assert sum(c.values is not None for c in CASES) >= 8


# --- ISO-8601 text --------------------------------------------------------------------------------------------

OFFSETS = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(lambda minutes: timezone(timedelta(minutes=minutes)))


@settings(max_examples=500, deadline=None)
@given(st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9999, 12, 30)), OFFSETS,
       st.sampled_from(["seconds", "milliseconds", "microseconds"]), st.sampled_from(["T", " ", "t"]))
def test_an_iso_time_is_the_instant_python_reads_in_it(moment: datetime, zone: timezone, timespec: str,
                                                        separator: str) -> None:
    local = moment.replace(tzinfo=zone)
    text = local.isoformat(sep=separator, timespec=timespec)
    assert iso_millis(text) == (datetime.fromisoformat(text) - EPOCH) // timedelta(milliseconds=1)
    assert iso_millis(text.replace("+00:00", "Z")) == iso_millis(text)
    compact = text[:-3] + text[-2:]  # +01:00 -> +0100
    assert iso_millis(compact) == iso_millis(text)


@pytest.mark.parametrize("text, millis", [
    ("1970-01-01T00:00:00Z", 0),
    ("1970-01-01T00:00:00.0009Z", 0),  # past the millisecond: dropped, never rounded up
    ("1969-12-31T23:59:59.9999Z", -1),
    ("9999-12-31T23:59:59.999999999Z", MAX_EPOCH_MILLIS),
    ("2000-02-29T12:00:00-12:30", 951870600000),
    ("0000-03-01T00:00:00Z", -62162035200000),  # year 0 of the proleptic Gregorian calendar is a leap year
])
def test_an_iso_time_to_the_millisecond(text: str, millis: int) -> None:
    assert iso_millis(text) == millis


@pytest.mark.parametrize("text, verdict", [
    ("2026-11-26T10:00:00", _NO_ZONE), ("2026-11-26 10:00:00.5", _NO_ZONE), ("2026-02-29T10:00:00", _WRONG),
    ("2026-11-26T10:00:00ZZ", _WRONG), ("2026-11-26T10:00:00+24:00", _WRONG), ("2026-11-26T10:00:00+01:60", _WRONG),
    (" 2026-11-26T10:00:00Z", _WRONG), ("2026-11-26T10:00:00Z\n", _WRONG), ("2026-11-26T10:00:00.Z", _WRONG),
    ("2026-1-26T10:00:00Z", _WRONG), ("", _WRONG), ("now", _WRONG),
])
def test_text_that_is_no_iso_time_with_a_zone_is_told_apart(text: str, verdict: object) -> None:
    assert iso_millis(text) is verdict


# --- the declaration --------------------------------------------------------------------------------------------

def stream(**fields: dict) -> StreamConfig:
    return StreamConfig.model_validate({"partitions": 2, "key": "k", "event_time": "t",
                                        "fields": {"k": {"type": "string"}, "t": {"type": "epoch_millis"}, **fields}})


def test_from_is_a_key_a_dotted_path_or_a_list_of_keys() -> None:
    declared = stream(a={"type": "string", "from": "user"}, b={"type": "string", "from": "auth.idp"},
                      c={"type": "string", "from": ["auth", "method"]}, d={"type": "string", "from": ["a.b"]},
                      e={"type": "string"})
    assert [declared.fields[n].path(n) for n in "abcde"] == [("user",), ("auth", "idp"), ("auth", "method"),
                                                             ("a.b",), ("e",)]
    assert [declared.fields[n].label(n) for n in "abcde"] == ["user", "auth.idp", "auth.method", "a.b", "e"]


@pytest.mark.parametrize("source, problem", [
    ("a..b", "has an empty key"), (".a", "has an empty key"), ("", "has an empty key"), ([], "expected a key"),
    (["a", ""], "must not be empty"), (5, "expected a key"), (["a", 5], "expected a key"),
    ("x" * 257, "over 256 characters"),
])
def test_a_from_that_names_no_key_is_refused(source: object, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        FieldConfig.model_validate({"type": "string", "from": source})


def test_from_is_read_as_from_only() -> None:
    with pytest.raises(ValidationError, match="source"):
        FieldConfig.model_validate({"type": "string", "source": "user"})


@pytest.mark.parametrize("fields, problem", [
    ({"a": {"type": "string", "from": "user"}, "b": {"type": "long", "from": "user"}},
     "fields 'a' and 'b' both read the key 'user'"),
    ({"user_id": {"type": "long"}, "b": {"type": "long", "from": "user_id"}}, "both read the key 'user_id'"),
    ({"a": {"type": "string", "from": "auth"}, "b": {"type": "string", "from": "auth.idp"}},
     "field 'a' reads the key 'auth' and field 'b' a key inside it"),
    ({"a": {"type": "string", "from": "User"}, "b": {"type": "string", "from": "user"}},
     "the keys 'User' and 'user' differ only in case: Spark cannot address both"),
    ({"a": {"type": "string", "from": "auth.IdP"}, "b": {"type": "string", "from": "auth.idp"}},
     "the keys 'auth.IdP' and 'auth.idp' differ only in case"),
])
def test_two_fields_never_read_one_key(fields: dict, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        stream(**fields)


def test_a_field_and_another_on_a_sibling_path_may_share_an_object() -> None:
    assert stream(a={"type": "string", "from": "auth.idp"}, b={"type": "string", "from": "auth.method"})


@pytest.mark.parametrize("changes, problem", [
    ({"key": "b"}, "a boolean cannot be a partition key"),
    ({"key": "s"}, "a timestamp cannot be a partition key"),
    ({"event_time": "b"}, "must be a field of type epoch_millis or timestamp"),
])
def test_keys_and_event_times_of_the_new_types(changes: dict, problem: str) -> None:
    declared = {"partitions": 2, "key": "k", "event_time": "s",
                "fields": {"k": {"type": "string"}, "s": {"type": "timestamp"}, "b": {"type": "boolean"}}}
    assert StreamConfig.model_validate(declared).fields["s"].column_type == "epoch_millis"
    with pytest.raises(ValidationError, match=problem):
        StreamConfig.model_validate({**declared, **changes})


@pytest.mark.parametrize("checks, problem", [
    ({"at_least": 0}, "a boolean field takes no bounds"), ({"not_empty": True}, "string fields only"),
])
def test_a_boolean_takes_no_checks(checks: dict, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        FieldConfig.model_validate({"type": "boolean", **checks})


@pytest.mark.parametrize("name, problem", [
    ("user", "field 'user' is a reserved word in PostgreSQL; name it otherwise and read the key with from: user"),
    ("user-id", "field 'user-id' must match ^[a-z_][a-z0-9_]{0,62}$ (lower-case letters, digits and _, a column name "
                "as it is); name it so and read the event's key with from: user-id"),
])
def test_a_field_name_sql_cannot_take_points_to_from(conf: Path, name: str, problem: str) -> None:
    plan_file = conf / "plans" / "trades.yaml"
    edit_yaml(plan_file, lambda plan: plan["streams"]["trades"]["fields"].update({name: {"type": "string"}}))
    with pytest.raises(ConfigError) as refused:
        load_plan("trades", load_cluster(conf / "cluster.yaml"))
    assert refused.value.field == f"streams.trades.fields.{name}"
    assert problem in str(refused.value)


def test_a_plan_reading_keys_of_other_names_loads(conf: Path) -> None:
    def logins(plan: dict) -> None:
        declared = plan["streams"]["trades"]
        declared["fields"] = {"symbol": {"type": "string", "from": "sym-bol"},
                              "price": {"type": "double", "from": "quote.price", "greater_than": 0},
                              "quantity": {"type": "long", "from": ["quote", "qty"], "greater_than": 0},
                              "timestamp": {"type": "timestamp", "from": "@timestamp"},
                              "success": {"type": "boolean", "from": "user"}}

    edit_yaml(conf / "plans" / "trades.yaml", logins)
    fields = load_plan("trades", load_cluster(conf / "cluster.yaml")).streams["trades"].fields
    assert fields["price"].path("price") == ("quote", "price") and fields["timestamp"].type == "timestamp"


def test_a_sum_min_or_max_of_a_boolean_is_refused_naming_the_measure(conf: Path) -> None:
    def summed(plan: dict) -> None:
        plan["streams"]["trades"]["fields"]["ok"] = {"type": "boolean"}
        plan["outputs"]["trade_aggregates"]["measures"]["ok_sum"] = {"sum": "ok"}

    edit_yaml(conf / "plans" / "trades.yaml", summed)
    with pytest.raises(ConfigError) as refused:
        load_plan("trades", load_cluster(conf / "cluster.yaml"))
    assert refused.value.field == "outputs.trade_aggregates.measures.ok_sum"
    assert "the sum of 'ok', a boolean field" in str(refused.value)


def test_the_configuration_schema_holds_the_new_options() -> None:
    field = json_schemas()["plans/<name>.yaml"]["$defs"]["FieldConfig"]
    assert {"boolean", "timestamp"} <= set(field["properties"]["type"]["enum"])
    described = json.dumps(field["properties"]["from"])
    assert '"type": "array"' in described and "auth.idp" in described


# --- the lines Tandem writes ------------------------------------------------------------------------------------

def test_a_produced_line_puts_each_field_at_its_key() -> None:
    line = json.loads(event_line(LOGINS, {**VALUES, "at": T0}))
    assert line == {"user": "ann", "user-id": 7, "@timestamp": T0, "auth": {"idp": "google", "method": "pw"},
                    "a.b": 1, "success": True, "region": "0-unknown", "attempts": 3, "device-id": "d1",
                    "channel": "app", "price": 9.5, "seen": 5, "note": "none", "ratio": 1.0}
    assert event_problems(LOGINS, line) == []


def test_generated_events_are_good_and_deliberately_bad_ones_bad() -> None:
    plan = SimpleNamespace(streams={"logins": LOGINS}, outputs={})  # value() reads the stream and outputs only
    generator = DeclaredGenerator(plan, seed=3)  # type: ignore[arg-type]
    rng = random.Random(5)
    for _ in range(200):
        event = {name: generator.value(LOGINS, name, T0) for name in LOGINS.fields}
        assert isinstance(event["success"], bool) and T0 - 1000 <= event["at"] <= T0
        assert event_problems(LOGINS, load_json(event_line(LOGINS, event))) == []
        try:
            broken = load_json(bad_line(LOGINS, event, rng))
        except ValueError:
            continue  # malformed
        assert event_problems(LOGINS, broken), broken


def test_a_client_finds_the_partition_key_where_the_key_field_reads_it() -> None:
    event = {"auth": {"idp": "google"}, "a.b": 5}
    assert _key_of(event, key_path("auth.idp")) == "google" and _key_of(event, key_path(["a.b"])) == 5
    with pytest.raises(KeyError):
        _key_of(event, key_path("auth.method"))


def test_the_relay_writes_an_output_event_as_a_line_of_the_stream_it_feeds() -> None:
    payload = {**VALUES, "at": "2026-11-26T10:00:00+00:00", "extra": 1}
    assert stream_message(LOGINS, payload) == json.loads(event_line(LOGINS, VALUES))
    [message] = messages_after(Tail(0, START), [{"xid": 1, "event_id": "e1", "payload": payload}], "t", "logins",
                               LOGINS)
    assert message.subject == f"t.logins.{partition_of('ann', 2)}"
    assert event_problems(LOGINS, load_json(message.payload)) == []
