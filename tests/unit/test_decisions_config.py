"""The plan's ``ha:`` section: standby mode and stall timeout, with errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from _conf import edit_yaml
from tandem.config import HAConfig, load_cluster, load_plan
from tandem.errors import ConfigError


def edit_plan(conf: Path, change) -> None:
    edit_yaml(conf / "plans" / "trades.yaml", change)


def test_shipped_trades_plan_is_hot_with_a_30_second_stall_timeout(conf: Path) -> None:
    plan = load_plan("trades", load_cluster(conf / "cluster.yaml"))
    assert plan.ha == HAConfig(standby="hot", stall_timeout_s=30.0, launch_timeout_s=180.0, max_launches=5,
                               launch_window_s=600.0)


def test_ha_section_is_optional(conf: Path) -> None:
    edit_plan(conf, lambda d: d.pop("ha"))
    assert load_plan("trades", load_cluster(conf / "cluster.yaml")).ha == HAConfig()


def test_warm_standby_and_durations(conf: Path) -> None:
    edit_plan(conf, lambda d: d.update(ha={"standby": "warm", "stall_timeout": "2 minutes", "launch_timeout": 90}))
    ha = load_plan("trades", load_cluster(conf / "cluster.yaml")).ha
    assert (ha.standby, ha.stall_timeout_s, ha.launch_timeout_s) == ("warm", 120.0, 90.0)


@pytest.mark.parametrize(("section", "field", "fragment"), [
    ({"standby": "lukewarm"}, "ha.standby", "hot, warm, cold"),
    ({"stall_timeout": "soon"}, "ha.stall_timeout", "duration"),
    ({"stall_timout": "1 s"}, "ha.stall_timout", "unknown field"),
    ({"standby": 1}, "ha.standby", "a string"),
    ({"max_launches": 0}, "ha.max_launches", "positive"),
])
def test_invalid_ha_fields_are_named(conf: Path, section: dict, field: str, fragment: str) -> None:
    edit_plan(conf, lambda d: d.update(ha=section))
    with pytest.raises(ConfigError) as caught:
        load_plan("trades", load_cluster(conf / "cluster.yaml"))
    assert caught.value.field == field
    assert fragment in str(caught.value)
