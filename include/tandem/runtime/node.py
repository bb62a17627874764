"""Run one instance of a plan on one node (plan × instance × node) inside a Spark driver.

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
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timezone
from pathlib import Path

import psutil
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from tandem.checkpoints import recover_swaps
from tandem.config import ClusterConfig, PlanConfig, spark_interval
from tandem.errors import PlanChanged, RestoreUnfinished, cause_of, raised_in
from tandem.host_identity import this_host_id
from tandem.lake.tables import has_legacy_columns, rename_legacy_columns
from tandem.layout import checkpoint_dir, plan_dirs
from tandem.names import ACTIVE, BACKUP, PASSIVE, ROLES, STANDBY_ROLES, WARM
from tandem.cutover import load_cut
from tandem.plan_shape import check_unchanged, record_shape, state_refusal
from tandem.plan_version import plan_version
from tandem.process_start import start_since_boot
from tandem.resync import resync_recorded
from tandem.runtime.listener import LivenessBeat, ProgressRecorder, SparkWorkProbe, instance_query_name
from tandem.runtime.plan_api import PlanContext, QueryDefinition, instance_queries
from tandem.runtime.publisher import MicroBatchPublisher
from tandem.runtime.verification import RollbackWatch, ShadowVerification, shadow_verification
from tandem.runtime.relays import RelayThread, published_to_streams
from tandem.runtime.roles import RoleController
from tandem.shared_storage import StorageNotShared, require_executor_storage, require_shared_storage
from tandem.spark_session import build_session
from tandem.store.db import Database
from tandem.store.locks import plan_lock
from tandem.store.leases import promoted_from
from tandem.store.migrations import migrate
from tandem.store.registry import InstanceKey, record_start, record_status, record_takeover, register_nodes
from tandem.store.supervision import restore_lock, unfinished_restore

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
QUERY_RESTART_WINDOW_S = 180.0
"""How long a query's transient failures in a row (no completed batch between them) are ridden out in place before
the instance fails: the bursts that starve a new Python worker (a failover's JVM starting beside the snapshot DAG's
on a two-core machine) last minutes; five quick retries (30 s of waits) did not outlast one in the soak."""
SATURATED_RESTART_WINDOW_S = 600.0
"""The window while the host's CPU is saturated (:data:`CPU_SATURATED_PRESSURE`): under a two-worker test suite a
``transformWithStateInPandas`` query's start failed this way for 84 s and more in a row on both nodes of a pair, and
a failure that lasts as long as the load would fail the instance over to a node as loaded."""
CPU_SATURATED_PRESSURE = 50.0
"""Percent of the last minute in which some task waited for a CPU (Linux PSI ``some avg60``)."""
RESTART_BACKOFF_MAX_S = 20.0


def restart_window_s(cpu_pressure: float | None) -> float:
    """How long transient start failures in a row are ridden out at this CPU pressure (pure)."""
    saturated = cpu_pressure is not None and cpu_pressure >= CPU_SATURATED_PRESSURE
    return SATURATED_RESTART_WINDOW_S if saturated else QUERY_RESTART_WINDOW_S


def restartable(error: str, failing_for_s: float, cpu_pressure: float | None = None) -> bool:
    """Whether a query that failed with ``error``, failing since ``failing_for_s`` ago without completing a batch,
    is started again from its checkpoint, the host's CPU pressure being ``cpu_pressure`` (pure)."""
    return failing_for_s < restart_window_s(cpu_pressure) and transient(error)


def transient(error: str) -> bool:
    """Whether a query's ``error`` is one of :data:`TRANSIENT_START_ERRORS`: about the machine, not the query (pure)."""
    return any(text in error for text in TRANSIENT_START_ERRORS)


def parse_cpu_pressure(text: str) -> float | None:
    """``some avg60`` of ``/proc/pressure/cpu`` (pure); ``None`` when the text has none."""
    for line in text.splitlines():
        if line.startswith("some "):
            fields = dict(item.split("=", 1) for item in line.split()[1:] if "=" in item)
            try:
                return float(fields["avg60"])
            except (KeyError, ValueError):
                return None
    return None


def cpu_pressure() -> float | None:
    """This host's CPU pressure (:func:`parse_cpu_pressure`); ``None`` where the kernel does not report it."""
    try:
        return parse_cpu_pressure(Path("/proc/pressure/cpu").read_text())
    except OSError:
        return None


