"""Shared fixtures: a throw-away PostgreSQL database, a project config in a temp dir, Spark, a NATS server."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from _project import PROJECT, ProcessGroups, create_database, drop_database, kill_groups, use_project

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Every JVM of the suite (the in-process sessions and each driver a test launches, which inherit this environment)
# compiles with C1 only: a test's driver lives for seconds to minutes, in which C2's compiles never pay off; an
# idle driver spent about a third of its CPU on them (tests/e2e/test_airflow_trades.py alone: 68 -> 44 CPU s for
# its two drivers). Production drivers keep the default tiered compilation (bench/ measures with it).
# C1 alone gets a code cache of 48 MB, which a worker's session filled after three modules of stateful queries
# ("Out of space in CodeCache for adapters" failed a task): give it the tiered default's 240 MB.
C1_ONLY = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
if C1_ONLY not in os.environ.get("SPARK_SUBMIT_OPTS", ""):  # xdist's workers inherit the controller's environment
    os.environ["SPARK_SUBMIT_OPTS"] = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} {C1_ONLY}".strip()
logging.getLogger("py4j").setLevel(logging.WARNING)  # its INFO lines at interpreter exit hit closed streams

# `make test` runs two pytest-xdist workers with ``--dist loadfile --no-loadscope-reorder``: a worker takes whole
# modules (their module fixtures start once) in collection order, never two HEAVY_MODULES at once (below). The
# longest modules go first so that the two workers end close together (longest-processing-time first). Seconds
# per module from a full run (junit times, an idle 2-core AMD EPYC machine, 2,310 s in all, 1,167 s of wall time
# on two workers; an Intel Xeon at 2.8 GHz takes about 3x as long); modules not listed take under 30 s.
MODULE_SECONDS = {
    "hosts/test_airflow_on_hosts.py": 654,
    "integration/test_supervise.py": 270,
    "integration/test_output_failover.py": 214,
    "integration/test_failover.py": 183,
    "integration/test_dags.py": 166,
    "e2e/test_presenter_page.py": 100,
    "e2e/test_airflow_trades.py": 95,
    "integration/test_notify_and_assets.py": 72,
    "integration/test_fourth_plan.py": 70,
    "integration/test_linked_groups.py": 68,
    "hosts/test_nats_on_hosts.py": 59,
    "hosts/test_spark_cluster_on_hosts.py": 110,  # added later: 330 s on a host 3x slower
    "integration/test_backfill.py": 55,
    "integration/test_big_batches.py": 45,  # added later, measured beside other test runs
    "integration/test_plan_snapshots.py": 50,
    "integration/test_launcher.py": 48,
    "integration/test_nats_source.py": 37,
    "integration/test_snapshots.py": 35,
    "e2e/test_presenter_api.py": 34,
}


# Modules that run several drivers under load: the suite's scheduler runs one of them at a time (_scheduling.py).
HEAVY_MODULES = {
    "hosts/test_airflow_on_hosts.py",
    "integration/test_supervise.py",
    "integration/test_output_failover.py",
    "integration/test_failover.py",
}


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
