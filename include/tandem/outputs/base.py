"""The contract every output kind keeps, and what the kinds share.

A kind is a module of :mod:`tandem.outputs` holding an :class:`OutputKind` (below) as ``KIND``: its sink
(publish, hold, trim, flush), its read, its restore policy (kept as it is, or rolled back to the snapshot's
cut), a backfill's and a reconcile's use of a recomputed range, its retention and its validation policy
(:class:`Validation`).

Sinks are idempotent and fenced:

- PostgreSQL rows are upserted with deterministic keys in one transaction that first checks the
  lease (``check_fence``) and also records the batch and the published position in
  ``publish_log``. A row only replaces one that covers no more events (count as version), so a
  new active that lags cannot move a value backwards.
- Delta appends carry an application transaction (app id = ``<instance>/<output>/<query id>``,
  version = batch id), so a replayed batch is skipped; the epoch is checked again just before the
  commit.
- A standby holds back what it would have published (:class:`HeldUntilPublished`: hold, trim,
  flush, written once), trimmed by what the active has published for good; on promotion it
  publishes what is left, then goes live. A shadow standby of a plan's new version (an upgrade,
  :mod:`tandem.supervisor.upgrade`) first compares what it trims with what the active published.
- Rows a store refuses for what they hold (a *data error*: :func:`is_data_error`) do not fail the
  batch: :class:`Refusals` finds them by bisecting the batch in a transaction it rolls back, sends
  them to the plan's quarantine with the store's error as the reason, and the sink publishes the
  rest. The decision depends on the rows alone, so a standby that publishes the same rows after a
  failover refuses the same ones; the quarantine keeps each refused row once (by its content).
  Any other error fails the query, as before.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from functools import cached_property
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import pyarrow as pa

from tandem.declarations import TIME_TYPES, OutputConfig, OutputRules, event_id
from tandem.errors import DataError
from tandem.lake.tables import append_once
from tandem.store import outputs as store
from tandem.store.db import CappedCursor, Database, rolled_back
from tandem.store.leases import check_fence
from tandem.store.registry import InstanceKey

if TYPE_CHECKING:
    import pandas as pd

    from tandem.config import ClusterConfig, PlanConfig
    from tandem.outputs.quarantine import QuarantineSink
    from tandem.outputs.recompute import Outcome, Recomputed

log = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
V = TypeVar("V")
UTC_MICROS = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class BatchInfo:
    instance: InstanceKey
    batch_id: int
    epoch: int
    published_at: datetime
    lineage: str = ""

    def app_id(self, output: str) -> str:
        base = f"{self.instance.id}/{output}"
        return f"{base}/{self.lineage}" if self.lineage else base


class Sink(Protocol):
    output: str

    def publish(self, rows: pa.Table, batch: BatchInfo) -> int:
        """Write one micro-batch idempotently and fenced; return how many rows were written."""

    def hold(self, rows: pa.Table, batch_id: int) -> None:
        """Keep a standby's batch back instead of publishing it."""

    def flush(self, batch: BatchInfo) -> int:
        """Publish everything held (on promotion); return how many rows were written."""

    def trim(self) -> None:
        """Drop held rows the active has already published for good."""

    def verify_with(self, verification: "Verification") -> None:
        """Compare held rows with the active's before trimming them (a shadow standby of a new version)."""


class Verification(Protocol):
    """Where a standby under verification reports what it compared: ``checked`` rows of ``output``, how those that
    differ from the active's differ, and the rows only it holds (``unmatched``), one line each. One per query, it
    tells how far the active has got in the query's batches: it is told of each batch whose held rows the active
    published (:meth:`published_through`), and :meth:`proven_batch` is the newest such batch after which the active
    has published again (a row it emits a batch later, at a timer or a window's end, has had its batch)."""

    def record(self, output: str, checked: int, differences: list[str], unmatched: list[str] = ()) -> None: ...

    def published_through(self, batch_id: int) -> None: ...

    def proven_batch(self) -> int | None: ...


UNMATCHED_AFTER = 2
"""A held row is only in this version (:meth:`HeldUntilPublished.trim`) once the active has published the rows the
standby held this many batches later (:meth:`Verification.proven_batch`), and never one under its identity."""


