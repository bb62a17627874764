"""The folders Tandem creates for its data are its owner's only (0700); folders that were there keep their mode
(issue 46, §5). Real folders in a temp dir."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from tandem.config import load_cluster
from tandem.layout import STORAGE_FOLDERS, make_private_dirs, prepare_storage_root
from tandem.sources.files import write_atomically


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def usual_umask():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_the_folders_it_creates_are_private_and_the_ones_that_were_there_keep_their_mode(tmp_path: Path) -> None:
    users = tmp_path / "shared"
    users.mkdir(mode=0o755)
    made = make_private_dirs(users / "a" / "b" / "c")
    assert made == users / "a" / "b" / "c"
    assert [mode(users / p) for p in ("a", "a/b", "a/b/c")] == [0o700] * 3
    assert mode(users) == 0o755
    (users / "open").mkdir(mode=0o755)
    make_private_dirs(users / "open")
    assert mode(users / "open") == 0o755, "an existing folder is not Tandem's to change"


def test_a_new_storage_root_and_its_folders_are_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        conf: Path) -> None:
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    monkeypatch.setenv("TANDEM_STORAGE_ROOT", str(tmp_path / "data"))
    cluster = load_cluster()
    prepare_storage_root(cluster)
    assert mode(tmp_path / "data") == 0o700
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == sorted(STORAGE_FOLDERS)
    assert {mode(tmp_path / "data" / name) for name in STORAGE_FOLDERS} == {0o700}


def test_a_storage_root_the_user_made_keeps_its_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     conf: Path) -> None:
    root = tmp_path / "mounted"
    root.mkdir(mode=0o755)
    (root / "landing").mkdir(mode=0o755)
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    monkeypatch.setenv("TANDEM_STORAGE_ROOT", str(root))
    prepare_storage_root(load_cluster())
    assert (mode(root), mode(root / "landing"), mode(root / "delta")) == (0o755, 0o755, 0o700)


def test_a_producer_s_new_landing_folder_is_private(tmp_path: Path) -> None:
    write_atomically(tmp_path / "landing" / "trades" / "0", ['{"a": 1}'])
    assert [mode(tmp_path / p) for p in ("landing", "landing/trades", "landing/trades/0")] == [0o700] * 3
