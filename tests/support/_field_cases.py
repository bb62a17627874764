"""Lines of a login stream whose fields read keys of other names (``from:``), a boolean and a timestamp, each with
what it must give: the row's values (by declared name) or the reason it is refused. The same cases run through the
receiver's checks in Python (``tests/unit/test_event_field_rules.py``) and the runtime's parse on Spark
(``tests/integration/test_event_fields.py``): the two implementations of one rule must agree on every one."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tandem.declarations import EXPECTED, MAX_EPOCH_MILLIS, StreamConfig

LOGINS = StreamConfig.model_validate({
    "partitions": 2, "key": "user_name", "event_time": "at",
    "fields": {
        "user_name": {"type": "string", "from": "user"},  # a reserved word of PostgreSQL as a key
        "user_id": {"type": "long", "from": "user-id", "formerly": "userId"},  # not an identifier
        "at": {"type": "timestamp", "from": "@timestamp", "formerly": "time"},
        "idp": {"type": "string", "from": "auth.idp"},  # a path into a nested object
        "method": {"type": "string", "from": ["auth", "method"]},  # the same, as a list of keys
        "dotted": {"type": "long", "from": ["a.b"], "at_least": 0},  # one key holding a dot
        "success": {"type": "boolean", "formerly": "ok"},
        "region": {"type": "string", "default": "0-unknown"},  # added by a producer: older lines lack it
        "attempts": {"type": "long", "default": 1, "at_least": 1},
        "device": {"type": "string", "from": "device-id", "formerly": "deviceId"},  # renamed by the producer
        "channel": {"type": "string", "default": "web", "required_since": "2026-11-26T10:00:00Z"},  # required at T0
        "price": {"type": "double", "formerly": "cost"},  # a renamed key of each type, with user_id, at, success
        "seen": {"type": "epoch_millis", "formerly": "seen_at"},
        "note": {"type": "string", "not_empty": True, "max_length": 8, "default": "none"},  # string checks' values
        "ratio": {"type": "double", "less_than": 10, "default": 1.0},  # numbers' values, as Python writes them
    }})
T0 = 1795687200000
"""2026-11-26T10:00:00Z in epoch milliseconds."""
GOOD = {"user": "ann", "user-id": 7, "@timestamp": "2026-11-26T10:00:00Z", "auth": {"idp": "google", "method": "pw"},
        "a.b": 1, "success": True, "attempts": 3, "device-id": "d1", "channel": "app", "price": 9.5, "seen": 5}
VALUES = {"user_name": "ann", "user_id": 7, "at": T0, "idp": "google", "method": "pw", "dotted": 1, "success": True,
          "region": "0-unknown", "attempts": 3, "device": "d1", "channel": "app", "price": 9.5, "seen": 5,
          "note": "none", "ratio": 1.0}
NOT_A_TIMESTAMP = "field '@timestamp' is not a timestamp (epoch milliseconds, or ISO-8601 text with Z or an offset): "
OUT_OF_RANGE = "field '@timestamp' must be a time between 1970 and 9999 (got "


@dataclass(frozen=True)
class Case:
    """A line and what it gives: ``values`` (a good line) or ``reason`` (Spark's and the receiver's), and
    ``receiver_reason`` where the receiver alone refuses it (a key given twice that no field reads)."""

    id: str
    line: str
    values: dict[str, Any] | None = None
    reason: str | None = None
    receiver_reason: str | None = None


MISSING_CHANNEL = "missing field 'channel' (required of events since 2026-11-26T10:00:00Z)"


def changed(**keys: Any) -> str:
    """:data:`GOOD` with keys replaced (``auth__idp``: the nested key; ``at`` for ``@timestamp``, ``user_id`` for
    ``user-id``, ``a_b`` for ``a.b``; ``...`` removes the key) as a line."""
    event = json.loads(json.dumps(GOOD))
    for name, value in keys.items():
        holder, key = event, {"at": "@timestamp", "user_id": "user-id", "a_b": "a.b", "device_id": "device-id"}.get(
            name, name)
        if "__" in key:
            outer, key = key.split("__")
            holder = event[outer]
        if value is ...:
            holder.pop(key)
        else:
            holder[key] = value
    return json.dumps(event)


def good(id: str, line: str, **values: Any) -> Case:
    return Case(id, line, values={**VALUES, **values})


def bad(id: str, line: str, reason: str, receiver_reason: str | None = None) -> Case:
    return Case(id, line, reason=reason, receiver_reason=receiver_reason)


def renamed(field: str, key: str, former: str, given: Any, wrong: Any, shown: str) -> list[Case]:
    """The cases of a field that reads ``key``, formerly ``former``: the former key read where the line has no value
    at ``key`` (no key, or null), never in place of a value of the wrong type there (issue 60: Spark took the
    former one then, the receiver refused the line)."""
    expected = EXPECTED[LOGINS.fields[field].type]
    return [
        good(f"{field}: under its former key", changed(**{key: ..., former: given}), **{field: given}),
        good(f"{field}: null under its new key, given under its former", changed(**{key: None, former: given}),
             **{field: given}),
        good(f"{field}: under both keys, the new one", changed(**{former: given})),
        bad(f"{field}: of another type under its new key, good under its former",
            changed(**{key: wrong, former: given}), f"field '{key}' is not {expected}: {shown}"),
        bad(f"{field}: of another type under its former key", changed(**{key: ..., former: wrong}),
            f"field '{key}' is not {expected}: {shown}"),
    ]


RENAMED = [
    *renamed("user_id", "user-id", "userId", 5, "abc", '"abc"'),
    *renamed("price", "price", "cost", 1.25, "1.5", '"1.5"'),
    *renamed("success", "success", "ok", False, "true", '"true"'),
    *renamed("seen", "seen", "seen_at", T0, "2026-11-26T10:00:00Z", '"2026-11-26T10:00:00Z"'),
    *renamed("at", "@timestamp", "time", T0 + 5, "x", '"x"'),
    bad("an integer as digits under its new key, good under its former", changed(user_id="123", userId=5),
        "field 'user-id' is not an integer: \"123\""),
    bad("an integer past 64 bits under its new key, good under its former", changed(user_id=2 ** 63, userId=5),
        f"field 'user-id' is outside the 64-bit integer range: {2 ** 63}"),
    bad("a double of another type under its new key, a number under its former", changed(price=True, cost=1.0),
        "field 'price' is not a number: true"),
    bad("an integer past the largest double", changed(price=-10 ** 400),
        f"field 'price' must be a finite number (got {str(-10 ** 400)[:200]}…)"),  # issue 60: Python overflowed
]
"""Renamed keys of every type but string (whose cases are the ``device`` ones)."""

QUOTED = [
    bad("an empty string", changed(note=""), "field 'note' must not be empty (got \"\")"),
    bad("spaces only", changed(note="  "), "field 'note' must not be empty (got \"  \")"),
    bad("NUL in a string", changed(note="a\u0000b"), "field 'note' must not contain NUL (U+0000) (got \"a\\u0000b\")"),
    bad("a string over its length, quotes and backslashes escaped", changed(note='say "hi" \\ bye'),
        "field 'note' must be at most 8 characters long (got \"say \\\"hi\\\" \\\\ bye\")"),
    bad("digits as text over a string's length", changed(note="123456789"),
        "field 'note' must be at most 8 characters long (got \"123456789\")"),
    bad("a number with a fraction, as Python writes it", changed(ratio=1796680000.5),
        "field 'ratio' must be < 10 (got 1796680000.5)"),
    bad("a large number, as Python writes it", changed(ratio=2.5e20), "field 'ratio' must be < 10 (got 2.5e+20)"),
    bad("an integer for a double", changed(ratio=12), "field 'ratio' must be < 10 (got 12)"),
    bad("a fraction for an integer", changed(seen=1796680000.5), "field 'seen' is not an integer: 1796680000.5"),
    bad("a small fraction for an integer", changed(seen=1e-7), "field 'seen' is not an integer: 1e-07"),
    bad("an array", "[1, 2]", "not a JSON object (got an array)"),
    bad("a string", '"ann"', "not a JSON object (got a string)"),
    bad("a number", "17.5", "not a JSON object (got a number)"),
    bad("true", "true", "not a JSON object (got a boolean)"),
    bad("null", "null", "not a JSON object (got null)"),
]
"""Values a reason quotes, by one rule on both sides (``tandem.event_checks.shown``): a string in double quotes,
escaped as JSON, however empty; a number as Python writes it (never Java's ``1.7966800005E9``); and valid JSON that
is not an object, named by what it is."""

TEXT = json.dumps(GOOD)
CASES = [
    good("every key read where from says", TEXT),
    good("epoch milliseconds", changed(at=T0)),
    good("an offset: the same instant", changed(at="2026-11-26T11:00:00+01:00")),
    good("a compact offset and a fraction", changed(at="2026-11-26T11:30:00.5+0130"), at=T0 + 500),
    good("a space, a comma, nine digits and z", changed(at="2026-11-26 10:00:00,123456789z"), at=T0 + 123),
    good("a leap day", changed(at="2024-02-29T00:00:00Z"), at=1709164800000),
    good("the first instant", changed(at="1970-01-01T01:00:00+01:00"), at=0),
    good("the last instant", changed(at="9999-12-31T23:59:59.999Z"), at=MAX_EPOCH_MILLIS),
    good("false", changed(success=False), success=False),
    good("a field with a default, given", changed(region="eu-1"), region="eu-1"),
    good("a field with a default, given as it", changed(region="0-unknown")),
    good("a field with a default, null", changed(region=None)),
    good("a field with a default, not given", changed(attempts=...), attempts=1),
    good("an integer field with a default, null", changed(attempts=None), attempts=1),
    good("a field required since a time, not given before it", changed(channel=..., at=T0 - 1), channel="web",
         at=T0 - 1),
    good("a field required since a time, null before it", changed(channel=None, at="2026-11-26T09:59:59Z"),
         channel="web", at=T0 - 1000),
    good("a renamed key under its former name", changed(device_id=..., deviceId="d0"), device="d0"),
    good("a renamed key under both names: the new one", changed(deviceId="old")),
    good("a renamed key, null under its new name", changed(device_id=None, deviceId="d0"), device="d0"),
    good("undeclared keys, nested", changed(extra={"x": [1, {"y": None}]}, auth={"idp": "google", "method": "pw",
                                                                              "more": {"deep": True}})),
    Case("undeclared key given twice", TEXT[:-1] + ', "x": {"y": 1, "y": 2}}', values=VALUES,
         receiver_reason="duplicate key 'y'"),
    bad("a boolean as a string", changed(success="true"), "field 'success' is not a boolean: \"true\""),
    bad("a boolean as a number", changed(success=1), "field 'success' is not a boolean: 1"),
    bad("yes", changed(success="yes"), "field 'success' is not a boolean: \"yes\""),
    bad("a boolean as an object", changed(success={"a": 1}), "field 'success' is not a boolean: {\"a\":1}"),
    bad("null is missing", changed(success=None), "missing field 'success'"),
    bad("a field with a default, of another type", changed(region=5), "field 'region' is not a string: 5"),
    bad("a field with a default, text that looks like a number", changed(attempts="1"),
        "field 'attempts' is not an integer: \"1\""),
    bad("a field with a default, failing its check", changed(attempts=0), "field 'attempts' must be >= 1 (got 0)"),
    bad("a field required since a time, not given at it", changed(channel=...), MISSING_CHANNEL),
    bad("a field required since a time, null after it", changed(channel=None, at=T0 + 1000), MISSING_CHANNEL),
    bad("a field required since a time, not given, the event's time not valid", changed(channel=..., at="x"),
        NOT_A_TIMESTAMP + '"x"'),
    bad("a renamed key under neither name", changed(device_id=...), "missing field 'device-id'"),
    bad("a renamed key's former name of another type", changed(device_id=..., deviceId=5),
        "field 'device-id' is not a string: 5"),
    bad("a renamed key's former name given twice", TEXT.replace('"device-id": "d1"', '"deviceId": "a", "deviceId": "b"'),
        "duplicate key 'deviceId'"),
    good("a renamed key, null under its new name, digits under its former",
         changed(device_id=None, deviceId="123"), device="123"),
    *RENAMED,
    bad("no zone", changed(at="2026-11-26T10:00:00"), "field '@timestamp' is an ISO-8601 time without a zone (write "
                                                      "Z or an offset such as +01:00): \"2026-11-26T10:00:00\""),
    bad("a day February lacks", changed(at="2026-02-30T10:00:00Z"), NOT_A_TIMESTAMP + '"2026-02-30T10:00:00Z"'),
    bad("no leap day", changed(at="2023-02-29T10:00:00Z"), NOT_A_TIMESTAMP + '"2023-02-29T10:00:00Z"'),
    bad("hour 24", changed(at="2026-11-26T24:00:00Z"), NOT_A_TIMESTAMP + '"2026-11-26T24:00:00Z"'),
    bad("a leap second", changed(at="2026-11-26T10:00:60Z"), NOT_A_TIMESTAMP + '"2026-11-26T10:00:60Z"'),
    bad("an hour-only offset", changed(at="2026-11-26T10:00:00+01"), NOT_A_TIMESTAMP + '"2026-11-26T10:00:00+01"'),
    bad("no seconds", changed(at="2026-11-26T10:00Z"), NOT_A_TIMESTAMP + '"2026-11-26T10:00Z"'),
    bad("ten fraction digits", changed(at="2026-11-26T10:00:00.1234567890Z"),
        NOT_A_TIMESTAMP + '"2026-11-26T10:00:00.1234567890Z"'),
    bad("a date alone", changed(at="2026-11-26"), NOT_A_TIMESTAMP + '"2026-11-26"'),
    bad("digits as text", changed(at=str(T0)), NOT_A_TIMESTAMP + f'"{T0}"'),
    bad("a trailing newline", changed(at="2026-11-26T10:00:00Z\n"), NOT_A_TIMESTAMP + '"2026-11-26T10:00:00Z\\n"'),
    bad("non-ASCII digits", changed(at="２026-11-26T10:00:00Z"), NOT_A_TIMESTAMP + '"２026-11-26T10:00:00Z"'),
    bad("control characters", changed(at="x\u0001\u001fy"), NOT_A_TIMESTAMP + '"x\\u0001\\u001Fy"'),
    bad("a fraction of a millisecond", changed(at=1.5), NOT_A_TIMESTAMP + "1.5"),
    bad("true", changed(at=True), NOT_A_TIMESTAMP + "true"),
    bad("past 64 bits", changed(at=2 ** 63), NOT_A_TIMESTAMP + str(2 ** 63)),
    bad("before 1970", changed(at=-1), OUT_OF_RANGE + "-1)"),
    bad("before 1970 by its offset", changed(at="1970-01-01T00:59:59.999+01:00"),
        OUT_OF_RANGE + '"1970-01-01T00:59:59.999+01:00")'),
    bad("year 0", changed(at="0000-01-01T00:00:00Z"), OUT_OF_RANGE + '"0000-01-01T00:00:00Z")'),
    bad("after 9999 by its offset", changed(at="9999-12-31T23:59:59.999-00:01"),
        OUT_OF_RANGE + '"9999-12-31T23:59:59.999-00:01")'),
    bad("past the last epoch millisecond", changed(at=MAX_EPOCH_MILLIS + 1), OUT_OF_RANGE + f"{MAX_EPOCH_MILLIS + 1})"),
    bad("a five-digit year", changed(at="10000-01-01T00:00:00Z"), NOT_A_TIMESTAMP + '"10000-01-01T00:00:00Z"'),
    bad("no timestamp", changed(at=...), "missing field '@timestamp'"),
    bad("a reserved word's key missing", changed(user=...), "missing field 'user'"),
    bad("the declared name is not the key", changed(user=..., user_name="ann"), "missing field 'user'"),
    bad("a number for an id", changed(user_id="7"), "field 'user-id' is not an integer: \"7\""),
    bad("NaN for an id", TEXT.replace('"user-id": 7', '"user-id": NaN'), "field 'user-id' is not an integer: \"NaN\""),
    bad("a nested key missing", changed(auth__idp=...), "missing field 'auth.idp'"),
    bad("a nested key of another type", changed(auth__idp=5), "field 'auth.idp' is not a string: 5"),
    bad("not an object on the path", changed(auth="google"), "missing field 'auth.idp'; missing field 'auth.method'"),
    bad("a string that looks like an object", changed(auth='{"idp": 1, "idp": 2}'),
        "missing field 'auth.idp'; missing field 'auth.method'"),
    bad("a path is not a key holding a dot", changed(a_b=..., a={"b": 1}), "missing field 'a.b'"),
    bad("a check of a key holding a dot", changed(a_b=-1), "field 'a.b' must be >= 0 (got -1)"),
    bad("every problem, in declaration order", changed(user=..., success="no"),
        "missing field 'user'; field 'success' is not a boolean: \"no\""),
    bad("a reserved word's key twice", TEXT[:-1] + ', "user": "bob"}', "duplicate key 'user'"),
    bad("a nested key twice", TEXT.replace('"method": "pw"', '"method": "pw", "idp": "x"'), "duplicate key 'auth.idp'"),
    bad("a nested key twice, once escaped", TEXT.replace('"method": "pw"', '"method": "pw", "m\\u0065thod": "x"'),
        "duplicate key 'auth.method'"),
    bad("an object and a key in it twice", TEXT[:-1] + ', "auth": {"idp": "x", "idp": "y", "method": "pw"}}',
        "duplicate key 'auth'; duplicate key 'auth.idp'"),
    bad("a key holding a dot twice", TEXT[:-1] + ', "a.b": 2}', "duplicate key 'a.b'"),
    bad("declared and undeclared keys twice", TEXT[:-1] + ', "x": {"y": 1, "y": 2}, "@timestamp": 5}',
        "duplicate key '@timestamp'"),
    *QUOTED,
]
