"""Property: every line a producer can send either lands in every output kind exactly as a plain-Python
reference says, or is quarantined with its reason; no line fails a batch (issue 24 §1).

Hypothesis writes lines for every stream of the three plans, field by field: good values at the edges
of their type (the longest strings, characters outside the BMP, the largest finite doubles, the 64-bit
integer limits, epoch 0 and 9999-12-31), hostile ones (NUL, unpaired surrogates, invalid UTF-8,
``1e999``, ``NaN``/``Infinity`` as tokens and as strings, integers past 64 bits, a line over the
size limit, undeclared fields nested thousands deep), wrong JSON types and missing fields. The
reference decides from what each line was *meant* to hold, without Tandem's code: good or bad, and
every problem a bad line's reason must name.

The lines go through :func:`tandem.runtime.records.parse_and_validate` on Spark; the good rows through
real sinks of every kind (events, table, aggregation of facts) on a real PostgreSQL and real Delta
tables, the bad ones through the quarantine sink; what the stores hold is read back and compared.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import count
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from tandem.aggregation.spec import AggregationSpec, Measure
from tandem.config import load_cluster, load_plans
from tandem.declarations import MAX_EPOCH_MILLIS, OutputConfig, StreamConfig
from tandem.lake.tables import read_table
from tandem.outputs.base import BatchInfo
from tandem.outputs.quarantine import QuarantineSink
from tandem.runtime.records import KEPT_CHARS, parse_and_validate, record_schema
from tandem.outputs.aggregation import FactAggregateSink
from tandem.outputs.events import EventsSink, read_events_lake
from tandem.outputs.table import TableSink
from tandem.store import Database
from tandem.store.leases import try_acquire
from tandem.store.outputs import read_table_rows
from tandem.store.registry import InstanceKey

pytestmark = pytest.mark.integration
MAX_LINE_BYTES = 4096  # the streams' limit in this test: an over-long line costs little to write
INT64 = (-2 ** 63, 2 ** 63 - 1)
EXAMPLES = 6  # per stream; each is one Spark job and a few PostgreSQL and Delta commits


def declared_streams() -> list[tuple[str, str, StreamConfig]]:
    plans = load_plans(load_cluster())
    return [(plan.name, name, stream.model_copy(update={"max_line_bytes": MAX_LINE_BYTES}))
            for plan in plans.values() for name, stream in sorted(plan.streams.items())]


STREAMS = declared_streams()


# --- what a line means, and what the reference says of it ------------------------------------------------------


@dataclass
class Line:
    """One line as bytes, what it was meant to hold, and the reference's verdict."""

    text: bytes
    values: dict[str, Any] = field(default_factory=dict)  # the declared fields of a good line
    problems: list[str] = field(default_factory=list)  # what a bad line's reason must name, in order
    line_problem: str | None = None  # a problem of the whole line (its reason is exactly about it)

    @property
    def good(self) -> bool:
        return not self.problems and self.line_problem is None

    @property
    def kept(self) -> str:
        """What the quarantine keeps of the line."""
        text = self.text.decode("utf-8", errors="replace")
        return text[:KEPT_CHARS] if len(self.text) > MAX_LINE_BYTES else text


def _greater(a: float, b: float) -> bool:
    """Spark's order of doubles: NaN above everything, +Infinity included."""
    return not math.isnan(b) and (math.isnan(a) or a > b)


def check_problems(name: str, declared, value: Any) -> list[str]:
    """The checks a parsed value fails, in the order the stream's checks are declared (Spark's semantics)."""
    problems = []
    for operator, bound, message in declared.checks():
        if operator == "not_empty":
            failed = value.strip(" ") == ""
        elif operator == "no_nul":
            failed = "\x00" in value
        elif operator == "max_length":
            failed = len(value) > bound
        elif operator == "finite":
            failed = not math.isfinite(value)
        elif operator == "between":
            failed = not bound[0] <= value <= bound[1]
        elif operator == ">":
            failed = not _greater(value, bound)
        elif operator == ">=":
            failed = not (_greater(value, bound) or value == bound)
        elif operator == "<":
            failed = not _greater(bound, value)
        else:
            failed = not (_greater(bound, value) or value == bound)
        if failed:
            problems.append(f"field '{name}' {message}")
    return problems


