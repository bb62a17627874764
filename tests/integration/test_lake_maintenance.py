"""Delta upkeep under live appends (issue 27 §3, first step): compaction, checkpoint and vacuum lose nothing, and
a version a snapshot recorded before them still restores an instance's slice exactly after them.

Real Delta tables (delta-rs) written the way the sinks write them (:func:`tandem.lake.tables.append_once`: one
commit per micro-batch with its application transaction). Two "instances" append one small batch after another
while the test compacts, checkpoints and vacuums (retention 0 h: only the versions kept for the snapshot protect
files); every appended batch's rows are remembered and compared with the table at the end, row by row.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable
from tandem.lake.history import roll_back_slice, vacuumed_files, version_at_batch
from tandem.lake.maintenance import kept_versions, maintain_table, oldest_readable_version
from tandem.lake.tables import append_once, read_table

pytestmark = pytest.mark.integration


def batch(instance: str, batch_id: int, rows: int = 5) -> pa.Table:
    return pa.table({"instance": [instance] * rows, "batch": [batch_id] * rows,
                     "value": [batch_id * 100 + i for i in range(rows)]})


class Appender(threading.Thread):
    """One instance appending a batch after another (each its own commit), until stopped."""

    def __init__(self, path: Path, instance: str, first_batch: int = 0) -> None:
        super().__init__(daemon=True)
        self.path, self.instance, self.next_batch = path, instance, first_batch
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                append_once(self.path, batch(self.instance, self.next_batch), f"{self.instance}/out/q", self.next_batch)
                self.next_batch += 1
        except BaseException as exc:  # noqa: BLE001 - surfaced by stop()
            self.error = exc

    def stop(self) -> int:
        self.stopping.set()
        self.join(60)
        assert self.error is None, repr(self.error)
        return self.next_batch


def rows_of(table: pa.Table) -> list[tuple]:
    return sorted(zip(*(table.column(c).to_pylist() for c in ("instance", "batch", "value"))))


def test_compaction_and_vacuum_under_live_appends_lose_nothing_and_keep_a_snapshots_version(tmp_path: Path) -> None:
    path = tmp_path / "delta" / "out"
    for batch_id in range(30):  # the history a snapshot cuts into: 30 small files per instance
        for instance in ("shard-1", "shard-2"):
            append_once(path, batch(instance, batch_id), f"{instance}/out/q", batch_id)
    snapshot_version = version_at_batch(path, "shard-1/out/q", 19)  # a snapshot of shard-1 cut at its batch 19
    at_snapshot = rows_of(read_table(path, ds.field("instance") == "shard-1", version=snapshot_version))
    assert {row[1] for row in at_snapshot} == set(range(20))
    files_before = len(DeltaTable(str(path)).file_uris())

    appenders = [Appender(path, "shard-1", 30), Appender(path, "shard-2", 30)]
    for appender in appenders:
        appender.start()
    keep = kept_versions([{"out": snapshot_version}, {"other": 3}], "out", DeltaTable(str(path)).version())
    assert keep == (snapshot_version,)
    try:
        upkeeps = [maintain_table(path, keep=keep, retention_s=0) for _ in range(3)]
    finally:
        ends = [appender.stop() for appender in appenders]
    for upkeep in upkeeps:
        print(upkeep.describe())
    assert upkeeps[0].files_compacted >= 40 and upkeeps[0].files_vacuumed > 0, upkeeps[0]

    expected = sorted(row for instance, end in zip(("shard-1", "shard-2"), ends) for b in range(end)
                      for row in rows_of(batch(instance, b)))
    assert rows_of(read_table(path)) == expected, "every appended row once, none lost, none twice"
    assert len(DeltaTable(str(path)).file_uris()) < files_before + 2 * (ends[0] - 30)

    # the snapshot's version is still readable, and rolling shard-1 back to it restores exactly its slice
    assert rows_of(read_table(path, ds.field("instance") == "shard-1", version=snapshot_version)) == at_snapshot
    roll_back_slice(path, "shard-1", snapshot_version)
    now = read_table(path)
    assert rows_of(now.filter(pa.compute.equal(now.column("instance"), "shard-1"))) == at_snapshot
    assert rows_of(now.filter(pa.compute.equal(now.column("instance"), "shard-2"))) == \
        [row for row in expected if row[0] == "shard-2"], "the other instance's rows are untouched"


def test_without_the_kept_version_vacuum_removes_what_time_travel_to_it_needs(tmp_path: Path) -> None:
    """The control: the same upkeep keeping no version makes the old version unreadable, so ``keep`` is what
    protects a snapshot (the test above could not pass by accident)."""
    path = tmp_path / "delta" / "out"
    for batch_id in range(10):
        append_once(path, batch("shard-1", batch_id), "shard-1/out/q", batch_id)
    old = DeltaTable(str(path)).version()
    append_once(path, batch("shard-1", 10), "shard-1/out/q", 10)
    maintain_table(path, keep=(), retention_s=0)
    with pytest.raises(Exception):  # noqa: B017 - delta-rs or pyarrow, whichever opens a vacuumed file first
        read_table(path, version=old - 5)
    assert vacuumed_files(path, old - 5)  # what a restore checks before it stops anything
    assert vacuumed_files(path, DeltaTable(str(path)).version()) == []


def test_the_log_cleanup_keeps_every_commit_a_kept_version_needs(tmp_path: Path) -> None:
    """Commits before the newest checkpoint at or below the kept version go; the kept version still reads exactly
    and a snapshot's bisection still finds its cut; the same cleanup keeping nothing makes that version unreadable."""
    path = tmp_path / "delta" / "out"
    app = "shard-1/out/q"
    for batch_id in range(10):
        append_once(path, batch("shard-1", batch_id), app, batch_id)
    first = maintain_table(path, keep=(), retention_s=0, log_retention_s=0)
    checkpoint = oldest_readable_version(path)
    assert first.log_entries_removed >= 10 and checkpoint > 0, first
    versions = {}
    for batch_id in range(10, 20):
        append_once(path, batch("shard-1", batch_id), app, batch_id)
        versions[batch_id] = DeltaTable(str(path)).version()
    kept = version_at_batch(path, app, 14)  # the bisection starts at the oldest version the log holds
    assert kept == versions[14]
    at_kept = rows_of(read_table(path, version=kept))
    assert {row[1] for row in at_kept} == set(range(15))

    second = maintain_table(path, keep=(kept,), retention_s=0, log_retention_s=0)
    assert second.log_entries_removed == 0 and oldest_readable_version(path) == checkpoint, second
    assert rows_of(read_table(path, version=kept)) == at_kept
    assert version_at_batch(path, app, 14) == kept
    with pytest.raises(ValueError, match="cleaned up"):
        version_at_batch(path, app, 3)  # before the oldest commit left

    third = maintain_table(path, keep=(), retention_s=0, log_retention_s=0)
    assert third.log_entries_removed > 0 and oldest_readable_version(path) > kept, third
    assert vacuumed_files(path, kept), "without keeping it, the version's log is gone"
    assert rows_of(read_table(path)) == sorted(row for b in range(20) for row in rows_of(batch("shard-1", b)))


