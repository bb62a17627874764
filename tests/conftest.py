"""Shared fixtures: a throw-away PostgreSQL database, a project config in a temp dir, Spark, a NATS server."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _project import PROJECT, create_database, drop_database, kill_groups, use_project

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO lines at interpreter exit hit closed streams


@pytest.fixture
def database_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    url = create_database()
    try:
        yield url
    finally:
        drop_database(url)


@pytest.fixture
def project(tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of conf/ in a temp folder; storage and database private to the test, code from the repo."""
    return use_project(tmp_path / "project", database_url, monkeypatch)


@pytest.fixture
def process_groups() -> Iterator[list[int]]:
    """Process groups (spark-submit PIDs started with their own session) to SIGKILL after the test."""
    groups: list[int] = []
    yield groups
    kill_groups(groups)


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the integration tests (settings from conf/spark-defaults.conf)."""
    from tandem.spark_session import build_session

    session = build_session("tandem-tests", "local[2]", PROJECT / "conf" / "spark-defaults.conf")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def nats_server(tmp_path_factory: pytest.TempPathFactory):
    """An embedded ``nats-server -js`` on a free port for a module's tests (each test takes a subject prefix of its
    own: :func:`_nats.messaging_layer`), stopped after them."""
    from _nats import start_nats

    started = start_nats(tmp_path_factory.mktemp("nats") / "jetstream")
    try:
        yield started
    finally:
        started.stop()
