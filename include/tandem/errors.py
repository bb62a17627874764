"""Errors a caller can catch by meaning, and the cause an error's text gives (:func:`cause_of`)."""

from __future__ import annotations

import re


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
        self.problems: list[ConfigError] = [self]
        """Each problem (:class:`ConfigProblems` holds several)."""
        super().__init__(f"{path}: {field}: {problem}" if field else f"{path}: {problem}")


class ConfigProblems(ConfigError):
    """Several problems of one configuration file, each a :class:`ConfigError` naming the file and the field.

    ``problems`` holds them in the order they were found; the message is theirs, one line each (``path``,
    ``field`` and ``problem`` are the first one's).
    """

    def __init__(self, problems: list[ConfigError]) -> None:
        super().__init__(problems[0].path, problems[0].field, problems[0].problem)
        self.problems = list(problems)
        self.args = ("\n".join(str(problem) for problem in self.problems),)


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


class RestoreUnfinished(TandemError):
    """A restore of the instance began rolling its checkpoints and outputs back and did not finish: the launch is
    refused before any checkpoint or output is touched, until a restore finishes."""


class PlanRunning(TandemError):
    """An operation that needs every instance of a plan stopped found one running (a live lease or driver)."""


TRACEBACK_HEADER = "Traceback (most recent call last):"
_SPARK_ENVELOPE = re.compile(r"\[STREAM_FAILED\] Query \[[^\]]*\] terminated with exception: ")
_OURS = re.compile(r"^query \S+ failed: ")
_EXCEPTION_NAME = re.compile(r"[A-Za-z_][\w.]*")


def raised_in(text: str) -> str | None:
    """The exception line (``module.Type: message``) of the last Python traceback in ``text``, ``None`` when it
    holds none (pure). Spark hands a ``foreachBatch`` function's exception over as the traceback Py4J printed,
    under a first line that only says a Python proxy raised."""
    lines = text.splitlines()
    headers = [i for i, line in enumerate(lines) if line.rstrip().endswith(TRACEBACK_HEADER)]
    if not headers:
        return None
    for line in lines[headers[-1] + 1:]:
        if line.strip() and not line[0].isspace():
            name = line.partition(":")[0]
            return line.strip() if _EXCEPTION_NAME.fullmatch(name) else None
    return None


def cause_of(text: str | None, limit: int = 500) -> str | None:
    """What an error's text says went wrong, in one line of at most ``limit`` characters (pure): the exception a
    Python traceback ends with (after the ``query <name> failed:`` an instance records in front), else the first
    line without Spark's ``[STREAM_FAILED] Query [id = …] terminated with exception:``."""
    if text is None:
        return None
    text = text.strip()
    first = (text.splitlines() or [""])[0]
    raised = raised_in(text)
    if raised is not None:
        ours = _OURS.match(first)
        line = (ours.group(0) if ours else "") + raised
    else:
        line = _SPARK_ENVELOPE.sub("", first)
    return line if len(line) <= limit else line[:limit - 1] + "…"
