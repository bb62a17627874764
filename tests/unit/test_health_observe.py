"""The observer's file-system half: which input waits, and for how long (no database)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tandem.supervisor.observe import input_files, oldest_after


def test_input_files_skip_hidden_and_underscore_files(tmp_path: Path) -> None:
    for name in ("events-1.jsonl", ".events-2.jsonl.tmp", "_SUCCESS", "events-3.jsonl"):
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "subdir").mkdir()
    assert len(input_files(tmp_path)) == 2
    assert input_files(tmp_path / "missing") == []


def test_oldest_file_after_the_last_batch_start() -> None:
    now = 1000.0
    assert oldest_after([900.0, 950.0, 990.0], after_epoch=940.0, now_epoch=now) == 50.0
    assert oldest_after([900.0, 920.0], after_epoch=940.0, now_epoch=now) is None
    assert oldest_after([], after_epoch=0.0, now_epoch=now) is None
    assert oldest_after([1001.0], after_epoch=0.0, now_epoch=now) == 0.0  # clocks a little apart


def test_mtimes_are_what_the_file_system_says(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text("{}\n")
    os.utime(path, (time.time() - 40, time.time() - 40))
    [mtime] = input_files(tmp_path)
    assert 39 <= oldest_after([mtime], after_epoch=0.0, now_epoch=time.time()) <= 42
