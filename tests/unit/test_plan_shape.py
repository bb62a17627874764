"""Which changes of a plan a checkpoint cannot carry (tandem.plan_shape.changes, pure)."""

from __future__ import annotations

import copy

from tandem.plan_shape import changes

RECORDED = {"format": 1, "group": "shard", "parallel": 2, "partitions": {"trades": 4, "quotes": 2},
            "aggregations": {"stats": {"keys": ["symbol"], "measures": {"n": "count bigint",
                                                                       "total": "sum double precision"}}}}


def changed(edit) -> dict:
    current = copy.deepcopy(RECORDED)
    edit(current)
    return current


def test_the_same_shape_and_additions_are_no_change() -> None:
    assert changes(RECORDED, copy.deepcopy(RECORDED)) == []
    assert changes(RECORDED, changed(lambda s: s["partitions"].update(news=3))) == []
    assert changes(RECORDED, changed(lambda s: s["aggregations"].update(other={"keys": [], "measures": {}}))) == []
    assert changes(RECORDED, changed(lambda s: s["aggregations"].pop("stats"))) == []


def test_each_change_a_checkpoint_cannot_carry_is_named() -> None:
    assert changes(RECORDED, changed(lambda s: s.update(parallel=3))) == [
        "group shard's parallel changed from 2 to 3 (its instances would read partitions another one already "
        "counted)"]
    assert changes(RECORDED, changed(lambda s: s["partitions"].update(quotes=4))) == [
        "stream quotes's partitions changed from 2 to 4 (every key would move to another partition)"]
    assert changes(RECORDED, changed(lambda s: s["aggregations"]["stats"].update(keys=["symbol", "venue"]))) == [
        "aggregation stats's keys changed from symbol to symbol, venue"]

    def measures(s):
        m = s["aggregations"]["stats"]["measures"]
        m.pop("n")
        m["total"] = "sum bigint"
        m.update(low="min double precision", high="max double precision")

    assert changes(RECORDED, changed(measures)) == [
        "aggregation stats: measures low, high added", "aggregation stats: measure n removed",
        "aggregation stats: measure total from sum double precision to sum bigint changed"]
