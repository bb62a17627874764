"""Source kinds without Spark or NATS: one kind per declarable source, their rules, what they read of landing
folders, a recomputation's admission, and that asking them loads no pyspark."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tandem.config import load_cluster, load_plan
from tandem.declarations import SOURCE_RULES
from tandem.layout import landing_dir
from tandem.sources import SOURCE_KINDS, landing_dirs, source_of
from tandem.sources.base import UNBOUNDED

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "include"


def test_every_kind_keeps_its_rules_from_the_one_table() -> None:
    assert set(SOURCE_KINDS) == set(SOURCE_RULES)
    assert all(kind.rules is SOURCE_RULES[name] for name, kind in SOURCE_KINDS.items())
    assert [name for name, kind in SOURCE_KINDS.items() if kind.receivable] == ["nats"]


def test_only_files_streams_have_landing_folders(conf: Path) -> None:
    cluster = load_cluster(conf / "cluster.yaml")
    trades, hot_rooms = load_plan("trades", cluster), load_plan("hot_rooms", cluster)
    instance = trades.instances[0]
    assert source_of(trades, "trades").name == "files"
    assert landing_dirs(cluster, trades, instance) == [
        landing_dir(cluster, "trades", p) for p in trades.partitions(instance, "trades")]
    assert {source_of(hot_rooms, s).name for s in hot_rooms.streams} == {"nats"}
    assert landing_dirs(cluster, hot_rooms, hot_rooms.instances[0]) == []


def test_a_recomputation_lifts_only_the_admission_limit_of_the_streams_kind(conf: Path) -> None:
    cluster = load_cluster(conf / "cluster.yaml")
    files = load_plan("trades", cluster).streams["trades"]
    nats = load_plan("hot_rooms", cluster).streams["temps"]
    assert SOURCE_KINDS["files"].unbounded(files).max_files_per_trigger == UNBOUNDED
    assert SOURCE_KINDS["files"].unbounded(files).max_events_per_trigger == files.max_events_per_trigger
    assert SOURCE_KINDS["nats"].unbounded(nats).max_events_per_trigger == UNBOUNDED
    assert SOURCE_KINDS["nats"].unbounded(nats).max_files_per_trigger == nats.max_files_per_trigger


def test_the_kinds_the_supervisor_and_the_triggers_ask_load_no_pyspark() -> None:
    probe = ("import sys, tandem.sources, tandem.supervisor.observe, tandem.airflow.triggers; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pyspark'))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
