"""Shared fixtures: a throw-away PostgreSQL database, a project config in a temp dir, Spark."""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg2
import pytest

PROJECT = Path(__file__).resolve().parents[1]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO lines at interpreter exit hit closed streams
SERVER_URL = os.environ.get("TANDEM_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/tandem")


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def _admin(url: str):
    conn = psycopg2.connect(_with_database(url, "postgres"), connect_timeout=5)
    conn.autocommit = True
    return conn


@pytest.fixture
def database_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    name = f"tandem_test_{uuid.uuid4().hex[:10]}"
    conn = _admin(SERVER_URL)
    with conn.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    try:
        yield _with_database(SERVER_URL, name)
    finally:
        conn = _admin(SERVER_URL)
        with conn.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()


@pytest.fixture
def project(tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of conf/ in a temp folder; storage and database private to the test, code from the repo."""
    root = tmp_path / "project"
    shutil.copytree(PROJECT / "conf", root / "conf")
    monkeypatch.setenv("TANDEM_HOME", str(PROJECT))
    monkeypatch.setenv("TANDEM_CONF_DIR", str(root / "conf"))
    monkeypatch.setenv("TANDEM_STORAGE_ROOT", str(root / "data"))
    monkeypatch.setenv("TANDEM_DATABASE_URL", database_url)
    return root


@pytest.fixture
def process_groups() -> Iterator[list[int]]:
    """Process groups (spark-submit PIDs started with their own session) to SIGKILL after the test."""
    groups: list[int] = []
    yield groups
    for pgid in groups:
        for process in psutil.process_iter():
            try:
                if os.getpgid(process.pid) == pgid:
                    process.kill()
            except (psutil.NoSuchProcess, ProcessLookupError, psutil.AccessDenied):
                pass
        try:
            os.waitpid(pgid, os.WNOHANG)
        except ChildProcessError:
            pass


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the integration tests (settings from conf/spark-defaults.conf)."""
    from tandem.runtime.session import build_session

    session = build_session("tandem-tests", "local[2]", PROJECT / "conf" / "spark-defaults.conf")
    yield session
    session.stop()
