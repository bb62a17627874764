"""Heartbeats from inside the Spark driver: per-batch progress and a periodic liveness beat."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from datetime import datetime, timezone

from pyspark.sql.streaming import StreamingQueryListener
from pyspark.sql.streaming.listener import JStreamingQueryListener, QueryProgressEvent, StreamingQueryProgress

from tandem.store.db import Database
from tandem.store.heartbeats import BatchProgress, beat, record_progress
from tandem.store.registry import InstanceKey

log = logging.getLogger(__name__)
QUALITY_METRICS = "tandem_quality"


def instance_query_name(instance: InstanceKey, query: str) -> str:
    """Spark's name of the plan's query ``query`` run by ``instance``: ``<instance id>:<query>``."""
    return f"{instance.id}:{query}"


def own_query_name(instance: InstanceKey, full_name: str | None) -> str | None:
    """The plan's name of a query of ``instance`` (the inverse of :func:`instance_query_name`), or ``None`` for a
    query of anything else: a listener hears every query of its Spark session, and a session may run another
    instance's queries (one still stopping, a recomputation, a test's)."""
    prefix, _, name = (full_name or "").rpartition(":")
    return name if name and full_name == instance_query_name(instance, name) else None


def _timestamp(text: str | None) -> datetime | None:
    if not text:
        return None
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return None if moment.timestamp() == 0 else moment


class ProgressAsJson(JStreamingQueryListener):
    """PySpark's bridge from the JVM's listener events to a Python listener, with each progress read as one JSON
    text (the way Spark Connect's client reads it).

    PySpark's own bridge reads a progress object by object through Py4J, every map of it (durations, event times,
    each operator's and the sink's metrics) with an iterator whose end is a Java exception; PySpark classifies each
    such exception by asking the JVM for half a dozen classes by short names, and every miss walks the driver's
    ~300 jars: a third of a loaded driver's JVM CPU (a JFR profile of trades at 50 events a second), and the
    driver's CPU went from 52 to 37 s a minute without it (``bench/driver_cost.py``).
    """

    def onQueryProgress(self, jevent) -> None:  # noqa: N802 (Spark's names)
        progress = StreamingQueryProgress.fromJson(json.loads(jevent.progress().json()))
        self.pylistener.onQueryProgress(QueryProgressEvent(progress))


class ProgressRecorder(StreamingQueryListener):
    """Writes one ``tandem.heartbeats`` row per completed micro-batch of this instance's queries."""

    def __init__(self, instance: InstanceKey, database_url: str) -> None:
        self.instance = instance
        self.db = Database(database_url, "tandem-listener")
        self.recorded = threading.Condition()
        self.last_batch: dict[str, int] = {}  # run id -> newest batch id handled (recorded or failed)

    @property
    def _jlistener(self):
        """The JVM side of this listener, which ``spark.streams.addListener`` registers: PySpark's wrapper around
        :class:`ProgressAsJson` instead of around its own bridge."""
        if not hasattr(self, "_jlistenerobj"):
            from pyspark import SparkContext

            self._jlistenerobj = SparkContext._jvm.PythonStreamingQueryListenerWrapper(ProgressAsJson(self))
        return self._jlistenerobj

    def onQueryStarted(self, event) -> None:  # noqa: N802 (Spark's names)
        pass

    def onQueryIdle(self, event) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, event) -> None:  # noqa: N802
        progress = event.progress
        name = own_query_name(self.instance, progress.name)
        if name is None:
            return
        states = progress.stateOperators or []
        quality = (progress.observedMetrics or {}).get(QUALITY_METRICS)
        row = BatchProgress(
            instance_id=self.instance.id, plan=self.instance.plan, instance=self.instance.instance,
            node=self.instance.node, query_name=name, query_id=str(progress.id), run_id=str(progress.runId),
            batch_id=progress.batchId, input_rows=progress.numInputRows,
            input_rows_per_s=_finite(progress.inputRowsPerSecond),
            processed_rows_per_s=_finite(progress.processedRowsPerSecond),
            batch_duration_ms=progress.batchDuration,
            watermark=_timestamp((progress.eventTime or {}).get("watermark")),
            state_rows=sum(s.numRowsTotal for s in states) if states else None,
            late_rows=sum(s.numRowsDroppedByWatermark for s in states) if states else None,
            quarantined_rows=int(quality["quarantined_rows"]) if quality is not None else None,
            state_memory_bytes=sum(s.memoryUsedBytes for s in states) if states else None,
        )
        with self.recorded:
            try:
                record_progress(self.db, row)
            except Exception:  # a heartbeat must never kill the query
                log.exception("could not record progress of %s batch %s", name, progress.batchId)
            run_id = str(progress.runId)
            self.last_batch[run_id] = max(progress.batchId, self.last_batch.get(run_id, -1))
            self.recorded.notify_all()

    def wait_until_recorded(self, queries: list, timeout_s: float = 10.0) -> bool:
        """Wait until the newest progress of every query has been handled (Spark delivers listener
        events asynchronously: the last batch's may still be on its way when the query stops)."""
        expected = {}
        for query in queries:
            last = query.lastProgress
            if last is not None:
                expected[str(query.runId)] = last.batchId
        with self.recorded:
            done = self.recorded.wait_for(
                lambda: all(self.last_batch.get(run, -1) >= batch for run, batch in expected.items()), timeout_s)
        if not done:
            log.warning("progress of the last batches not recorded within %.0fs: %s", timeout_s, expected)
        return done


