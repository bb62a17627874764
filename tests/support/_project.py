"""A throw-away PostgreSQL database and a temp project, as plain functions: the fixtures of
``tests/conftest.py`` use them per test, and tests that share one running pair across several
tests (``test_failover.py``, ``test_supervise.py``) use them for a class-scoped fixture."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import psycopg2
import pytest

from _costs import note_start
from tandem.process_start import same_start, start_since_boot
from tandem.store.db import Database
from tandem.store.migrations import migrate

PROJECT = Path(__file__).resolve().parents[2]
SERVER_URL = os.environ.get("TANDEM_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/tandem")


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def _admin(url: str):
    conn = psycopg2.connect(_with_database(url, "postgres"), connect_timeout=5)
    conn.autocommit = True
    return conn


def create_database() -> str:
    """A fresh, empty PostgreSQL database on the test server; its URL (drop it with :func:`drop_database`)."""
    name = f"tandem_test_{uuid.uuid4().hex[:10]}"
    conn = _admin(SERVER_URL)
    with conn.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    return _with_database(SERVER_URL, name)


def note_failovers(url: str) -> None:
    """Count the failovers a test's database saw (a node taking the lease from another) for the suite's costs."""
    try:
        with psycopg2.connect(url, connect_timeout=5) as conn, conn.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM tandem.failover_events "
                           "WHERE kind = 'PROMOTED' AND previous_node IS NOT NULL AND previous_node <> node")
            note_start("failover", cursor.fetchone()[0])
        conn.close()
    except psycopg2.Error:  # no Tandem schema (yet): nothing failed over
        pass


def drop_database(url: str) -> None:
    note_failovers(url)
    name = urlsplit(url).path.lstrip("/")
    conn = _admin(SERVER_URL)
    with conn.cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    conn.close()


@contextmanager
def migrated_database() -> Iterator[Database]:
    """A fresh database with Tandem's migrations applied, open for a module's tests; dropped afterwards."""
    url = create_database()
    try:
        with Database(url) as db:
            migrate(db)
            yield db
    finally:
        drop_database(url)


def use_project(root: Path, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of conf/ in ``root``; storage, drivers' scratch folders and database private to it, code from the repo
    (env set with ``monkeypatch``)."""
    shutil.copytree(PROJECT / "conf", root / "conf")
    monkeypatch.setenv("TANDEM_HOME", str(PROJECT))
    monkeypatch.setenv("TANDEM_CONF_DIR", str(root / "conf"))
    monkeypatch.setenv("TANDEM_STORAGE_ROOT", str(root / "data"))
    monkeypatch.setenv("TANDEM_SCRATCH_DIR", str(root / "scratch"))
    monkeypatch.setenv("TANDEM_DATABASE_URL", database_url)
    return root


class ProcessGroups(list):
    """Process groups a test started (spark-submit PIDs, each the leader of its own session), each with its leader's
    start time when it was recorded: PIDs wrap around within minutes on a busy machine (``pid_max`` 32768), and a
    group id recorded by one test can name another test's new group by the time the first one tears down."""

    def __init__(self, groups=()) -> None:
        super().__init__()
        self.leader_started: dict[int, float | None] = {}
        self.extend(groups)

    def append(self, pgid: int) -> None:
        if pgid not in self.leader_started:
            self.leader_started[pgid] = start_since_boot(pgid)
        super().append(pgid)

    def extend(self, pgids) -> None:
        for pgid in pgids:
            self.append(pgid)

    def reused(self, pgid: int) -> bool:
        """Whether ``pgid`` now leads a group other than the one recorded (a live leader started at another time)."""
        recorded = self.leader_started.get(pgid)
        try:
            leader = psutil.Process(pgid)
            return recorded is None or not same_start(recorded, leader)
        except psutil.NoSuchProcess:
            return False  # no leader: whatever still has this group id is what is left of the recorded group


def kill_groups(groups: list[int]) -> None:
    """SIGKILL every process of the given process groups (spark-submit PIDs started with their own session); with
    :class:`ProcessGroups`, a group id that another group has taken meanwhile is left alone."""
    for pgid in groups:
        if isinstance(groups, ProcessGroups) and groups.reused(pgid):
            continue
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


def _trades_spec():
    from tandem.aggregation.spec import spec_for
    from tandem.config import load_cluster, load_plan

    return spec_for(load_plan("trades", load_cluster(PROJECT / "conf" / "cluster.yaml")), "trade_aggregates")


TRADES = _trades_spec()
"""The trades plan's aggregation, as conf/plans/trades.yaml declares it."""


def without_suites(conf: Path, plan: str) -> None:
    """Make ``plan`` of the configuration folder ``conf`` name no suite and have no suite file: it
    validates with the suites its declarations imply."""
    import yaml

    path = conf / "plans" / f"{plan}.yaml"
    data = yaml.safe_load(path.read_text())
    for section in ("validation", "snapshot"):
        data.pop(section, None)
    path.write_text(yaml.safe_dump(data))
    for suite in (conf / "expectations").glob(f"{plan}_*.json"):
        suite.unlink()