class HeldUntilPublished(Generic[K, V]):
    """What a standby holds of one output, written once for every kind: ``hold`` keeps its rows by
    identity (a newer row replaces an older one), ``trim`` drops those the active has published for
    good, and ``flush`` publishes the rest on promotion, as the batch they were held in.

    A kind says what identifies a row (:meth:`identities`), which held rows are published for good
    (:meth:`published_of`) and how held rows are published (:meth:`publish_held`).

    Under verification (:meth:`verify_with`, a shadow standby of a plan's new version, or the old version's after
    a hand-over), ``trim`` first compares the rows it drops with what the active published (:meth:`differences`); a
    row is compared once it is final on this side too (:meth:`settled`), and held until then. A held row the active
    never publishes under its identity, though it published rows held :data:`UNMATCHED_AFTER` batches later, is
    reported once as only in this version (the two versions identify the row differently: a hand-over would publish
    its event again), or, where that would publish nothing twice (:attr:`unmatched_is_twice` false), as a
    difference.
    """

    output: str
    unmatched_is_twice = True
    """Whether a held row the active never published would publish its event a second time at a hand-over."""

    def __init__(self) -> None:
        self.held: dict[K, V] = {}
        self.held_batch: int | None = None
        self.verification: Verification | None = None
        self.held_in: dict[K, int] = {}  # under verification: the batch each held row was last held in
        self.reported: set[K] = set()  # held rows already reported as only in this version

    def identities(self, rows: pa.Table) -> dict[K, V]:
        raise NotImplementedError

    def published_of(self, held: dict[K, V]) -> Iterable[K]:
        """Of the held rows, the identities the active has published for good."""
        raise NotImplementedError

    def publish_held(self, held: dict[K, V], batch: BatchInfo) -> int:
        raise NotImplementedError

    def hold(self, rows: pa.Table, batch_id: int) -> None:
        identities = self.identities(rows)
        self.held.update(identities)
        self.note_held(identities, batch_id)

    def note_held(self, identities: Iterable[K], batch_id: int) -> None:
        """``identities`` were held in batch ``batch_id``."""
        self.held_batch = batch_id
        if self.verification is not None:
            for identity in identities:
                self.held_in[identity] = batch_id

    def describe(self, identity: K) -> str:
        """A held row, as a difference names it."""
        return str(identity)

    def settled(self, identities: list[K]) -> list[K]:
        """Of held rows, those this side will not change any more (compared under verification); default: all."""
        return identities

    def differences(self, rows: dict[K, V]) -> list[str]:
        """How each of ``rows`` (held, published for good by the active) differs from the active's row, one line
        each; default: none, the rows agree by identity (the kind keeps no value to compare)."""
        return []

    def verify_with(self, verification: Verification) -> None:
        self.verification = verification
        if self.held_batch is not None:
            self.held_in = dict.fromkeys(self.held, self.held_batch)

    def trim(self, *, verifying: bool = True) -> None:
        if not self.held:
            return
        published = list(self.published_of(self.held))
        comparing = self.verification is not None and verifying
        if comparing and published:
            batches = [self.held_in[identity] for identity in published if identity in self.held_in]
            if batches:
                self.verification.published_through(max(batches))
            published = self.settled(published)
            if published:
                self._compare({identity: self.held[identity] for identity in published})
        for identity in published:
            self.held.pop(identity, None)
            self.held_in.pop(identity, None)
            self.reported.discard(identity)
        if comparing:
            self._report_unmatched()

    def _report_unmatched(self) -> None:
        waiting = [identity for identity in self.held_in if identity in self.held and identity not in self.reported]
        if not waiting:
            return
        try:
            proven = self.verification.proven_batch()
        except Exception as exc:  # noqa: BLE001 - as in _compare
            log.warning("%s: could not tell how far the active has published: %s", self.output, first_line(exc))
            return
        if proven is None:
            return
        unmatched = [identity for identity in waiting if self.held_in[identity] <= proven - UNMATCHED_AFTER]
        if not unmatched:
            return
        self.reported.update(unmatched)
        lines = [f"{self.describe(identity)}: only in this version (the other version published rows held "
                 f"{UNMATCHED_AFTER} batches later, never this one)" for identity in unmatched]
        try:
            if self.unmatched_is_twice:
                self.verification.record(self.output, 0, [], lines)
            else:
                self.verification.record(self.output, 0, lines)
        except Exception as exc:  # noqa: BLE001 - as in _compare
            log.warning("%s: could not record %d rows only in this version: %s", self.output, len(lines),
                        first_line(exc))

    def _compare(self, rows: dict[K, V]) -> None:
        try:
            differences = self.differences(rows)
            self.verification.record(self.output, len(rows), differences)
        except Exception as exc:  # noqa: BLE001 - a comparison never stops the standby; the count stays short
            log.warning("%s: could not compare %d held rows with the active's: %s", self.output, len(rows),
                        first_line(exc))

    def flush(self, batch: BatchInfo) -> int:
        if not self.held or self.held_batch is None:
            return 0
        self.trim(verifying=False)
        if not self.held:
            return 0
        count = len(self.held)
        written = self.publish_held(dict(self.held), replace(batch, batch_id=self.held_batch))
        log.info("published %d held rows of %s (%d written)", count, self.output, written)
        self.held.clear()
        self.held_in.clear()
        self.reported.clear()
        return written


