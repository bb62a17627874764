"""PostgreSQL connections for the coordination store.

Every connection runs with ``search_path=tandem`` and ``TimeZone=UTC``, so SQL in Tandem names
its tables unqualified and ``date_trunc`` cuts buckets in UTC.

Only failures to reach PostgreSQL are retried (the server is down, restarting, refusing
connections, or the connection broke); a wrong role, password or database, an unparsable URL or
any SQL error fails at once with its own message. No message ever shows a password: URLs go
through :func:`redact`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg2
import psycopg2.extensions
import psycopg2.extras
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_fixed

from tandem.errors import StoreError, StoreUnreachable
from tandem.redaction import redact

SCHEMA = "tandem"
_SESSION_SETTINGS = {"search_path": f"{SCHEMA},public", "TimeZone": "UTC", "DateStyle": "ISO",
                     "extra_float_digits": "3",
                     "tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3",
                     "tcp_user_timeout": "10000"}
"""Every session's settings. Timestamps print as ISO in UTC and doubles exactly whatever the server's defaults (rows
copied out as CSV are parsed as such). The server-side TCP ones end the session of a client behind a network
partition within ~11 s (PostgreSQL's defaults wait two hours), which rolls back its open transaction and releases
its locks."""
T = TypeVar("T")
log = logging.getLogger(__name__)

_TRANSIENT_STATES = ("the database system is starting up", "the database system is shutting down",
                     "the database system is in recovery mode", "the database system is not yet accepting connections",
                     "too many clients", "remaining connection slots are reserved")
"""Server messages at connection time that mean "try again soon" (libpq gives no SQLSTATE then)."""
_TRANSIENT_SQLSTATE_CLASSES = ("08", "57P01", "57P02", "57P03", "57P05", "53300", "25P03")
"""Connection exceptions, administrator/crash shutdown, cannot connect now, idle-session timeout, too many
connections, and the idle-in-transaction timeout a frozen publisher's fenced transaction ends with (its retry
then finds itself fenced, see :func:`tandem.store.leases.check_fence`)."""

_TCP_SETTINGS = {"keepalives": 1, "keepalives_idle": 5, "keepalives_interval": 2, "keepalives_count": 3,
                 "tcp_user_timeout": 10_000}
"""A connection to a server behind a network partition fails within ~10 s instead of TCP's ~15 minutes of
retransmissions: keepalive probes on idle connections, and a limit on how long sent data may stay
unacknowledged. (Safety never depends on it: a cut-off publisher is fenced by its lease either way.)"""


def storable_text(text: str | None) -> str | None:
    """``text`` as PostgreSQL's ``text`` stores it: NUL (which it refuses) written ``\\u0000``.

    For what Tandem writes about its own state (errors, reasons), which may quote input or other processes.
    """
    return None if text is None else text.replace("\x00", "\\u0000")


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` means PostgreSQL could not be reached or the connection broke (worth retrying)."""
    if isinstance(exc, StoreUnreachable | psycopg2.InterfaceError):
        return True
    if not isinstance(exc, psycopg2.OperationalError):
        return False
    if exc.pgcode:
        return exc.pgcode.startswith(_TRANSIENT_SQLSTATE_CLASSES)
    text = str(exc)
    # no SQLSTATE: a client-side failure (refused, timed out, closed), or the server's FATAL at connect
    return "FATAL:" not in text or any(state in text for state in _TRANSIENT_STATES)


def session_options(settings: Mapping[str, str] | None = None) -> str:
    """libpq's ``options`` for Tandem's session settings, with ``settings`` added or replacing them (pure)."""
    return " ".join(f"-c {name}={value}" for name, value in {**_SESSION_SETTINGS, **(settings or {})}.items())


def connect(url: str, application_name: str = "tandem", connect_timeout: int = 5,
            settings: Mapping[str, str] | None = None) -> psycopg2.extensions.connection:
    """Open one connection with Tandem's session settings (and ``settings``).

    Raises:
        StoreUnreachable: PostgreSQL cannot be reached now (worth retrying).
        StoreError: it refused the connection for good (wrong role, password, database) or the URL is invalid.
    """
    try:
        return psycopg2.connect(url, options=session_options(settings), application_name=application_name,
                                connect_timeout=connect_timeout, **_TCP_SETTINGS)
    except psycopg2.ProgrammingError:  # libpq cannot parse it; its message quotes the offending part
        raise StoreError(f"invalid PostgreSQL URL {redact(url)}: libpq cannot parse it (check the percent-escapes)") \
            from None
    except psycopg2.OperationalError as exc:
        problem = " ".join(str(exc).split())
        error = StoreUnreachable if is_unreachable(exc) else StoreError
        raise error(f"cannot connect to PostgreSQL at {redact(url)}: {problem}") from None


