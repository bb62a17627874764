"""The presenter's PostgreSQL connections: a few, reused, each with a statement timeout.

Purpose:
    Twenty open pages poll every two seconds. Opening a connection per request costs a
    PostgreSQL backend start each time and lets a burst of requests take as many server
    connections as it likes, beside the plan instances whose lease renewals must never wait;
    a request without a statement timeout can hold a backend as long as its query runs.

How it works:
    :class:`ConnectionPool` keeps at most ``size`` :class:`~tandem.store.db.Database` objects
    (each one lazily opened connection, reopened after PostgreSQL restarts). A request borrows
    one for its whole duration and gives it back; when all are lent, it waits up to ``wait_s``
    and then gets :class:`PresenterBusy` (503). Every connection runs with
    ``statement_timeout`` (:data:`STATEMENT_TIMEOUT_S`), so a slow query fails with PostgreSQL's
    "canceling statement due to statement timeout" instead of piling up.

What it does not do:
    It never shares a connection between two requests at once (``Database`` is not thread-safe)
    and it does not retry a query cancelled by the timeout: the caller sees the error.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg2.extensions
import psycopg2.extras

from tandem.errors import TandemError
from tandem.store.db import Database, set_statement_timeout

POOL_SIZE = 4
STATEMENT_TIMEOUT_S = 10.0
BORROW_WAIT_S = 15.0


class PresenterBusy(TandemError):
    """Every connection of the presenter is in use for longer than a request may wait."""


class TimedDatabase(Database):
    """A :class:`Database` whose every (re)opened connection runs with ``statement_timeout``."""

    def __init__(self, url: str, application_name: str, statement_timeout_s: float) -> None:
        super().__init__(url, application_name)
        self.statement_timeout_ms = max(1, round(statement_timeout_s * 1000))
        self._timed: psycopg2.extensions.connection | None = None

    def connection(self) -> psycopg2.extensions.connection:
        conn = super().connection()
        if conn is not self._timed:
            with conn.cursor() as cursor:
                set_statement_timeout(cursor, self.statement_timeout_ms)
            conn.commit()
            self._timed = conn
        return conn


class ConnectionPool:
    """At most ``size`` connections to one PostgreSQL URL, lent to one request at a time."""

    def __init__(self, url: str, size: int = POOL_SIZE, statement_timeout_s: float = STATEMENT_TIMEOUT_S,
                 wait_s: float = BORROW_WAIT_S, application_name: str = "tandem-presenter") -> None:
        self.url, self.size, self.wait_s = url, size, wait_s
        self.statement_timeout_s, self.application_name = statement_timeout_s, application_name
        self._slots = threading.BoundedSemaphore(size)
        self._idle: list[TimedDatabase] = []
        self._lock = threading.Lock()
        self.opened = 0

    @contextmanager
    def borrow(self) -> Iterator[Database]:
        """One of the pool's databases for the duration of the block (:class:`PresenterBusy` when none frees up)."""
        if not self._slots.acquire(timeout=self.wait_s):
            raise PresenterBusy(f"all {self.size} PostgreSQL connections of the presenter stayed busy for "
                                f"{self.wait_s:g} s: try again")
        try:
            with self._lock:
                db = self._idle.pop() if self._idle else None
            if db is None:
                db = TimedDatabase(self.url, self.application_name, self.statement_timeout_s)
                self.opened += 1
            try:
                yield db
            finally:
                with self._lock:
                    self._idle.append(db)
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for db in idle:
            db.close()


_pools: dict[str, ConnectionPool] = {}
_pools_lock = threading.Lock()


def pool_for(url: str) -> ConnectionPool:
    """The process's pool for ``url`` (created on first use)."""
    with _pools_lock:
        pool = _pools.get(url)
        if pool is None:
            pool = _pools[url] = ConnectionPool(url)
        return pool
