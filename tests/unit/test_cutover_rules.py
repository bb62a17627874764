"""A cut-over's record and refusals (tandem.cutover: pure parts, and the record on disk)."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_snapshot_source_log import LANDING, checkpoint

from tandem.config import load_cluster, load_plan
from tandem.checkpoints import processed_files_by_source
from tandem.cutover import Cut, _cut_batch, _why_not, load_cut, range_refusal_before_cut, refusal_before_cut
from tandem.errors import TandemError
from tandem.layout import cut_file
from tandem.store import Database, migrate

CUT = Cut(plan="trades", group="shard", generation=2, at=1_800_000_000.0, retired=("shard-1", "shard-2"),
          watermark_ms=5_000, horizon_start_ms=-3_605_000, consumed={"aggregates": frozenset({"file:///a", "file:///b"})},
          done=True)


@pytest.fixture
def cluster(conf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    monkeypatch.setenv("TANDEM_STORAGE_ROOT", str(tmp_path / "data"))
    return load_cluster(conf / "cluster.yaml")


def test_a_cut_is_recorded_and_read_back_whole(cluster) -> None:
    assert load_cut(cluster, "trades", "shard") is None
    path = cut_file(cluster, "trades", "shard")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(CUT.to_json()))
    assert load_cut(cluster, "trades", "shard") == CUT and CUT.label("shard-1") == "shard-1~2"
    path.write_text("{}")
    with pytest.raises(TandemError, match=r"shard.json: not a cut-over record"):
        load_cut(cluster, "trades", "shard")


def test_a_snapshot_taken_before_the_newest_cut_is_refused(cluster) -> None:
    plan = load_plan("trades", cluster)
    path = cut_file(cluster, "trades", "shard")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(CUT.to_json()))
    assert refusal_before_cut(cluster, plan, CUT.at + 1, "snapshot s2") is None
    assert refusal_before_cut(cluster, plan, CUT.at - 1, "snapshot s1") == (
        "snapshot s1 reaches before the cut-over of group shard (generation 2, 2027-01-15T08:00:00Z): its rows are "
        "the retired instances' (shard-1, shard-2), which a recomputation by today's instances would count again")


def test_a_backfill_range_is_fenced_by_the_event_time_the_retired_partials_reach_not_by_the_wall_clock(
        cluster) -> None:
    """Issue 60: the fence compared the range's start (event time) with the cut's wall-clock ``at``: event times
    ahead of the wall clock passed into seconds the retired partials hold, and historical ranges after them were
    refused."""
    plan = load_plan("trades", cluster)
    at = datetime.fromtimestamp(CUT.at, timezone.utc)
    reach = at + timedelta(days=365)  # the retired instances counted events a year ahead of the cut's wall clock
    path = cut_file(cluster, "trades", "shard")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(replace(CUT, reach_ms=int(reach.timestamp() * 1000)).to_json()))
    why = range_refusal_before_cut(cluster, plan, at + timedelta(days=1))
    assert why is not None and f"start it at or after {reach.isoformat()}" in why and "shard-1~2" in why, why
    assert range_refusal_before_cut(cluster, plan, reach) is None
    path.write_text(json.dumps(replace(CUT, reach_ms=int(reach.timestamp() * 1000) - 10 ** 12).to_json()))
    assert range_refusal_before_cut(cluster, plan, at - timedelta(days=1)) is None, "after every retired event"
    path.write_text(json.dumps(replace(CUT, reach_ms=None).to_json()))
    assert range_refusal_before_cut(cluster, plan, at - timedelta(days=1)) is None, "no partials retired"
    legacy = CUT.to_json()
    del legacy["reach_ms"]
    path.write_text(json.dumps(legacy))
    assert load_cut(cluster, "trades", "shard").reach_ms == int(CUT.at * 1000), "a cut recorded before: its at"
    assert range_refusal_before_cut(cluster, plan, at - timedelta(seconds=1))
    assert range_refusal_before_cut(cluster, plan, at) is None


def test_what_a_cut_over_cannot_carry_is_named(cluster) -> None:
    plan = load_plan("trades", cluster)
    assert _why_not(plan, "shard", ["group shard's parallel changed from 2 to 3 (...)"]) is None
    assert "a cut-over keeps each key in its partition" in _why_not(
        plan, "shard", ["stream trades's partitions changed from 2 to 4 (every key would move to another partition)"])
    assert "declare a new output instead" in _why_not(
        plan, "shard", ["aggregation trade_aggregates's keys changed from symbol to symbol, venue"])
    nats = load_plan("hot_rooms", cluster)
    assert "over NATS" in _why_not(nats, next(iter(nats.groups)), [])


def test_a_batch_a_stop_interrupted_belongs_to_the_cut_when_its_partials_were_published(tmp_path: Path,
                                                                                       database_url: str) -> None:
    """A stop interrupts a batch: planned (offsets/4), not committed. Its files were counted if the query published
    its partials (they stay, retired); a query published by id reads them again (its ids are kept once)."""
    query = checkpoint(tmp_path / "aggregates", committed=3)
    cluster_plan = SimpleNamespace(name="trades")
    with Database(database_url) as db:
        migrate(db)
        assert _cut_batch(db, cluster_plan, "shard-1", "node-a", "aggregates", query, ["trade_aggregates"]) == 3
        db.run(lambda c: c.execute(
            "INSERT INTO publish_log (instance_id, plan, instance, node, output, batch_id, epoch, rows) "
            "VALUES ('trades/shard-1/node-a', 'trades', 'shard-1', 'node-a', 'trade_aggregates', 4, 1, 10)"))
        assert _cut_batch(db, cluster_plan, "shard-1", "node-b", "aggregates", query, ["trade_aggregates"]) == 3
        assert _cut_batch(db, cluster_plan, "shard-1", "node-a", "aggregates", query, []) == 3  # published by id
        assert _cut_batch(db, cluster_plan, "shard-1", "node-a", "aggregates", query, ["trade_aggregates"]) == 4
    assert processed_files_by_source(query, 4) == [{f"{LANDING}/f{b}.jsonl" for b in range(5)}]
    assert processed_files_by_source(query) == [{f"{LANDING}/f{b}.jsonl" for b in range(4)}]
