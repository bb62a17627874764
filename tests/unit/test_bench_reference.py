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
from tandem.config import load_cluster, load_plan  # noqa: E402
from tandem.declarations import FieldConfig  # noqa: E402
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
def test_the_line_rule_follows_the_plans_declaration(change: dict, valid: bool, conf: Path) -> None:
    event = {**GOOD, **change}
    assert (C.valid_trade(json.dumps(event)) is not None) is valid
    trades = load_plan("trades", load_cluster(conf / "cluster.yaml")).streams["trades"]
    assert (C.valid_event(json.dumps(event), trades.fields) is not None) is valid  # the rule read from the YAML


def test_the_rule_read_from_a_declaration_refuses_a_repeated_key_and_fills_a_default() -> None:
    fields = {"room_no": FieldConfig(type="long", at_least=0), "device_id": FieldConfig(type="string", not_empty=True),
              "temp": FieldConfig(type="double", default=20.0)}
    assert C.valid_event('{"room_no": 1, "device_id": "d"}', fields) == {"room_no": 1, "device_id": "d", "temp": 20.0}
    assert C.valid_event('{"room_no": 1, "device_id": "d", "room_no": 2}', fields) is None
    assert C.valid_event('{"room_no": 1, "device_id": "d", "temp": Infinity}', fields) is None
    assert C.valid_event('{"room_no": -1, "device_id": "d"}', fields) is None
    assert C.valid_event('{"room_no": 1.0, "device_id": "d"}', fields) is None


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


def _changes(path: Path, *changes: tuple[str, dict | None, dict | None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"before": before, "after": after, "op": op}) + "\n"
                            for op, before, after in changes))


def test_flinks_trade_rows_are_read_with_utc_buckets_in_epoch_millis(tmp_path: Path) -> None:
    row = {"bucket_start": "2025-01-01 00:00:01", "symbol": "IBM", "price_sum": 21.0, "trade_count": 2,
           "quantity_sum": 7, "price_min": 10.5, "price_max": 10.5}
    older = {**row, "bucket_start": "2024-12-31 23:59:59", "symbol": "WSO2", "price_sum": 3.25, "trade_count": 1}
    _changes(tmp_path / "trade_aggregates" / "part-u-0-0", ("c", None, row), ("c", None, older))
    _changes(tmp_path / "trade_aggregates" / ".part-u-1-0.inprogress", ("c", None, {**row, "symbol": "X"}))
    rows = flink_peer.read_rows(tmp_path).sort_values("bucket_start")
    assert rows["bucket_start"].tolist() == [1_735_689_599_000, 1_735_689_601_000]
    assert rows["symbol"].tolist() == ["WSO2", "IBM"]
    assert rows["trade_count"].tolist() == [1, 2]


def test_an_outputs_changes_fold_into_its_rows_in_any_order(tmp_path: Path) -> None:
    a, b = {"order_no": "o-1", "n": 1}, {"order_no": "o-2", "n": 2}
    # a retraction read before the row it takes out: a multiset does not mind the order
    _changes(tmp_path / "overdue_orders" / "part-u-0-0", ("d", a, None), ("c", None, b), ("c", None, b))
    _changes(tmp_path / "overdue_orders" / "part-u-1-0", ("c", None, a), ("c", None, a))
    assert sorted(r["order_no"] for r in flink_peer.read_outputs(tmp_path, "pizza_shop")["overdue_orders"]) == \
        ["o-1", "o-2", "o-2"]
    _changes(tmp_path / "overdue_orders" / "part-u-1-1", ("d", b, None), ("d", b, None), ("d", b, None))
    with pytest.raises(ValueError, match="taken out more often"):
        flink_peer.read_outputs(tmp_path, "pizza_shop")


def test_a_keyed_outputs_upserts_apply_in_the_order_its_subtask_wrote_them(tmp_path: Path) -> None:
    def latest(order_no: str) -> dict:
        return {"customer_name": "alice", "order_no": order_no}

    out = tmp_path / "last_orders"
    # a subtask's 10th file comes after its 2nd (numbers, not text); an update is written as its new row alone
    _changes(out / "part-u-0-2", ("c", None, latest("o-1")), ("c", None, latest("o-2")))
    _changes(out / "part-u-0-10", ("c", None, latest("o-3")))
    _changes(out / "part-u-1-0", ("c", None, {"customer_name": "bob", "order_no": "o-9"}), ("d", {
        "customer_name": "bob", "order_no": "o-9"}, None))
    assert flink_peer.read_outputs(tmp_path, "pizza_shop")["last_orders"] == [latest("o-3")]
    _changes(out / "part-u-1-1", ("c", None, latest("o-4")))
    with pytest.raises(ValueError, match="two sink subtasks"):
        flink_peer.read_outputs(tmp_path, "pizza_shop")

def test_flinks_last_orders_tie_break_hashes_the_text_tandems_event_id_hashes() -> None:
    """Flink's ``last_orders`` breaks a tie by ``SHA256`` of a JSON text it builds in SQL: the same text, hashed,
    must be Tandem's event id of the order (``tandem.declarations.event_id``)."""
    import hashlib

    from tandem.declarations import event_id

    head, tail = '{"order_no":', ',"output":"last_orders","plan":"pizza_shop"}'
    query = flink_peer.PIZZA_SHOP.outputs["last_orders"].query
    assert f"CONCAT(\n        '{head}', JSON_STRING(order_no), '{tail}')" in query
    for order_no in ("o1750000000000-16005", 'a "quoted" \\ one'):
        text = head + json.dumps(order_no) + tail
        assert hashlib.sha256(text.encode()).hexdigest()[:32] == event_id("pizza_shop", "last_orders",
                                                                          {"order_no": order_no})