def _finite(value: float | None) -> float | None:
    return value if value is not None and value == value and abs(value) != float("inf") else None


class SparkWorkProbe(threading.Thread):
    """Whether the driver's Spark work advanced since the previous call: a stage started, or a task of a running
    stage completed (Spark's status tracker, polled every ``interval_s`` by this daemon thread, so that a JVM slow
    to answer never delays a liveness beat). A micro-batch may take longer than the stall timeout on a loaded
    machine; while this says yes, it is slow, not stuck."""

    def __init__(self, spark, interval_s: float) -> None:
        super().__init__(name="tandem-work-probe", daemon=True)
        self.tracker = spark.sparkContext.statusTracker()
        self.interval_s = interval_s
        self.seen: dict[int, int] = {}  # active stage id -> tasks completed at the previous poll
        self.advanced = threading.Event()
        self.stopping = threading.Event()

    def poll(self) -> None:
        now: dict[int, int] = {}
        for stage_id in self.tracker.getActiveStageIds():
            info = self.tracker.getStageInfo(stage_id)
            if info is not None:
                now[stage_id] = info.numCompletedTasks
        if work_advanced(self.seen, now):
            self.advanced.set()
        self.seen = now

    def run(self) -> None:
        while not self.stopping.wait(self.interval_s):
            try:
                self.poll()
            except Exception:  # the status tracker is gone while Spark stops: no evidence of work
                return

    def __call__(self) -> bool:
        advanced = self.advanced.is_set()
        self.advanced.clear()
        return advanced

    def stop(self) -> None:
        self.stopping.set()


def work_advanced(before: dict[int, int], now: dict[int, int]) -> bool:
    """Whether a stage in ``now`` is new or completed more tasks than in ``before`` (stage id -> tasks completed;
    pure)."""
    return any(stage not in before or done > before[stage] for stage, done in now.items())


class LivenessBeat(threading.Thread):
    """A daemon thread that records a liveness beat every ``interval_s``, batches or not, and then
    runs ``on_beat`` (the role controller's lease renewal or take-over).

    A beat also reads the instance's stop request: when someone asked it to stop (from any host),
    ``on_stop_request`` is called with who asked, once. ``work_probe`` (a :class:`SparkWorkProbe`) tells each beat
    whether the driver's work advanced since the previous one.
    """

    def __init__(self, instance: InstanceKey, database_url: str, interval_s: float,
                 on_beat: Callable[[], None] = lambda: None,
                 on_stop_request: Callable[[str], None] = lambda requested_by: None,
                 work_probe: Callable[[], bool] = lambda: False) -> None:
        super().__init__(name="tandem-liveness", daemon=True)
        self.instance = instance
        self.interval_s = interval_s
        self.db = Database(database_url, "tandem-liveness")
        self.started_at = datetime.now(timezone.utc)
        self.host = socket.gethostname()
        self.on_beat = on_beat
        self.on_stop_request = on_stop_request
        self.work_probe = work_probe
        self.stop_requested_by: str | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                requested_by = beat(self.db, self.instance.id, self.host, os.getpid(), self.started_at,
                                    self.work_probe())
            except Exception as exc:  # PostgreSQL may be restarting; keep beating
                log.warning("liveness beat failed: %s", exc)
            else:
                if requested_by is not None and self.stop_requested_by is None:
                    self.stop_requested_by = requested_by
                    log.info("stop requested by %s", requested_by)
                    self.on_stop_request(requested_by)
            try:
                self.on_beat()
            except Exception:  # the next beat tries again
                log.exception("heartbeat work failed")
            self.stopping.wait(self.interval_s)
        self.db.close()

    def stop(self) -> None:
        self.stopping.set()
