"""distinct_exact measures (pure): exact sets merged by union and read as their size while a partial holds at most
``max_values`` values; past it an HLL sketch, read as approximate (``<measure>_exact`` false), never silently."""

from __future__ import annotations

import json
import logging
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from tandem.aggregation import distinct, exact_sets, sketches
from tandem.aggregation.merge import merge_partials
from tandem.aggregation.postgres import unions_by_parent
from tandem.aggregation.spec import UTC_MICROS, AggregationSpec, Measure, spec_for
from tandem.config import load_cluster, load_plan
from tandem.declarations import DEFAULT_MAX_VALUES
from tandem.outputs.aggregation import ApproximateNotices, KIND

UTC = timezone.utc
SECOND = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
BOUND = 50
VISITORS = Measure("visitors", "distinct_exact", "bytea", "user", max_values=BOUND)
SPEC = AggregationSpec(name="visits", table="visits", keys=("site",), measures=(
    Measure("visits", "count", "bigint"), VISITORS, Measure("sketched", "distinct", "bytea", "user")))
ERROR = 3 * 1.04 / 2 ** 6  # three standard errors of an lgK = 12 sketch


def users(first: int, last: int) -> list[str]:
    return [f"u{n}" for n in range(first, last)]


# -- the partials ---------------------------------------------------------------------------------------------------

def test_an_exact_set_is_its_sorted_values_as_compact_json_and_reads_back() -> None:
    values = ["b", "", "a", "é", "\U0010ffff", 'q"', "back\\slash", "nl\n", "b"]
    encoded = exact_sets.encode(values)
    assert encoded == json.dumps(sorted(set(values)), ensure_ascii=False, separators=(",", ":")).encode()
    assert encoded.startswith(b'["","a","b"')
    assert exact_sets.decode(encoded) == set(values)
    assert exact_sets.count(encoded) == (len(set(values)), True)
    assert exact_sets.encode([]) == b"[]" and exact_sets.count(b"[]") == (0, True)


def test_the_values_of_nothing_are_no_partial_and_none_is_ignored() -> None:
    assert exact_sets.of([], BOUND) is None
    assert exact_sets.of([None, None], BOUND) is None
    assert exact_sets.decode(exact_sets.of(["a", None, "a"], BOUND)) == {"a"}
    assert exact_sets.union([None, None], BOUND) is None
    assert exact_sets.count(None) == (0, True)


def test_a_union_within_the_bound_is_the_exact_union() -> None:
    one, two = exact_sets.of(users(0, 30), BOUND), exact_sets.of(users(20, 50), BOUND)
    merged = exact_sets.union([one, None, two], BOUND)
    assert exact_sets.decode(merged) == set(users(0, 50))  # 50 values: at the bound, still exact
    assert exact_sets.count(merged) == (50, True)


def test_a_union_past_the_bound_is_a_sketch_and_stays_one() -> None:
    one, two = exact_sets.of(users(0, 30), BOUND), exact_sets.of(users(20, 51), BOUND)
    merged = exact_sets.union([one, two], BOUND)
    assert merged.startswith(exact_sets.SKETCH_TAG) and not exact_sets.is_exact(merged)
    count, exact = exact_sets.count(merged)
    assert not exact and abs(count - 51) <= max(1.0, ERROR * 51)
    # a later union with a small set is still approximate, and counts the small set's new values
    later = exact_sets.union([merged, exact_sets.of(users(1000, 1040), BOUND)], BOUND)
    count, exact = exact_sets.count(later)
    assert not exact and abs(count - 91) <= max(1.0, ERROR * 91)


def test_the_sketch_past_the_bound_counts_as_an_hll_distinct_does() -> None:
    values = users(0, 5_000)
    count, exact = exact_sets.count(exact_sets.union([exact_sets.encode(values)], 10))
    assert not exact and abs(count - 5_000) <= ERROR * 5_000
    # an HLL estimate depends on the order values came in: two sketches of the same values agree within their errors
    assert abs(count - sketches.estimate(sketches.of(values))) <= 2 * ERROR * 5_000
    assert exact_sets.count(exact_sets.union([exact_sets.encode(["", "a", "b"])], 1)) == (3, False)  # "" counts


def test_a_set_too_large_in_bytes_is_a_sketch_whatever_max_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exact_sets, "MAX_SET_BYTES", 40)
    small, large = exact_sets.encode(users(0, 3)), exact_sets.encode(users(0, 12))
    assert len(small) <= 40 < len(large)
    assert exact_sets.union([small], 1_000) == small
    assert not exact_sets.is_exact(exact_sets.union([large], 1_000))
    assert not exact_sets.is_exact(exact_sets.bounded(large, 1_000))


