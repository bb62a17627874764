"""How a plan's change compares with what a checkpoint was built from (tandem.plan_shape.changes, pure)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tandem.plan_shape import (
    CODE, STATE_COMPATIBLE, STATE_REBUILD, STREAM_SCHEMA, TOPOLOGY, _read, changes,
)

RECORDED = {"format": 2, "version": "aaaaaaaaaaaa", "group": "shard", "parallel": 2,
            "partitions": {"trades": 4, "quotes": 2},
            "fields": {"trades": {"symbol": "string", "price": "double", "user": "string from user-id"},
                       "quotes": {"symbol": "string"}},
            "outputs": {"stats": {"kind": "aggregation", "keys": ["symbol"],
                                  "measures": {"n": "count bigint", "total": "sum double precision"}}}}


def changed(edit, version: str = "bbbbbbbbbbbb") -> dict:
    current = copy.deepcopy(RECORDED)
    current["version"] = version
    edit(current)
    return current


def found(edit) -> list[tuple[str, str]]:
    return [(c.kind, c.text) for c in changes(RECORDED, changed(edit))]


def test_the_same_plan_is_no_change_and_another_version_of_it_is_code_only() -> None:
    assert changes(RECORDED, copy.deepcopy(RECORDED)) == []
    (only,) = changes(RECORDED, changed(lambda s: None))
    assert (only.kind, only.refused) == (CODE, False)
    assert only.text.startswith("version aaaaaaaaaaaa to bbbbbbbbbbbb: the plan's YAML or module changed")
    legacy = {k: v for k, v in RECORDED.items() if k not in ("version", "fields")}  # recorded before versions
    assert changes(legacy, changed(lambda s: None)) == []


def test_additions_and_removals_are_state_compatible_and_taken() -> None:
    assert found(lambda s: (s["partitions"].update(news=3), s["fields"].update(news={"a": "long"}))) == [
        (STATE_COMPATIBLE, "stream news added")]
    assert found(lambda s: s["outputs"].update(other={"kind": "aggregation", "keys": [], "measures": {}})) == [
        (STATE_COMPATIBLE, "aggregation other added (its query starts its own checkpoint)")]
    assert found(lambda s: s["outputs"].pop("stats")) == [
        (STATE_COMPATIBLE, "aggregation stats removed (its state is not read any more)")]
    assert found(lambda s: (s["partitions"].pop("quotes"), s["fields"].pop("quotes"))) == [
        (STATE_COMPATIBLE, "stream quotes removed (not read any more)")]


def test_stream_fields_added_removed_retyped_or_renamed_are_stream_schema_changes() -> None:
    def edit(s):
        fields = s["fields"]["trades"]
        fields["venue"] = "string"
        fields.pop("symbol")
        fields["price"] = "long"
        fields["user"] = "string from login"

    assert found(edit) == [(STREAM_SCHEMA, "stream trades: field venue (string) added"),
                           (STREAM_SCHEMA, "stream trades: field symbol (string) removed"),
                           (STREAM_SCHEMA, "stream trades: field price from double to long"),
                           (STREAM_SCHEMA, "stream trades: field user from string from user-id to string from login")]
    assert not any(c.refused for c in changes(RECORDED, changed(edit)))


def test_each_change_a_checkpoint_cannot_carry_is_named_and_refused() -> None:
    assert found(lambda s: s.update(parallel=3)) == [
        (TOPOLOGY, "group shard's parallel changed from 2 to 3 (its instances would read partitions another one "
                   "already counted)")]
    assert found(lambda s: s["partitions"].update(quotes=4)) == [
        (TOPOLOGY, "stream quotes's partitions changed from 2 to 4 (every key would move to another partition)")]
    assert found(lambda s: s["outputs"]["stats"].update(keys=["symbol", "venue"])) == [
        (STATE_REBUILD, "aggregation stats's keys changed from symbol to symbol, venue")]

    def measures(s):
        m = s["outputs"]["stats"]["measures"]
        m.pop("n")
        m["total"] = "sum bigint"
        m.update(low="min double precision", high="max double precision")

    assert found(measures) == [
        (STATE_REBUILD, "aggregation stats: measures low, high added"),
        (STATE_REBUILD, "aggregation stats: measure n removed"),
        (STATE_REBUILD, "aggregation stats: measure total from sum double precision to sum bigint changed")]
    assert found(lambda s: s["outputs"]["stats"].update(kind="latest")) == [
        (STATE_REBUILD, "aggregation stats became a latest output")]
    assert all(c.refused for c in changes(RECORDED, changed(measures)))


def test_a_record_of_the_first_format_reads_as_the_current_one(tmp_path: Path) -> None:
    current = {k: v for k, v in RECORDED.items() if k not in ("version", "fields")}
    legacy = {**{k: v for k, v in current.items() if k != "outputs"}, "format": 1,
              "aggregations": {"stats": {"keys": ["symbol"], "measures": {"n": "count bigint",
                                                                         "total": "sum double precision"}}}}
    (tmp_path / "shape.json").write_text(json.dumps(legacy))
    assert _read(tmp_path / "shape.json") == current
    (tmp_path / "shape.json").write_text(json.dumps({**RECORDED, "format": 9}))
    assert _read(tmp_path / "shape.json") is None
