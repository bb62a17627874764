"""Configuration loading: valid files load, every invalid field is named with its file."""

from __future__ import annotations

from pathlib import Path

import pytest

from _conf import edit_yaml as edit
from tandem.config import load_cluster, load_plan, load_plans, spark_interval
from tandem.declarations import parse_duration, parse_instant
from tandem.errors import ConfigError


def test_shipped_configuration_loads(conf: Path) -> None:
    cluster = load_cluster(conf / "cluster.yaml")
    plans = load_plans(cluster)
    assert set(cluster.nodes) == {"node-a", "node-b"}
    assert cluster.storage_root == (conf.parent / ".tandem/data").resolve()
    trades = plans["trades"]
    assert trades.instances == ("shard-1", "shard-2")
    assert trades.watermark_s == 10.0
    assert trades.heartbeat.timeout_s == 3.0


def test_the_maintenance_schedule_is_hourly_unless_declared_and_manual_means_triggered_runs_only(conf: Path) -> None:
    cluster = load_cluster(conf / "cluster.yaml")
    assert load_plan("trades", cluster).maintenance.dag_schedule == "@hourly"
    edit(conf / "plans" / "trades.yaml", lambda d: d["maintenance"].update(schedule="manual"))
    assert load_plan("trades", cluster).maintenance.dag_schedule is None
    edit(conf / "plans" / "trades.yaml", lambda d: d["maintenance"].update(schedule="*/20 * * * *"))
    assert load_plan("trades", cluster).maintenance.dag_schedule == "*/20 * * * *"


def test_environment_overrides_paths_and_urls(conf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_STORAGE_ROOT", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("TANDEM_DATABASE_URL", "postgresql://u@db:5432/x")
    cluster = load_cluster(conf / "cluster.yaml")
    assert cluster.storage_root == tmp_path / "elsewhere"
    assert cluster.database_url == "postgresql://u@db:5432/x"


@pytest.mark.parametrize(
    ("file", "change", "field", "fragment"),
    [
        ("cluster.yaml", lambda d: d["nodes"]["node-a"].pop("spark_master"), "nodes.node-a.spark_master", "required"),
        ("cluster.yaml", lambda d: d["nodes"]["node-a"].update(typo=1), "nodes.node-a.typo", "unknown field"),
        ("cluster.yaml", lambda d: d["database"].update(url="mysql://x"), "database.url", "postgresql://"),
        ("cluster.yaml", lambda d: d.update(nodes={}), "nodes", "at least one"),
        ("plans/trades.yaml", lambda d: d.update(watermark="soon"), "watermark", "duration"),
        ("plans/trades.yaml", lambda d: d["groups"]["shard"].update(parallel=0), "groups.shard.parallel",
         "positive integer"),
        ("plans/trades.yaml", lambda d: d.update(groups={"Instance 1": {"queries": ["aggregates"]}}), "groups.Instance 1",
         "must match"),
        ("plans/trades.yaml", lambda d: d.update(nodes=["node-z"]), "nodes[0]", "unknown node"),
        ("plans/trades.yaml", lambda d: d["heartbeat"].update(max_missed=0), "heartbeat.max_missed", "positive"),
        ("plans/trades.yaml", lambda d: d["streams"]["trades"].update(format="csv"), "streams.trades.format",
         "jsonl"),
        ("plans/trades.yaml", lambda d: d.update(name="other"), "name", "file name"),
        ("plans/trades.yaml", lambda d: d.update(trigger_interval=True), "trigger_interval", "expected"),
    ],
)
def test_invalid_field_is_named_with_its_file(conf: Path, file: str, change, field: str, fragment: str) -> None:
    edit(conf / file, change)
    with pytest.raises(ConfigError) as caught:
        load_plan("trades", load_cluster(conf / "cluster.yaml"))
    error = caught.value
    assert error.path == str((conf / file).resolve())
    assert error.field == field
    assert fragment in str(error)
    assert str(error).startswith(str((conf / file).resolve()))


def test_invalid_yaml_names_the_position(conf: Path) -> None:
    (conf / "cluster.yaml").write_text("nodes: [unclosed\n")
    with pytest.raises(ConfigError, match=r"cluster.yaml: line \d+, column \d+: invalid YAML"):
        load_cluster(conf / "cluster.yaml")


def test_missing_file_is_named(conf: Path) -> None:
    with pytest.raises(ConfigError, match="nope.yaml: file not found"):
        load_plan("nope", load_cluster(conf / "cluster.yaml"))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500 ms", 0.5), ("2 seconds", 2.0), ("1s", 1.0), ("3 mins", 180.0), ("1 hour", 3600.0), ("1 day", 86400.0),
     ("7", 7.0), (2, 2.0), (0.25, 0.25)],
)
def test_parse_duration(text, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "0 s", "-1 s", "5 fortnights", True, float("inf"), float("nan")])
def test_parse_duration_rejects(text) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "utc"),
    [("2026-11-26T10:00:00Z", "2026-11-26T10:00:00+00:00"), ("2026-11-26 10:00", "2026-11-26T10:00:00+00:00"),
     (" 2026-11-26T11:30:00+01:00 ", "2026-11-26T10:30:00+00:00"), ("2026-11-26", "2026-11-26T00:00:00+00:00")],
)
def test_parse_instant_reads_iso_times_as_utc_when_they_name_no_zone(text: str, utc: str) -> None:
    from datetime import timezone

    assert parse_instant(text).astimezone(timezone.utc).isoformat() == utc


@pytest.mark.parametrize("text", ["", "now", "yesterday", "26/11/2026 10:00", "2026-13-01T00:00:00Z"])
def test_parse_instant_rejects_with_an_example(text: str) -> None:
    with pytest.raises(ValueError, match="expected an ISO time such as 2026-11-26T10:00:00Z"):
        parse_instant(text)


def test_spark_interval_keeps_milliseconds() -> None:
    assert spark_interval(1.0) == "1 second"
    assert spark_interval(10.0) == "10 seconds"
    assert spark_interval(0.5) == "500 milliseconds"
    assert spark_interval(1.25) == "1250 milliseconds"