# --- field values: (JSON text, parsed value or None, the problem of a value that does not parse) -----------------

FieldValue = tuple[str, Any, str | None]
BMP_AND_ASTRAL = st.characters(blacklist_categories=("Cs",))  # any code point but a surrogate


def string_values(name: str, limit: int, clean: bool) -> st.SearchStrategy[FieldValue]:
    def as_json(text: str) -> FieldValue:
        return json.dumps(text), text, None

    edge = st.text(BMP_AND_ASTRAL, min_size=limit - 1, max_size=limit + (0 if clean else 1))  # up to the limit
    if clean:
        return st.one_of(st.text(BMP_AND_ASTRAL.filter(lambda c: c not in " \x00"), min_size=1, max_size=12), edge
                         .filter(lambda t: t.strip(" ") and "\x00" not in t)).map(as_json)
    return st.one_of(
        st.text(BMP_AND_ASTRAL, min_size=1, max_size=12).map(as_json),
        edge.map(as_json),
        st.sampled_from(["", "   ", "a\x00b", "😀" * 3, "-5", "[x]", "true", "{}", "\\"]).map(as_json),
        st.sampled_from([("5", f"field '{name}' is not a string"), ("true", f"field '{name}' is not a string"),
                         ('{"a": [1, 2]}', f"field '{name}' is not a string")]).map(lambda v: (v[0], None, v[1])),
    )


def double_values(name: str, clean: bool) -> st.SearchStrategy[FieldValue]:
    finite = st.floats(min_value=-1e300, max_value=1e300, allow_nan=False, allow_infinity=False)
    good = st.one_of(finite.map(lambda v: (json.dumps(v), v, None)),
                     st.integers(-10 ** 6, 10 ** 6).map(lambda v: (str(v), float(v), None)))
    if clean:
        return good
    return st.one_of(
        good,
        st.sampled_from([("1e999", math.inf), ("-1e999", -math.inf), ("NaN", math.nan), ("Infinity", math.inf),
                         ("-Infinity", -math.inf), ('"NaN"', math.nan), ('"Infinity"', math.inf),
                         ("1" + "0" * 400, math.inf), ("2.5e-320", 2.5e-320), ("-0.0", -0.0)]).map(
            lambda v: (v[0], v[1], None)),
        st.sampled_from(['"12.5"', "true", "[1]"]).map(lambda text: (text, None, f"field '{name}' is not a number")),
    )


def long_values(name: str, low: int, high: int, clean: bool) -> st.SearchStrategy[FieldValue]:
    outside = f"field '{name}' is outside the 64-bit integer range"
    good = st.integers(low, high).map(lambda v: (str(v), v, None))
    if clean:
        return good
    return st.one_of(
        good,
        st.sampled_from([low, high, *INT64]).map(lambda v: (str(v), v, None)),
        st.sampled_from([2 ** 63, -2 ** 63 - 1, 10 ** 30]).map(lambda v: (str(v), None, outside)),
        st.sampled_from(['"7"', "1.0", "1.5", "1e3", "false"]).map(
            lambda text: (text, None, f"field '{name}' is not an integer")),
    )


def field_values(name: str, declared, clean: bool) -> st.SearchStrategy[FieldValue]:
    """Values of a declared field; ``clean``: values its type takes (checks may still refuse them)."""
    if declared.type == "string":
        return string_values(name, declared.length_limit, clean)
    if declared.type == "double":
        return double_values(name, clean)
    if declared.type == "epoch_millis":
        edges = [("0", 0, None), (str(MAX_EPOCH_MILLIS), MAX_EPOCH_MILLIS, None)] + ([] if clean else [("-1", -1, None)])
        return long_values(name, 1_700_000_000_000 - 10 ** 9, 1_700_000_000_000 + 10 ** 9, clean) \
            | st.sampled_from(edges)
    return long_values(name, -1000, 1000, clean)


