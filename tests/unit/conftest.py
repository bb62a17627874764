"""Fixtures of the unit tests: a private copy of conf/ to edit."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

PROJECT_CONF = Path(__file__).resolve().parents[2] / "conf"


@pytest.fixture
def conf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped conf/ in a temp folder, with no environment overrides."""
    target = tmp_path / "conf"
    shutil.copytree(PROJECT_CONF, target)
    for name in ("TANDEM_HOME", "TANDEM_STORAGE_ROOT", "TANDEM_DATABASE_URL", "TANDEM_AIRFLOW_URL"):
        monkeypatch.delenv(name, raising=False)
    return target