class Database:
    """One lazily opened connection that is reopened after PostgreSQL restarts.

    Not thread-safe: give every thread its own ``Database``. ``settings`` are more session settings.
    """

    def __init__(self, url: str, application_name: str = "tandem", settings: Mapping[str, str] | None = None) -> None:
        self.url = url
        self.application_name = application_name
        self.settings = dict(settings or {})
        self._conn: psycopg2.extensions.connection | None = None

    def connection(self) -> psycopg2.extensions.connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.url, self.application_name, settings=self.settings)
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
        except (psycopg2.OperationalError, psycopg2.InterfaceError):
            self.close()
            raise

    def run(self, work: Callable[[psycopg2.extensions.cursor], T], attempts: int = 30, delay_s: float = 1.0) -> T:
        """Run ``work`` in a transaction, retrying it whole while PostgreSQL is unreachable.

        Only connection failures are retried (:func:`is_unreachable`); any other error is raised at
        once. ``work`` must be idempotent: a retry after a lost commit acknowledgement runs it again.
        """

        def warn(state) -> None:
            log.warning("PostgreSQL unreachable (attempt %d/%d): %s", state.attempt_number, attempts,
                        " ".join(str(state.outcome.exception()).split()))

        retrying = Retrying(stop=stop_after_attempt(attempts), wait=wait_fixed(delay_s), reraise=True,
                            retry=retry_if_exception(is_unreachable), before_sleep=warn)
        try:
            for attempt in retrying:
                with attempt, self.transaction() as cursor:
                    return work(cursor)
        except (StoreUnreachable, psycopg2.OperationalError, psycopg2.InterfaceError) as exc:
            if not is_unreachable(exc):
                raise
            raise StoreUnreachable(f"PostgreSQL at {redact(self.url)} unreachable after {attempts} attempts: "
                                   f"{' '.join(str(exc).split())}") from None
        raise AssertionError("unreachable")

    def __enter__(self) -> "Database":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def set_statement_timeout(cursor, timeout_ms: int) -> None:
    """Make every later statement of ``cursor``'s session (not only of this transaction) end after ``timeout_ms``."""
    cursor.execute("SELECT set_config('statement_timeout', %s, false)", (f"{timeout_ms}ms",))


@contextmanager
def rolled_back(cursor) -> Iterator[None]:
    """Whatever runs inside is undone on leaving (rolled back to a savepoint) while the transaction goes on;
    an error raised inside still propagates."""
    cursor.execute("SAVEPOINT tandem_probe")
    try:
        yield
    finally:
        cursor.execute("ROLLBACK TO SAVEPOINT tandem_probe")


class CappedCursor:
    """A server-side cursor whose ``fetchall`` returns at most ``cap`` rows, for the store's read functions.

    A read that may match more rows than its caller answers with (the REST API, a limited read) brings ``cap``
    rows, not all of them: the caller asks one more than its limit and refuses the request when
    that one arrives. Only ``execute`` and ``fetch*`` are meant to be used (a function that needs
    more of a cursor must take a plain one). Use it inside the transaction of ``cursor``.
    """

    _names = itertools.count()

    def __init__(self, cursor: psycopg2.extensions.cursor, cap: int) -> None:
        self.cap = cap
        self._cursor = cursor.connection.cursor(name=f"tandem_capped_{next(self._names)}",
                                                cursor_factory=psycopg2.extras.RealDictCursor)

    def execute(self, query: Any, params: Any = None) -> None:
        self._cursor.execute(query, params)

    def fetchall(self) -> list[dict[str, Any]]:
        return self._cursor.fetchmany(self.cap)

    def fetchone(self) -> dict[str, Any] | None:
        return self._cursor.fetchone()

    def __enter__(self) -> "CappedCursor":
        return self

    def __exit__(self, *exc: object) -> None:
        self._cursor.close()