@st.composite
def lines_of(draw, stream: StreamConfig) -> Line:
    """A line of ``stream``: a JSON object field by field, or a line that is bad as a whole."""
    shape = draw(st.sampled_from(["clean"] * 6 + ["object"] * 4 + ["malformed", "surrogate", "not_utf8", "too_long",
                                                                    "duplicate"]))
    parts, line = [], Line(b"")
    for name, declared in stream.fields.items():
        presence = "value" if shape in ("clean", "duplicate") else draw(st.sampled_from(["value"] * 8 +
                                                                                         ["missing", "null"]))
        if presence != "value":
            line.problems.append(f"missing field '{name}'")
            if presence == "null":
                parts.append(f'"{name}": null')
            continue
        text, value, problem = draw(field_values(name, declared, clean=shape == "clean"))
        parts.append(f'"{name}": {text}')
        if problem:
            line.problems.append(problem)
        else:
            line.values[name] = value
            line.problems += check_problems(name, declared, value)
    depth = 0
    if draw(st.booleans()):  # a field nobody declared, nested deeper than Jackson's default 1,000 levels
        depth = draw(st.integers(1, 990 if shape == "duplicate" else 1200))  # keys of a deeper line: not listed
        parts.insert(draw(st.integers(0, len(parts))), '"extra": ' + "[" * depth + "]" * depth)
    text = "{" + ", ".join(parts) + "}"
    if shape == "malformed":
        # where the decoder stopped: tests/unit/test_quarantine_reasons.py; past 512 levels it is not asked
        problem = "invalid JSON: " if 1 + depth <= 512 else "not a JSON object, nested"
        return Line(text[:-1].encode(), problems=[problem])
    if shape == "surrogate":
        return Line(text.replace("{", '{"note": "\\ud83d", ', 1).encode(),
                    line_problem="line holds an unpaired UTF-16 surrogate escape (\\uD800-\\uDFFF)")
    if shape == "not_utf8":  # a UTF-8-encoded surrogate (CESU) and a byte no UTF-8 text holds
        return Line(b'{"note": "\xed\xa0\x80\xff", ' + text[1:].encode(),
                    line_problem="line is not valid UTF-8 (invalid bytes are kept as U+FFFD)")
    if shape == "duplicate":  # a declared field twice, once maybe spelled with an escape: which value is meant?
        name = draw(st.sampled_from(list(stream.fields)))
        spelled = draw(st.sampled_from([name, f"{name[0]}\\u{ord(name[1]):04x}{name[2:]}" if len(name) > 1 else name]))
        return Line(("{" + f'"{spelled}": 0, ' + text[1:]).encode(), line_problem=f"duplicate key '{name}'")
    if shape == "too_long":
        return Line(text.replace("{", '{"note": "' + "x" * MAX_LINE_BYTES + '", ', 1).encode())
    line.text = text.encode()
    return line


def sized(line: Line) -> Line:
    """The line as Spark judges it first: over the size limit, nothing else about it counts."""
    if len(line.text) <= MAX_LINE_BYTES:
        return line
    return Line(line.text, line_problem=f"line of {len(line.text)} bytes is over the stream's max_line_bytes "
                                        f"({MAX_LINE_BYTES}); its first {KEPT_CHARS} characters are kept")


# --- the stores ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory):
    from _project import migrated_database

    with migrated_database() as db:
        yield db, tmp_path_factory.mktemp("hostile")


NUMBERS = count()


