"""The contract every source kind keeps.

A kind is a module of :mod:`tandem.sources` holding a :class:`SourceKind` (below) as ``KIND``. The module imports
no pyspark: the supervisor, the Airflow triggers and the CLI ask kinds too. Its Spark half (the reader of
:meth:`SourceKind.lines`) is a module of its own, imported only when a query is built.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from tandem.declarations import SourceRules, StreamConfig

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from tandem.config import ClusterConfig, PlanConfig

UNBOUNDED = 2**31 - 1
"""A stream's admission limit (files, events per trigger) when a finite run reads all its input in one micro-batch."""


class StreamWriter(Protocol):
    """Where a producer's lines of one plan go, for the streams of one kind; holds what it opened until closed."""

    def write(self, stream: str, partition: int, lines: Sequence[str], ids: Sequence[str] | None = None) -> str:
        """Write ``lines`` to one partition of ``stream``; where they went (a file, ``nats:<subject>:<first>..<last>``).

        ``ids``: each line's id (``None``: a new one each), for a kind that drops a line written again."""

    def close(self) -> None: ...


class SourceKind:
    """A source kind: where a stream's lines come from. One module of :mod:`tandem.sources` holds one subclass and its
    ``KIND`` instance.

    The kind owns every duty a stream has through its source; generic code (the runtime, producers, the receiver,
    the supervisor, a backfill, a restore, landing retention, a plan reset) asks it and never names a kind:

    - ``rules``: what the declaration may say (:data:`tandem.declarations.SOURCE_RULES`, checked by the configuration);
    - ``receivable``: whether the receiver publishes events to it;
    - :meth:`lines`: the lines one instance reads, a streaming DataFrame (Spark);
    - :meth:`landing_partitions`: the landing folders an instance reads (landing retention, the supervisor's waiting
      input);
    - :meth:`prepare` / :meth:`writer`: a producer's (or the receiver's) writes;
    - :meth:`unread_published` / :meth:`pending_arrivals`: input a query has not read yet (the supervisor, a
      backfill's read-through);
    - :meth:`backfill_refusal` / :meth:`gather` / :meth:`unbounded`: a backfill's recomputation;
    - :meth:`lost_input`: a restore's check that the input after a cut is still there;
    - :meth:`drop_published`: a plan reset.
    """

    name = ""
    rules: SourceRules
    receivable = False
    """Whether the receiver (HTTP) publishes events to a stream of this kind."""

    def lines(self, spark: SparkSession, cluster: ClusterConfig, plan: PlanConfig, instance: str, stream: str,
              folders: list[Path] | None = None) -> DataFrame:
        """The lines of ``stream`` instance ``instance`` reads: ``raw`` (the text) and ``source_file`` (where it came
        from, the id of a bad line in the quarantine); ``folders``: a recomputation's input (:meth:`gather`)."""
        raise NotImplementedError

    def landing_partitions(self, plan: PlanConfig, instance: str, stream: str) -> list[int]:
        """The partitions of ``stream`` whose landing folders ``instance`` reads (none: it reads no files)."""
        return []

    def prepare(self, cluster: ClusterConfig, plan: PlanConfig, stream: str) -> None:
        """Make ``stream`` ready to be written to (as declared)."""

    def writer(self, cluster: ClusterConfig, plan: PlanConfig) -> StreamWriter:
        """A producer's writer of the plan's streams of this kind."""
        raise NotImplementedError

    def unread_published(self, cluster: ClusterConfig, plan: PlanConfig, instance: str, stream: str,
                         committed: list[list[Any]]) -> list[float]:
        """When the oldest input of ``stream`` each reading query has not read was published (POSIX times), found by
        asking the source (``committed``: each query's committed source offsets); none when it does not answer.
        Landing files are not asked: the supervisor watches their folders (:meth:`landing_partitions`)."""
        return []

    def pending_arrivals(self, cluster: ClusterConfig, plan: PlanConfig, instance: str, stream: str,
                         query_dir: Path) -> list[int]:
        """When each input of ``stream`` the query of ``query_dir`` has not read by its last committed batch arrived
        (ms since the epoch)."""
        return []

    def backfill_refusal(self, cluster: ClusterConfig, plan: PlanConfig, instances: list[str], stream: str,
                         start: datetime) -> str | None:
        """Why input of ``stream`` the instances read at or after ``start`` may be gone, or ``None``."""
        return None

    def gather(self, cluster: ClusterConfig, plan: PlanConfig, instance: str, stream: str,
               folder: Path) -> list[Path] | None:
        """A recomputation's input of ``stream``, fixed in ``folder`` (the folders :meth:`lines` reads); ``None``: it
        reads the stream as a live query does."""
        return None

    def unbounded(self, config: StreamConfig) -> StreamConfig:
        """``config`` without its admission limit: a finite run reads all its input in one micro-batch (pure)."""
        return config

    def lost_input(self, cluster: ClusterConfig, offsets: list[Any]) -> list[str]:
        """Of a cut's source offsets, what its sources of this kind no longer hold after them, a line each."""
        return []

    def drop_published(self, cluster: ClusterConfig, plan: PlanConfig, stream: str) -> list[str]:
        """A plan reset: delete what the plan's output published to ``stream``; what went, a line each."""
        return []
