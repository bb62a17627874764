"""A private Airflow (SQLite metadata, this repo's ``dags/``) for running DAGs with ``dag.test()``, and a
private Airflow stack on a free loopback port (:func:`airflow_stack`) for the e2e tests and benchmarks.

Each ``dag.test()`` run happens in a fresh interpreter, because Airflow reads its configuration once per process.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from _costs import note_start
from tandem.airflow_rest import AirflowClient
from tandem.config import load_cluster
from tandem.packaging import build_dist
from tandem.store import Database, migrate

REPO = Path(__file__).resolve().parents[2]

DAG_TEST = """
import json, sys
from sqlalchemy import select
from airflow.dag_processing.dagbag import DagBag
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session

dags_folder, dag_id, conf = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
dag = DagBag(dags_folder, safe_mode=False).dags[dag_id]
run = dag.test(run_conf=conf or None)
tis = {ti.task_id: {"state": str(ti.state), "try_number": ti.try_number} for ti in run.get_task_instances()}
with create_session() as session:
    rows = session.scalars(select(XComModel).where(XComModel.dag_id == run.dag_id, XComModel.run_id == run.run_id))
    xcom = {f"{x.task_id}.{x.key}": x.value for x in rows}
print("RESULT " + json.dumps({"state": str(run.state), "tis": tis, "xcom": xcom}, default=str))
"""


def private_airflow_env(tmp_path: Path) -> dict[str, str]:
    """Environment of a private Airflow over the temp project (``TANDEM_CONF_DIR`` etc. already set).

    The launched jobs get their own ``TANDEM_HOME``: this repo's ``jobs/`` and a fresh ``dist/``.
    Airflow's metadata DB is migrated, and so is Tandem's schema.
    """
    code = tmp_path / "code"
    (code / "jobs").mkdir(parents=True)
    for job in (REPO / "jobs").glob("*.py"):  # the entrypoints beside the dist built from the same checkout
        shutil.copy(job, code / "jobs" / job.name)
    build_dist(code)
    home = tmp_path / "airflow"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "TANDEM_HOME": str(code),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    })
    migrated_sqlite(home, env)
    with Database(load_cluster().database_url) as db:
        migrate(db)
    return env


_MIGRATED: Path | None = None


def migrated_sqlite(home: Path, env: dict[str, str]) -> None:
    """A migrated Airflow metadata DB at ``home/airflow.db`` (SQLite), fresh for each caller: a copy of one this
    process migrated once. The schema depends on Airflow's version only, and a migration costs ~15 CPU s."""
    global _MIGRATED
    if _MIGRATED is None:
        template = Path(tempfile.mkdtemp(prefix="tandem-airflow-db-"))
        atexit.register(shutil.rmtree, template, True)
        note_start("airflow db migrate")
        subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], check=True,
                       capture_output=True, timeout=300,
                       env={**env, "AIRFLOW_HOME": str(template),
                            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{template}/airflow.db"})
        _MIGRATED = template / "airflow.db"
    home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_MIGRATED, home / "airflow.db")


def dag_test_command(dag_id: str, conf: dict | None = None) -> list[str]:
    """The command that runs ``dag.test()`` for ``dag_id`` and prints ``RESULT {json}`` last."""
    return [sys.executable, "-c", DAG_TEST, str(REPO / "dags"), dag_id, json.dumps(conf or {})]


def dag_result(output: str) -> dict | None:
    """The run's state, task states and XComs printed by :data:`DAG_TEST` (None when it printed none)."""
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[-1].removeprefix("RESULT ")) if lines else None


def dag_test(env: dict[str, str], dag_id: str, conf: dict | None = None) -> tuple[dict, str]:
    """Run the DAG once to the end; return its result and the whole output (fails if it printed no result)."""
    note_start("airflow dags test")
    done = subprocess.run(dag_test_command(dag_id, conf), env=env, capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    result = dag_result(done.stdout)
    assert result is not None, output[-5000:]
    return result, output


def code_home(tmp_path: Path) -> Path:
    """A TANDEM_HOME for the stack with this checkout's code and a fresh dist/tandem.zip (the shared
    dist/ may be older), both nodes on local[1]; returns the env file the stack script sources."""
    code = tmp_path / "code"
    (code / "jobs").mkdir(parents=True)
    for job in (REPO / "jobs").glob("*.py"):  # the entrypoints beside the dist built from the same checkout
        shutil.copy(job, code / "jobs" / job.name)
    for shared in (".venv", "dags", "plugins"):
        (code / shared).symlink_to(REPO / shared)
    build_dist(code)
    env_file = tmp_path / "env.sh"
    text = (REPO / ".tandem" / "env.sh").read_text()
    text = text.replace(f"export TANDEM_HOME='{REPO}'", f"export TANDEM_HOME='{code}'")
    text = text.replace('"host": "local[2]"', '"host": "local[1]"')
    assert f"TANDEM_HOME='{code}'" in text
    env_file.write_text(text)
    return env_file


def _free_port() -> int:
    """A port whose log-server neighbours (port + 713, + 714) are free as well."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + 714 < 65536 and all(_is_free(port + offset) for offset in (713, 714)):
            return port
    raise RuntimeError("no free port")


def _is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


@contextmanager
def airflow_stack(home: Path, extra_env: dict[str, str] | None = None) -> Iterator[AirflowClient]:
    """Start ``scripts/airflow_stack.sh`` in ``home`` on a free loopback port (``extra_env`` e.g. another
    ``TANDEM_ENV_FILE``); stop it after."""
    port = _free_port()
    env = {**os.environ, "TANDEM_AIRFLOW_HOME": str(home), "AIRFLOW_HOME": str(home),
           "TANDEM_AIRFLOW_PORT": str(port), "TANDEM_AIRFLOW_URL": f"http://127.0.0.1:{port}", **(extra_env or {})}
    env.pop("TANDEM_AIRFLOW_DB_URL", None)
    stack = ["bash", str(REPO / "scripts" / "airflow_stack.sh")]
    try:
        note_start("airflow stack")
        subprocess.run([*stack, "up"], env=env, check=True, timeout=600)
        yield AirflowClient.as_admin(f"http://127.0.0.1:{port}", airflow_home=home)
    finally:
        subprocess.run([*stack, "down"], env=env, timeout=180)
