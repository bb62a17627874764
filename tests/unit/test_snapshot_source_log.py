"""Processed landing files from hand-made file-source logs: only what committed batches read counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.checkpoints import CheckpointError
from tandem import checkpoints
from tandem.checkpoints import processed_files

LANDING = "file:///data/landing/trades/shard-1"


def put(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def offsets(log_offset: int | None) -> str:
    source = "-" if log_offset is None else json.dumps({"logOffset": log_offset})
    return "v1\n" + json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}}) + "\n" + source


def log_entry(*files: str) -> str:
    return "v1\n" + "".join(json.dumps({"path": f"{LANDING}/{f}", "timestamp": 1, "batchId": 0}) + "\n" for f in files)


def checkpoint(root: Path, committed: int, compact_at: int | None = None) -> Path:
    """Batches 0..committed are done, each read file ``f<batch>.jsonl``; batch committed+1 picked its file."""
    for batch in range(committed + 2):
        put(root / "offsets" / str(batch), offsets(batch))
        if compact_at is not None and batch == compact_at:
            put(root / "sources" / "0" / f"{batch}.compact", log_entry(*(f"f{b}.jsonl" for b in range(batch + 1))))
        else:
            put(root / "sources" / "0" / str(batch), log_entry(f"f{batch}.jsonl"))
        if batch <= committed:
            put(root / "commits" / str(batch), "v1\n{}")
    return root


def test_only_files_read_by_committed_batches_count(tmp_path: Path) -> None:
    query = checkpoint(tmp_path / "q", committed=3)
    assert processed_files(query) == {f"{LANDING}/f{b}.jsonl" for b in range(4)}  # f4 was picked, not committed


def test_a_compacted_log_counts_every_file_it_repeats(tmp_path: Path) -> None:
    query = checkpoint(tmp_path / "q", committed=6, compact_at=4)
    for old in range(4):  # Spark may delete the entries a compact file repeats
        (query / "sources" / "0" / str(old)).unlink()
    assert processed_files(query) == {f"{LANDING}/f{b}.jsonl" for b in range(7)}


def test_nothing_committed_means_nothing_processed(tmp_path: Path) -> None:
    assert processed_files(tmp_path / "missing") == frozenset()
    query = tmp_path / "q"
    put(query / "offsets" / "0", offsets(0))
    put(query / "sources" / "0" / "0", log_entry("f0.jsonl"))
    assert processed_files(query) == frozenset()


def test_a_source_without_an_offset_yet_has_read_nothing(tmp_path: Path) -> None:
    query = tmp_path / "q"
    put(query / "offsets" / "0", offsets(None))
    put(query / "commits" / "0", "v1\n{}")
    assert processed_files(query) == frozenset()


def test_broken_logs_are_named(tmp_path: Path) -> None:
    query = checkpoint(tmp_path / "q", committed=1)
    put(query / "sources" / "0" / "1", "v1\nnot json\n")
    with pytest.raises(CheckpointError, match=r"sources/0/1: line 2 is not a file-source log record"):
        processed_files(query)
    with pytest.raises(CheckpointError, match="no source 1"):
        processed_files(query, source_index=1)
    (query / "offsets" / "1").unlink()
    with pytest.raises(CheckpointError, match="offsets/1 is missing although batch 1 committed"):
        processed_files(query)


def test_entries_before_the_newest_compaction_are_not_read(tmp_path: Path) -> None:
    query = checkpoint(tmp_path / "q", committed=6, compact_at=4)
    put(query / "sources" / "0" / "1", "v1\nnot json\n")  # repeated by 4.compact: Spark may be deleting it
    assert processed_files(query) == {f"{LANDING}/f{b}.jsonl" for b in range(7)}


def test_an_entry_that_goes_while_the_log_is_read_is_read_from_the_compaction_that_repeats_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    query = checkpoint(tmp_path / "q", committed=6, compact_at=4)
    log = query / "sources" / "0"
    read = checkpoints._logged_records
    calls = []

    def compacted_meanwhile(entry: Path) -> list[dict]:
        calls.append(entry.name)
        if len(calls) == 1:  # the listing is stale: Spark wrote 6.compact and deleted what it repeats
            for number in (4, 5, 6):
                for name in (str(number), f"{number}.compact"):
                    (log / name).unlink(missing_ok=True)
            put(log / "6.compact", log_entry(*(f"f{b}.jsonl" for b in range(7))))
        return read(entry)

    monkeypatch.setattr(checkpoints, "_logged_records", compacted_meanwhile)
    assert processed_files(query) == {f"{LANDING}/f{b}.jsonl" for b in range(7)}
    assert calls == ["4.compact", "6.compact"]
