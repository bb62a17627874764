"""The plan's ``snapshot:`` section: interval and how many good snapshots to keep, errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from _conf import edit_yaml
from tandem.config import SnapshotConfig, load_cluster, load_plan
from tandem.errors import ConfigError


def edit_plan(conf: Path, change) -> None:
    edit_yaml(conf / "plans" / "trades.yaml", change)


def load(conf: Path):
    return load_plan("trades", load_cluster(conf / "cluster.yaml"))


def test_shipped_trades_plan_snapshots_every_15_minutes_keeps_3_and_validates_with_trades_state(conf: Path) -> None:
    assert load(conf).snapshot == SnapshotConfig(interval_s=900.0, keep=3, suite="trades_state")


def test_snapshot_section_is_optional_and_defaults_to_15_minutes_and_3(conf: Path) -> None:
    edit_plan(conf, lambda d: d.pop("snapshot"))
    assert load(conf).snapshot == SnapshotConfig(interval_s=900.0, keep=3, suite="trades_state")


def test_one_field_alone_keeps_the_default_of_the_other(conf: Path) -> None:
    edit_plan(conf, lambda d: d.update(snapshot={"keep": 1}))
    assert load(conf).snapshot == SnapshotConfig(interval_s=900.0, keep=1, suite="trades_state")


@pytest.mark.parametrize(("interval", "seconds"), [("1 hour", 3600.0), ("90 s", 90.0), (600, 600.0), ("5m", 300.0)])
def test_interval_takes_any_duration(conf: Path, interval, seconds: float) -> None:
    edit_plan(conf, lambda d: d.update(snapshot={"interval": interval, "keep": 7}))
    assert load(conf).snapshot == SnapshotConfig(interval_s=seconds, keep=7, suite="trades_state")


def test_the_suite_defaults_to_plan_state_and_can_be_named(conf: Path) -> None:
    (conf / "expectations" / "my_state_suite.json").write_text("{}")
    edit_plan(conf, lambda d: d.update(snapshot={"suite": "my_state_suite"}))
    assert load(conf).snapshot.suite == "my_state_suite"


@pytest.mark.parametrize(("section", "field", "fragment"), [
    ({"interval": "often"}, "snapshot.interval", "duration"),
    ({"interval": "0 minutes"}, "snapshot.interval", "positive"),
    ({"interval": True}, "snapshot.interval", "expected"),
    ({"keep": 0}, "snapshot.keep", "positive"),
    ({"keep": -2}, "snapshot.keep", "positive"),
    ({"keep": "3"}, "snapshot.keep", "an integer"),
    ({"keep": 2.5}, "snapshot.keep", "an integer"),
    ({"keep": True}, "snapshot.keep", "an integer"),
    ({"kept": 3}, "snapshot.kept", "unknown field"),
    ({"interval": "15 minutes", "retention": "1 day"}, "snapshot.retention", "unknown field"),
])
def test_invalid_snapshot_fields_are_named_with_the_file(conf: Path, section: dict, field: str,
                                                         fragment: str) -> None:
    edit_plan(conf, lambda d: d.update(snapshot=section))
    with pytest.raises(ConfigError) as caught:
        load(conf)
    plan_file = str((conf / "plans" / "trades.yaml").resolve())
    assert caught.value.path == plan_file
    assert caught.value.field == field
    assert fragment in str(caught.value)
    assert str(caught.value).startswith(f"{plan_file}: {field}: ")


def test_a_snapshot_section_that_is_not_a_mapping_is_named(conf: Path) -> None:
    edit_plan(conf, lambda d: d.update(snapshot=["15 minutes", 3]))
    with pytest.raises(ConfigError, match=r"trades.yaml: snapshot: expected a mapping, got list"):
        load(conf)