def restart_backoff_s(restarts: int) -> float:
    """Seconds to wait before the ``restarts``-th start in a row (pure): longer each time, at most
    :data:`RESTART_BACKOFF_MAX_S`."""
    return min(2.0 * restarts, RESTART_BACKOFF_MAX_S)


_SPARK_RUN_IDS = re.compile(r"(id|runId) = [0-9a-f-]{36}")


def failure_of(query_name: str, error: str, publisher: MicroBatchPublisher | None) -> str | None:
    """The failure of a query in words that repeat when it fails the same way again (pure).

    The publisher's own account (the output, the batch of its checkpoint, the error's first line) when
    it raised; otherwise the exception a Python traceback in Spark's text ends with, else Spark's first line
    without the run's ids. ``None`` for a :func:`transient` error (still
    there after the window :func:`restartable` rides out): it says nothing about the query, so runs ending with it
    never count as failing the same way, and the instance is failed over and relaunched, never BLOCKED.
    """
    if publisher is not None and publisher.failure:
        return f"query {query_name}: {publisher.failure}"
    if transient(error):
        return None
    line = raised_in(error) or _SPARK_RUN_IDS.sub(r"\1 = …", (error.strip().splitlines() or ["no error text"])[0])
    return f"query {query_name}: {line[:500]}"


def start_queries(ctx: PlanContext, definitions: list[QueryDefinition], roles: RoleController,
                  trigger_interval_s: float, available_now: bool,
                  publishers: dict[str, MicroBatchPublisher] | None = None) -> list[StreamingQuery]:
    """Start every query of the plan, each with its own checkpoint directory (``publishers`` gets each
    query's ``foreachBatch`` publisher by query name)."""
    queries = []
    for definition in definitions:
        checkpoint = checkpoint_dir(ctx.cluster, ctx.plan.name, ctx.instance.instance, ctx.instance.node, definition.name)
        publisher = MicroBatchPublisher(ctx.instance, definition.sink, roles, checkpoint,
                                        query=definition.name)
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


_PROVIDER_SWAP = threading.Lock()
"""Held while a query starts with its own provider: queries of instances in one driver start from several threads,
and an unguarded swap could read another start's provider as the session's own and leave it there for good."""


def start_query(spark: SparkSession, definition: QueryDefinition, writer: DataStreamWriter) -> StreamingQuery:
    """``writer.start()`` with the state store ``definition`` declares: a query copies the session's settings when
    it starts, so the provider is set just for it and the session's own is put back."""
    with _PROVIDER_SWAP:
        default_provider = spark.conf.get(STATE_STORE_PROVIDER)
        spark.conf.set(STATE_STORE_PROVIDER,
                       ROCKSDB_PROVIDER if definition.state_store == "rocksdb" else default_provider)
        try:
            return writer.start()
        finally:
            spark.conf.set(STATE_STORE_PROVIDER, default_provider)


def _rename_legacy_lake_columns(cluster: ClusterConfig, plan: PlanConfig) -> None:
    """Give the plan's Delta tables written before a column rename today's names, before any query writes (an
    installation upgrades in place; the plan's lock serialises the nodes that start together)."""
    root = plan_dirs(cluster, plan.name)["delta"]
    tables = sorted(path for path in root.iterdir() if path.is_dir()) if root.is_dir() else []
    if any(has_legacy_columns(path) for path in tables):
        with plan_lock(cluster.database_url, plan.name, "the rename of Delta columns"):
            for path in tables:
                rename_legacy_columns(path)


def await_restore(db: Database, database_url: str, key: InstanceKey) -> None:
    """Wait while a restore of the instance puts a snapshot's cut back (it launches its ACTIVE node first, so that
    the JVM starts while the outputs roll back); refuse to run after a restore that stopped half-way."""
    with restore_lock(database_url, key.plan, key.instance):
        pass  # taken once the restore, if any, has released it
    unfinished = unfinished_restore(db, key.plan, key.instance)
    if unfinished is not None:
        raise RestoreUnfinished(
            f"plan {key.plan}, instance {key.instance}: a restore began at "
            f"{unfinished['happened_at'].astimezone(timezone.utc):%Y-%m-%d %H:%M:%S} UTC ({unfinished['reason']}) "
            "and did not finish, so its checkpoints and outputs may be half rolled back: run it again "
            f"(`tandem restore {key.plan} --instance {key.instance}`, or the tandem_restore DAG)")


