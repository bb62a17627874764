"""The words of a quarantine reason (pure): a line that is not JSON says where its decoder stopped, valid JSON that is
not an object says what it is, and every value a reason quotes is written one way (``tandem.event_checks.shown``):
a string in double quotes however empty, a number as Python writes it. The runtime's parse on Spark is held to the
same cases (``tests/support/_field_cases.py``, ``tests/integration/test_event_fields.py``)."""

from __future__ import annotations

import math

import pytest

from tandem.declarations import StreamConfig
from tandem.event_checks import SHOWN_CHARS, event_problems, load_json, shown, shown_text, unreadable_line
from tandem.monitoring.reasons import reason_class


@pytest.mark.parametrize(("line", "reason"), [
    ('{"user": "a", "ts": 17', "invalid JSON: Expecting ',' delimiter at line 1 column 23"),  # cut short
    ("{not json", "invalid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    ('{"a": 1,}', "invalid JSON: Expecting property name enclosed in double quotes at line 1 column 9"),
    ('{"a" 1}', "invalid JSON: Expecting ':' delimiter at line 1 column 6"),
    ("hello", "invalid JSON: Expecting value at line 1 column 1"),
    ("", "invalid JSON: Expecting value at line 1 column 1"),
    ('{"a": 1} {"b": 2}', "invalid JSON: Extra data at line 1 column 10"),
    ("[" * 100_000, "not a JSON object, nested 100000 levels deep (the decoder that says more reads 512 at most)"),
    ("[" * 512 + "]" * 511, "invalid JSON: Expecting ',' delimiter at line 1 column 1024"),  # as deep as it reads
    ('{"a": "' + "[" * 600 + '", "b": 1', "invalid JSON: Expecting ',' delimiter at line 1 column 617"),  # text
    ("[1, 2]", "not a JSON object (got an array)"),
    ('"text"', "not a JSON object (got a string)"),
    ("17", "not a JSON object (got a number)"),
    ("-1.5e3", "not a JSON object (got a number)"),
    ("false", "not a JSON object (got a boolean)"),
    ("null", "not a JSON object (got null)"),
    ('{"a": 1}', "invalid JSON"),  # an object only Spark's reader refuses: Python cannot say more
    (None, None),
])
def test_a_line_that_is_no_json_object_says_where_the_decoder_stopped_or_what_it_is(line, reason) -> None:
    assert unreadable_line(line) == reason


@pytest.mark.parametrize(("event", "reason"), [
    ([1, 2], "not a JSON object (got an array)"), ("x", "not a JSON object (got a string)"),
    (5, "not a JSON object (got a number)"), (2.5, "not a JSON object (got a number)"),
    (True, "not a JSON object (got a boolean)"), (None, "not a JSON object (got null)"),
])
def test_the_receiver_names_what_an_event_that_is_not_an_object_is(event, reason) -> None:
    stream = StreamConfig.model_validate({"partitions": 1, "key": "k", "event_time": "t",
                                          "fields": {"k": {"type": "string"}, "t": {"type": "epoch_millis"}}})
    assert event_problems(stream, event) == [reason]


@pytest.mark.parametrize(("value", "text"), [
    ("", '""'),
    ("  ", '"  "'),
    ("ann", '"ann"'),
    ("true", '"true"'),  # text is told from the boolean
    ("a\u0000b", '"a\\u0000b"'),
    ('say "hi" \\ bye', '"say \\"hi\\" \\\\ bye"'),
    ("tab\there\nx\u001f", '"tab\\there\\nx\\u001F"'),
    ("ü😀", '"ü😀"'),
    (1796680000.5, "1796680000.5"),  # not Java's 1.7966800005E9
    (1e-7, "1e-07"),
    (2.5e20, "2.5e+20"),
    (100000.0, "100000.0"),
    (-0.0, "-0.0"),
    (12, "12"),
    (2 ** 63, "9223372036854775808"),
    (True, "true"),
    (None, "null"),
    ({"a": [1, 2.5]}, '{"a":[1,2.5]}'),
    (math.nan, '"NaN"'),
    (-math.inf, '"-Infinity"'),
])
def test_a_value_is_quoted_as_its_json_text_strings_in_quotes_numbers_as_python_writes_them(value, text) -> None:
    assert shown(value) == text


@pytest.mark.parametrize(("text", "is_string", "written"), [
    ("1.7966800005E9", False, "1796680000.5"),  # Java's Double.toString, as Spark's reader gives a double
    ("1.0E-7", False, "1e-07"),
    ("2.5E20", False, "2.5e+20"),
    ("9.999999999999999E22", False, "1e+23"),  # JDK 17's digit too many: the same double
    ("100000.0", False, "100000.0"),
    ("-0.0", False, "-0.0"),
    ("12", False, "12"),
    ("-99999999999999999999", False, "-99999999999999999999"),  # an integer's digits, however many
    ("true", False, "true"),
    ('{"a":[1,2]}', False, '{"a":[1,2]}'),
    ('"NaN"', False, '"NaN"'),  # Spark writes a non-finite double back quoted
    ("", True, '""'),
    ("1.5E9", True, '"1.5E9"'),  # a string that looks like a number stays a string
    ("a\u0000b", True, '"a\\u0000b"'),
    (None, True, None),
])
def test_a_value_spark_reads_as_text_is_quoted_as_the_receiver_quotes_it(text, is_string, written) -> None:
    assert shown_text(text, is_string) == written


def test_a_long_value_is_cut_with_an_ellipsis() -> None:
    assert shown("x" * 500) == '"' + "x" * (SHOWN_CHARS - 1) + "…"
    assert shown("x" * (SHOWN_CHARS - 2)) == '"' + "x" * (SHOWN_CHARS - 2) + '"'
    assert shown_text("[" + "1," * 300 + "1]", False) == "[" + "1," * 99 + "1…"


STREAM = StreamConfig.model_validate({"partitions": 1, "key": "name", "event_time": "at", "fields": {
    "name": {"type": "string", "not_empty": True, "max_length": 4},
    "at": {"type": "epoch_millis"},
    "price": {"type": "double", "less_than": 10},
}})


@pytest.mark.parametrize(("line", "reasons"), [
    ('{"name": "", "at": 5, "price": 1}', ["field 'name' must not be empty (got \"\")"]),
    ('{"name": "a\\u0000", "at": 5, "price": 1}', ["field 'name' must not contain NUL (U+0000) (got \"a\\u0000\")"]),
    ('{"name": "abcde", "at": 5, "price": 1}', ["field 'name' must be at most 4 characters long (got \"abcde\")"]),
    ('{"name": "a", "at": 5, "price": 1796680000.5}', ["field 'price' must be < 10 (got 1796680000.5)"]),
    ('{"name": "a", "at": 1796680000.5, "price": 1}', ["field 'at' is not an integer: 1796680000.5"]),
    ('{"name": "a", "at": -1, "price": 1}', ["field 'at' must be epoch milliseconds between 1970 and 9999 (got -1)"]),
    ('{"name": 5, "at": "5", "price": "1.5"}', ["field 'name' is not a string: 5",
                                                "field 'at' is not an integer: \"5\"",
                                                "field 'price' is not a number: \"1.5\""]),
    ('{"name": "a", "at": 9223372036854775808, "price": 1}',
     ["field 'at' is outside the 64-bit integer range: 9223372036854775808"]),
])
def test_every_reason_quotes_its_value_the_same_way(line: str, reasons: list[str]) -> None:
    assert event_problems(STREAM, load_json(line)) == reasons


@pytest.mark.parametrize("reason", [
    "invalid JSON: Expecting ',' delimiter at line 1 column 23", "invalid JSON", "not a JSON object (got an array)",
    "malformed JSON: not a JSON object",  # a row quarantined before these words
])
def test_a_line_that_is_no_json_object_is_counted_as_malformed(reason: str) -> None:
    assert reason_class(reason) == "malformed_json"
