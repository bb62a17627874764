"""Which changes of a plan a checkpoint cannot carry (tandem.plan_shape.changes, pure)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tandem.plan_shape import _read, changes

RECORDED = {"format": 2, "group": "shard", "parallel": 2, "partitions": {"trades": 4, "quotes": 2},
            "outputs": {"stats": {"kind": "aggregation", "keys": ["symbol"],
                                  "measures": {"n": "count bigint", "total": "sum double precision"}}}}


def changed(edit) -> dict:
    current = copy.deepcopy(RECORDED)
    edit(current)
    return current


def test_the_same_shape_and_additions_are_no_change() -> None:
    assert changes(RECORDED, copy.deepcopy(RECORDED)) == []
    assert changes(RECORDED, changed(lambda s: s["partitions"].update(news=3))) == []
    assert changes(RECORDED, changed(lambda s: s["outputs"].update(other={"kind": "aggregation", "keys": [], "measures": {}}))) == []
    assert changes(RECORDED, changed(lambda s: s["outputs"].pop("stats"))) == []


def test_each_change_a_checkpoint_cannot_carry_is_named() -> None:
    assert changes(RECORDED, changed(lambda s: s.update(parallel=3))) == [
        "group shard's parallel changed from 2 to 3 (its instances would read partitions another one already "
        "counted)"]
    assert changes(RECORDED, changed(lambda s: s["partitions"].update(quotes=4))) == [
        "stream quotes's partitions changed from 2 to 4 (every key would move to another partition)"]
    assert changes(RECORDED, changed(lambda s: s["outputs"]["stats"].update(keys=["symbol", "venue"]))) == [
        "aggregation stats's keys changed from symbol to symbol, venue"]

    def measures(s):
        m = s["outputs"]["stats"]["measures"]
        m.pop("n")
        m["total"] = "sum bigint"
        m.update(low="min double precision", high="max double precision")

    assert changes(RECORDED, changed(measures)) == [
        "aggregation stats: measures low, high added", "aggregation stats: measure n removed",
        "aggregation stats: measure total from sum double precision to sum bigint changed"]
    assert changes(RECORDED, changed(lambda s: s["outputs"]["stats"].update(kind="latest"))) == [
        "aggregation stats became a latest output"]


def test_a_record_of_the_first_format_reads_as_the_current_one(tmp_path: Path) -> None:
    legacy = {**{k: v for k, v in RECORDED.items() if k != "outputs"}, "format": 1,
              "aggregations": {"stats": {"keys": ["symbol"], "measures": {"n": "count bigint",
                                                                         "total": "sum double precision"}}}}
    (tmp_path / "shape.json").write_text(json.dumps(legacy))
    assert _read(tmp_path / "shape.json") == RECORDED
    (tmp_path / "shape.json").write_text(json.dumps({**RECORDED, "format": 9}))
    assert _read(tmp_path / "shape.json") is None