def test_bounded_keeps_a_partial_within_the_bound_byte_for_byte() -> None:
    within = exact_sets.encode(users(0, BOUND))
    assert exact_sets.bounded(within, BOUND) == within
    past = exact_sets.bounded(exact_sets.encode(users(0, BOUND + 1)), BOUND)
    assert not exact_sets.is_exact(past)
    assert exact_sets.bounded(past, BOUND) == past  # a sketch stays as it is
    assert exact_sets.bounded(None, BOUND) is None


def test_a_read_unions_the_instances_exactly_past_the_bound_while_each_partial_is_a_set() -> None:
    parts = [exact_sets.of(users(k * 40, k * 40 + 45), BOUND) for k in range(3)]  # each within the bound
    assert all(exact_sets.is_exact(p) for p in parts)
    assert exact_sets.count_union(parts) == (len(set(users(0, 125))), True)
    with_sketch = [*parts, exact_sets.union([exact_sets.encode(users(500, 600))], BOUND)]
    count, exact = exact_sets.count_union(with_sketch)
    assert not exact and abs(count - 225) <= ERROR * 225


def test_an_hll_partial_kept_by_a_cut_over_reads_as_approximate_and_a_set_as_a_sketch() -> None:
    """A cut-over between distinct and distinct_exact keeps the older partials in the same column."""
    bare = sketches.of(users(0, 20))
    assert distinct.read(VISITORS, [bare, exact_sets.of(users(10, 30), BOUND)]) == \
        {"visitors": sketches.estimate(sketches.union([bare, sketches.of(users(10, 30))])), "visitors_exact": False}
    hll = SPEC.measures[2]
    assert distinct.read(hll, [exact_sets.of(users(0, 20), BOUND), bare]) == \
        {"sketched": sketches.estimate(sketches.of(users(0, 20)))}
    unioned = distinct.union(hll, [exact_sets.union([exact_sets.encode(users(0, 99))], BOUND), bare])
    assert sketches.estimate(unioned) == sketches.estimate(sketches.of(users(0, 99)))  # bare: a bare sketch again


# -- the measure and its merges -------------------------------------------------------------------------------------

def test_max_values_defaults_and_belongs_to_distinct_exact_alone() -> None:
    assert Measure("v", "distinct_exact", "bytea", "user").max_values == DEFAULT_MAX_VALUES == 100_000
    assert Measure("v", "distinct_exact", "bytea", "user").exact_flag == "v_exact"
    assert Measure("v", "distinct", "bytea", "user").exact_flag is None
    with pytest.raises(ValueError, match="max_values is a setting of a distinct_exact measure, not of distinct"):
        Measure("v", "distinct", "bytea", "user", max_values=5)
    with pytest.raises(ValueError, match="max_values must be at least 1"):
        Measure("v", "distinct_exact", "bytea", "user", max_values=0)
    assert SPEC.distinct_columns == ["visitors", "sketched"]


def partial(instance: str, who: list[str], bucket: datetime = SECOND, site: str = "a") -> dict:
    return {"bucket_start": bucket, "site": site, "instance": instance, "visits": len(who),
            "visitors": exact_sets.of(who, BOUND), "sketched": sketches.of(who)}


def test_merging_instances_equals_one_node_that_saw_every_event() -> None:
    rng = random.Random(7)
    events = [(rng.choice(["s-1", "s-2", "s-3"]), rng.choice("ab"), f"u{rng.randrange(60)}") for _ in range(400)]
    parts = []
    for instance in ("s-1", "s-2", "s-3"):
        for site in "ab":
            who = [u for i, s, u in events if i == instance and s == site]
            if who:
                parts.append(partial(instance, who, site=site))
    rows = merge_partials(SPEC, parts)
    for row in rows:
        want = {u for _, s, u in events if s == row["site"]}
        assert row["visitors"] == len(want) and row["visitors_exact"] is True
        assert row["visits"] == sum(1 for _, s, _ in events if s == row["site"])
        assert list(row) == ["bucket_start", "site", "visits", "visitors", "visitors_exact", "sketched", "instances"]


def test_a_merge_with_a_partial_past_the_bound_is_marked_approximate() -> None:
    over = partial("s-1", users(0, BOUND + 30))
    assert not exact_sets.is_exact(over["visitors"])
    [row] = merge_partials(SPEC, [over, partial("s-2", users(0, 10))])
    assert row["visitors_exact"] is False
    assert abs(row["visitors"] - (BOUND + 30)) <= max(1.0, ERROR * (BOUND + 30))
    [other] = merge_partials(SPEC, [partial("s-1", users(0, 10), bucket=SECOND + timedelta(seconds=1))])
    assert (other["visitors"], other["visitors_exact"]) == (10, True)  # another bucket stays exact


def test_a_roll_up_unions_each_parents_children_within_the_bound() -> None:
    children = [exact_sets.of(users(0, 10), BOUND), exact_sets.of(users(5, 20), BOUND), None,
                exact_sets.of(users(0, 40), BOUND), exact_sets.of(users(40, 80), BOUND)]
    parents = [0, 0, 1, 2, 2]
    first, second, third = unions_by_parent(VISITORS, parents, children, 3)
    assert exact_sets.decode(first) == set(users(0, 20))
    assert second is None
    assert not exact_sets.is_exact(third) and not exact_sets.count(third)[1]


