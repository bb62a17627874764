"""The demo's closing check: the merged per-second trade aggregates against what it produced."""

from __future__ import annotations

from datetime import datetime, timezone

from tandem.demo import compare_trade_seconds, expected_trade_seconds

UTC = timezone.utc
T = 1_795_000_000_000  # ms, a whole second


def test_trades_are_counted_per_second_and_symbol() -> None:
    events = [{"symbol": "IBM", "timestamp": T, "quantity": 3}, {"symbol": "IBM", "timestamp": T + 999, "quantity": 4},
              {"symbol": "IBM", "timestamp": T + 1000, "quantity": 5}, {"symbol": "AAPL", "timestamp": T, "quantity": 1}]
    second = datetime.fromtimestamp(T / 1000, UTC)
    assert expected_trade_seconds(events) == {
        (second, "IBM"): (2, 7), (datetime.fromtimestamp(T / 1000 + 1, UTC), "IBM"): (1, 5), (second, "AAPL"): (1, 1)}


def test_a_lost_a_doubled_and_an_unexpected_bucket_are_all_reported() -> None:
    s0, s1, s2 = (datetime.fromtimestamp(T / 1000 + i, UTC) for i in range(3))
    expected = {(s0, "IBM"): (2, 7), (s1, "IBM"): (1, 5)}
    rows = [{"bucket_start": s0, "symbol": "IBM", "trade_count": 4, "quantity_sum": 14},
            {"bucket_start": s2, "symbol": "IBM", "trade_count": 1, "quantity_sum": 1}]
    assert compare_trade_seconds(expected, rows) == [
        ((s0, "IBM"), "4 trades / quantity 14, produced 2 / 7"), ((s1, "IBM"), "missing"),
        ((s2, "IBM"), "not produced")]
    exact = [{"bucket_start": s0, "symbol": "IBM", "trade_count": 2, "quantity_sum": 7},
             {"bucket_start": s1, "symbol": "IBM", "trade_count": 1, "quantity_sum": 5}]
    assert compare_trade_seconds(expected, exact) == []
