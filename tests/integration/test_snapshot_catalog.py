"""The snapshot catalog against a real PostgreSQL (no Spark): statuses, ordering, the newest good one."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg2
import pytest

from tandem.errors import SnapshotError
from tandem.store import Database, migrate
from tandem.store.snapshots import (
    BAD,
    GOOD,
    PRUNED,
    TAKING,
    begin_snapshot,
    database_now,
    get_snapshot,
    latest_good,
    list_snapshots,
    mark_bad,
    mark_good,
    mark_pruned,
    new_snapshot_id,
    record_contents,
)

pytestmark = pytest.mark.integration
UTC = timezone.utc
T0 = datetime(2026, 11, 21, 8, 0, 0, tzinfo=UTC)
SNAPSHOTS = Path("/data/snapshots/trades")
ID_PATTERN = re.compile(r"^trades-shard-1-\d{8}T\d{6}Z-[0-9a-f]{6}$")


@pytest.fixture
def db(database_url: str):
    with Database(database_url) as database:
        migrate(database)
        yield database


def begin(db: Database, minutes: float = 0.0, instance: str = "shard-1", node: str = "node-a"):
    return begin_snapshot(db, plan="trades", instance=instance, node=node, snapshots_dir=SNAPSHOTS,
                          taken_at=T0 + timedelta(minutes=minutes))


def good(db: Database, minutes: float, instance: str = "shard-1", batch: int = 7):
    record = begin(db, minutes, instance)
    record_contents(db, record.id, batch_id=batch, checkpoint_bytes=100)
    return mark_good(db, record.id, {"success": True})


def test_begin_inserts_a_taking_row_named_after_plan_instance_and_time(db: Database) -> None:
    before = database_now(db)
    record = begin_snapshot(db, plan="trades", instance="shard-1", node="node-a", snapshots_dir=SNAPSHOTS)
    assert ID_PATTERN.match(record.id), record.id
    assert record.status == TAKING
    assert record.instance_id == "trades/shard-1/node-a"
    assert record.checkpoint_path == str(SNAPSHOTS / record.id)
    assert before <= record.taken_at <= database_now(db)
    assert record.id.split("-")[3] == record.taken_at.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    assert (record.batch_id, record.validation, record.output_versions, record.pruned_at) == (None, None, {}, None)
    assert get_snapshot(db, record.id) == record


def test_a_snapshot_is_cut_recorded_validated_and_marked_good(db: Database) -> None:
    record = begin(db)
    record_contents(db, record.id, batch_id=41, checkpoint_bytes=12_345,
                    output_versions={"trade_aggregates": 17, "quarantine": 3}, query_batches={"aggregates": 41})
    record_contents(db, record.id, state_rows=1_000, state_bytes=65_536, output_versions={"quarantine": 4},
                    query_batches={"quarantine": 40})
    validation = {"success": True, "expectations": [{"name": "keys_not_null", "success": True}]}
    marked = mark_good(db, record.id, validation)
    assert marked.status == GOOD
    assert (marked.batch_id, marked.checkpoint_bytes) == (41, 12_345)
    assert (marked.state_rows, marked.state_bytes) == (1_000, 65_536)
    assert marked.output_versions == {"trade_aggregates": 17, "quarantine": 4}
    assert marked.query_batches == {"aggregates": 41, "quarantine": 40}
    assert marked.validation == validation
    assert marked.completed_at is not None and marked.reason is None
    assert mark_good(db, record.id, validation) == marked  # a retry after a lost acknowledgement changes nothing


def test_good_needs_a_recorded_cut(db: Database) -> None:
    record = begin(db)
    with pytest.raises(SnapshotError, match="no recorded cut"):
        mark_good(db, record.id, {"success": True})
    assert get_snapshot(db, record.id).status == TAKING


def test_the_cut_batch_cannot_change_and_contents_are_only_recorded_while_taking(db: Database) -> None:
    record = begin(db)
    record_contents(db, record.id, batch_id=5)
    record_contents(db, record.id, batch_id=5, checkpoint_bytes=10)  # a retry with the same batch is fine
    with pytest.raises(SnapshotError, match="cut at batch 5, not 6"):
        record_contents(db, record.id, batch_id=6)
    mark_good(db, record.id, {"success": True})
    with pytest.raises(SnapshotError, match="is GOOD: cannot record its contents"):
        record_contents(db, record.id, state_rows=3)
    with pytest.raises(ValueError, match="state_rows must be a non-negative integer"):
        record_contents(db, record.id, state_rows=-1)
    with pytest.raises(ValueError, match="output_versions"):
        record_contents(db, record.id, output_versions={"trade_aggregates": "7"})


def test_bad_keeps_the_reason_and_a_good_snapshot_found_broken_becomes_bad(db: Database) -> None:
    failed = mark_bad(db, begin(db).id, "copy failed: disk full")
    assert (failed.status, failed.reason, failed.validation) == (BAD, "copy failed: disk full", None)
    assert failed.completed_at is not None
    broken = good(db, 1)
    marked = mark_bad(db, broken.id, "state file 3.delta missing", {"success": False, "missing": ["state/0/1/3.delta"]})
    assert (marked.status, marked.reason, marked.validation["missing"]) == (BAD, "state file 3.delta missing",
                                                                            ["state/0/1/3.delta"])
    assert marked.completed_at == broken.completed_at
    with pytest.raises(SnapshotError, match="is BAD: cannot mark it GOOD"):
        mark_good(db, broken.id, {"success": True})


def test_pruning_is_final_and_idempotent(db: Database) -> None:
    record = good(db, 0)
    pruned = mark_pruned(db, record.id, "older than the newest 3 good snapshots")
    assert (pruned.status, pruned.reason) == (PRUNED, "older than the newest 3 good snapshots")
    assert pruned.pruned_at is not None
    assert mark_pruned(db, record.id, "again") == pruned
    for change in (lambda: mark_bad(db, record.id, "late check"), lambda: mark_good(db, record.id, {})):
        with pytest.raises(SnapshotError, match="is PRUNED"):
            change()


def test_unknown_snapshots_are_named(db: Database) -> None:
    assert get_snapshot(db, "trades-shard-1-nope") is None
    unknown = "trades-shard-1-nope"
    for change in (lambda: mark_good(db, unknown, {}), lambda: mark_pruned(db, unknown, "x"),
                   lambda: mark_bad(db, unknown, "x"), lambda: record_contents(db, unknown)):
        with pytest.raises(SnapshotError, match=f"no snapshot '{unknown}' in the catalog"):
            change()


def test_latest_good_is_the_newest_good_of_its_instance(db: Database) -> None:
    assert latest_good(db, "trades", "shard-1") is None
    good(db, 0)
    newest = good(db, 15)
    mark_bad(db, begin(db, 30).id, "validation failed")  # newer, but BAD
    begin(db, 45)  # newer, still TAKING
    good(db, 60, instance="shard-2")  # another instance
    pruned = good(db, 20)
    mark_pruned(db, pruned.id, "test")
    assert latest_good(db, "trades", "shard-1") == newest
    assert latest_good(db, "trades", "shard-3") is None
    assert latest_good(db, "other", "shard-1") is None


def test_list_is_newest_first_and_filters_by_instance_and_status(db: Database) -> None:
    ids = [good(db, minutes).id for minutes in (0, 15, 30)]
    bad = mark_bad(db, begin(db, 45).id, "x").id
    other = good(db, 50, instance="shard-2").id
    assert [r.id for r in list_snapshots(db, "trades")] == [other, bad, *reversed(ids)]
    assert [r.id for r in list_snapshots(db, "trades", instance="shard-1", statuses=(GOOD,))] == list(reversed(ids))
    assert [r.id for r in list_snapshots(db, "trades", limit=2)] == [other, bad]
    assert list_snapshots(db, "other") == []
    with pytest.raises(ValueError, match="unknown snapshot status DONE"):
        list_snapshots(db, "trades", statuses=("DONE",))


def test_the_table_refuses_impossible_rows(db: Database) -> None:
    record = begin(db)

    def update(sql: str) -> None:
        db.run(lambda cursor: cursor.execute(sql, (record.id,)), attempts=1)

    for sql in ("UPDATE snapshots SET status = 'DONE' WHERE id = %s",
                "UPDATE snapshots SET status = 'GOOD', completed_at = now() WHERE id = %s",  # GOOD without a batch
                "UPDATE snapshots SET status = 'PRUNED' WHERE id = %s",  # PRUNED without pruned_at
                "UPDATE snapshots SET batch_id = -1 WHERE id = %s",
                "UPDATE snapshots SET output_versions = '[1]' WHERE id = %s"):
        with pytest.raises(psycopg2.errors.CheckViolation):
            update(sql)


def test_latest_good_uses_the_partial_index(db: Database) -> None:
    def fill_and_explain(cursor) -> str:
        cursor.execute(
            """INSERT INTO snapshots (id, plan, instance, instance_id, node, batch_id, taken_at, completed_at,
                                      checkpoint_path, status, pruned_at)
               SELECT 'p' || (i % 20) || '-' || i, 'p' || (i % 20), 'instance-' || ((i / 20) % 4), 'x', 'node-a', i,
                      timestamptz '2026-01-01' + make_interval(mins => i), now(), '/x',
                      CASE WHEN (i / 80) % 10 = 0 THEN 'GOOD' ELSE 'PRUNED' END,
                      CASE WHEN (i / 80) % 10 = 0 THEN NULL ELSE now() END
               FROM generate_series(0, 49999) AS i""")
        cursor.execute("ANALYZE snapshots")
        cursor.execute("""EXPLAIN SELECT * FROM snapshots WHERE plan = 'p3' AND instance = 'shard-1'
                          AND status = 'GOOD' ORDER BY taken_at DESC, id DESC LIMIT 1""")
        return "\n".join(row["QUERY PLAN"] for row in cursor.fetchall())

    plan = db.run(fill_and_explain)
    assert "snapshots_good_newest" in plan, plan


def test_new_snapshot_id_is_in_utc_and_needs_a_zone() -> None:
    at = datetime(2026, 11, 21, 9, 30, 5, tzinfo=timezone(timedelta(hours=1)))
    assert new_snapshot_id("trades", "shard-1", at, token="abc123") == "trades-shard-1-20261121T083005Z-abc123"
    assert ID_PATTERN.match(new_snapshot_id("trades", "shard-1", at))
    with pytest.raises(ValueError, match="time zone"):
        new_snapshot_id("trades", "shard-1", datetime(2026, 11, 21))
