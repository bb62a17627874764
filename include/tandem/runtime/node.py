"""Run one plan instance (plan × shard × node) inside a Spark driver.

``run_instance`` registers the instance, starts the liveness beat, the progress listener and (when
the plan publishes events to a stream) the relay, starts every query of the plan with its own
checkpoint, and waits. It returns when a query fails (status FAILED), when ``stop`` is set or
SIGTERM arrives (status STOPPED), or, with ``available_now``, when every query has processed the
input present at start.
"""

from __future__ import annotations

import logging
import re
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

import psutil
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from tandem.checkpoints import recover_swaps
from tandem.config import ClusterConfig, PlanConfig, spark_interval
from tandem.layout import checkpoint_dir
from tandem.names import ACTIVE, BACKUP, PASSIVE, ROLES
from tandem.runtime.listener import LivenessBeat, ProgressRecorder, SparkWorkProbe, instance_query_name
from tandem.runtime.plan_api import PlanContext, QueryDefinition, instance_queries
from tandem.runtime.publisher import MicroBatchPublisher
from tandem.runtime.relays import RelayThread, published_to_streams
from tandem.runtime.roles import RoleController
from tandem.shared_storage import StorageNotShared, require_shared_storage
from tandem.spark_session import build_session
from tandem.store.db import Database
from tandem.store.migrations import migrate
from tandem.store.registry import InstanceKey, record_start, record_status, register_nodes

log = logging.getLogger(__name__)
STATE_STORE_PROVIDER = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@dataclass(frozen=True)
class RunResult:
    status: str  # STOPPED | FAILED
    error: str | None = None
    failure: str | None = None
    """A failure in words that are the same when a relaunch fails the same way (see :func:`failure_of`)."""


TRANSIENT_START_ERRORS = ("Python worker failed to connect back",
                          "Timed out while waiting for the Python worker to connect back")
"""Query failures that say nothing about the query: Spark waits a fixed 10 s for a new Python worker
(``transformWithStateInPandas``) to connect back, which a busy machine can miss."""
MAX_QUERY_RESTARTS = 5
"""Transient failures in a row (without a completed batch between them) before the instance fails."""


def restartable(error: str, restarts: int) -> bool:
    """Whether a query that failed with ``error`` is started again from its checkpoint (pure)."""
    return restarts < MAX_QUERY_RESTARTS and any(text in error for text in TRANSIENT_START_ERRORS)


_SPARK_RUN_IDS = re.compile(r"(id|runId) = [0-9a-f-]{36}")


def failure_of(query_name: str, error: str, publisher: MicroBatchPublisher | None) -> str:
    """The failure of a query in words that repeat when it fails the same way again (pure).

    The publisher's own account (the output, the batch of its checkpoint, the error's first line) when
    it raised; otherwise Spark's first line without the run's ids.
    """
    if publisher is not None and publisher.failure:
        return f"query {query_name}: {publisher.failure}"
    line = _SPARK_RUN_IDS.sub(r"\1 = …", (error.strip().splitlines() or ["no error text"])[0])
    return f"query {query_name}: {line[:500]}"


def start_queries(ctx: PlanContext, definitions: list[QueryDefinition], roles: RoleController,
                  trigger_interval_s: float, available_now: bool,
                  publishers: dict[str, MicroBatchPublisher] | None = None) -> list[StreamingQuery]:
    """Start every query of the plan, each with its own checkpoint directory (``publishers`` gets each
    query's ``foreachBatch`` publisher by query name)."""
    queries = []
    for definition in definitions:
        checkpoint = checkpoint_dir(ctx.cluster, ctx.plan.name, ctx.instance.shard_id, ctx.instance.node, definition.name)
        publisher = MicroBatchPublisher(ctx.instance, definition.sink, roles, checkpoint)
        if publishers is not None:
            publishers[definition.name] = publisher
        writer = (
            definition.frame.writeStream.queryName(instance_query_name(ctx.instance, definition.name))
            .outputMode(definition.output_mode)
            .option("checkpointLocation", str(checkpoint))
            .foreachBatch(publisher)
        )
        writer = writer.trigger(availableNow=True) if available_now else writer.trigger(
            processingTime=spark_interval(max(trigger_interval_s, definition.min_trigger_interval_s)))
        queries.append(start_query(ctx.spark, definition, writer))
    return queries


def start_query(spark: SparkSession, definition: QueryDefinition, writer: DataStreamWriter) -> StreamingQuery:
    """``writer.start()`` with the state store ``definition`` declares: a query copies the session's settings when
    it starts, so the provider is set just for it and the session's own is put back."""
    default_provider = spark.conf.get(STATE_STORE_PROVIDER)
    spark.conf.set(STATE_STORE_PROVIDER, ROCKSDB_PROVIDER if definition.state_store == "rocksdb" else default_provider)
    try:
        return writer.start()
    finally:
        spark.conf.set(STATE_STORE_PROVIDER, default_provider)


