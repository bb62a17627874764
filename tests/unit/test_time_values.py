"""Times read from any output are ISO 8601 text in UTC (pure): epoch milliseconds spelled as a timestamp column of
the same instant reads, and which fields of each kind's rows hold times."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from _references import iso_of_millis

from tandem.config import load_cluster, load_plan
from tandem.declarations import MAX_EPOCH_MILLIS
from tandem.json_values import iso_time, times_as_iso
from tandem.outputs import kind_of
from tandem.outputs.base import plan_time_fields, stream_time_fields
from tandem.presenter.views import epoch_millis_fields

MILLIS = [0, 1, 999, 1000, 1795687200000, 1795687200250, 1795687200007, MAX_EPOCH_MILLIS, -1, -86_400_000]


@pytest.mark.parametrize("millis", MILLIS)
def test_epoch_millis_read_as_the_iso_text_of_a_timestamp_column_of_the_same_instant(millis: int) -> None:
    assert iso_time(millis) == iso_of_millis(millis)
    column = pa.array([millis], pa.timestamp("ms", tz="UTC")).cast(pa.timestamp("us", tz="UTC"))
    assert iso_time(millis) == column.to_pylist()[0].isoformat(), "the text a Spark timestamp column reads as"


def test_the_examples_of_the_docs() -> None:
    assert iso_time(1795687200000) == "2026-11-26T10:00:00+00:00"
    assert iso_time(1795687200250) == "2026-11-26T10:00:00.250000+00:00"


def test_only_the_named_fields_holding_integers_become_iso_text() -> None:
    row = {"at": 1795687200000, "seen": np.int64(1795687200250), "text": "2026-11-26T10:00:00+00:00", "none": None,
           "flag": True, "real": 1795687200000.0, "count": 5, "far": 2 ** 63 - 1, "before_year_1": -10 ** 15}
    names = ["at", "seen", "text", "none", "flag", "real", "far", "before_year_1", "absent"]
    got = times_as_iso(row, names)
    assert got == {**row, "at": "2026-11-26T10:00:00+00:00", "seen": "2026-11-26T10:00:00.250000+00:00"}
    assert row["at"] == 1795687200000, "the row given is not changed"
    assert "absent" not in got


PLAN = """name: clocks
description: fields of every kind that hold times
streams:
  readings:
    partitions: 1
    key: room
    event_time: at
    fields:
      room: {type: string}
      at: {type: epoch_millis}
      seen: {type: timestamp}
      n: {type: long}
      mixed: {type: epoch_millis}
  others:
    partitions: 1
    key: room
    event_time: at
    fields:
      room: {type: string}
      at: {type: timestamp}
      mixed: {type: long}
groups:
  clocks: {queries: [clock]}
outputs:
  last_reading:
    kind: latest
    key: [room]
    time: noted_at
    values: [seen, n, mixed]
  alarms:
    kind: events
    key: [room]
    time: fired_at
  per_time:
    kind: table
    key: [room, at]
    values: [seen]
    id: [n]
  stats:
    kind: aggregation
    key: [room]
    measures:
      readings: {count: "*"}
      first_seen: {min: seen}
      last_at: {max: at}
      at_sum: {sum: at}
      seen_double: {max: seen, type: double}
      seen_long: {max: seen, type: long}
      n_max: {max: n}
  quarantine:
    kind: quarantine
nodes: [node-a]
"""


def test_each_kind_names_the_fields_of_its_rows_that_hold_times(conf: Path) -> None:
    """A stream field of a time type in every stream that declares it, any output's ``time``; a table's keys only
    (its values are sums); an aggregation's min and max of a time kept as a long; none of the quarantine's."""
    (conf / "plans" / "clocks.yaml").write_text(PLAN)
    plan = load_plan("clocks", load_cluster(conf / "cluster.yaml"))
    assert stream_time_fields(plan) == {"at", "seen"}, "mixed is a long in one stream"
    times = {"at", "seen", "noted_at", "fired_at"}  # an output's time is a time in every output's rows
    assert plan_time_fields(plan) == times
    assert {name: kind_of(plan, name).time_fields(plan, name) for name in plan.outputs} == {
        "last_reading": times, "alarms": times, "per_time": {"at"}, "stats": {"first_seen", "last_at", "seen_long"},
        "quarantine": set()}
    assert epoch_millis_fields(plan) == ["at", "fired_at", "noted_at", "seen"], "what the page shows as times"


def test_an_aware_datetime_reads_as_the_same_text() -> None:
    moment = datetime(2026, 11, 26, 10, 0, 0, 250_000, tzinfo=timezone.utc)
    assert iso_time(1795687200250) == moment.isoformat()
