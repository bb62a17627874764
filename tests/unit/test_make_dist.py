"""`make up` (and test, demo) rebuild dist/tandem.zip when it is missing or stale (issue 9, item 13).

Runs ``make -n`` (prints the commands, runs none) on a copy of the Makefile beside a small package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"


def planned(root: Path, target: str) -> str:
    return subprocess.run(["make", "-n", "-C", str(root), target], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("target", ["up", "dist", "test", "demo"])
def test_the_zip_is_built_when_missing_or_older_than_the_package_and_only_then(tmp_path: Path, target: str) -> None:
    shutil.copy(MAKEFILE, tmp_path / "Makefile")
    package = tmp_path / "include" / "tandem"
    (package / "store" / "migrations").mkdir(parents=True)
    for name in ("__init__.py", "cli.py", "store/migrations/001_x.sql"):
        (package / name).write_text("# x\n")
    assert "tandem.packaging" in planned(tmp_path, target), "a missing zip is not built"

    zip_path = tmp_path / "dist" / "tandem.zip"
    zip_path.parent.mkdir()
    zip_path.write_bytes(b"zip")
    assert "tandem.packaging" not in planned(tmp_path, target), "a fresh zip is rebuilt"

    later = time.time() + 5
    os.utime(package / "store" / "migrations" / "001_x.sql", (later, later))
    assert "tandem.packaging" in planned(tmp_path, target), "a stale zip is not rebuilt"
