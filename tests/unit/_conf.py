"""Editing the unit tests' private copy of conf/ (the ``conf`` fixture)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml


def edit_yaml(path: Path, change: Callable[[dict], object]) -> None:
    """Load a YAML file, let ``change`` modify the data in place, write it back."""
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))
