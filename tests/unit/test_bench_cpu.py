"""Whose CPU a benchmark run used (``bench/_common.py``): its processes are the ones it names and their descendants."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import _common as C  # noqa: E402


def test_the_python_workers_a_jvm_forks_through_its_daemon_are_the_benchmarks() -> None:
    # 10 the bench's Python, 11 its JVM, 12 pyspark's daemon, 13-14 its workers; 20-21 another user's shell and job
    parents = {10: 1, 11: 10, 12: 11, 13: 12, 14: 12, 20: 1, 21: 20, 1: 0}
    assert C.family({10, 11}, parents) == {10, 11, 12, 13, 14}


def test_a_process_without_children_is_itself_and_naming_none_finds_none() -> None:
    assert C.family({5}, {5: 1, 6: 1}) == {5}
    assert C.family(set(), {5: 1}) == set()
