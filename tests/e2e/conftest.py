"""A private Airflow stack (API server, scheduler, triggerer, DAG processor) for end-to-end tests."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tandem.airflow_rest import AirflowClient

REPO = Path(__file__).resolve().parents[2]


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
def _airflow_stack(home: Path, extra_env: dict[str, str] | None = None) -> Iterator[AirflowClient]:
    """Start ``scripts/airflow_stack.sh`` in ``home`` (``extra_env`` e.g. another ``TANDEM_ENV_FILE``); stop it after."""
    port = _free_port()
    env = {**os.environ, "TANDEM_AIRFLOW_HOME": str(home), "AIRFLOW_HOME": str(home),
           "TANDEM_AIRFLOW_PORT": str(port), "TANDEM_AIRFLOW_URL": f"http://127.0.0.1:{port}", **(extra_env or {})}
    env.pop("TANDEM_AIRFLOW_DB_URL", None)
    stack = ["bash", str(REPO / "scripts" / "airflow_stack.sh")]
    try:
        subprocess.run([*stack, "up"], env=env, check=True, timeout=600)
        yield AirflowClient.as_admin(f"http://127.0.0.1:{port}", airflow_home=home)
    finally:
        subprocess.run([*stack, "down"], env=env, timeout=180)


@pytest.fixture
def airflow(project: Path, tmp_path: Path) -> Iterator[AirflowClient]:
    """A private Airflow stack in a temp home, over the temp project's configuration."""
    with _airflow_stack(tmp_path / "airflow") as client:
        yield client


@pytest.fixture
def airflow_stack():
    """``airflow_stack(home, extra_env)``: a context manager for tests that start the stack themselves."""
    return _airflow_stack
