"""The HA tests' own checks can fail: a batch appended twice and two writers of one epoch are found."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from _ha import published_twice
from deltalake import write_deltalake

pytestmark = pytest.mark.integration
BUCKET = datetime(2026, 1, 1, tzinfo=timezone.utc)


def rows(*published: tuple[int, int, str]) -> pa.Table:
    """One row of the same key per (epoch, batch, node)."""
    return pa.Table.from_pylist([
        {"granularity": "second", "bucket_start": BUCKET, "symbol": "IBM", "instance": "shard-1", "epoch": epoch,
         "batch_id": batch, "node": node} for epoch, batch, node in published])


def test_published_twice_finds_a_duplicate_batch_and_an_epoch_with_two_writers(tmp_path: Path) -> None:
    clean, duplicated, two_writers = tmp_path / "clean", tmp_path / "duplicated", tmp_path / "two_writers"
    write_deltalake(str(clean), rows((1, 0, "node-a"), (1, 1, "node-a"), (2, 1, "node-b")))
    write_deltalake(str(duplicated), rows((1, 0, "node-a"), (1, 1, "node-a")))
    write_deltalake(str(duplicated), rows((1, 1, "node-a")), mode="append")  # the same batch appended again
    write_deltalake(str(two_writers), rows((1, 0, "node-a"), (1, 1, "node-b")))

    assert published_twice(clean) == []
    assert published_twice(tmp_path / "no_table") == []
    [problem] = published_twice(duplicated)
    assert "1 (key, epoch, batch) published twice" in problem
    assert published_twice(two_writers) == ["delta: shard-1 epoch 1 written by ['node-a', 'node-b']"]
