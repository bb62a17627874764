"""Errors a caller can catch by meaning."""

from __future__ import annotations


class TandemError(Exception):
    """Base class of every error Tandem raises on purpose."""


class ConfigError(TandemError):
    """A configuration file is missing, malformed or holds an invalid value.

    The message always names the file and the field (``conf/plans/trades.yaml: watermark: ...``).
    """

    def __init__(self, path: str, field: str, problem: str) -> None:
        self.path = path
        self.field = field
        self.problem = problem
        super().__init__(f"{path}: {field}: {problem}" if field else f"{path}: {problem}")


class StoreError(TandemError):
    """The coordination store (PostgreSQL) refused or could not be reached."""


class StoreUnreachable(StoreError):
    """PostgreSQL could not be reached, or the connection broke: worth trying again."""


class PlanError(TandemError):
    """A plan could not be built or run (unknown plan, missing module, bad query)."""


class QueryError(TandemError):
    """A merged-aggregate query was asked with invalid arguments."""


class NothingPublished(QueryError):
    """An aggregation's serving table does not exist yet: no instance has published it."""


class FencedError(TandemError):
    """A write carried a stale fencing epoch: another node holds the ACTIVE lease now."""


class DataError(TandemError):
    """A sink refused rows for what they hold (a value PostgreSQL or Delta cannot store), not for its own state.

    The rows can be isolated and quarantined with the message as the reason; the rest of the batch is published.
    """


class SnapshotError(TandemError):
    """A snapshot is unknown, or cannot move to the requested status (e.g. GOOD without a cut)."""


class SnapshotRefused(SnapshotError):
    """A snapshot may not be restored: it is BAD (refused unless forced), still TAKING, or PRUNED."""


class LockLost(StoreError):
    """An advisory lock's PostgreSQL session ended (restart, terminated backend): whoever held it must stop."""


class PathOutsideRoot(TandemError):
    """A name or a recorded path would lead outside the storage root: nothing is read, written or deleted there."""


class DataLoss(TandemError):
    """Input an instance (or a snapshot to restore) still needs is gone from its source: a stream's retention
    dropped it. Never retried: the error names the stream and the missing range."""


class BackfillRefused(TandemError):
    """A backfill may not run: its range is not closed, its input is gone, or it overlaps a running one."""


class PlanChanged(TandemError):
    """The plan changed in a way its instances' checkpoints cannot carry (a group's parallelism, a stream's
    partitions, an aggregation's keys or measures): the launch is refused before any query starts."""