def fence(db: Database, batch: BatchInfo) -> None:
    """Raise :class:`FencedError` unless this instance still holds the lease at the batch's epoch."""
    key = batch.instance
    db.run(lambda cursor: check_fence(cursor, key.plan, key.instance, key.node, batch.epoch), attempts=3)


DATA_ERROR_SQLSTATES = ("22", "54000")
"""PostgreSQL's data exceptions (class 22: a value it cannot convert, store or compute) and 54000 (an index
row over the size limit): errors about the rows' values, not about the store's state."""


def is_data_error(exc: BaseException) -> bool:
    """Whether a sink's error is about the values of the rows it was given (quarantine them) or not (fail)."""
    if isinstance(exc, DataError):
        return True
    code = getattr(exc, "pgcode", None) or ""
    return code.startswith(DATA_ERROR_SQLSTATES)


def first_line(exc: BaseException) -> str:
    """An error's first line, the way an operator reads it (the SQLSTATE of a PostgreSQL error in front)."""
    code = getattr(exc, "pgcode", None)
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:500]
    return f"SQLSTATE {code}: {text}" if code else text


def same_value(old: Any, new: Any) -> bool:
    """Whether two versions' values of one column agree: numbers within a relative 1e-9 (a sum's last bits
    depend on the order it was added in), NaN equal to NaN, anything else equal (pure).

    Stricter than a reconcile's :func:`tandem.outputs.recompute.same` on purpose: a change of code may change a
    value's type, so a boolean never equals a number here, and two values near zero agree within 1e-12 only."""
    if isinstance(old, bool) or isinstance(new, bool):
        return type(old) is type(new) and old == new
    numbers = (int, float, Decimal)
    if isinstance(old, numbers) and isinstance(new, numbers):
        if isinstance(old, int) and isinstance(new, int):
            return old == new
        old, new = float(old), float(new)
        return (math.isnan(old) and math.isnan(new)) or math.isclose(old, new, rel_tol=1e-9, abs_tol=1e-12)
    if isinstance(old, memoryview):
        old = bytes(old)
    if isinstance(new, memoryview):
        new = bytes(new)
    return old == new


def row_difference(identity: str, old: Mapping[str, Any] | None, new: Mapping[str, Any],
                   columns: Iterable[str]) -> str | None:
    """How a new version's row differs from the old version's published row of the same identity, in one line
    (``None``: they agree on ``columns``) (pure)."""
    if old is None:
        return f"{identity}: only in the new version"
    differing = [f"{column} {old.get(column)!r} (old) != {new.get(column)!r} (new)" for column in columns
                 if not same_value(old.get(column), new.get(column))]
    return f"{identity}: {'; '.join(differing)}" if differing else None


class _ProbesDone(Exception):
    """Ends the probing transaction: everything it wrote is rolled back."""