@dataclass
class Outputs:
    """One set of sinks of every kind for one example, on fresh outputs (their names are the example's number)."""

    stream: StreamConfig
    db: Database
    root: Path

    def __post_init__(self) -> None:
        n = next(NUMBERS)
        self.plan, self.instance = f"hostile{n}", InstanceKey(f"hostile{n}", "g-1", "node-a")
        fields = list(self.stream.fields)
        numeric = sorted((f for f, d in self.stream.fields.items() if d.type != "string" and f != self.stream.event_time),
                         key=lambda f: self.stream.fields[f].type != "double") or [self.stream.event_time]
        self.value = numeric[0]
        url, root = self.db.url, self.root / self.plan
        self.quarantine = QuarantineSink(self.instance, url, root / "quarantine")
        self.events = EventsSink(self.plan, "events", OutputConfig(kind="events", key=fields,
                                                                   time=self.stream.event_time),
                                 self.instance, url, root / "events", self.quarantine)
        self.table = TableSink(self.plan, "table", OutputConfig(kind="table", key=[self.stream.key],
                                                                values=[self.value], id=fields),
                               self.instance, url, root / "table", self.quarantine)
        self.spec = AggregationSpec(
            name="facts", table=f"{self.plan}_facts", keys=(self.stream.key,),
            measures=(Measure("n", "count", "bigint"), Measure("total", "sum", "double precision", self.value),
                      Measure("low", "min", "double precision", self.value),
                      Measure("high", "max", "double precision", self.value)))
        self.facts = FactAggregateSink(self.spec, self.plan, "facts", OutputConfig(
            kind="aggregation", id=fields, time=self.stream.event_time, key=[self.stream.key],
            measures={"n": {"count": "*"}}), self.instance, url, root / "facts", self.quarantine)

    def publish(self, good: pa.Table, bad: pa.Table) -> None:
        epoch = try_acquire(self.db, self.plan, "g-1", "node-a", 30.0)
        assert epoch is not None
        batch = BatchInfo(self.instance, 0, epoch, datetime.now(timezone.utc))
        for sink in (self.events, self.table, self.facts):
            sink.publish(good, batch)
        self.quarantine.publish(bad, batch)


def spark_rows(spark, stream: StreamConfig, lines: list[Line]) -> list[dict]:
    """The lines through parse_and_validate, in input order."""
    frame = spark.createDataFrame([(i, bytearray(line.text), f"file-{i}") for i, line in enumerate(lines)],
                                  "i long, bytes binary, source_file string")
    raw = frame.select("i", F.col("bytes").cast("string").alias("raw"), "source_file")
    validated = parse_and_validate(raw, record_schema(stream)).orderBy("i")
    return [row.asDict() for row in validated.collect()]


# --- the property --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("plan,stream_name,stream", STREAMS, ids=[f"{p}.{s}" for p, s, _ in STREAMS])
def test_every_line_lands_exactly_or_is_quarantined_with_its_reason(plan, stream_name, stream, spark, store) -> None:
    db, root = store
    seen = {"good": 0, "bad": 0}

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=(Phase.explicit, Phase.generate),  # no shrinking: an example costs a Spark job
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                     HealthCheck.function_scoped_fixture])
    @given(st.lists(lines_of(stream).map(sized), min_size=10, max_size=25))
    def check(lines: list[Line]) -> None:
        rows = spark_rows(spark, stream, lines)
        assert len(rows) == len(lines)
        for line, row in zip(lines, rows):
            shown = line.text[:300]
            if line.good:
                assert row["reason"] is None, (shown, row["reason"])
                assert {name: row[name] for name in stream.fields} == line.values, shown
            elif line.line_problem:
                assert row["reason"] == line.line_problem, (shown, row["reason"])
            else:
                assert_names_in_order(row["reason"], line.problems, shown)
            if not line.good:
                assert row["raw"] == line.kept, shown

        seen["good"] += sum(line.good for line in lines)
        seen["bad"] += sum(not line.good for line in lines)
        outputs = Outputs(stream, db, root)
        good = [row for row in rows if row["reason"] is None]
        bad = [row for row in rows if row["reason"] is not None]
        outputs.publish(good_table(stream, good), pa.table({
            "raw": pa.array([r["raw"] for r in bad], pa.string()),
            "source_file": pa.array([r["source_file"] for r in bad], pa.string()),
            "reason": pa.array([r["reason"] for r in bad], pa.string())}))
        assert_stores_hold(outputs, [line for line in lines if line.good], [line for line in lines if not line.good])

    check()
    assert seen["good"] >= 5 and seen["bad"] >= 5, f"the examples must exercise both verdicts: {seen}"


PROBLEM_START = re.compile(r"(?:^|; )(?:missing field '|field '|invalid JSON|not a JSON object)")


