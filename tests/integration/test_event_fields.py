"""Fields real events carry (issue 47 §4), on Spark: the runtime's parse (:func:`tandem.runtime.records.
parse_and_validate`, what every source kind's lines go through) reads booleans, keys of other names (a reserved
word, ``user-id``, ``@timestamp``, a key holding a dot), nested paths (``auth.idp``) and timestamps as ISO-8601
text or epoch milliseconds into columns of the declared names, and quarantines the bad variants with the reasons
the receiver gives for the same lines (``tests/support/_field_cases.py``; the Python side runs them in
``tests/unit/test_event_field_rules.py``)."""

from __future__ import annotations

import json
import math
import random
import struct
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType

from _field_cases import CASES, LOGINS, changed
from tandem.event_checks import event_problems, load_json, typed_value
from tandem.runtime.plan_api import good_events, quarantined
from tandem.runtime.records import SHOWN_TEXT, parse_and_validate, record_schema

pytestmark = pytest.mark.integration


def test_every_case_parses_to_its_values_or_is_quarantined_with_its_reason(spark) -> None:
    lines = spark.createDataFrame([(i, case.line, f"file-{i}") for i, case in enumerate(CASES)],
                                  "i long, raw string, source_file string")
    validated = parse_and_validate(lines, record_schema(LOGINS))
    types = {field.name: field.dataType for field in validated.schema.fields}
    assert [types[name] for name in ("user_name", "user_id", "at", "idp", "success")] == \
        [StringType(), LongType(), LongType(), StringType(), BooleanType()], "columns of the declared names"

    event_time = F.date_format(F.timestamp_millis("at"), "yyyy-MM-dd'T'HH:mm:ss.SSSXXX")  # the session's zone: UTC
    rows = [row.asDict() for row in validated.withColumn("event_time", event_time).orderBy("i").collect()]
    assert len(rows) == len(CASES)
    for case, row in zip(CASES, rows):
        assert row["reason"] == case.reason, case.id
        assert row["valid"] is (case.reason is None), case.id
        if case.values is not None:
            assert {name: row[name] for name in LOGINS.fields} == case.values, case.id
        else:
            assert row["raw"] == case.line, case.id  # the quarantine keeps the line as it came
    assert rows[0]["event_time"] == "2026-11-26T10:00:00.000Z", "the event time queries see"


def iso_texts(count: int, seed: int = 47) -> list[str]:
    """ISO-8601 times of every spelling (separators, fractions, offsets), a few without a zone or on a day their month
    lacks, from years 0000 to 9999."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        moment = datetime(1970, 1, 1) + timedelta(seconds=rng.uniform(-86400 * 400, 253402300799))
        digits = rng.choice([0, 1, 3, 6, 9])
        fraction = (rng.choice(".,") + "".join(rng.choice("0123456789") for _ in range(digits))) if digits else ""
        minutes = rng.randint(-(23 * 60 + 59), 23 * 60 + 59)
        offset = f"{'+' if minutes >= 0 else '-'}{abs(minutes) // 60:02}{rng.choice([':', ''])}{abs(minutes) % 60:02}"
        zone = rng.choice(["Z", "z", offset, offset, ""])
        text = moment.strftime("%Y-%m-%d") + rng.choice("Tt ") + moment.strftime("%H:%M:%S") + fraction + zone
        texts.append(text.replace("-02-28", "-02-29") if rng.random() < 0.05 else text)
    return texts + ["0000-02-29T00:00:00Z", "1900-02-29T00:00:00Z", "2000-02-29T00:00:00Z"]


def test_spark_reads_iso_times_as_the_receiver_does(spark) -> None:
    events = [changed(at=text) for text in iso_texts(300)]
    lines = spark.createDataFrame([(i, line, "f") for i, line in enumerate(events)],
                                  "i long, raw string, source_file string")
    rows = parse_and_validate(lines, record_schema(LOGINS)).orderBy("i").select("raw", "at", "reason").collect()
    for line, row in zip(events, rows):
        event = load_json(line)
        assert (row["reason"] or "") == "; ".join(event_problems(LOGINS, event)), line
        if row["reason"] is None:
            assert row["at"] == typed_value(LOGINS.fields["at"], event["@timestamp"]), line
    assert 100 < sum(row["reason"] is None for row in rows) < len(rows), "good times and bad ones"


DEEPER = "(the decoder that says more reads 512 at most)"
UNREADABLE = [
    ('{"user": "ann", "@timestamp": 17', "invalid JSON: Expecting ',' delimiter at line 1 column 33"),  # cut short
    ("{not json", "invalid JSON: Expecting property name enclosed in double quotes at line 1 column 2"),
    ('{"user": "ann",}', "invalid JSON: Expecting property name enclosed in double quotes at line 1 column 16"),
    ("hello", "invalid JSON: Expecting value at line 1 column 1"),
    ("", "invalid JSON: Expecting value at line 1 column 1"),
    ('{"user": ' + "[" * 600, f"not a JSON object, nested 601 levels deep {DEEPER}"),
    ("[" * 700 + "]" * 700, f"not a JSON object, nested 700 levels deep {DEEPER}"),
]
"""Lines the receiver never sees (it refuses a body that is not JSON as a whole), so Spark alone quarantines them:
each reason says where Python's JSON decoder stopped (its column counted by hand here)."""