def run_instance(cluster: ClusterConfig, plan: PlanConfig, node: str, shard_id: str, *,
                 trigger_interval_s: float | None = None, spark: SparkSession | None = None,
                 available_now: bool = False, stop: threading.Event | None = None,
                 role: str = ACTIVE) -> RunResult:
    """Run the plan's queries for one shard on one node until they end, fail, or are stopped.

    ``role`` is the role the instance is launched for: ACTIVE takes the lease at start when it is
    free (or its own node's), PASSIVE and BACKUP process everything and take over on expiry.
    """
    plan.check_shard(shard_id)
    cluster.node(plan.check_node(node))
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    key = InstanceKey(plan.name, shard_id, node)
    interval = trigger_interval_s or plan.trigger_interval_s
    stop = stop or threading.Event()
    spark = spark or build_session(f"tandem:{key.id}", cluster.node(node).spark_master, cluster.spark_defaults)

    recover_swaps(checkpoint_dir(cluster, plan.name, shard_id, node, ""))  # before Spark reads a checkpoint
    with Database(cluster.database_url, "tandem-node") as db:
        migrate(db)
        register_nodes(db, cluster)
        me = psutil.Process()
        record_start(db, key, host=socket.gethostname(), pid=me.pid, pid_started_at=me.create_time(),
                     ancestors=[parent.pid for parent in me.parents()],
                     spark_app_id=spark.sparkContext.applicationId, trigger_interval_s=interval,
                     checkpoint_root=str(checkpoint_dir(cluster, plan.name, shard_id, node, "")))
        try:
            require_shared_storage(db, cluster, plan, node)
        except StorageNotShared as exc:
            record_status(db, key, "FAILED", str(exc))
            raise
        roles = RoleController(key, cluster.database_url, plan.heartbeat.timeout_s,
                               standby_role=BACKUP if role == BACKUP else PASSIVE)
        roles.start(wants_active=role == ACTIVE)
        work = SparkWorkProbe(spark, plan.heartbeat.interval_s)
        work.start()
        liveness = LivenessBeat(key, cluster.database_url, plan.heartbeat.interval_s, on_beat=roles.tick,
                                on_stop_request=lambda _by: stop.set(), work_probe=work)
        liveness.start()
        relays = RelayThread(cluster, plan, roles, interval) if published_to_streams(plan) else None
        if relays is not None:
            relays.start()
        recorder = ProgressRecorder(key, cluster.database_url)
        spark.streams.addListener(recorder)
        queries: list[StreamingQuery] = []
        try:
            ctx = PlanContext(cluster, plan, key, spark)
            definitions = instance_queries(ctx)
            publishers: dict[str, MicroBatchPublisher] = {}
            queries = start_queries(ctx, definitions, roles, interval, available_now, publishers)
            record_status(db, key, "RUNNING")
            result = _wait(queries, [d.name for d in definitions], publishers, roles, stop, available_now,
                           lambda i: start_queries(ctx, [definitions[i]], roles, interval, available_now,
                                                   publishers)[0])
        except Exception as exc:
            result = RunResult("FAILED", f"{type(exc).__name__}: {exc}")
        finally:
            _stop_all(queries)
            recorder.wait_until_recorded(queries)
            spark.streams.removeListener(recorder)
            liveness.stop()
            work.stop()
            liveness.join(timeout=5)
            if relays is not None:
                relays.stop()
                relays.join(timeout=10)
            roles.stop()
        if result.status == "STOPPED" and liveness.stop_requested_by is not None:
            result = RunResult("STOPPED", f"stopped at the request of {liveness.stop_requested_by}")
        record_status(db, key, result.status, result.error, failure=result.failure)
        log.info("instance %s ended: %s %s", key.id, result.status, result.error or "")
        return result


def _wait(queries: list[StreamingQuery], names: list[str], publishers: dict[str, MicroBatchPublisher],
          roles: RoleController, stop: threading.Event, available_now: bool,
          restart: Callable[[int], StreamingQuery]) -> RunResult:
    """Wait for the queries to end; a query that failed transiently (:func:`restartable`) is started again
    (``restart(i)``, from its checkpoint: nothing it published is lost or repeated). A promotion that
    could not publish what was held fails the instance too."""
    restarts = [0] * len(queries)
    while not stop.is_set():
        if roles.failure:
            return RunResult("FAILED", roles.failure, f"promotion: {roles.failure}")
        for i, query in enumerate(queries):
            error = query.exception()
            if error is None:
                continue
            text = str(error.desc if hasattr(error, "desc") else error)
            if query.lastProgress is not None:
                restarts[i] = 0  # it completed a batch since it last started: only failures in a row count
            if not restartable(text, restarts[i]):
                return RunResult("FAILED", f"query {query.name} failed: {text}",
                                 failure_of(names[i], text, publishers.get(names[i])))
            restarts[i] += 1
            log.warning("query %s failed at a transient step (%s); starting it again (%d of %d)", query.name,
                        text.splitlines()[0][:200], restarts[i], MAX_QUERY_RESTARTS)
            stop.wait(2.0 * restarts[i])
            queries[i] = restart(i)
        running = [q for q in queries if q.isActive]
        if available_now and not running:
            return RunResult("STOPPED")
        _await_end(running, stop, WAIT_POLL_S)
    return RunResult("STOPPED")


WAIT_POLL_S = 0.5
"""How often the instance looks at its queries and the stop flag while they run."""


def _await_end(running: list[StreamingQuery], stop: threading.Event, timeout_s: float) -> None:
    """Wait up to ``timeout_s``, and no longer than it takes the first running query to end.

    An available-now run returns as soon as its last query ends, not at the next poll; a query's
    failure is read by the caller (``query.exception()``).
    """
    if not running:
        stop.wait(timeout_s)
        return
    try:
        running[0].awaitTermination(timeout_s)
    except StreamingQueryException:
        pass


def _stop_all(queries: list[StreamingQuery]) -> None:
    """Stop every query; one that fails to stop must not keep the others (or the status) from ending."""
    for query in queries:
        try:
            if query.isActive:
                query.stop()
        except Exception:  # noqa: BLE001 - logged; the instance is ending anyway
            log.exception("could not stop query %s", query.name)


def install_stop_signals(stop: threading.Event) -> None:
    """SIGTERM / SIGINT stop the instance gracefully (queries stop, status STOPPED)."""

    def handler(signum, _frame) -> None:
        log.info("received signal %d, stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