class Refusals:
    """What a sink does with rows its store refuses for what they hold: the dead-letter queue of Kafka Connect.

    Purpose
        One value PostgreSQL cannot store must not stop a plan: without this, the active fails the
        batch, the standby takes over, replays the same rows and fails the same way.

    How it works
        :meth:`run` runs the sink's transaction (``apply(cursor, keys)``) on a batch's rows. On a data
        error it bisects the rows in one transaction that it rolls back, each probe in a savepoint,
        down to the rows the store refuses on their own; sends them to the plan's quarantine (the
        row as JSON, the store's error as the reason, ``output:<name>/<content hash>`` as the
        source, so a refused row is quarantined once whoever refuses it); and runs the transaction
        again with the rest.

    What it does not do
        It does not quarantine when no row fails on its own (rows that fail only together, a table
        that is gone): the original error fails the batch, and the supervisor blocks the instance if
        it keeps failing there. A plan without a quarantine output fails on every data error.
    """

    def __init__(self, output: str, db: Database, quarantine: QuarantineSink | None) -> None:
        self.output = output
        self.db = db
        self.quarantine = quarantine

    def run(self, apply: Callable[[Any, list[K]], T], keys: list[K], row_of: Callable[[K], dict[str, Any]],
            batch: BatchInfo) -> tuple[T | None, list[K]]:
        """``(apply's result, the keys it was applied to)``: every key, or those the store did not refuse.

        The result is ``None`` when every key was refused (nothing was applied).
        """
        try:
            return self.db.run(lambda cursor: apply(cursor, keys)), keys
        except Exception as exc:
            if self.quarantine is None or not is_data_error(exc):
                raise
            refused = self.refused(apply, keys, first_line(exc))
            if not refused:
                raise
        self.quarantine.publish_refused(self.output, {key: (row_of(key), reason) for key, reason in refused.items()},
                                        batch)
        kept = [key for key in keys if key not in refused]
        log.warning("%s batch %d: %d of %d rows refused by the store, quarantined: %s", self.output, batch.batch_id,
                    len(refused), len(keys), next(iter(refused.values())))
        if not kept:
            return None, kept
        return self.db.run(lambda cursor: apply(cursor, kept)), kept

    def refused(self, apply: Callable[[Any, list[K]], Any], keys: list[K], error: str) -> dict[K, str]:
        """The keys ``apply`` fails on by themselves, each with its error (``keys`` failed with ``error``).

        Nothing is written: every probe runs in a savepoint of one transaction that is rolled back.
        """
        found: dict[K, str] = {}

        def probe(cursor) -> None:
            def fails(part: list[K]) -> str | None:
                with rolled_back(cursor):
                    try:
                        apply(cursor, part)
                        return None
                    except Exception as exc:
                        if not is_data_error(exc):
                            raise
                        return first_line(exc)

            def search(part: list[K], part_error: str) -> None:
                if len(part) == 1:
                    found[part[0]] = part_error
                    return
                half = len(part) // 2
                for piece in (part[:half], part[half:]):
                    piece_error = fails(piece)
                    if piece_error is not None:
                        search(piece, piece_error)

            search(list(keys), error)
            raise _ProbesDone

        try:
            self.db.run(probe, attempts=3)
        except _ProbesDone:
            pass
        return found


def as_utc(value: datetime | int) -> datetime:
    """A row's time as an aware UTC datetime (an integer is epoch milliseconds).

    Raises:
        DataError: an integer outside the years 1-9999.
    """
    if isinstance(value, int):
        try:
            return datetime.fromtimestamp(value / 1000, timezone.utc)
        except (OverflowError, OSError, ValueError):
            raise DataError(f"time {value} is not epoch milliseconds within the years 1-9999") from None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


LAKE_COLUMNS = ("instance", "node", "epoch", "batch_id", "published_at")
"""The columns every Delta copy of an output adds to its rows (:func:`lake_columns`)."""


def lake_columns(batch: BatchInfo, n: int) -> dict[str, pa.Array]:
    key = batch.instance
    return {"instance": pa.repeat(key.instance, n), "node": pa.repeat(key.node, n),
            "epoch": pa.repeat(pa.scalar(batch.epoch, pa.int64()), n),
            "batch_id": pa.repeat(pa.scalar(batch.batch_id, pa.int64()), n),
            "published_at": pa.repeat(pa.scalar(batch.published_at, UTC_MICROS), n)}


