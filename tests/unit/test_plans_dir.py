"""Plans kept outside ``conf/plans/``: ``TANDEM_PLANS_DIR`` names their folder for every command, the page and the
drivers a launch starts."""

from __future__ import annotations

import shutil
import subprocess
import sys
import os
from pathlib import Path

import pytest

from tandem.config import load_cluster, load_plan, load_plans_and_errors, plans_dir
from tandem.errors import ConfigError
from tandem.scaffold import new_plan
from tandem.supervisor.submit_command import child_environment


@pytest.fixture
def elsewhere(conf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The shipped plans moved out of the configuration folder into ``<tmp>/my-plans``."""
    folder = tmp_path / "my-plans"
    shutil.move(conf / "plans", folder)
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    monkeypatch.setenv("TANDEM_PLANS_DIR", str(folder))
    return folder


def test_plans_are_found_in_the_folder_tandem_plans_dir_names(conf: Path, elsewhere: Path) -> None:
    cluster = load_cluster()
    assert cluster.plans_dir == elsewhere and plans_dir(conf) == elsewhere
    assert load_plan("trades", cluster).path == elsewhere / "trades.yaml"
    plans, broken = load_plans_and_errors(cluster)
    assert set(plans) == {path.stem for path in elsewhere.glob("*.yaml")} and not broken
    assert child_environment(cluster, base={})["TANDEM_PLANS_DIR"] == str(elsewhere)  # the driver's too


def test_a_new_plan_is_written_there(conf: Path, elsewhere: Path) -> None:
    yaml_path, module_path = new_plan(load_cluster(), "fraud_alerts")
    assert (yaml_path, module_path) == (elsewhere / "fraud_alerts.yaml", elsewhere / "fraud_alerts.py")
    assert not (conf / "plans").exists()


def test_without_it_the_plans_are_in_the_configuration_folder(conf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    monkeypatch.delenv("TANDEM_PLANS_DIR", raising=False)
    assert load_cluster().plans_dir == conf / "plans" and plans_dir(conf) == conf / "plans"


def test_a_relative_folder_is_from_the_current_folder(conf: Path, elsewhere: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(elsewhere.parent)
    monkeypatch.setenv("TANDEM_PLANS_DIR", "my-plans")
    assert load_cluster().plans_dir == elsewhere


def test_a_folder_that_is_not_there_is_refused_naming_the_variable(conf: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    monkeypatch.setenv("TANDEM_PLANS_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"TANDEM_PLANS_DIR \(environment\).*nowhere is not a folder"):
        load_cluster()


def test_config_check_checks_the_plans_there(conf: Path, elsewhere: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tandem.cli", "config", "check"], env=dict(os.environ),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{elsewhere / 'trades.yaml'}: ok: plan trades" in done.stdout
