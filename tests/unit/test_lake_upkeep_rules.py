"""Which versions of a Delta table vacuum must keep for the kept snapshots, which contribution ids may go (pure)."""

from __future__ import annotations

import pytest
from deltalake.exceptions import CommitFailedError

from tandem.lake import maintenance
from tandem.lake.maintenance import kept_versions, versions_before_removals


def test_the_kept_versions_are_those_snapshots_recorded_for_the_table_once_each_oldest_first() -> None:
    recorded = [{"trades": 40, "quarantine": 7}, {"trades": 12}, {"quarantine": 3}, {"trades": 40}, {"trades": 99}]
    assert kept_versions(recorded, "trades", latest=60) == (12, 40)
    assert kept_versions(recorded, "quarantine", latest=60) == (3, 7)
    assert kept_versions(recorded, "other", latest=60) == ()


def test_a_commit_conflict_is_tried_again_and_the_last_one_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    waits: list[float] = []
    outcomes = iter([CommitFailedError("conflict"), CommitFailedError("conflict"), "done"])

    def action() -> str:
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert maintenance.retry_on_conflict(action, waits.append) == ("done", 2)
    assert waits == [0.2, 0.4]

    def always() -> None:
        raise CommitFailedError("conflict")

    with pytest.raises(CommitFailedError):
        maintenance.retry_on_conflict(always, waits.append)


def test_contribution_ids_go_after_the_retention_and_before_what_a_kept_snapshot_replays() -> None:
    from datetime import datetime, timedelta, timezone

    from tandem.batch.trim import replay_needs_since
    from tandem.outputs.base import contributions_cutoff
    from tandem.store.snapshots import GOOD, SnapshotRecord

    now = datetime(2026, 11, 26, 12, tzinfo=timezone.utc)
    month = 30 * 86400.0
    assert contributions_cutoff(now, month, None) == now - timedelta(days=30)
    assert contributions_cutoff(now, month, now - timedelta(days=2)) == now - timedelta(days=30)
    assert contributions_cutoff(now, month, now - timedelta(days=40)) == now - timedelta(days=40)

    def snapshot(replay_from: datetime | None) -> SnapshotRecord:
        return SnapshotRecord(id="s", plan="trades", instance="shard-1", instance_id="trades/shard-1/node-a",
                              node="node-a", taken_at=now, checkpoint_path="/x", status=GOOD, replay_from=replay_from)

    # the cut's earliest commit, less the clock margin; an hour before the start when it was not recorded
    assert replay_needs_since(snapshot(now - timedelta(seconds=20))) == now - timedelta(minutes=5, seconds=20)
    assert replay_needs_since(snapshot(None)) == now - timedelta(hours=1)
    # a commit "after" the snapshot started (clocks that disagree) never moves the bound past the start
    assert replay_needs_since(snapshot(now + timedelta(minutes=2))) == now - timedelta(minutes=5)


def test_a_table_is_vacuumed_once_its_dead_rows_pass_fifty_and_a_fifth_of_the_live_ones() -> None:
    from tandem.store.trim import needs_vacuum

    assert not needs_vacuum(live_rows=0, dead_rows=50)
    assert needs_vacuum(live_rows=0, dead_rows=51)
    assert not needs_vacuum(live_rows=10_000, dead_rows=2_050)
    assert needs_vacuum(live_rows=10_000, dead_rows=2_051)


def test_log_entries_expire_before_the_newest_checkpoint_at_or_below_the_oldest_kept_version() -> None:
    from tandem.lake.maintenance import expired_log_entries, log_version

    def name(version: int, suffix: str = "json") -> str:
        return f"{version:020d}.{suffix}"

    log = [(name(v), 100.0 + v) for v in range(0, 31)] + [(name(10, "checkpoint.parquet"), 110.5),
                                                        (name(20, "checkpoint.parquet"), 120.5),
                                                        (name(9, "crc"), 109.0), ("_last_checkpoint", 1.0),
                                                        (".00000000000000000031.json.tmp", 1.0)]
    assert log_version(name(20, "checkpoint.parquet")) == 20 and log_version("_last_checkpoint") is None
    # a snapshot keeps version 25: time travel to it starts at checkpoint 20, so everything before 20 may go
    assert expired_log_entries(log, floor=25, cutoff=1e9) == sorted(
        [name(v) for v in range(20)] + [name(10, "checkpoint.parquet"), name(9, "crc")])
    # keeping version 15 keeps checkpoint 10 and every commit from it on
    assert expired_log_entries(log, floor=15, cutoff=1e9) == sorted([name(v) for v in range(10)] + [name(9, "crc")])
    # only entries older than the retention go: a reader may be loading version 5 right now
    assert expired_log_entries(log, floor=25, cutoff=105.0) == [name(v) for v in range(5)]
    # no checkpoint at or below the kept version: its commits from 0 on are all needed
    assert expired_log_entries(log, floor=9, cutoff=1e9) == []


def commit(version: int, at_ms: int, operation: str = "WRITE", mode: str | None = "Append") -> dict:
    return {"version": version, "timestamp": at_ms, "operation": operation,
            "operationParameters": {} if mode is None else {"mode": mode}}


def test_the_versions_kept_for_the_retention_are_those_before_each_recent_commit_that_removed_files() -> None:
    history = [commit(9, 9_000), commit(8, 8_000, "OPTIMIZE", None), commit(7, 7_000), commit(6, 6_000, "DELETE"),
               commit(5, 5_000, "WRITE", "Overwrite"), commit(4, 4_000, "OPTIMIZE", None), commit(3, 3_000),
               commit(2, 2_000, "STREAMING UPDATE", "Append"), commit(0, 500, "WRITE", "ErrorIfExists")]
    # appends remove nothing; OPTIMIZE, DELETE and an overwrite do; the one at 4,000 ms is older than the retention
    assert versions_before_removals(history, since_ms=5_000) == (4, 5, 7)
    assert versions_before_removals(history, since_ms=0) == (3, 4, 5, 7)
    assert versions_before_removals(history, since_ms=10_000) == ()
    assert versions_before_removals([commit(0, 9_000, "OPTIMIZE", None)], since_ms=0) == ()  # no version before 0
