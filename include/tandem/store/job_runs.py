"""``job_runs``: one row per run of a plan's batch jobs (reconcile, backfill, the maintenance tasks) with its result
(migration 022), so that ``tandem exporter`` can say when each last succeeded and an alert can fire on a failure."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tandem.store.db import Database, storable_text

RUNNING, SUCCESS, FAILURE = "RUNNING", "SUCCESS", "FAILURE"
MAX_DETAIL = 500


def start_run(db: Database, plan: str, job: str) -> int:
    """Record that ``job`` of ``plan`` started; its id."""
    return db.run(lambda cursor: (cursor.execute("INSERT INTO job_runs (plan, job) VALUES (%s, %s) RETURNING id",
                                                 (plan, job)), cursor.fetchone()["id"])[1])


def finish_run(db: Database, run_id: int, result: str, detail: str = "") -> None:
    """Record how run ``run_id`` ended (:data:`SUCCESS` or :data:`FAILURE`, with a line saying why)."""
    db.run(lambda cursor: cursor.execute(
        "UPDATE job_runs SET result = %s, detail = %s, finished_at = clock_timestamp() WHERE id = %s",
        (result, storable_text(detail[:MAX_DETAIL]), run_id)))


@contextmanager
def recorded_run(db: Database, plan: str, job: str) -> Iterator[None]:
    """Record the run of the block: SUCCESS when it returns, FAILURE (with the exception's first line) when it raises
    (the exception goes on)."""
    run_id = start_run(db, plan, job)
    try:
        yield
    except BaseException as exc:
        finish_run(db, run_id, FAILURE, f"{type(exc).__name__}: {' '.join(str(exc).split())}")
        raise
    finish_run(db, run_id, SUCCESS)