def run_instance(cluster: ClusterConfig, plan: PlanConfig, node: str, instance: str, *,
                 trigger_interval_s: float | None = None, spark: SparkSession | None = None,
                 available_now: bool = False, stop: threading.Event | None = None,
                 role: str = ACTIVE) -> RunResult:
    """Run the plan's queries for one instance on one node until they end, fail, or are stopped.

    ``role`` is the role the instance is launched for: ACTIVE takes the lease at start when it is
    free (or its own node's), PASSIVE and BACKUP process everything and take over on expiry, WARM
    builds its session and queries but starts them only once it has taken the lease, from a cut of
    the previous holder's checkpoint (:func:`await_warm_takeover`).
    """
    plan.check_instance(instance)
    cluster.node(plan.check_node(node))
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    key = InstanceKey(plan.name, instance, node)
    interval = trigger_interval_s or plan.trigger_interval_s
    stop = stop or threading.Event()
    spark = spark or build_session(f"tandem:{key.id}", cluster.node(node).spark_master, cluster.spark_defaults)

    with Database(cluster.database_url, "tandem-node") as db:
        migrate(db)
        try:
            await_restore(db, cluster.database_url, key)
        except RestoreUnfinished as exc:
            record_status(db, key, "FAILED", str(exc), failure=str(exc))
            raise
        recover_swaps(checkpoint_dir(cluster, plan.name, instance, node, ""))  # before Spark reads a checkpoint
        _rename_legacy_lake_columns(cluster, plan)
        register_nodes(db, cluster)
        me = psutil.Process()
        version = plan_version(plan)  # hashes the plan's files: once, the version recorded is the one verified
        record_start(db, key, host=socket.gethostname(), host_id=this_host_id(), pid=me.pid,
                     pid_started_at=start_since_boot(me.pid),
                     ancestors=[parent.pid for parent in me.parents()],
                     spark_app_id=spark.sparkContext.applicationId, trigger_interval_s=interval,
                     checkpoint_root=str(checkpoint_dir(cluster, plan.name, instance, node, "")),
                     plan_version=version)
        try:
            require_shared_storage(db, cluster, plan, node)
            require_executor_storage(db, cluster, node, spark)
        except StorageNotShared as exc:
            record_status(db, key, "FAILED", str(exc))
            raise
        try:  # before the lease is taken and any query reads a checkpoint
            cut = load_cut(cluster, plan.name, plan.group_of(instance)[0])
            if cut is not None and not cut.done:
                raise PlanChanged(f"plan {plan.name}, instance {instance}: the cut-over of group {cut.group} "
                                  f"(generation {cut.generation}) stopped half-way: finish it with `tandem plan "
                                  f"cutover {plan.name} --group {cut.group}`")
            check_unchanged(cluster, plan, instance, node)
        except PlanChanged as exc:  # the same words at every launch: the supervisor blocks it, never loops
            record_status(db, key, "FAILED", str(exc), failure=str(exc))
            raise
        record_shape(cluster, plan, instance, node)
        roles = RoleController(key, cluster.database_url, plan.heartbeat.timeout_s,
                               standby_role=role if role in STANDBY_ROLES else PASSIVE)
        promoted = threading.Event()
        roles.on_promote(lambda _epoch: promoted.set())
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
        result: RunResult | None = None
        try:
            ctx = PlanContext(cluster, plan, key, spark, cut=cut)
            definitions = instance_queries(ctx)
            def verify_with(verification: ShadowVerification) -> None:
                for definition in definitions:
                    definition.sink.verify_with(verification.for_query(definition.name))

            # only a hot standby compares: a WARM one runs no query, an ACTIVE one holds nothing
            verification = shadow_verification(db, key, version, cluster.database_url) \
                if role in (PASSIVE, BACKUP) else None
            if verification is not None:
                verify_with(verification)
            elif role != WARM:  # the old version of an upgrade, once handed over from, compares for a rollback
                roles.on_tick(RollbackWatch(key, version, cluster.database_url, lambda: roles.role != ACTIVE,
                                            verify_with))
            publishers: dict[str, MicroBatchPublisher] = {}
            if role == WARM and not await_warm_takeover(db, cluster, plan, key, roles, promoted, stop):
                result = RunResult("STOPPED")
            else:
                queries = start_queries(ctx, definitions, roles, interval, available_now, publishers)
                roles.queries_run()
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
            roles.stop(release_reason(result, liveness.stop_requested_by))
        if result.status == "STOPPED" and liveness.stop_requested_by is not None:
            result = RunResult("STOPPED", f"stopped at the request of {liveness.stop_requested_by}")
        record_status(db, key, result.status, result.error, failure=result.failure)
        log.info("instance %s ended: %s %s", key.id, result.status, result.error or "")
        return result


