"""The benchmarks' references for the trades plan (``bench/_common.py``) and the Flink peer's reading of its rows
(``bench/flink_peer.py``): what judges Tandem's, the plain job's and Flink's outputs must itself be right."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import _common as C  # noqa: E402
import flink_peer  # noqa: E402
from tandem.sources.files import write_atomically  # noqa: E402

GOOD = {"symbol": "IBM", "price": 10.5, "quantity": 3, "timestamp": 1_735_689_600_123}


@pytest.mark.parametrize("change, valid", [
    ({}, True),
    ({"price": 7}, True),                          # an integer is a number
    ({"symbol": "  "}, False),                     # empty once stripped
    ({"symbol": "A\x00B"}, False),
    ({"symbol": {"nested": True}}, False),
    ({"symbol": 5}, False),
    ({"price": 0}, False),
    ({"price": "10.5"}, False),                    # a string is not a number
    ({"price": True}, False),
    ({"quantity": 1.5}, False),
    ({"quantity": 0}, False),
    ({"timestamp": -5}, False),                    # before 1970
    ({"timestamp": 253_402_300_800_000}, False),   # after 9999
    ({"timestamp": "yesterday"}, False),
])
def test_the_line_rule_follows_the_plans_declaration(change: dict, valid: bool) -> None:
    event = {**GOOD, **change}
    assert (C.valid_trade(json.dumps(event)) is not None) is valid


@pytest.mark.parametrize("line", ["{not json", "[1, 2, 3]", "", '{"price": 10.0, "quantity": 1, "timestamp": 5}'])
def test_lines_that_are_no_event_are_invalid(line: str) -> None:
    assert C.valid_trade(line) is None


def test_the_reference_read_from_the_lines_equals_the_one_computed_from_the_generator(tmp_path: Path) -> None:
    spec = C.InputSpec(events=4_000, files=4, symbols=7, span_hours=0.05, bad_ratio=0.05, seed=3)
    written = C.prepare_input(spec, tmp_path, write_atomically)
    from_lines, valid, invalid = C.trades_reference(sorted(written.directory.glob("*.jsonl")))
    assert (valid, invalid) == (written.valid, written.invalid)
    assert invalid > 100  # every kind of bad line is there
    comparison = C.compare_frames(from_lines, C.ground_truth(spec, 1000))
    assert comparison["match"], comparison
    assert comparison["rows_left"] == written.second_rows


def test_a_changed_measure_a_missing_and_an_extra_row_are_each_found() -> None:
    base = pd.DataFrame({"bucket_start": [0, 1000], "symbol": ["A", "B"], "price_sum": [1.5, 2.0],
                         "trade_count": [1, 2], "quantity_sum": [3, 4], "price_min": [1.5, 1.0],
                         "price_max": [1.5, 1.0]})
    assert C.compare_frames(base, base.copy())["match"]
    changed = base.assign(quantity_sum=[3, 5])
    assert C.compare_frames(changed, base)["mismatched"] == 1
    extra = pd.concat([base, base.assign(symbol=["C", "D"])], ignore_index=True)
    result = C.compare_frames(extra, base)
    assert (result["only_left"], result["only_right"], result["match"]) == (2, 0, False)


def test_flinks_csv_rows_are_read_with_utc_buckets_in_epoch_millis(tmp_path: Path) -> None:
    part = tmp_path / "part-1-0.csv"
    part.write_text("2025-01-01 00:00:01,IBM,21.0,2,7,10.5,10.5\n2024-12-31 23:59:59,WSO2,3.25,1,1,3.25,3.25\n")
    (tmp_path / ".part-2-0.csv.inprogress").write_text("2025-01-01 00:00:02,IBM,1.0,1,1,1.0,1.0\n")
    rows = flink_peer.read_rows(tmp_path).sort_values("bucket_start")
    assert rows["bucket_start"].tolist() == [1_735_689_599_000, 1_735_689_601_000]
    assert rows["symbol"].tolist() == ["WSO2", "IBM"]
    assert rows["trade_count"].tolist() == [1, 2]
