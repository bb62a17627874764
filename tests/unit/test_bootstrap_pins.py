"""The venv runs the pinned pip and setuptools, not ensurepip's (issue 9, item 14)."""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints.txt"


def test_pip_and_setuptools_are_the_pinned_versions() -> None:
    pins = dict(line.split("==") for line in CONSTRAINTS.read_text().splitlines()
                if line.startswith(("pip==", "setuptools==")))
    assert set(pins) == {"pip", "setuptools"}
    assert {name: version(name) for name in pins} == pins