def assert_names_in_order(reason: str, problems: list[str], shown: bytes) -> None:
    """``reason`` names exactly ``problems``, in order (each followed by the value it got, if any)."""
    position = 0
    for problem in problems:
        found = reason.find(problem, position)
        assert found >= position, (shown, reason, problems)
        position = found + len(problem)
    assert len(PROBLEM_START.findall(reason)) == len(problems), (shown, reason, problems)


def canonical(stream: StreamConfig, values: dict[str, Any]) -> tuple:
    """A row as comparable values: doubles as floats (jsonb keeps no -0.0, and prints 1e300 as an integer)."""
    return tuple(float(values[f]) + 0.0 if d.type == "double" else values[f] for f, d in stream.fields.items())


def close(got: float, values: list[float]) -> bool:
    """A sum equals the exact sum of ``values`` up to rounding (the stores add in other orders and precisions)."""
    return abs(got - math.fsum(values)) <= 1e-12 * math.fsum(abs(v) for v in values) + 1e-300


def good_table(stream: StreamConfig, rows: list[dict]) -> pa.Table:
    types = {"string": pa.string(), "double": pa.float64(), "long": pa.int64(), "epoch_millis": pa.int64()}
    return pa.table({name: pa.array([row[name] for row in rows], types[declared.type])
                     for name, declared in stream.fields.items()})


def assert_stores_hold(outputs: Outputs, good: list[Line], bad: list[Line]) -> None:
    """What PostgreSQL and Delta hold of every output kind equals the reference of the lines."""
    stream, db = outputs.stream, outputs.db
    distinct = {json.dumps(line.values, sort_keys=True): line.values for line in good}  # ids: every field
    assert not [r for r in read_table(outputs.root / outputs.plan / "quarantine").to_pylist()
                if r["source_file"].startswith("output:")], "a good line's row was refused by a store"

    events = db.run(lambda cursor: (cursor.execute(
        "SELECT payload FROM output_events WHERE plan = %s AND output = 'events'", (outputs.plan,)),
        cursor.fetchall())[1])
    expected = sorted(canonical(stream, values) for values in distinct.values())
    assert sorted(canonical(stream, e["payload"]) for e in events) == expected, "events"
    lake = read_events_lake(outputs.root / outputs.plan / "events")
    assert sorted(canonical(stream, row) for row in (lake.to_pylist() if lake.num_rows else [])) == expected, \
        "events in Delta"

    sums: dict[str, list[float]] = {}
    for values in distinct.values():
        sums.setdefault(json.dumps(values[stream.key]), []).append(values[outputs.value])
    merged = db.run(lambda cursor: read_table_rows(cursor, outputs.plan, "table", [outputs.value]))
    got = {json.dumps(row["key"][stream.key]): float(row[outputs.value]) for row in merged}
    assert got.keys() == sums.keys(), "table keys"
    for key, values in sums.items():
        assert close(got[key], values), (key, got[key], values)

    seconds: dict[tuple, list[float]] = {}
    for values in distinct.values():
        second = values[stream.event_time] // 1000 * 1000
        seconds.setdefault((second, str(values[stream.key])), []).append(float(values[outputs.value]))
    rows = db.run(lambda cursor: (cursor.execute(
        f'SELECT bucket_start, "{stream.key}" AS key, n, total, low, high FROM "{outputs.spec.table}" '
        "WHERE granularity = 'second'"), cursor.fetchall())[1]) if distinct else []
    stored = {(round(r["bucket_start"].timestamp() * 1000), r["key"]): r for r in rows}
    assert stored.keys() == seconds.keys(), "aggregation of facts: seconds and keys"
    for identity, values in seconds.items():
        row = stored[identity]
        assert (row["n"], row["low"], row["high"]) == (len(values), min(values), max(values)), identity
        assert close(row["total"], values), identity

    quarantined = read_table(outputs.root / outputs.plan / "quarantine").to_pylist()
    assert sorted(r["raw"] for r in quarantined) == sorted(line.kept for line in bad), "quarantine"