# -- what is stored, and what is said of it -------------------------------------------------------------------------

def seconds_table(sets: list[list[str]]) -> pa.Table:
    return pa.table({"bucket_start": pa.array([SECOND + timedelta(seconds=i) for i in range(len(sets))], UTC_MICROS),
                     "site": pa.array(["a"] * len(sets)),
                     "visits": pa.array([len(s) for s in sets], pa.int64()),
                     "visitors": pa.array([exact_sets.encode(s) for s in sets], pa.binary()),
                     "sketched": pa.array([sketches.of(s) for s in sets], pa.binary())})


def test_spark_seconds_past_the_bound_are_stored_as_sketches_and_the_others_as_they_are() -> None:
    within = seconds_table([users(0, 5), users(0, BOUND)])
    assert distinct.bounded(SPEC, within) is within  # nothing to change: not even read
    rows = seconds_table([users(0, 5), users(0, BOUND + 1), []])
    stored = distinct.bounded(SPEC, rows)
    got = stored.column("visitors").to_pylist()
    assert got[0] == exact_sets.encode(users(0, 5)) and got[2] == b"[]"
    assert not exact_sets.is_exact(got[1])
    assert stored.column("sketched").to_pylist() == rows.column("sketched").to_pylist()


def written(rows: pa.Table, granularity: str = "second", instance: str = "s-1") -> pa.Table:
    stored = distinct.bounded(SPEC, rows)
    return (stored.add_column(0, "granularity", pa.array([granularity] * stored.num_rows))
            .append_column("instance", pa.array([instance] * stored.num_rows)))


def test_the_partials_past_the_bound_are_named_with_their_bucket_and_told_once(caplog) -> None:
    rows = written(seconds_table([users(0, 5), users(0, BOUND + 1), users(0, BOUND + 2)]))
    found = distinct.approximate(SPEC, rows)
    assert [(a.measure, a.granularity, a.bucket_start, a.keys, a.instance) for a in found] == [
        ("visitors", "second", SECOND + timedelta(seconds=s), (("site", "a"),), "s-1") for s in (1, 2)]
    notices = ApproximateNotices("web", "visits")
    with caplog.at_level(logging.WARNING, logger="tandem.outputs.aggregation"):
        assert notices.note(SPEC, rows) == found
        assert notices.note(SPEC, rows) == []  # the next batch writing the same buckets says nothing new
        assert len(notices.note(SPEC, written(seconds_table([users(0, BOUND + 1)]), instance="s-2"))) == 1
    [first, second] = [r.getMessage() for r in caplog.records]
    assert first.startswith("plan web, output visits: 2 distinct_exact partials past max_values, stored as HLL "
                            "sketches and read as approximate (<measure>_exact false) from now on: ")
    assert (f"visitors second {(SECOND + timedelta(seconds=1)).isoformat()} site=a instance s-1 "
            f"(past max_values {BOUND})") in first
    assert "instance s-2" in second and "1 distinct_exact partial past" in second


def test_an_aggregation_without_distinct_exact_says_nothing() -> None:
    spec = AggregationSpec(name="v", table="v", keys=(), measures=(Measure("n", "count", "bigint"),))
    assert ApproximateNotices("web", "v").note(spec, spec.written_schema.empty_table()) == []


# -- the declaration ------------------------------------------------------------------------------------------------

def test_a_plan_declares_distinct_exact_with_its_bound(conf: Path) -> None:
    path = conf / "plans" / "trades.yaml"
    declared = yaml.safe_load(path.read_text())
    declared["outputs"]["trade_aggregates"]["measures"].update(
        traders={"distinct_exact": "symbol"}, traders_small={"distinct_exact": "symbol", "max_values": 10},
        traders_hll={"distinct": "symbol"})
    path.write_text(yaml.safe_dump(declared))
    plan = load_plan("trades", load_cluster(conf / "cluster.yaml"))
    measures = {m.column: m for m in spec_for(plan, "trade_aggregates").measures}
    assert (measures["traders"].kind, measures["traders"].sql_type, measures["traders"].source,
            measures["traders"].max_values) == ("distinct_exact", "bytea", "symbol", DEFAULT_MAX_VALUES)
    assert measures["traders_small"].max_values == 10 and measures["traders_hll"].max_values is None
    summary = KIND.summary(plan, "trade_aggregates")["measures"]  # what the Tandem page shows
    for name in ("traders", "traders_small"):
        assert summary[summary.index(name) + 1] == f"{name}_exact"
    assert "traders_hll_exact" not in summary and summary[0] == "avg_price"
    assert KIND.state_shape(plan, "trade_aggregates")["measures"]["traders"] == "distinct_exact bytea"
