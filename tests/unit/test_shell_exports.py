"""What set-up writes into .tandem/env.sh runs nothing when sourced (issue 9, item 6)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _conf import edit_yaml

from tandem.config import load_cluster
from tandem.errors import ConfigError


def exports(conf: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TANDEM_CONF_DIR": str(conf)}
    return subprocess.run([sys.executable, "-m", "tandem.cli", "airflow-env"], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("conn_id", ["x$(touch /tmp/tandem-pwned)", "tandem-node-a", "a b", "1abc", ""])
def test_a_connection_id_that_cannot_name_a_shell_variable_is_refused(conf: Path, conn_id: str) -> None:
    edit_yaml(conf / "cluster.yaml", lambda data: data["nodes"]["node-a"].update(airflow_conn_id=conn_id))
    with pytest.raises(ConfigError, match=r"cluster.yaml: nodes.node-a.airflow_conn_id: .* cannot name the variable"):
        load_cluster(conf / "cluster.yaml")
    done = exports(conf)
    assert done.returncode == 2 and "airflow_conn_id" in done.stderr and done.stdout == ""


def test_hostile_values_are_quoted_and_sourcing_runs_only_the_exports(conf: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    master = f"local[2]'; touch {marker}; echo '$(touch {marker})`touch {marker}`"
    edit_yaml(conf / "cluster.yaml", lambda data: data["nodes"]["node-a"].update(spark_master=master))
    done = exports(conf)
    assert done.returncode == 0, done.stderr
    env_file = tmp_path / "env.sh"
    env_file.write_text(done.stdout)
    subprocess.run(["sh", "-n", str(env_file)], check=True)
    shown = subprocess.run(["sh", "-c", f'. "{env_file}" && printf %s "$AIRFLOW_CONN_TANDEM_NODE_A"'],
                           capture_output=True, text=True, check=True).stdout
    assert not marker.exists(), "sourcing the exports ran a command"
    assert json.loads(shown)["host"] == master


def test_the_environment_lets_python_keep_its_bytecode_caches() -> None:
    """Where the host sets PYTHONDONTWRITEBYTECODE, every process would compile each module it imports again
    (~40 % of a ``dag.test()`` run): ``.tandem/env.sh`` lifts it for Tandem's processes."""
    env_file = Path(__file__).resolve().parents[2] / ".tandem" / "env.sh"
    done = subprocess.run(["sh", "-c", f'. "{env_file}" && python -c "import sys; print(sys.dont_write_bytecode)"'],
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False", done.stdout + done.stderr
