"""The demo's closing check: the merged per-second trade aggregates against what it produced."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from tandem.config import load_cluster, load_plan
from tandem.demo import compare_trade_seconds, expected_trade_seconds, quarantined_lines, quarantined_of
from tandem.lake.tables import append_once
from tandem.layout import delta_table_dir
from tandem.outputs.quarantine import QUARANTINE_SCHEMA

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


def test_the_quarantined_lines_are_counted_in_the_plans_quarantine_output_whatever_its_name(
        conf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan_file = conf / "plans" / "trades.yaml"
    shipped = plan_file.read_text()
    plan_file.write_text(shipped.replace("  quarantine:\n    kind: quarantine\n", "  rejects:\n    kind: quarantine\n"))
    assert plan_file.read_text() != shipped
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    monkeypatch.setenv("TANDEM_STORAGE_ROOT", str(tmp_path / "data"))
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    append_once(delta_table_dir(cluster, "trades", "rejects"), pa.Table.from_pylist([
        {"raw": "{", "source_file": f"f{i}", "reason": "malformed JSON", "plan": "trades", "instance": "shard-1",
         "node": "node-a", "batch_id": 0, "quarantined_at": start + timedelta(minutes=i), "plan_version": "v"}
        for i in range(5)], schema=QUARANTINE_SCHEMA), "test", 0)
    assert quarantined_lines(cluster, plan, start + timedelta(minutes=3)) == 2
    assert quarantined_lines(cluster, plan) == 5
    # by text (a run's own bad lines among what earlier runs left): each row holding one counts, "{" five times
    assert quarantined_of(cluster, plan, ["{\n"]) == 5
    assert quarantined_of(cluster, plan, ["}", "not quarantined"]) == 0