class HeldById(HeldUntilPublished[str, dict]):
    """Rows identified by a deterministic id; a standby's held rows are trimmed by the ids published for good."""

    table = ""
    id_column = ""

    def __init__(self, plan: str, output: str, config: OutputConfig, instance: InstanceKey, database_url: str,
                 delta_path: Path, quarantine: QuarantineSink | None = None) -> None:
        super().__init__()
        self.plan = plan
        self.output = output
        self.config = config
        self.instance = instance
        self.delta_path = delta_path
        self.db = Database(database_url, "tandem-publisher")
        self.refusals = Refusals(output, self.db, quarantine)
        self.schema: pa.Schema | None = None  # the query's rows, as Spark hands them over

    def identities(self, rows: pa.Table) -> dict[str, dict[str, Any]]:
        """Rows by id: a table's or aggregation's ``id`` fields, an event's ``key`` fields (events have no ``id``)."""
        self.schema = rows.schema
        fields = self.config.id or self.config.key
        return {event_id(self.plan, self.output, {f: row[f] for f in fields}): row for row in rows.to_pylist()}

    def published_of(self, held: dict[str, dict[str, Any]]) -> list[str]:
        return self.db.run(lambda cursor: store.in_lake(cursor, self.table, self.id_column, self.plan, self.output,
                                                        list(held)), attempts=1)

    def describe(self, identity: str) -> str:
        """``<id column> <id> {the fields it is computed from}``."""
        row = self.held.get(identity, {})
        fields = self.config.id or self.config.key
        return f"{self.id_column} {identity} {store.to_json({f: row.get(f) for f in fields})}"

    def publish_held(self, held: dict[str, dict[str, Any]], batch: BatchInfo) -> int:
        return self.write(held, batch)

    def publish(self, rows: pa.Table, batch: BatchInfo) -> int:
        return self.write(self.identities(rows), batch) if rows.num_rows else 0

    def to_lake(self, rows: pa.Table, batch: BatchInfo, ids: list[str]) -> None:
        """Append rows to Delta once per batch (:meth:`append_to_lake`), then mark their ids ``in_lake``."""
        self.append_to_lake(rows, batch)
        self.db.run(lambda cursor: store.mark_in_lake(cursor, self.table, self.id_column, self.plan, self.output, ids))

    def append_to_lake(self, rows: pa.Table, batch: BatchInfo) -> None:
        """Append rows, with the lake's columns, to Delta once per batch, after the fence is checked again."""
        for name, column in lake_columns(batch, rows.num_rows).items():
            rows = rows.append_column(name, column)
        fence(self.db, batch)
        append_once(self.delta_path, rows, app_id=batch.app_id(self.output), version=batch.batch_id)

    def write(self, rows: dict[str, dict[str, Any]], batch: BatchInfo) -> int:
        raise NotImplementedError