def test_vacuum_keeps_files_removed_within_the_retention_to_the_second_and_deletes_them_after(tmp_path: Path) -> None:
    """delta-rs counts a vacuum's retention in whole hours; the upkeep keeps the declared seconds: the files a
    compaction removed stay while it is younger than the retention (the version before it still reads) and go
    once it is older (``now`` moved on instead of waiting)."""
    path = tmp_path / "delta" / "out"
    app = "shard-1/out/q"
    for batch_id in range(6):
        append_once(path, batch("shard-1", batch_id), app, batch_id)
    before_compaction = DeltaTable(str(path)).version()
    first = maintain_table(path, retention_s=1200)  # compacts 6 files into 1
    assert first.files_compacted == 6 and first.files_vacuumed == 0, first
    append_once(path, batch("shard-1", 6), app, 6)
    within = maintain_table(path, retention_s=1200, now=lambda: time.time() + 1100)
    assert within.files_vacuumed == 0, within  # removed 1,100 s "ago": a reader of the version before may be at work
    assert rows_of(read_table(path, version=before_compaction)) == sorted(
        row for b in range(6) for row in rows_of(batch("shard-1", b)))
    after = maintain_table(path, retention_s=1200, now=lambda: time.time() + 1300)
    assert after.files_vacuumed == 6 + 2, after  # the first 6, then the compacted file and batch 6 of the 2nd run
    assert vacuumed_files(path, before_compaction)
    assert rows_of(read_table(path)) == sorted(row for b in range(7) for row in rows_of(batch("shard-1", b)))


def test_rows_past_their_retention_are_deleted_before_the_compaction(tmp_path: Path) -> None:
    """Issue 46 §4: the quarantine's rows older than ``maintenance.retention.quarantine`` go (the upkeep passes
    ``expire``); the others stay, and a time travel to before the delete still reads them all."""
    from datetime import datetime, timedelta, timezone

    path = tmp_path / "quarantine"
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    ages = [40, 31, 29, 1]
    for index, day in enumerate(ages):
        append_once(path, pa.table({"raw": [f"line {day}"], "quarantined_at": pa.array(
            [now - timedelta(days=day)], pa.timestamp("us", tz="UTC"))}), app_id="q", version=index)
    version = DeltaTable(str(path)).version()
    upkeep = maintain_table(path, expire=("quarantined_at", now - timedelta(days=30)))
    assert upkeep.rows_expired == 2 and "2 rows past their retention deleted" in upkeep.describe()
    assert sorted(read_table(path)["raw"].to_pylist()) == ["line 1", "line 29"]
    assert len(read_table(path, version=version)) == len(ages)


def test_a_live_append_racing_a_backfills_overwrite_of_another_slice_is_tried_again_and_lands_once(
        tmp_path: Path) -> None:
    """A backfill replaces an instance's range with one overwrite commit (a predicate) while the other instance appends
    its micro-batches: an append that meets that commit (delta-rs: "a concurrent transaction deleted data this
    operation read") is tried again on the new version; before, it failed the live query (seen in test_backfill
    under load; here ~30 of 150 appends failed)."""
    from deltalake import write_deltalake

    path = tmp_path / "delta" / "out"
    append_once(path, batch("shard-2", 0), "shard-2/out/q", 0)
    appender = Appender(path, "shard-1")
    appender.start()
    for round_no in range(40):  # shard-2's range, recomputed again and again
        write_deltalake(str(path), batch("shard-2", round_no), mode="overwrite", predicate="instance = 'shard-2'")
    time.sleep(0.2)
    appended = appender.stop()
    assert appended > 0
    mine = rows_of(read_table(path, ds.field("instance") == "shard-1"))
    assert mine == rows_of(pa.concat_tables([batch("shard-1", b) for b in range(appended)])), "each batch once"
    assert rows_of(read_table(path, ds.field("instance") == "shard-2")) == rows_of(batch("shard-2", 39))
