"""Shared fixtures: a throw-away PostgreSQL database, a project config in a temp dir, Spark, a NATS server."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _project import PROJECT, ProcessGroups, create_database, drop_database, kill_groups, use_project
from tandem.supervisor.submit_command import SHORT_LIVED_JVM_OPTIONS

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Every JVM of the suite (the in-process sessions and each driver a test launches, which inherit this environment)
# compiles with C1 only: a test's driver lives for seconds to minutes, in which C2's compiles never pay off; an
# idle driver spent about a third of its CPU on them (tests/e2e/test_airflow_trades.py alone: 68 -> 44 CPU s for
# its two drivers). Production drivers keep the default tiered compilation (bench/ measures with it).
if SHORT_LIVED_JVM_OPTIONS not in os.environ.get("SPARK_SUBMIT_OPTS", ""):  # xdist's workers inherit the controller's
    os.environ["SPARK_SUBMIT_OPTS"] = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} {SHORT_LIVED_JVM_OPTIONS}".strip()
logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO lines at interpreter exit hit closed streams

# `make test` runs two pytest-xdist workers with ``--dist loadfile --no-loadscope-reorder``: a worker takes whole
# modules (their module fixtures start once) in collection order, never two heavy modules at once (below). The
# longest modules go first so that the two workers end close together (longest-processing-time first). Seconds
# per module and the heavy modules come from the last measured full run: tests/module_seconds.json, written by
# `python tests/support/_costs.py` from what the cost plugin measured (tests/README.md).
MEASURED = json.loads((PROJECT / "tests" / "module_seconds.json").read_text())
MODULE_SECONDS: dict[str, int] = MEASURED["seconds"]
# Heavy beside what the measurement finds: modules whose processes wait on each other across hosts and under load,
# so that a neighbour's load stretches them past their timeouts although their own average stays under 1.2 cores.
# test_spark_cluster_on_hosts (nine JVMs: a master, two workers, four executors, two drivers) spent 228 s on its
# first batch beside test_airflow_on_hosts in CI on 2026-12-07 and timed out.
ALWAYS_HEAVY = frozenset({
    "hosts/test_airflow_on_hosts.py",
    "hosts/test_spark_cluster_on_hosts.py",
    "integration/test_supervise.py",
    "integration/test_output_failover.py",
    "integration/test_failover.py",
})
HEAVY_MODULES: frozenset[str] = frozenset(MEASURED["heavy"]) | ALWAYS_HEAVY


def pytest_configure(config: pytest.Config) -> None:
    """Measure every module, test and fixture (tests/support/_costs.py) unless ``-p no:tandem_costs``."""
    if not config.pluginmanager.is_blocked("tandem_costs"):
        from _costs import SuiteCosts

        config.pluginmanager.register(SuiteCosts(config), "tandem_costs")


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which would answer for loadfile first
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadfile`` that never runs two heavy modules at the same time."""
    if config.getvalue("dist") != "loadfile":
        return None
    from _scheduling import OneHeavyModuleAtATime

    return OneHeavyModuleAtATime(config, log, heavy=HEAVY_MODULES)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, the longest modules first (a stable sort: tests keep their order within a module)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: -MODULE_SECONDS.get(item.nodeid.split("::")[0].removeprefix("tests/"), 0))


@pytest.fixture(autouse=True)
def wide_cli_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's tables laid out whole in every test, whatever terminal (or none: 80 columns) runs the suite; the
    tests of the CLI's width set ``COLUMNS`` themselves."""
    monkeypatch.setenv("COLUMNS", "200")


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
    groups = ProcessGroups()
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
