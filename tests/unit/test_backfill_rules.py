"""The pure decisions of a backfill: which ranges are closed, which input is gone, which recomputed seconds count."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa

import pytest
from _conf import edit_yaml
from tandem.batch.backfill import closed_until, read_through, refusal_of_range, retention_refusal
from tandem.outputs.aggregation import newest_seconds
from tandem.outputs.recompute import BATCH_COLUMN
from tandem.config import load_cluster, load_plan
from tandem.errors import ConfigError
from tandem.sources.files import missing_input

UTC = timezone.utc
T = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)


def test_an_instance_is_closed_up_to_its_slowest_query_at_its_furthest_node() -> None:
    positions = {("p/shard-1/node-a", "aggregates"): T, ("p/shard-1/node-b", "aggregates"): T + timedelta(seconds=5),
                 ("p/shard-1/node-a", "alerts"): T + timedelta(seconds=3), ("p/shard-1/node-a", "quarantine"): None,
                 ("p/shard-2/node-a", "quarantine"): None}
    assert closed_until(positions, ["shard-1", "shard-2", "shard-3"]) == {
        "shard-1": T + timedelta(seconds=3), "shard-2": None, "shard-3": None}


def test_only_a_closed_non_empty_range_with_zones_may_be_backfilled() -> None:
    closed = {"shard-1": T, "shard-2": T - timedelta(seconds=1)}
    assert refusal_of_range(T - timedelta(minutes=5), T - timedelta(seconds=1), closed) is None
    assert "not closed" in refusal_of_range(T - timedelta(minutes=5), T, closed)
    assert "shard-2" in refusal_of_range(T - timedelta(minutes=5), T, closed)
    assert "empty" in refusal_of_range(T, T, closed)
    assert "time zone" in refusal_of_range(T.replace(tzinfo=None), T, closed)
    assert "no event-time watermark" in refusal_of_range(T - timedelta(minutes=5), T, {"shard-1": None})


def test_an_instance_without_state_is_closed_by_arrival_up_to_its_oldest_unread_input_less_the_lateness() -> None:
    ms = int(T.timestamp() * 1000)
    now = ms + 5_000
    assert read_through([], now, 10.0) == T + timedelta(seconds=5 - 10), "all read: now, less 10 s"
    assert read_through([ms - 30_000, ms - 45_000], now, 10.0) == T - timedelta(seconds=45 + 10), "the oldest unread"
    assert read_through([ms - 60_000], now, 0.0) == T - timedelta(seconds=60)


def test_missing_input_is_what_was_read_since_the_start_and_is_gone_oldest_first() -> None:
    start_ms = int(T.timestamp() * 1000)
    processed = {"file:///l/0/a%20b.jsonl": start_ms + 5, "file:///l/0/old.jsonl": start_ms - 1,
                 "file:///l/0/kept.jsonl": start_ms + 1, "file:///l/0/first.jsonl": start_ms}
    kept = {Path("/l/0/kept.jsonl")}
    assert missing_input(processed, T, lambda p: p in kept) == [Path("/l/0/first.jsonl"), Path("/l/0/a b.jsonl")]


def test_the_newest_batch_of_each_second_in_the_range_counts() -> None:
    rows = pa.table({"bucket_start": pa.array([T, T, T + timedelta(seconds=1), T - timedelta(seconds=1),
                                               T + timedelta(seconds=9)], pa.timestamp("us", tz="UTC")),
                     "symbol": ["IBM", "IBM", "IBM", "IBM", "IBM"], "trade_count": [1, 3, 2, 7, 4],
                     BATCH_COLUMN: [0, 1, 0, 0, 0]})
    seconds = newest_seconds(rows, ("symbol",), T, T + timedelta(seconds=9))
    assert sorted((r["bucket_start"], r["trade_count"]) for r in seconds.to_pylist()) == [
        (T, 3), (T + timedelta(seconds=1), 2)]
    assert BATCH_COLUMN not in seconds.column_names


def test_partials_differ_as_late_extra_or_different() -> None:
    from tandem.outputs.aggregation import compare_partials
    from tandem.outputs.recompute import Outcome

    def row(second: int, symbol: str, count: int, total: float) -> dict:
        return {"bucket_start": T + timedelta(seconds=second), "symbol": symbol, "trade_count": count,
                "price_sum": total}

    published = [row(0, "IBM", 2, 3.0), row(1, "IBM", 1, 1.0), row(2, "IBM", 1, 1.0), row(3, "IBM", 2, 0.1 + 0.2)]
    recomputed = [row(0, "IBM", 3, 4.0), row(1, "IBM", 1, 2.0), row(3, "IBM", 2, 0.3), row(4, "IBM", 1, 5.0)]
    outcome = compare_partials(Outcome("shard-1", "trades"), published, recomputed, ("symbol",),
                               ["trade_count", "price_sum"], "trade_count")
    assert outcome.counts == {"late": 2, "extra": 1, "different": 1} and outcome.real == 2 and outcome.compared == 5
    assert [e["bucket_start"] for e in outcome.examples["late"]] == [str(T), str(T + timedelta(seconds=4))]
    assert outcome.examples["different"] == [{"bucket_start": str(T + timedelta(seconds=1)), "symbol": "IBM",
                                               "price_sum": [1.0, 2.0]}]


def test_ids_differ_as_late_extra_or_different_and_without_the_published_side_only_as_late() -> None:
    from tandem.outputs.recompute import Outcome, compare_ids

    recomputed = {"a": {"n": 1, "avg": 31.469999999999995}, "b": {"n": 2}, "c": {"n": 3}}
    published = {"a": {"n": 1, "avg": 31.470000000000002, "extra": 0}, "b": {"n": 9}, "d": {"n": 4}}
    outcome = compare_ids(Outcome("s", "events"), published, recomputed)
    assert outcome.counts == {"late": 1, "extra": 1, "different": 1}  # a's average: the same sum in another order
    assert outcome.examples == {"late": [{"id": "c"}], "extra": [{"id": "d"}], "different": [{"id": "b", "n": [9, 2]}]}
    assert compare_ids(Outcome("s", "e"), {"a": {"avg": 31.48}}, {"a": {"avg": 31.47}}).counts["different"] == 1
    assert compare_ids(Outcome("s", "facts"), None, {"x": {}}).counts == {"late": 1, "extra": 0, "different": 0}


def test_only_the_lease_holder_s_newest_watermark_closes_a_range() -> None:
    # node-b ran further before a restore took shard-1 back; node-a holds the lease now
    positions = {("p/shard-1/node-a", "aggregates"): T, ("p/shard-1/node-b", "aggregates"): T + timedelta(hours=1)}
    assert closed_until(positions, ["shard-1"], {"shard-1": "node-a"}) == {"shard-1": T}
    assert closed_until(positions, ["shard-1"], {"shard-1": None}) == {"shard-1": T + timedelta(hours=1)}


def test_a_range_reaching_rows_the_retention_deleted_is_refused(conf: Path) -> None:
    cluster = load_cluster(conf / "cluster.yaml")
    trades = load_plan("trades", cluster)
    instances = list(trades.instances)
    old = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
    seconds_gone = {"partials/trade_aggregates/second": old + timedelta(days=1)}
    assert retention_refusal(trades, old, old + timedelta(minutes=30), {}, instances) is None, "nothing trimmed"
    assert retention_refusal(trades, old, old + timedelta(minutes=30), seconds_gone, instances) is None, "aligned"
    inside = retention_refusal(trades, old + timedelta(seconds=90), old + timedelta(minutes=30), seconds_gone, instances)
    assert "inside the minute bucket" in inside and "maintenance.retention.partials.second" in inside
    assert "start it at a minute boundary (2026-11-20T09:01:00+00:00 or 2026-11-20T09:02:00+00:00)" in inside
    ends = retention_refusal(trades, old, old + timedelta(minutes=30, seconds=5), seconds_gone, instances)
    assert ends.startswith("it ends at")
    later = old + timedelta(days=2)
    assert retention_refusal(trades, later + timedelta(seconds=7), later + timedelta(seconds=9), seconds_gone,
                             instances) is None, "the minute's seconds are all there"

    pizza = load_plan("pizza_shop", cluster)  # order_stats and delivered_orders: published once by id
    ids_gone = {"contributions/orders-1": old}
    assert "ids of delivered_orders, order_stats applied before" in retention_refusal(
        pizza, old, old + timedelta(hours=1), ids_gone, ["orders-1"])
    assert retention_refusal(pizza, old, old + timedelta(hours=1), ids_gone, ["orders-2"]) is None
    assert retention_refusal(pizza, old + timedelta(hours=1), old + timedelta(hours=2), ids_gone, ["orders-1"]) is None
    facts = retention_refusal(pizza, old, old + timedelta(hours=1), {"partials/pizza_shop_order_stats/second":
                                                                     old + timedelta(minutes=5)}, ["orders-1"])
    assert "order_stats adds facts to its second rows" in facts

    edit_yaml(conf / "plans" / "pizza_shop.yaml", lambda d: d.setdefault("maintenance", {}).update(keep_input="40 days"))
    with pytest.raises(ConfigError, match="maintenance.keep_input: keeps input 40 days, longer than "
                                          "maintenance.retention.contributions .30 days."):
        load_plan("pizza_shop", load_cluster(conf / "cluster.yaml"))
