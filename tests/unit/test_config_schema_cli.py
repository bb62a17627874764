"""``tandem config schema``: a plan file named as a user names one (``plans/x.yaml``) asks for the plan files'
schema; a YAML output path is refused with the usage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.cli import schema_arguments
from tandem.config import json_schemas
from tandem.errors import TandemError

NAMES = ("cluster.yaml", "plans/<name>.yaml")


@pytest.mark.parametrize("file, path, expected", [
    ("plans/x.yaml", None, ("plans/<name>.yaml", None)),  # failed: 'would be a JSON file named like a YAML one'
    ("conf/plans/trades.yml", "plan.schema.json", ("plans/<name>.yaml", Path("plan.schema.json"))),
    ("/srv/tandem/plans/fraud_alerts.yaml", None, ("plans/<name>.yaml", None)),  # a plans folder elsewhere
    ("conf/cluster.yaml", None, ("cluster.yaml", None)),
    ("plans/<name>.yaml", None, ("plans/<name>.yaml", None)),  # as the help writes it
    ("schemas.json", None, (None, Path("schemas.json"))),  # both, written there
    (None, None, (None, None)),
])
def test_a_file_named_as_the_user_names_it_asks_for_its_kinds_schema(file, path, expected) -> None:
    assert schema_arguments(file, path, NAMES) == expected


@pytest.mark.parametrize("file, path, message", [
    ("plans/x.yaml", "out.yaml", "out.yaml would be a JSON file named like a YAML one"),
    ("notes.txt", "out.json", "'notes.txt' is not a configuration file"),
    ("nonsense.yaml", None, "'nonsense.yaml' is not a configuration file"),  # not an output path either
])
def test_a_wrong_use_says_the_right_usage(file, path, message) -> None:
    with pytest.raises(TandemError) as refused:
        schema_arguments(file, path, NAMES)
    assert message in str(refused.value)
    assert "usage: tandem config schema [cluster.yaml | plans/<name>.yaml] [OUTPUT.json]" in str(refused.value)


def test_a_plan_file_in_the_plans_folder_elsewhere_names_the_plan_files_schema(tmp_path: Path) -> None:
    folder = tmp_path / "my-plans"
    assert schema_arguments(str(folder / "trades.yaml"), None, NAMES, folder) == ("plans/<name>.yaml", None)
    with pytest.raises(TandemError, match="is not a configuration file"):
        schema_arguments(str(tmp_path / "trades.yaml"), None, NAMES, folder)


def test_the_command_prints_the_plan_files_schema_for_a_plan_file(conf: Path, tmp_path: Path) -> None:
    env = {**os.environ, "TANDEM_CONF_DIR": str(conf)}
    done = subprocess.run([sys.executable, "-m", "tandem.cli", "config", "schema", "plans/x.yaml"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json_schemas()["plans/<name>.yaml"]
