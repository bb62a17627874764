"""Advisory locks that die with their PostgreSQL session are noticed before the next action (issue 9, item 8), and a
backfill whose job died (its run lock free) stops refusing overlapping ones (issue 27)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg2
import pytest

from tandem.batch.backfill import run_backfill
from tandem.config import load_cluster, load_plan
from tandem.errors import BackfillRefused, LockLost
from tandem.store import backfills as catalog
from tandem.store import migrate
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
            "SELECT kind, reason FROM failover_events WHERE plan = 'trades' AND instance = 'shard-1' ORDER BY id"),
            cursor.fetchall())[1])
        instances = db.run(lambda cursor: (cursor.execute("SELECT instance_id FROM plan_instances"),
                                           cursor.fetchall())[1])
    kinds = [event["kind"] for event in events]
    assert kinds == ["LOCK_LOST"], f"something was done after the lock was lost: {events}"
    assert "stopped before: launch" in events[0]["reason"]
    assert instances == []


def test_a_backfill_whose_job_ended_without_finishing_refuses_overlaps_only_until_it_counts_as_abandoned(
        project: Path, database_url: str) -> None:
    """A RUNNING backfill refuses an overlapping one while its job holds its run lock, and while it is recent (its
    job may still be starting); once its lock is free and it is older than ``ABANDONED_AFTER_S``, the next overlapping
    registration marks it FAILED as abandoned and its job, should it start late, is refused."""
    start = datetime(2026, 11, 26, 10, tzinfo=timezone.utc)
    end = start + timedelta(minutes=30)
    with Database(database_url) as db:
        migrate(db)

        def age(backfill_id: str) -> None:
            db.run(lambda cursor: cursor.execute(
                "UPDATE backfills SET started_at = started_at - make_interval(secs => %s) WHERE id = %s",
                (catalog.ABANDONED_AFTER_S + 60, backfill_id)))

        first = catalog.register(db, "trades", start, end, ["shard-1"], "test")
        age(first.id)
        with AdvisoryLock(database_url, "backfill", catalog.run_lock_name(first.id)):  # its job runs
            with pytest.raises(BackfillRefused, match=f"backfill {first.id} .* overlaps"):
                catalog.register(db, "trades", start, end, ["shard-1"], "test")
        recent = catalog.register(db, "trades", start, end, ["shard-2"], "test")  # no job yet, but just registered
        with pytest.raises(BackfillRefused, match=f"backfill {recent.id} .* overlaps"):
            catalog.register(db, "trades", start + timedelta(minutes=5), end, ["shard-2"], "test")

        second = catalog.register(db, "trades", start + timedelta(minutes=5), end, ["shard-1"], "test")
        abandoned = catalog.get_backfill(db, first.id)
        assert (abandoned.status, second.status) == (catalog.FAILED, catalog.RUNNING)
        assert abandoned.error.startswith("abandoned: ") and second.id in abandoned.error, abandoned.error
        cluster = load_cluster()
        with pytest.raises(BackfillRefused, match=f"no RUNNING backfill '{first.id}'.*FAILED: abandoned"):
            run_backfill(cluster, load_plan("trades", cluster), db, None, start, end, backfill_id=first.id)


def test_a_plan_s_upkeep_waits_for_its_coordination_lock_and_another_plan_s_does_not(project: Path) -> None:
    """Issue 46 §4: PostgreSQL retention of plan trades waits while another process holds the plan's lock (a
    backfill, a restore...); the pizza shop's does not; a thread holding it may take it again (re-entrant)."""
    import threading
    import time

    from tandem.batch.trim import trim_plan_rows
    from tandem.store.locks import plan_lock

    cluster = load_cluster()
    with Database(cluster.database_url) as db:
        migrate(db)
    release, held, times = threading.Event(), threading.Event(), {}

    def other_process() -> None:  # a session of its own, as another process's would be
        with plan_lock(cluster.database_url, "trades", "a backfill"):
            held.set()
            release.wait(30)
            times["released"] = time.monotonic()

    def retention(plan: str) -> None:
        with Database(cluster.database_url) as db:
            trim_plan_rows(load_plan(plan, cluster), db)
        times[plan] = time.monotonic()

    holder = threading.Thread(target=other_process)
    holder.start()
    assert held.wait(30)
    waiting = threading.Thread(target=retention, args=("trades",))
    waiting.start()
    retention("pizza_shop")  # another plan's lock: done at once
    waiting.join(1.5)
    assert waiting.is_alive(), "the trades retention ran while the plan's lock was held"
    release.set()
    holder.join(30)
    waiting.join(30)
    assert times["pizza_shop"] < times["released"] <= times["trades"]

    with plan_lock(cluster.database_url, "trades", "a restore"):
        with Database(cluster.database_url) as db:
            trim_plan_rows(load_plan("trades", cluster), db)  # the same thread: taken again, no deadlock
