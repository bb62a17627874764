"""The observer's file-system half: which input waits, and for how long (no database)."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tandem import layout
from tandem.layout import InputMtimes, input_mtimes
from tandem.supervisor.observe import oldest_after


def test_input_files_skip_hidden_and_underscore_files(tmp_path: Path) -> None:
    for name in ("events-1.jsonl", ".events-2.jsonl.tmp", "_SUCCESS", "events-3.jsonl"):
        (tmp_path / name).write_text("{}\n")
    (tmp_path / "subdir").mkdir()
    assert len(input_mtimes(tmp_path)) == 2
    assert input_mtimes(tmp_path / "missing") == {}


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
    [mtime] = input_mtimes(tmp_path).values()
    assert 39 <= oldest_after([mtime], after_epoch=0.0, now_epoch=time.time()) <= 42


class _Retired:
    """A directory entry listed whose file is gone before it is stat-ed (landing retention moved it)."""

    name = "events-0-retired.jsonl"

    def inode(self) -> int:
        return 1

    def is_file(self) -> bool:
        return True

    def stat(self):
        raise FileNotFoundError(self.name)


def test_a_file_moved_away_while_its_folder_is_read_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Landing retention retires files while the supervision's trigger reads the folder: a file listed, then gone
    before its modification time is read, is no input waiting (it crashed the trigger in the soak)."""
    kept = tmp_path / "events-1.jsonl"
    kept.write_text("{}\n")
    scandir = os.scandir

    @contextmanager
    def with_retired(folder):
        with scandir(folder) as entries:
            yield [_Retired(), *entries]

    monkeypatch.setattr(layout.os, "scandir", with_retired)
    assert input_mtimes(tmp_path) == {kept: kept.stat().st_mtime}


def test_a_poller_stats_each_input_file_once(tmp_path: Path) -> None:
    """The supervision trigger's reads: a file seen before keeps the time first read (input files do not change),
    a new file, or one written again under the same name, is read; a file gone is forgotten."""
    inputs, first = InputMtimes(), tmp_path / "events-1.jsonl"
    first.write_text("{}\n")
    os.utime(first, (time.time() - 40, time.time() - 40))
    then = first.stat().st_mtime
    assert inputs.of(tmp_path) == {"events-1.jsonl": then}
    os.utime(first, (time.time() - 10, time.time() - 10))  # not read again: the remembered time stays
    (tmp_path / "events-2.jsonl").write_text("{}\n")
    assert inputs.of(tmp_path) == {"events-1.jsonl": then, "events-2.jsonl": (tmp_path / "events-2.jsonl").stat().st_mtime}
    assert InputMtimes().of(tmp_path)["events-1.jsonl"] == first.stat().st_mtime != then  # a new reader reads
    (tmp_path / "events-2.jsonl").unlink()
    replaced = tmp_path / ".events-1.jsonl.tmp"
    replaced.write_text("{}\n")
    os.replace(replaced, first)  # a producer writes the same name again: another inode
    assert inputs.of(tmp_path) == {"events-1.jsonl": first.stat().st_mtime}
    assert inputs.of(tmp_path / "missing") == {}
