"""Advisory locks that die with their PostgreSQL session are noticed before the next action (issue 9, item 8)."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg2
import pytest

from tandem.config import load_cluster, load_plan
from tandem.errors import LockLost
from tandem.store.db import Database
from tandem.store.locks import AdvisoryLock
from tandem.supervisor.reconcile import Supervisor

pytestmark = pytest.mark.integration
LOCK_SESSIONS = "application_name LIKE 'tandem-%%-lock'"


def terminate_lock_sessions(database_url: str) -> int:
    """``pg_terminate_backend`` of every Tandem lock session on this test's database; how many."""
    with psycopg2.connect(database_url) as conn, conn.cursor() as cursor:
        cursor.execute(f"""SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                           WHERE datname = current_database() AND {LOCK_SESSIONS}""")
        killed = cursor.fetchone()[0]
    conn.close()
    return killed


def test_a_lock_whose_session_was_terminated_is_reported_lost_and_can_be_taken_again(database_url: str) -> None:
    with AdvisoryLock(database_url, "supervise", "trades/shard-1") as lock:
        lock.check()
        assert terminate_lock_sessions(database_url) == 1
        with pytest.raises(LockLost, match="trades/shard-1 was lost"):
            lock.check()
        with AdvisoryLock(database_url, "supervise", "trades/shard-1") as other:  # free again: nobody waits
            other.check()


class TerminateLockOnFirstHealthLine(logging.Handler):
    """Ends the supervision lock's PostgreSQL session while the supervisor reconciles, after it observed."""

    def __init__(self, database_url: str) -> None:
        super().__init__()
        self.database_url = database_url
        self.terminated = 0

    def emit(self, record: logging.LogRecord) -> None:
        if not self.terminated and "MISSING" in record.getMessage():
            self.terminated = terminate_lock_sessions(self.database_url)


def test_no_action_happens_after_the_supervision_lock_is_lost_mid_reconcile(project: Path, tmp_path: Path) -> None:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    logger = logging.getLogger("test_locks.supervisor")
    logger.setLevel(logging.INFO)
    hook = TerminateLockOnFirstHealthLine(cluster.database_url)
    logger.addHandler(hook)
    try:
        # nothing runs: the supervisor decides to launch; a missing zip keeps any launch from starting a job
        with Supervisor(cluster, plan, log=logger, py_files=tmp_path / "missing.zip") as supervisor:
            with pytest.raises(LockLost):
                supervisor.reconcile("shard-1", cause="test")
    finally:
        logger.removeHandler(hook)
    assert hook.terminated == 1, "the lock session was not found while reconciling"

    with Database(cluster.database_url) as db:
        events = db.run(lambda cursor: (cursor.execute(
            "SELECT kind, reason FROM failover_events WHERE plan = 'trades' AND shard_id = 'shard-1' ORDER BY id"),
            cursor.fetchall())[1])
        instances = db.run(lambda cursor: (cursor.execute("SELECT instance_id FROM plan_instances"),
                                           cursor.fetchall())[1])
    kinds = [event["kind"] for event in events]
    assert kinds == ["LOCK_LOST"], f"something was done after the lock was lost: {events}"
    assert "stopped before: launch" in events[0]["reason"]
    assert instances == []
