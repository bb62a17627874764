"""The Spark half of the ``nats`` source kind (:mod:`tandem.sources.nats`): a stream's partitions are subjects of one
JetStream stream, read by sequence range. Imported only when a query is built.

Purpose
    Events reach a plan from a broker, as the seeds' distributed deployments require, and every node
    of an instance (ACTIVE, PASSIVE, BACKUP) reads every event on its own: nothing is acknowledged
    away, no consumer group competes, and each node's position lives in its own Spark checkpoint, so
    re-sync, snapshots and restore work as with files.

How it works
    PySpark's Python data source API (:class:`NatsStreamReader`). An offset is
    ``{"stream": <JetStream stream>, "seq": N, "created": <when the stream was made>}``: every message of the
    instance's partitions with a stream sequence up to N of that stream has been read. A micro-batch is the
    range ``(start, end]``, read per partition subject (one Spark task each) through
    :meth:`tandem.messaging.JetStream.read`: the same range gives the same messages whenever it is replayed. ``latestOffset`` bounds a batch by
    ``max_events_per_trigger`` sequences (admission control; the engine may ask for everything), and
    ``Trigger.AvailableNow`` stops at the sequence the stream had when the query started. ``read``
    yields Arrow record batches of ``raw`` (the message as UTF-8 text, invalid bytes as U+FFFD) and
    ``source_file`` (``nats:<subject>:<sequence>``, the id of a bad message in the quarantine).

    **Data loss is loud.** Retention drops the oldest messages of the whole stream; when the stream's
    first sequence is past the next one an instance needs, messages it has not read are gone and
    the query fails with :class:`tandem.errors.DataLoss`, naming the stream and the missing range
    (the missing messages may belong to other partitions too: which ones cannot be known once they
    are gone, so the check is on the range). The supervisor's relaunch fails the same way, and the
    instance ends BLOCKED with that error. A partition's read checks again as it begins: retention may
    drop messages between the check and the read, and the server then starts the read's consumer at
    its first sequence, past the range's (:meth:`tandem.messaging.JetStream.read` raises the
    :class:`~tandem.errors.DataLoss`); a slow read is checked after every fetch the same way
    (:func:`tandem.messaging.wire.skipped_by_retention`); after the read, a stream whose last sequence went
    back (deleted and made again meanwhile) fails it too.

    **A stream made again is loss too.** A stream deleted and made again under its name (``tandem plan
    reset`` of the plan whose output publishes to it, with this plan reading it by ``from_plan``) starts its
    sequences at 1: an offset of the old stream says nothing of the new one's messages, even when the new
    one holds more than it. Each offset carries the stream's creation time; a batch, a partition's read and
    the relaunch's check (:func:`tandem.messaging.jetstream.lost_after`) of a stream made at another time fail
    with :class:`~tandem.errors.DataLoss`, naming the stream, the offset and both times. There is no option
    to start over from the new stream's first message: the reading plan is reset (or restored) by an
    operator, who knows whether what it published from the old stream still stands. An offset written before
    offsets carried the time is checked by its sequences only.

    **An unreachable server stalls, it does not fail**: a call that finds NATS unreachable (a restarted
    server, a partition) tries again every second for :data:`UNREACHABLE_FOR_S`, then fails the query; a
    read goes on after the last message it yielded.

What it does not do
    It does not create the JetStream stream: the kind does, or checks it against the declaration
    (:meth:`tandem.sources.nats.Nats.prepare`), before :func:`read` builds the query.
    Credentials never travel in the data source's options (they show in query plans): a URL with
    credentials is taken from ``TANDEM_NATS_URL`` in the worker's environment.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from tandem.config import NatsConfig, PlanConfig
from tandem.messaging import JetStream, partition_subject, stream_name
from tandem.messaging.jetstream import Bounds, check_not_lost, check_not_reset, connect_options
from tandem.messaging.wire import ConnectOptions

log = logging.getLogger(__name__)
SOURCE_NAME = "tandem_nats"
SCHEMA = "raw string, source_file string"
_ARROW_SCHEMA = pa.schema([("raw", pa.string()), ("source_file", pa.string())])


def read(spark: SparkSession, nats: NatsConfig, plan: PlanConfig, instance: str, stream: str) -> DataFrame:
    """The messages of the partitions of ``stream`` that instance ``instance`` reads, on the messaging layer ``nats``,
    as lines."""
    spark.dataSource.register(NatsSource)
    subjects = [partition_subject(nats.prefix, stream, p) for p in plan.partitions(instance, stream)]
    return (spark.readStream.format(SOURCE_NAME)
            .option("servers", ",".join(_without_credentials(s) for s in nats.servers))
            .option("stream", stream_name(nats.prefix, stream))
            .option("subjects", json.dumps(subjects))
            .option("max_events_per_trigger", str(plan.streams[stream].max_events_per_trigger))
            .option("connect", json.dumps(asdict(connect_options(nats))))
            .load())


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    host = f"[{parts.hostname}]" if parts.hostname and ":" in parts.hostname else (parts.hostname or "")
    return urlunsplit((parts.scheme, f"{host}:{parts.port}" if parts.port else host, "", "", ""))


def _servers(option: str) -> list[str]:
    """The servers to connect to: ``TANDEM_NATS_URL`` of this process (it may carry credentials), else the option."""
    override = os.environ.get("TANDEM_NATS_URL", "")
    return [s.strip() for s in (override or option).split(",") if s.strip()]


UNREACHABLE_FOR_S = 120.0
"""How long the source waits for the messaging layer to answer again (a restarted server, a network partition)
before the query fails: meanwhile the instance stalls, beating, and goes on where it stopped."""


class Unreachable:
    """The wait of one call for NATS: a new try every second until :data:`UNREACHABLE_FOR_S` after the first
    failure, then the failure raised (naming the stream and how long it waited)."""

    def __init__(self, stream: str) -> None:
        self.stream, self.since = stream, None

    def wait_after(self, exc: OSError) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = now
            log.warning("JetStream stream %s: NATS does not answer (%s): trying again for %.0f s", self.stream, exc,
                        UNREACHABLE_FOR_S)
        if now - self.since >= UNREACHABLE_FOR_S:
            raise ConnectionError(f"JetStream stream {self.stream}: NATS did not answer for {UNREACHABLE_FOR_S:.0f} s: "
                                  f"{exc}") from exc
        time.sleep(1.0)


@dataclass(frozen=True)
class SubjectRange(InputPartition):
    """One Spark task: the messages of ``subject`` with ``first <= sequence <= last``."""

    subject: str
    first: int
    last: int
    created: str = ""  # when the stream was made (the range's offsets'); "": not known


class NatsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The driver's side (offsets, admission, partitions) and the executors' (``read``) of one query's source."""

    def __init__(self, options: dict[str, str]) -> None:
        self.servers_option = options["servers"]
        self.stream = options["stream"]
        self.subjects: list[str] = json.loads(options["subjects"])
        self.max_events = int(options["max_events_per_trigger"])
        self.connect = ConnectOptions(**json.loads(options.get("connect") or "{}"))
        self.target: int | None = None  # Trigger.AvailableNow: the last sequence when the query started
        self._js: JetStream | None = None  # the driver's connection, opened when first needed

    def _bounds(self) -> Bounds:
        waiting = Unreachable(self.stream)
        while True:
            try:
                if self._js is None:
                    self._js = JetStream(_servers(self.servers_option), name=f"tandem-source-{self.stream}",
                                         options=self.connect)
                return self._js.bounds(self.stream)
            except OSError as exc:  # a broken connection or none: a new one, until the deadline
                self._close()
                waiting.wait_after(exc)

    def _close(self) -> None:
        if self._js is not None:
            self._js.close()
            self._js = None

    def _offset(self, seq: int, bounds: Bounds) -> dict:
        return {"stream": self.stream, "seq": seq, "created": bounds.created}

    def initialOffset(self) -> dict:
        bounds = self._bounds()
        return self._offset(max(bounds.first - 1, 0), bounds)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_events)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._bounds().last

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        covered = int(start["seq"])
        bounds = self._bounds()
        check_not_lost(self.stream, covered, bounds, start.get("created"))
        end = bounds.last if self.target is None else min(bounds.last, self.target)
        if not isinstance(limit, ReadAllAvailable) and isinstance(limit, ReadMaxRows):
            end = min(end, covered + limit.max_rows)
        return self._offset(max(end, covered), bounds)

    def reportLatestOffset(self) -> dict | None:
        bounds = self._bounds()
        return self._offset(bounds.last, bounds)

    def partitions(self, start: dict, end: dict) -> list[SubjectRange]:
        first, last = int(start["seq"]) + 1, int(end["seq"])
        created = end.get("created") or ""
        return [SubjectRange(subject, first, last, created) for subject in self.subjects] if last >= first else []

    def read(self, partition: SubjectRange) -> Iterator[pa.RecordBatch]:
        prefix, first = f"nats:{partition.subject}:", partition.first
        waiting = Unreachable(self.stream)
        while True:
            try:
                with JetStream(_servers(self.servers_option), name=f"tandem-read-{self.stream}",
                               options=self.connect) as js:
                    check_not_lost(self.stream, first - 1, js.bounds(self.stream), partition.created)
                    for chunk in js.read(self.stream, partition.subject, first, partition.last):  # DataLoss: dropped
                        yield arrow_batch(prefix, chunk)                                   # since the check
                        first = chunk[-1][0] + 1  # a retry resumes after what was yielded
                    check_not_reset(self.stream, partition.last, js.bounds(self.stream), partition.created)
                    return
            except OSError as exc:
                waiting.wait_after(exc)

    def commit(self, end: dict) -> None:
        """Nothing to do: nothing is acknowledged (every node reads everything; retention alone drops messages)."""

    def stop(self) -> None:
        self._close()


