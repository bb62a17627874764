"""PostgreSQL connections for the coordination store.

Every connection runs with ``search_path=tandem`` and ``TimeZone=UTC``, so SQL in Tandem names
its tables unqualified and ``date_trunc`` cuts buckets in UTC.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import psycopg2
import psycopg2.extensions
import psycopg2.extras

from tandem.errors import StoreError

SCHEMA = "tandem"
_OPTIONS = f"-c search_path={SCHEMA},public -c TimeZone=UTC"
_TRANSIENT = (psycopg2.OperationalError, psycopg2.InterfaceError)
T = TypeVar("T")
log = logging.getLogger(__name__)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def connect(url: str, application_name: str = "tandem", connect_timeout: int = 5) -> psycopg2.extensions.connection:
    """Open one connection with Tandem's session settings."""
    try:
        return psycopg2.connect(
            url, options=_OPTIONS, application_name=application_name, connect_timeout=connect_timeout
        )
    except psycopg2.OperationalError as exc:
        raise StoreError(f"cannot connect to PostgreSQL at {redact(url)}: {str(exc).strip()}") from exc


class Database:
    """One lazily opened connection that is reopened after PostgreSQL restarts.

    Not thread-safe: give every thread its own ``Database``.
    """

    def __init__(self, url: str, application_name: str = "tandem") -> None:
        self.url = url
        self.application_name = application_name
        self._conn: psycopg2.extensions.connection | None = None

    def connection(self) -> psycopg2.extensions.connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.url, self.application_name)
        return self._conn

    def close(self) -> None:
        if self._conn is not None and not self._conn.closed:
            self._conn.close()
        self._conn = None

    @contextmanager
    def transaction(self) -> Iterator[psycopg2.extensions.cursor]:
        """A cursor inside one transaction: committed on success, rolled back on error."""
        conn = self.connection()
        try:
            with conn, conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cursor:
                yield cursor
        except _TRANSIENT:
            self.close()
            raise

    def run(self, work: Callable[[psycopg2.extensions.cursor], T], attempts: int = 30, delay_s: float = 1.0) -> T:
        """Run ``work`` in a transaction, retrying it whole while PostgreSQL is unreachable.

        ``work`` must be idempotent: a retry after a lost commit acknowledgement runs it again.
        """
        for attempt in range(1, attempts + 1):
            try:
                with self.transaction() as cursor:
                    return work(cursor)
            except (*_TRANSIENT, StoreError) as exc:
                if attempt == attempts:
                    raise StoreError(f"PostgreSQL at {redact(self.url)} unreachable after {attempts} attempts: {exc}") from exc
                log.warning("PostgreSQL unreachable (attempt %d/%d): %s", attempt, attempts, str(exc).strip())
                time.sleep(delay_s)
        raise AssertionError("unreachable")

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
