"""Fields real events carry (issue 47 §4), on Spark: the runtime's parse (:func:`tandem.runtime.records.
parse_and_validate`, what every source kind's lines go through) reads booleans, keys of other names (a reserved
word, ``user-id``, ``@timestamp``, a key holding a dot), nested paths (``auth.idp``) and timestamps as ISO-8601
text or epoch milliseconds into columns of the declared names, and quarantines the bad variants with the reasons
the receiver gives for the same lines (``tests/support/_field_cases.py``; the Python side runs them in
``tests/unit/test_event_field_rules.py``)."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import pytest
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType

from _field_cases import CASES, LOGINS, changed
from tandem.event_checks import event_problems, load_json, typed_value
from tandem.runtime.records import parse_and_validate, record_schema

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