def test_a_line_that_is_not_json_says_where_the_decoder_stopped_and_only_bad_lines_reach_python(spark) -> None:
    lines = spark.createDataFrame([(i, line, "f") for i, (line, _) in enumerate(UNREADABLE)],
                                  "i long, raw string, source_file string")
    validated = parse_and_validate(lines, record_schema(LOGINS))
    assert [row["reason"] for row in validated.orderBy("i").collect()] == [reason for _, reason in UNREADABLE]
    # the reasons' Python UDF runs after the filter of bad lines, and good events never run it
    quarantine = quarantined(validated)._jdf.queryExecution().executedPlan().toString()
    python, filtered = quarantine.find("EvalPython"), quarantine.find("Filter NOT")
    assert 0 <= python < filtered, quarantine  # the plan prints parents first
    assert "EvalPython" not in good_events(validated, SimpleNamespace(streams={"logins": LOGINS}), "logins") \
        ._jdf.queryExecution().executedPlan().toString()


FLOATS = [1796680000.5, 100000.0, 1e16, 9999999999999998.0, 1.5e-4, 1e-4, 1e-5, 0.00012345, -0.0, 0.0, 2.5e20, 0.1,
          123.0, -1.25, 1.7976931348623157e308, 2.2250738585072014e-308, 5e-324, 1e23, 8.41e21, 2.82879384806159e17]
"""With the doubles JDK 17 writes with more digits than needed (``1e23`` as ``9.999999999999999E22``)."""


def test_a_double_in_a_reason_reads_as_python_writes_it(spark) -> None:
    """Spark's reader gives a number with a fraction as Java writes it (``1.7966800005E9``); a reason quotes it as
    Python's ``repr`` (``1796680000.5``), the receiver's words."""
    rng = random.Random(11)
    doubles = FLOATS + [struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0] for _ in range(2000)]
    doubles = [d for d in doubles if math.isfinite(d)]
    frame = spark.createDataFrame([(i, json.dumps({"x": d})) for i, d in enumerate(doubles)], "i long, raw string")
    text = F.from_json("raw", "x string").getField("x")
    rows = frame.select("i", text.alias("java"), SHOWN_TEXT(text, F.lit(False)).alias("shown")).orderBy("i").collect()
    assert rows[0]["java"] == "1.7966800005E9", "Java's spelling, which the reason does not keep"
    assert [row["shown"] for row in rows] == [repr(d) for d in doubles]
