"""Merge arithmetic: avg = Σsum / Σcount (never an average of averages), min of mins, max of maxes."""

from __future__ import annotations

from datetime import datetime, timezone

from tandem.aggregation.merge import merge_partials
from _project import TRADES

HOUR = datetime(2024, 5, 1, 10, tzinfo=timezone.utc)


def partial(instance: str, symbol: str, prices: list[float], quantities: list[int], bucket=HOUR) -> dict:
    return {"bucket_start": bucket, "symbol": symbol, "instance": instance, "price_sum": sum(prices),
            "trade_count": len(prices), "quantity_sum": sum(quantities), "price_min": min(prices),
            "price_max": max(prices)}


def test_seed_example_hourly_totals_add_up() -> None:
    # Reference seed 003: node 1 totals 30 and node 2 totals 40 in the same hour → 70.
    rows = merge_partials(TRADES, [partial("wso2-sp-1", "IBM", [10.0, 20.0], [10, 20]),
                                   partial("wso2-sp-2", "IBM", [30.0], [40])])
    assert len(rows) == 1
    assert rows[0]["quantity_sum"] == 70
    assert rows[0]["instances"] == 2


def test_average_is_weighted_by_count_not_an_average_of_averages() -> None:
    one = partial("a", "IBM", [10.0, 10.0, 10.0], [1, 1, 1])  # avg 10 over 3 trades
    two = partial("b", "IBM", [40.0], [1])  # avg 40 over 1 trade
    [row] = merge_partials(TRADES, [one, two])
    assert row["avg_price"] == 70.0 / 4  # 17.5, not (10 + 40) / 2 = 25
    assert row["trade_count"] == 4
    assert (row["price_min"], row["price_max"]) == (10.0, 40.0)


def test_groups_stay_apart_by_bucket_and_symbol_and_are_sorted() -> None:
    later = datetime(2024, 5, 1, 11, tzinfo=timezone.utc)
    rows = merge_partials(TRADES, [partial("a", "WSO2", [5.0], [1], later), partial("a", "IBM", [7.0], [2], later),
                                   partial("b", "IBM", [9.0], [3])])
    assert [(r["bucket_start"], r["symbol"]) for r in rows] == [(HOUR, "IBM"), (later, "IBM"), (later, "WSO2")]
    assert [r["instances"] for r in rows] == [1, 1, 1]


def test_merging_equals_a_single_node_that_saw_every_event() -> None:
    prices = [float(p) for p in range(1, 101)]
    quantities = list(range(100, 200))
    instances = [partial(f"s{k}", "IBM", prices[k::3], quantities[k::3]) for k in range(3)]
    [merged] = merge_partials(TRADES, instances)
    [single] = merge_partials(TRADES, [partial("all", "IBM", prices, quantities)])
    for column in ("price_sum", "trade_count", "quantity_sum", "price_min", "price_max", "avg_price"):
        assert merged[column] == single[column]


def test_no_rows_merge_to_no_rows() -> None:
    assert merge_partials(TRADES, []) == []