# --- validation policies ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """What a validation reads: rows of ``[since, until)`` (``until`` ``None``: up to now), of one granularity
    (``None``: all; outputs without buckets ignore it)."""

    since: datetime
    until: datetime | None = None
    granularity: str | None = None


@dataclass(frozen=True)
class Validation:
    """How one output is validated: its kind's validation policy, run by :mod:`tandem.quality.outputs`.

    Attributes:
        table: where the rows are read from, as the report names it.
        key_columns: the columns that identify a row among the samples of a failed expectation.
        implied: what the declaration implies: the output's part of the suite of a plan that names no suite file.
        required: added to a suite file's expectations for the output, but for one the file has already
            (the same type and kwargs).
        takes_unnamed: whether a suite file's expectation that names no output (``meta.output``) applies.
        read: ``read(cursor, window, limit)``: up to ``limit`` of the output's rows in the window, as stored.
        frame: the rows read, as the columns the expectations name.
        granularities: the buckets the output keeps (empty: it has none, a window's granularity is ignored).
    """

    table: str
    key_columns: list[str]
    implied: list[dict[str, Any]]
    required: list[dict[str, Any]]
    takes_unnamed: bool
    read: Callable[[Any, Window, int], list[dict[str, Any]]]
    frame: Callable[[list[Mapping[str, Any]]], pd.DataFrame]
    granularities: tuple[str, ...] = field(default=())


# --- the kind -------------------------------------------------------------------------------------------------


ALL_TIME = (datetime(1, 1, 1, tzinfo=timezone.utc), datetime(9999, 12, 31, tzinfo=timezone.utc))
"""The range a read covers when it is given none."""


@dataclass(frozen=True)
class ReadRequest:
    """What a read of an output asks for; each kind uses what applies to it.

    ``start``/``end``: the event-time range (``None``: where the data is); ``granularity``: an aggregation's
    buckets; ``keys``: per key field, the values wanted, as text (the CLI's ``--key`` and the REST API's ``key``
    give text: ``5`` finds the number 5 or the string "5", see :func:`spellings`); ``source``: ``postgres`` or
    ``delta``; ``limit``: at most this many rows (``None``: all).
    """

    start: datetime | None = None
    end: datetime | None = None
    granularity: str | None = None
    keys: Mapping[str, list[str]] = field(default_factory=dict)
    source: str = "postgres"
    limit: int | None = None

    @cached_property
    def spelled(self) -> dict[str, list[Any]]:
        """Per filtered key, every JSON value its wanted texts name (:func:`spellings`), worked out once per read."""
        return {name: [value for text in wanted for value in spellings(str(text))]
                for name, wanted in self.keys.items()}

    def matches(self, row: Mapping[str, Any]) -> bool:
        """Whether a read row holds one of the wanted values of every filtered key (:func:`is_key`)."""
        return all(any(is_key(value, row.get(name)) for value in wanted) for name, wanted in self.spelled.items())

    def covers(self, moment: datetime) -> bool:
        """Whether ``moment`` lies in ``[start, end)`` (an open side when not given)."""
        return (self.start is None or moment >= self.start) and (self.end is None or moment < self.end)

    def picked(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Of read rows, those that match the key filter, at most ``limit`` of them."""
        rows = [row for row in rows if self.matches(row)]
        return rows[:self.limit] if self.limit is not None else rows

    def in_store(self, ranged: bool = False) -> tuple[dict[str, Any], int | None]:
        """What a store can apply of the request: the key fields filtered by one value each (as the JSON values it may
        name: :func:`spellings`), and the limit, which it may apply only when that is the whole filter (and,
        ``ranged``, no time range is asked of a read that applies it after the store)."""
        single = {name: self.spelled[name] for name, values in self.keys.items() if len(values) == 1}
        whole = len(single) == len(self.keys) and not (ranged and (self.start or self.end))
        return single, self.limit if whole else None


def spellings(text: str) -> list[Any]:
    """The JSON values a key filter's text names: the string itself, and the number or boolean it spells
    (``"5"`` -> ``["5", 5]``, ``"true"`` -> ``["true", True]``, ``"IBM"`` -> ``["IBM"]``). A store holding typed
    JSON keys matches any of them (PostgreSQL's jsonb compares numbers by value: 5 finds 5.0)."""
    found: list[Any] = [text]
    try:
        value = json.loads(text)
    except ValueError:
        return found
    if isinstance(value, (bool, int, float)) and not (isinstance(value, float) and not math.isfinite(value)):
        found.append(value)
    return found


def is_key(wanted: Any, value: Any) -> bool:
    """Whether a row's key ``value`` is ``wanted``, one of a filter's :func:`spellings`: a boolean the same boolean, a
    string the same text, a number the same number by value."""
    if isinstance(wanted, bool) or isinstance(value, bool):
        return wanted is value
    return isinstance(wanted, str) == isinstance(value, str) and wanted == value


@contextmanager
def reading(cluster: ClusterConfig, db: Database | None) -> Iterator[Database]:
    """``db`` (a caller's, e.g. the REST API's pooled connection), or a connection of the read's own, closed after."""
    if db is not None:
        yield db
        return
    with Database(cluster.database_url, "tandem-query") as own:
        yield own


def capped(cursor: Any, limit: int | None) -> Any:
    """A context giving ``cursor``, or, with a ``limit``, a server-side cursor that fetches at most that many rows."""
    return nullcontext(cursor) if limit is None else CappedCursor(cursor, limit)


@dataclass(frozen=True)
class Trimmed:
    """Rows of one table (or one granularity of an aggregation's table) deleted by one retention run."""

    table: str
    rows: int
    before: datetime
    what: str = ""

    def describe(self) -> str:
        return (f"{self.table}{f' ({self.what})' if self.what else ''}: {self.rows} rows older than "
                f"{self.before.isoformat(timespec='seconds')} deleted")


@dataclass(frozen=True)
class RetentionRun:
    """One retention run of a plan, as a kind's :meth:`OutputKind.trim` sees it: ``cutoff(seconds)`` is the
    instant that old (on PostgreSQL's clock); ``kept_for_replay`` per instance, the earliest row a restore of a
    kept snapshot may bring again (rows published after it stay)."""

    db: Database
    plan: PlanConfig
    now: datetime
    kept_for_replay: Mapping[str, datetime]

    def cutoff(self, seconds: float) -> datetime:
        return self.now - timedelta(seconds=seconds)

    def replay_cutoff(self, seconds: float, instance: str) -> datetime:
        """Older than ``seconds`` and than what a restore of the instance's kept snapshots needs."""
        return contributions_cutoff(self.now, seconds, self.kept_for_replay.get(instance))


def contributions_cutoff(now: datetime, retention_s: float, replay_needs: datetime | None) -> datetime:
    """Rows published once by id before this instant may go: older than the retention, and than what a restore of
    the instance's kept snapshots needs (``replay_needs``: the earliest row such a replay brings again; ``None``:
    the instance has no kept snapshot) (pure)."""
    cutoff = now - timedelta(seconds=retention_s)
    return cutoff if replay_needs is None else min(cutoff, replay_needs)


def stream_time_fields(plan: PlanConfig) -> frozenset[str]:
    """The names of stream fields that hold times: declared ``epoch_millis`` or ``timestamp``, and of no other type
    in any stream of the plan (a name two streams type otherwise is not taken for a time) (pure)."""
    types: dict[str, set[str]] = {}
    for stream in plan.streams.values():
        for name, declared in stream.fields.items():
            types.setdefault(name, set()).add(declared.type)
    return frozenset(name for name, declared in types.items() if declared <= set(TIME_TYPES))


def plan_time_fields(plan: PlanConfig) -> frozenset[str]:
    """The field names that hold times in a plan's rows, which a read shows as ISO 8601 text when they hold epoch
    milliseconds and the Tandem page as UTC times: every output's ``time`` (a query's rows carry it to its other
    outputs too: the pizza shop's ``order_time`` in ``overdue_orders``) and every stream field that holds times
    (:func:`stream_time_fields`) (pure)."""
    return stream_time_fields(plan) | {config.time for config in plan.outputs.values() if config.time}


class OutputKind:
    """An output kind: one module of :mod:`tandem.outputs` holds one subclass and its ``KIND`` instance.

    The kind owns every duty an output has; generic code (the loader, the runtime, the CLI, the REST API,
    snapshots, backfill, reconcile, retention, validation) asks it and never names a kind:

    - ``rules``: what its declaration must and may say;
    - :meth:`published_by_id`: whether each row is published once by a deterministic id (else Spark's partials);
    - :meth:`sink`: the fenced, idempotent sink of one instance;
    - :meth:`read`: the output merged over the instances, from PostgreSQL or Delta, in one JSON shape, its
      :meth:`time_fields` as ISO 8601 text;
    - :meth:`follow` / :meth:`page`: its new rows as they are published (appended kinds only);
    - :meth:`state_shape`: the Spark state its declaration shapes, which a checkpoint was built with;
    - :meth:`retire` / :meth:`counted_until`: its rows of instances a cut-over retires, relabelled, and the event
      time they reach (partials only);
    - :meth:`restore` / :meth:`rolled_back_on_restore`: what a restore does to it;
    - :meth:`replace` / :meth:`compare`: a backfill's and a reconcile's use of a recomputed range;
    - :meth:`trim`: its rows' retention;
    - :meth:`reset`: its rows deleted when its plan is reset (:mod:`tandem.plan_reset`);
    - :meth:`validation`: its validation suite.
    """

    name = ""
    rules: OutputRules
    """What its declaration must and may say (:data:`tandem.declarations.OUTPUT_RULES`, checked by the
    configuration, which sits below the kinds)."""
    recomputed = True
    """Whether a backfill and a reconcile recompute it (the quarantine is not: bad input stays bad)."""

    def published_by_id(self, config: OutputConfig) -> bool:
        """Whether each row is published once by a deterministic id (a restore keeps it; a backfill adds only
        what is missing), rather than as partials Spark's state recomputes."""
        return True

    def applies_contributions(self, config: OutputConfig) -> bool:
        """Whether its rows are contributions applied once by id to a value (``tandem.output_contributions``,
        trimmed by ``maintenance.retention.contributions``): a backfill of input older than the ids kept would
        apply rows again (:attr:`OutputRules.contributions_by_id`)."""
        return self.rules.contributions_by_id and bool(config.id)

    def sink(self, plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
             quarantine: QuarantineSink | None = None) -> Sink:
        """The sink of ``output`` for one instance; rows its store refuses go to ``quarantine``."""
        raise NotImplementedError

    def read(self, cluster: ClusterConfig, plan: PlanConfig, output: str, request: ReadRequest,
             db: Database | None = None) -> list[dict[str, Any]]:
        """The output merged over the plan's instances, as rows of JSON-able values (the same from either source),
        at most ``request.limit`` of them; PostgreSQL through ``db`` when given (:func:`reading`)."""
        raise NotImplementedError

    def time_fields(self, plan: PlanConfig, output: str) -> frozenset[str]:
        """The fields of its read rows that hold times: :meth:`read`, :meth:`follow` and :meth:`page` give those
        holding epoch milliseconds as ISO 8601 text in UTC (:func:`tandem.json_values.times_as_iso`), as a
        timestamp column reads (pure). Default: :func:`plan_time_fields`."""
        return plan_time_fields(plan)

    def follow(self, cluster: ClusterConfig, plan: PlanConfig, output: str, request: ReadRequest,
               emit: Callable[[dict[str, Any]], None]) -> None:
        """Emit the rows of the read, then every new one as it is published, until interrupted."""
        raise DataError(f"{output} is an output of kind {self.name}: only an output whose rows are appended can be "
                        "followed")

    def page(self, db: Database, plan: PlanConfig, output: str, after: tuple[int, str] | None, tail: int | None,
             limit: int) -> list[dict[str, Any]]:
        """A poller's next rows, each exactly once: up to ``limit`` after the position ``after`` ((transaction id, row
        id) of the last row it got; ``None``: from the first), or with no position and ``tail``, the newest ``tail``.
        Each row carries its position as ``xid`` and ``event_id``."""
        raise DataError(f"{output} is an output of kind {self.name}: only an output whose rows are appended can be "
                        "polled")

    def state_shape(self, plan: PlanConfig, output: str) -> dict[str, Any] | None:
        """What Spark's state for the output holds as its declaration says (``keys``, and ``measures`` by column), so
        that a launch refuses a change a checkpoint cannot carry (:mod:`tandem.plan_shape`); ``None``: the
        declaration shapes no state (pure)."""
        return None

    def retire(self, db: Database, cluster: ClusterConfig, plan: PlanConfig, output: str,
               labels: Mapping[str, str]) -> None:
        """A cut-over (:mod:`tandem.cutover`): keep the rows of the instances in ``labels`` under their retired
        labels, so that the instances starting afresh publish beside them (a kind whose rows are not published by
        id must)."""
        raise DataError(f"{output} is an output of kind {self.name}: its rows cannot be retired by a cut-over")

    def counted_until(self, db: Database, plan: PlanConfig, output: str, instances: list[str]) -> datetime | None:
        """A cut-over (:mod:`tandem.cutover`): the event time before which every event the rows of ``instances``
        counted lies (a backfill of a range from it on cannot count one of them again), or ``None`` when they hold
        none of the rows :meth:`retire` keeps."""
        return None

    def rolled_back_on_restore(self, config: OutputConfig) -> bool:
        """Whether a restore rolls the output back to the snapshot's cut (else it is kept as it is)."""
        return not self.published_by_id(config)

    def restore(self, db: Database, plan: PlanConfig, output: str, path: Path, instance: str,
                version: int | None) -> dict[str, int | None] | None:
        """Put one instance's part of ``output`` (its Delta table at ``path``) back to a snapshot's cut
        (``version`` of that table; ``None``: the table was empty then). Returns what changed, or ``None`` when
        the output is kept as it is (the replay after the cut adds only what is missing)."""
        return None

    def replace(self, job: Recomputed, backfill_id: str) -> dict[str, Any]:
        """A backfill: put the recomputed range of one instance in place; what changed."""
        raise NotImplementedError

    def compare(self, job: Recomputed) -> Outcome:
        """A reconcile: the differences between the recomputed range of one instance and what it published."""
        raise NotImplementedError

    def backfill_refusal(self, plan: PlanConfig, output: str, start: datetime, end: datetime,
                         trimmed: Mapping[str, datetime]) -> str | None:
        """Why a backfill of ``[start, end)`` would need rows of ``output`` the plan's retention deleted (``trimmed``:
        :func:`tandem.store.trim.horizons`), or ``None`` (pure)."""
        return None

    def summary(self, plan: PlanConfig, output: str) -> dict[str, Any]:
        """What the Tandem page shows of the declaration besides its key: ``granularities``, ``measures`` (the
        value columns) and ``time`` (a field read as a time)."""
        config = plan.outputs[output]
        return {"granularities": [], "measures": list(config.values), "time": None}

    def trim(self, run: RetentionRun, output: str) -> list[Trimmed]:
        """Delete the output's rows older than the plan's retention; what was deleted."""
        return []

    def reset(self, db: Database, plan: PlanConfig, output: str) -> list[str]:
        """A plan reset (:mod:`tandem.plan_reset`, nothing of the plan running): delete every row of ``output`` in
        PostgreSQL, so that the plan's next run starts from nothing (its Delta table goes with the plan's folder);
        what went, a line each (none: it keeps no rows there)."""
        return []

    def validation(self, plan: PlanConfig, output: str) -> Validation | None:
        """How ``output`` is validated, or ``None`` when it is not."""
        return None
