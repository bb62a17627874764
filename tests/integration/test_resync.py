"""Checkpoint cuts: the file rules on hand-made layouts, then real Spark runs resumed from a cut."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import psycopg2
import psycopg2.extras
import pytest
from deltalake import DeltaTable

from tandem.checkpoints import CheckpointError, committed_batch, cut_checkpoint, recover_swaps
from tandem.config import load_cluster, load_plan
from tandem.layout import checkpoint_dir, landing_dir
from tandem.plan_shape import SHAPE_FILE
from tandem.sources.files import write_atomically
from tandem.runtime.node import run_instance
from tandem.resync import resync_instance
from tandem.reading import read_output

pytestmark = pytest.mark.integration
UTC = timezone.utc
T0 = int(datetime(2025, 3, 1, 12, 0, 0, tzinfo=UTC).timestamp() * 1000)
ALL_TIME = (datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))
GRANULARITIES = ("second", "minute", "hour", "day", "month", "year")


# ------------------------------------------------------------------------------------------------
# The file rules, on hand-made checkpoint layouts


def put(path: Path, text: str = "x", crc: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if crc:
        path.with_name(f".{path.name}.crc").write_text("crc")


def offsets(log_offset: int | None) -> str:
    source = "-" if log_offset is None else json.dumps({"logOffset": log_offset})
    return "v1\n" + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}) + "\n" + source


def fake_checkpoint(root: Path, committed: int, in_flight: bool = True, compact_at: int | None = None) -> Path:
    """A query checkpoint whose batches 0..committed are done; batch committed+1 is half written."""
    put(root / "metadata", json.dumps({"id": "11111111-2222-3333-4444-555555555555"}))
    last = committed + 1 if in_flight else committed
    for batch in range(last + 1):
        put(root / "offsets" / str(batch), offsets(batch))  # one source-log entry per batch
        put(root / "sources" / "0" / (f"{batch}.compact" if batch == compact_at else str(batch)), "v1\n{}")
        for partition in (0, 1):
            put(root / "state" / "0" / str(partition) / f"{batch + 1}.delta")
        if batch <= committed:
            put(root / "commits" / str(batch), "v1\n{}")
    put(root / "state" / "0" / "_metadata" / "metadata", "v1\n{}")
    for partition in (0, 1):
        put(root / "state" / "0" / str(partition) / "_metadata" / "schema", "schema")
        put(root / "state" / "0" / str(partition) / f".{last + 1}.delta.1234.tmp", crc=False)
    return root


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_cut_takes_everything_up_to_the_last_committed_batch_and_nothing_newer(tmp_path: Path) -> None:
    source = fake_checkpoint(tmp_path / "a" / "q", committed=4)
    info = cut_checkpoint(source, tmp_path / "b" / "q")
    assert info.batch_id == 4
    copied = tree(tmp_path / "b" / "q")
    assert {f"offsets/{n}" for n in range(5)} | {f"commits/{n}" for n in range(5)} <= copied
    assert "offsets/5" not in copied and "sources/0/5" not in copied
    assert {f"sources/0/{n}" for n in range(5)} <= copied
    assert {f"state/0/{p}/{v}.delta" for p in (0, 1) for v in range(1, 6)} <= copied
    assert not any(name.endswith("6.delta") or name.endswith(".tmp") for name in copied)
    assert {"state/0/_metadata/metadata", "state/0/0/_metadata/schema", "state/0/1/_metadata/schema"} <= copied
    assert "offsets/.4.crc" in copied and "commits/.0.crc" in copied
    assert info.files == len(copied) and info.bytes == sum(p.stat().st_size for p in (tmp_path / "b" / "q").rglob("*")
                                                              if p.is_file())


def test_the_target_is_a_new_lineage_without_the_old_metadata_checksum(tmp_path: Path) -> None:
    source = fake_checkpoint(tmp_path / "a" / "q", committed=1)
    info = cut_checkpoint(source, tmp_path / "b" / "q")
    metadata = json.loads((tmp_path / "b" / "q" / "metadata").read_text())
    assert metadata["id"] == info.query_id != "11111111-2222-3333-4444-555555555555"
    assert not (tmp_path / "b" / "q" / ".metadata.crc").exists()
    same = cut_checkpoint(source, tmp_path / "c" / "q", new_query_id=False)
    assert same.query_id == "11111111-2222-3333-4444-555555555555"


def test_a_compacted_source_log_is_cut_at_the_offsets_entry(tmp_path: Path) -> None:
    source = fake_checkpoint(tmp_path / "a" / "q", committed=10, compact_at=9)
    cut_checkpoint(source, tmp_path / "b" / "q")
    copied = tree(tmp_path / "b" / "q")
    assert {"sources/0/9.compact", "sources/0/10"} <= copied and "sources/0/11" not in copied


def test_a_source_without_an_offset_yet_copies_no_log_entry(tmp_path: Path) -> None:
    source = fake_checkpoint(tmp_path / "a" / "q", committed=0)
    put(source / "offsets" / "0", offsets(None))
    cut_checkpoint(source, tmp_path / "b" / "q")
    assert not any(name.startswith("sources/") for name in tree(tmp_path / "b" / "q"))


def test_the_target_is_replaced_not_merged(tmp_path: Path) -> None:
    source = fake_checkpoint(tmp_path / "a" / "q", committed=2)
    stale = fake_checkpoint(tmp_path / "b" / "q", committed=7)
    cut_checkpoint(source, stale)
    assert committed_batch(stale) == 2
    assert "offsets/7" not in tree(stale)
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["q"], "staging or old copies were left behind"


def test_a_swap_interrupted_between_its_two_renames_is_undone(tmp_path: Path) -> None:
    """The crash left ``.q.old-*`` and no ``q`` (and an unfinished staging copy): the old checkpoint comes back."""
    root = tmp_path / "b"
    own = fake_checkpoint(root / "q", committed=7)
    before = tree(own)
    own.rename(root / ".q.old-0123abcd")
    fake_checkpoint(root / ".q.cut-89abcdef", committed=2)
    fake_checkpoint(root / "r", committed=1)
    fake_checkpoint(root / ".r.old-00000000", committed=0)  # r's swap completed: only the old copy is left over

    done = recover_swaps(root)
    assert sorted(p.name for p in root.iterdir()) == ["q", "r"], done
    assert tree(root / "q") == before and committed_batch(root / "q") == 7
    assert committed_batch(root / "r") == 1
    assert len(done) == 3
    cut_checkpoint(fake_checkpoint(tmp_path / "a" / "q", committed=3), root / "q")  # and a new cut works
    assert committed_batch(root / "q") == 3


def test_a_cut_that_cannot_restart_fails_and_leaves_the_target_alone(tmp_path: Path) -> None:
    source = fake_checkpoint(tmp_path / "a" / "q", committed=3)
    (source / "state" / "0" / "1" / "3.delta").unlink()
    target = fake_checkpoint(tmp_path / "b" / "q", committed=1, in_flight=False)
    before = tree(target)
    with pytest.raises(CheckpointError, match="state 0/1 version 3 is missing"):
        cut_checkpoint(source, target)
    assert tree(target) == before
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["q"]


def test_a_snapshot_ends_the_state_chain(tmp_path: Path) -> None:
    source = fake_checkpoint(tmp_path / "a" / "q", committed=5)
    for partition in (0, 1):
        put(source / "state" / "0" / str(partition) / "4.snapshot")
        for version in (1, 2, 3):
            (source / "state" / "0" / str(partition) / f"{version}.delta").unlink()
    assert cut_checkpoint(source, tmp_path / "b" / "q").batch_id == 5


def test_nothing_committed_copies_nothing(tmp_path: Path) -> None:
    source = tmp_path / "a" / "q"
    put(source / "offsets" / "0", offsets(0))
    target = fake_checkpoint(tmp_path / "b" / "q", committed=1, in_flight=False)
    before = tree(target)
    info = cut_checkpoint(source, target)
    assert (info.batch_id, info.files, info.bytes) == (None, 0, 0)
    assert tree(target) == before


def test_missing_source_or_cut_onto_itself_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no checkpoint"):
        cut_checkpoint(tmp_path / "nothing", tmp_path / "b")
    source = fake_checkpoint(tmp_path / "a" / "q", committed=0)
    with pytest.raises(CheckpointError, match="same checkpoint"):
        cut_checkpoint(source, tmp_path / "a" / "q")


# ------------------------------------------------------------------------------------------------
# Real Spark: resume another node from a cut


def make_events(seed: int, count: int, start_ms: int, spread_ms: int = 5_000) -> list[dict]:
    rng = random.Random(seed)
    return [{"symbol": rng.choice(["IBM", "WSO2", "ORCL", "MSFT"]), "price": round(rng.uniform(1, 500), 2),
             "quantity": rng.randint(1, 1000), "timestamp": start_ms + rng.randint(0, spread_ms)} for _ in range(count)]


def write_events(directory: Path, events: list[dict], per_file: int) -> None:
    for start in range(0, len(events), per_file):
        write_atomically(directory, [json.dumps(e) for e in events[start:start + per_file]])


def expected(events: list[dict], granularity: str) -> dict[tuple, tuple]:
    cut = {"second": lambda m: m.replace(microsecond=0), "minute": lambda m: m.replace(second=0, microsecond=0),
           "hour": lambda m: m.replace(minute=0, second=0, microsecond=0),
           "day": lambda m: m.replace(hour=0, minute=0, second=0, microsecond=0),
           "month": lambda m: m.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
           "year": lambda m: m.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0)}[granularity]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        groups[(cut(datetime.fromtimestamp(e["timestamp"] / 1000, tz=UTC)), e["symbol"])].append(e)
    return {k: (len(g), sum(e["quantity"] for e in g), round(sum(e["price"] for e in g), 6),
                min(e["price"] for e in g), max(e["price"] for e in g)) for k, g in groups.items()}


def served(cluster, granularity: str, source: str) -> dict[tuple, tuple]:
    return {(r["bucket_start"], r["symbol"]): (r["trade_count"], r["quantity_sum"], round(r["price_sum"], 6),
                                               r["price_min"], r["price_max"])
            for r in read_output(cluster, "trades", granularity, *ALL_TIME, source=source)}


def assert_exact(cluster, events: list[dict], label: str) -> None:
    for granularity in GRANULARITIES:
        want = expected(events, granularity)
        for source in ("postgres", "delta"):
            got = served(cluster, granularity, source)
            assert got == want, f"{label}: {source} {granularity} differs: " + str(
                sorted(set(got.items()) ^ set(want.items()))[:4])


def batches(database_url: str, node: str) -> list[dict]:
    with psycopg2.connect(database_url) as conn, conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cur:
        cur.execute("""SELECT batch_id, input_rows FROM tandem.heartbeats
                       WHERE node = %s AND query_name = 'aggregates' ORDER BY id""", (node,))
        rows = cur.fetchall()
    conn.close()
    return rows


def test_a_node_resumed_from_a_cut_counts_every_event_exactly_once(project: Path, database_url: str, spark) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    landing = landing_dir(cluster, "trades", 0)

    # node-b runs first, alone, for a while: its batch ids (and its Delta transactions) run ahead
    early = []
    for round_ in range(3):
        events = make_events(round_, 60, T0 + round_ * 20_000)
        write_events(landing, events, per_file=30)
        early += events
        assert run_instance(cluster, plan, "node-b", "shard-1", spark=spark, available_now=True).status == "STOPPED"
    b_batches = max(row["batch_id"] for row in batches(database_url, "node-b"))
    assert b_batches >= 4

    # node-a starts from nothing and catches up on everything
    more = make_events(10, 200, T0 + 80_000)
    write_events(landing, more, per_file=50)
    assert run_instance(cluster, plan, "node-a", "shard-1", spark=spark, available_now=True).status == "STOPPED"
    assert_exact(cluster, early + more, "node-a alone")

    # node-a's cut replaces node-b's own checkpoint; node-b resumes after node-a's last batch
    cuts = resync_instance(cluster, plan, "shard-1", "node-a", "node-b")
    a_root = checkpoint_dir(cluster, "trades", "shard-1", "node-a", "")
    assert set(cuts) == {"aggregates", "quarantine"}
    for query, info in cuts.items():
        assert info.batch_id == committed_batch(a_root / query) and info.files > 0
    assert cuts["aggregates"].batch_id < b_batches, "the test must make node-b's old batch ids run ahead"

    last = make_events(20, 150, T0 + 100_000)
    write_events(landing, last, per_file=50)
    before = len(batches(database_url, "node-b"))
    assert run_instance(cluster, plan, "node-b", "shard-1", spark=spark, available_now=True).status == "STOPPED"
    resumed = batches(database_url, "node-b")[before:]
    assert resumed[0]["batch_id"] == cuts["aggregates"].batch_id + 1
    assert sum(row["input_rows"] for row in resumed) == len(last), "node-b reprocessed input the cut covered"
    assert_exact(cluster, early + more + last, "node-b from the cut")

    delta = DeltaTable(str(cluster.storage_root / "delta" / "trades" / "trade_aggregates"))
    new_lineage = f"trades/shard-1/node-b/trade_aggregates/{cuts['aggregates'].query_id}"
    assert delta.transaction_version(new_lineage) == max(r["batch_id"] for r in resumed if r["input_rows"])


def test_a_node_whose_checkpoint_swap_was_interrupted_resumes_from_its_old_checkpoint(
        project: Path, database_url: str, spark) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    landing = landing_dir(cluster, "trades", 0)
    first = make_events(1, 120, T0)
    write_events(landing, first, per_file=40)
    assert run_instance(cluster, plan, "node-a", "shard-1", spark=spark, available_now=True).status == "STOPPED"
    root = checkpoint_dir(cluster, "trades", "shard-1", "node-a", "")
    committed = committed_batch(root / "aggregates")

    (root / "aggregates").rename(root / ".aggregates.old-0badc0de")  # the crash: first rename done, second not
    more = make_events(2, 60, T0 + 30_000)
    write_events(landing, more, per_file=60)
    before = len(batches(database_url, "node-a"))
    assert run_instance(cluster, plan, "node-a", "shard-1", spark=spark, available_now=True).status == "STOPPED"
    resumed = batches(database_url, "node-a")[before:]
    assert resumed[0]["batch_id"] == committed + 1, "the node started over instead of resuming its checkpoint"
    assert sum(row["input_rows"] for row in resumed) == len(more)
    assert sorted(p.name for p in root.iterdir() if p.name != SHAPE_FILE) == ["aggregates", "quarantine"]
    assert_exact(cluster, first + more, "node-a after the interrupted swap")


def test_cuts_taken_while_the_query_runs_are_consistent(project: Path, database_url: str, spark) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    landing = landing_dir(cluster, "trades", 0)
    source = checkpoint_dir(cluster, "trades", "shard-1", "node-a", "aggregates")
    target = checkpoint_dir(cluster, "trades", "shard-1", "node-b", "aggregates")
    stop = threading.Event()
    result: list = []
    runner = threading.Thread(target=lambda: result.append(run_instance(
        cluster, plan, "node-a", "shard-1", spark=spark, trigger_interval_s=0.2, stop=stop)))
    everything: list[dict] = []
    cuts = []

    def write(i: int) -> None:
        events = make_events(100 + i, 40, T0 + i * 1000, spread_ms=900)
        write_events(landing, events, per_file=40)
        everything.extend(events)

    runner.start()
    try:
        write(0)
        deadline = time.monotonic() + 240
        while committed_batch(source) is None and time.monotonic() < deadline and runner.is_alive():
            time.sleep(0.5)
        i = 1
        while time.monotonic() < deadline and runner.is_alive() and (
                len(cuts) < 4 or len({c.batch_id for c in cuts}) < 3):
            write(i)
            i += 1
            time.sleep(0.3)
            cuts.append(cut_checkpoint(source, target))
    finally:
        stop.set()
        runner.join(timeout=120)
    assert result and result[0].status == "STOPPED", result
    assert [c.batch_id for c in cuts] == sorted(c.batch_id for c in cuts)
    assert len({c.batch_id for c in cuts}) >= 3, "the query did not commit batches while it was cut"

    # the last cut (taken mid-stream) restarts cleanly and, with the input after it, adds up exactly
    before = committed_batch(target)
    resync_instance(cluster, plan, "shard-1", "node-a", "node-b")
    assert committed_batch(target) >= before
    assert run_instance(cluster, plan, "node-b", "shard-1", spark=spark, available_now=True).status == "STOPPED"
    assert_exact(cluster, everything, "node-b after cuts of a running query")