def arrow_batch(prefix: str, chunk: list[tuple[int, bytes]]) -> pa.RecordBatch:
    """``(sequence, payload)`` messages as a record batch of :data:`SCHEMA` (pure): the payload as UTF-8 text (invalid
    bytes as U+FFFD, so the line is quarantined with its reason) and ``<prefix><sequence>`` as its source."""
    sequences, payloads = zip(*chunk)
    try:
        raw = pa.array(payloads, pa.binary()).cast(pa.string())  # validated at once; the usual case
    except pa.ArrowInvalid:
        raw = pa.array([payload.decode("utf-8", "replace") for payload in payloads], pa.string())
    sources = pc.binary_join_element_wise(prefix, pa.array(sequences, pa.int64()).cast(pa.string()), "")
    return pa.RecordBatch.from_arrays([raw, sources], schema=_ARROW_SCHEMA)


class NatsSource(DataSource):
    """``spark.readStream.format("tandem_nats")``: options ``servers``, ``stream``, ``subjects`` (JSON list),
    ``max_events_per_trigger``, ``connect`` (JSON: :class:`~tandem.messaging.wire.ConnectOptions`, names of files,
    never secrets)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SCHEMA

    def streamReader(self, schema) -> NatsStreamReader:
        return NatsStreamReader(dict(self.options))