def release_reason(result: RunResult | None, stop_requested_by: str | None) -> str:
    """Why an ending instance gives its lease up, as its RELEASED event says (pure): ``tandem status`` and the page
    tell a clean stop from a failure by it and by the instance's final status."""
    if result is None or result.status != "STOPPED":
        return f"instance failed: {cause_of(result.error) if result and result.error else 'interrupted'}"
    return f"instance stopped at the request of {stop_requested_by}" if stop_requested_by else "instance stopped"


def await_warm_takeover(db: Database, cluster: ClusterConfig, plan: PlanConfig, key: InstanceKey,
                        roles: RoleController, promoted: threading.Event, stop: threading.Event) -> bool:
    """A WARM standby waits, its session and queries built, until its role controller has taken the lease;
    then it copies a cut of the previous holder's checkpoint over its own, so the queries it starts next resume
    where the last ACTIVE committed. ``False`` when it is stopped first."""
    record_status(db, key, "RUNNING")
    log.info("%s is a WARM standby: its queries start when it takes the lease", key.id)
    while not promoted.wait(WAIT_POLL_S):
        if stop.is_set():
            return False
    with roles.lock:  # the promotion sets the event while it publishes, and holds the lock until its epoch is set
        epoch = roles.epoch
    record_takeover(db, key)
    previous = promoted_from(db, plan.name, key.instance, epoch) if epoch is not None else None
    if previous is not None and previous != key.node:
        resync_recorded(db, cluster, plan, key.instance, previous, key.node)
    return True


def _wait(queries: list[StreamingQuery], names: list[str], publishers: dict[str, MicroBatchPublisher],
          roles: RoleController, stop: threading.Event, available_now: bool,
          restart: Callable[[int], StreamingQuery]) -> RunResult:
    """Wait for the queries to end; a query that failed transiently (:func:`restartable`) is started again
    (``restart(i)``, from its checkpoint: nothing it published is lost or repeated). A promotion that
    could not publish what was held fails the instance too."""
    restarts = [0] * len(queries)
    failing_since: list[float | None] = [None] * len(queries)
    while not stop.is_set():
        if roles.failure:
            return RunResult("FAILED", roles.failure, f"promotion: {roles.failure}")
        for i, query in enumerate(queries):
            error = query.exception()
            if error is None:
                continue
            text = str(error.desc if hasattr(error, "desc") else error)
            if query.lastProgress is not None or failing_since[i] is None:
                # it completed a batch since it last started (or never failed): only failures in a row count
                restarts[i], failing_since[i] = 0, time.monotonic()
            failing_for = time.monotonic() - failing_since[i]
            refused = state_refusal(roles.instance.plan, names[i], text)
            if refused is not None:  # the same words at every launch: the supervisor blocks it, never loops
                log.error("%s\n%s", refused, text)
                return RunResult("FAILED", refused, refused)
            if not restartable(text, failing_for, pressure := cpu_pressure()):
                return RunResult("FAILED", f"query {query.name} failed: {text}",
                                 failure_of(names[i], text, publishers.get(names[i])))
            restarts[i] += 1
            log.warning("query %s failed at a transient step (%s); starting it again (start %d in a row, failing "
                        "for %.0f s of the %.0f s ridden out at CPU pressure %s %%)", query.name,
                        text.splitlines()[0][:200], restarts[i], failing_for, restart_window_s(pressure), pressure)
            stop.wait(restart_backoff_s(restarts[i]))
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
