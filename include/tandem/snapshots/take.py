"""Take a snapshot of a running plan instance, and prune old ones.

Purpose
    The snapshot DAG, ``tandem snapshot`` and the ops DAG's ``snapshot_now`` all take a snapshot
    the same way: :func:`take_snapshot` cuts the ACTIVE node of one instance without stopping it,
    exports its state, records the Delta versions of its outputs at the cut, validates the result
    and marks it GOOD or BAD in the catalog. :func:`prune_snapshots` applies the retention
    decisions of :mod:`tandem.snapshots.retention`. It reads the checkpoint through the shared
    storage, so it runs on any host: the snapshot DAG runs it on a live standby's host
    (:func:`tandem.supervisor.decisions.snapshot_node`), off the ACTIVE's CPUs.

How it works
    1. A TAKING row is inserted in ``tandem.snapshots`` first, with its taker (this process), so a
       snapshot that dies half-way is visible, and given up as soon as its taker is gone or stops
       beating (:mod:`tandem.snapshots.takers`), then pruned.
    2. Every query checkpoint of the instance is cut at its last committed batch into
       ``snapshots/<plan>/<id>/<query>`` (:func:`tandem.checkpoints.cut_checkpoint`, the same
       function the HA re-sync uses; it only reads files Spark never rewrites, so the query keeps
       running and batches committing meanwhile are simply not part of the cut). The copy keeps
       the checkpoint's query id: it names the lineage whose Delta transactions mark the outputs.
    3. For every query, the version of its Delta output that holds exactly its batches up to the
       cut (:func:`tandem.lake.history.version_at_batch`).
    4. Spark's state data source reads the cut's state at its batch; the rows are appended to
       ``delta/<plan>/state_snapshots`` (:mod:`tandem.snapshots.state_export`).
    5. Validation (:mod:`tandem.snapshots.validation`) against Spark's own count of state rows at
       that batch (the ``numRowsTotal`` the instance's listener recorded for it) → GOOD or BAD.
    Any failure on the way marks the snapshot BAD with the error, then raises.

What it does not do
    It does not restore (:mod:`tandem.snapshots.restore`) and never touches the live checkpoint
    beyond reading it.
"""

from __future__ import annotations

import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from tandem.checkpoints import checkpoint_lineage, committed_batch, cut_checkpoint, query_dirs
from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import PathOutsideRoot, SnapshotError, TandemError
from tandem.lake.history import version_at_batch
from tandem.layout import checkpoint_dir, delta_table_dir, snapshot_dir, snapshots_dir
from tandem.snapshots.retention import PRUNE, RetentionPlan, decide_retention
from tandem.snapshots.state_export import (
    STATE_SCHEMA,
    STATE_TABLE,
    TIMERS,
    StateOperator,
    append_state,
    delete_state,
    export_state,
    read_operator_state,
)
from tandem.snapshots.takers import TakingBeat, abandon_stale, this_taker
from tandem.snapshots.validation import SnapshotValidation, validate_snapshot
from tandem.store import heartbeats
from tandem.store import snapshots as catalog
from tandem.store.db import Database
from tandem.store.locks import plan_lock
from tandem.store.leases import read_lease
from tandem.store.registry import InstanceKey

log = logging.getLogger(__name__)
PROGRESS_WAIT_S = 10.0
VACUUM_RETENTION_H = 1


@dataclass(frozen=True)
class QueryOutput:
    """Where one query of a plan publishes (its Delta tables by output) and what its state values are called."""

    delta_paths: dict[str, Path]
    state_value_names: tuple[str, ...] = ()


def snapshot_session(cluster: ClusterConfig, plan: PlanConfig):
    """A local Spark session for taking snapshots of ``plan`` in this process, at lower CPU priority.

    One core (``local[1]``) and the largest driver memory of the plan's nodes: the export holds the
    whole state of an instance in the driver (as Arrow) on its way to Delta.
    """
    from tandem.spark_session import build_session, lower_priority

    lower_priority()
    memory = max((cluster.node(n).driver_memory for n in plan.nodes), key=_memory_bytes, default="1g")
    return build_session(f"tandem-snapshot:{plan.name}", "local[1]", cluster.spark_defaults,
                         {"spark.driver.memory": memory})


def _memory_bytes(text: str) -> float:
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    text = text.strip().lower().removesuffix("b")
    return float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text or 0)


def plan_outputs(cluster: ClusterConfig, plan: PlanConfig, instance: str) -> dict[str, QueryOutput]:
    """Per query of the instance's group: its outputs' Delta tables and its state value names (from the plan's
    declarations and its module's queries; builds nothing, starts nothing)."""
    from tandem.runtime.plan_api import check_plan_module, load_plan_module, state_value_names

    specs = check_plan_module(plan, load_plan_module(plan))
    queries = plan.groups[plan.group_of(instance)[0]].queries
    return {name: QueryOutput({output: delta_table_dir(cluster, plan.name, output) for output in specs[name].outputs},
                              state_value_names(plan, specs[name])) for name in queries}


def active_node(db: Database, plan: PlanConfig, instance: str) -> str:
    """The node holding the instance's ACTIVE lease (raises when nobody holds a valid one)."""
    lease = read_lease(db, plan.name, instance)
    if lease is None or lease.holder is None or lease.expired_for_s >= 0:
        holder = f"last held by {lease.holder}, expired" if lease and lease.holder else "never taken"
        raise SnapshotError(f"{plan.name}/{instance} has no ACTIVE instance (lease {holder}): nothing to snapshot; "
                            "name a node to snapshot a stopped instance's checkpoint")
    return lease.holder


def expected_state_rows(db: Database, instance_id: str, query: str, query_id: str | None, batch_id: int,
                        wait_s: float = PROGRESS_WAIT_S) -> int | None:
    """Spark's count of state rows after ``batch_id`` (``numRowsTotal`` recorded by the listener), or ``None``.

    The listener records progress asynchronously after the commit: wait up to ``wait_s`` for it.
    """
    deadline = time.monotonic() + wait_s
    while True:
        found = heartbeats.state_rows_after(db, instance_id, query, query_id, batch_id)
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


@dataclass(frozen=True)
class TakenSnapshot:
    """The catalog row of a snapshot just taken, and its validation."""

    record: catalog.SnapshotRecord
    validation: SnapshotValidation

    @property
    def good(self) -> bool:
        return self.record.status == catalog.GOOD

    def summary(self) -> str:
        r = self.record
        batches = ", ".join(f"{q} at batch {b}" for q, b in sorted(r.query_batches.items()))
        versions = ", ".join(f"{t} v{v}" for t, v in sorted(r.output_versions.items()))
        return (f"{r.id} of {r.instance_id}: {r.status}; cut {batches}; {r.state_rows} state rows; "
                f"checkpoint {r.checkpoint_bytes} bytes; outputs {versions or 'none yet'}"
                + (f"; {r.reason}" if r.reason else ""))


def take_snapshot(cluster: ClusterConfig, plan: PlanConfig, instance: str, spark, *, node: str | None = None,
                  db: Database | None = None) -> TakenSnapshot:
    """Snapshot one instance's ACTIVE key (or ``node``'s) now: cut, export, validate, catalogue.

    Returns the snapshot, GOOD or BAD (validation failed: the reason is recorded).

    Raises:
        SnapshotError: there is nothing to snapshot (no ACTIVE key, no checkpoint, nothing
            committed yet), or taking it failed (then it is marked BAD with the error).
    """
    plan.check_instance(instance)  # before anything is read or recorded: an instance names folders and the snapshot id
    if node is not None:
        plan.check_node(node)
    owned = db is None
    db = db or Database(cluster.database_url, "tandem-snapshot")
    try:
        node = node or active_node(db, plan, instance)
        cluster.node(node)
        key = InstanceKey(plan.name, instance, node)
        live = query_dirs(checkpoint_dir(cluster, plan.name, instance, node, ""))
        if not live:
            raise SnapshotError(f"{key.id} has no checkpoint at "
                                f"{checkpoint_dir(cluster, plan.name, instance, node, '')}: nothing to snapshot")
        if all(committed_batch(directory) is None for directory in live.values()):
            raise SnapshotError(f"{key.id} has not committed a batch yet: nothing to snapshot")
        record = catalog.begin_snapshot(db, plan=plan.name, instance=instance, node=node,
                                        snapshots_dir=snapshots_dir(cluster, plan.name),
                                        instance_id=key.id, taker=this_taker())
        try:
            with TakingBeat(cluster.database_url, record.id):  # its progress: a taker gone holds nothing back
                return _take(cluster, plan, key, spark, db, record, live)
        except Exception as exc:
            reason = f"taking the snapshot failed: {type(exc).__name__}: {exc}"
            catalog.mark_bad(db, record.id, reason[:2000])
            log.error("snapshot %s: %s", record.id, reason)
            raise exc if isinstance(exc, TandemError) else SnapshotError(f"snapshot {record.id}: {reason}") from exc
    finally:
        if owned:
            db.close()


def _take(cluster: ClusterConfig, plan: PlanConfig, key: InstanceKey, spark, db: Database,
          record: catalog.SnapshotRecord, live: dict[str, Path]) -> TakenSnapshot:
    target = Path(record.checkpoint_path)
    outputs = plan_outputs(cluster, plan, key.instance)
    batches: dict[str, int] = {}
    lineages: dict[str, str] = {}
    committed: list[float] = []
    copied = 0
    for query, directory in sorted(live.items()):
        cut = cut_checkpoint(directory, target / query, new_query_id=False)
        if cut.batch_id is None:
            log.info("snapshot %s: %s has committed nothing yet, left out", record.id, query)
            continue
        batches[query] = cut.batch_id
        if cut.committed_at is not None:
            committed.append(cut.committed_at)
        lineages[query] = cut.query_id or checkpoint_lineage(target / query)
        copied += cut.bytes
    if not batches:
        raise SnapshotError(f"{key.id} has not committed a batch yet: nothing to snapshot")
    # an key of stateless queries (a filter) has no state: its snapshot is the input it has processed
    stateful = [q for q in batches if (target / q / "state").is_dir()]
    versions = {}
    for query, batch in batches.items():
        for output, path in (outputs[query].delta_paths.items() if query in outputs else ()):
            version = version_at_batch(path, f"{key.id}/{output}/{lineages[query]}", batch)
            if version is not None:
                versions[output] = version
    # a restore replays each query from the batch after its cut: none started before the earliest cut's commit
    catalog.record_contents(db, record.id, batch_id=batches[(stateful or sorted(batches))[0]], query_batches=batches,
                            checkpoint_bytes=copied, output_versions=versions,
                            replay_from_age_s=max(0.0, time.time() - min(committed)) if committed else None)

    exports, operators = [], {}
    expected = 0
    for query in stateful:
        export = export_state(spark, target / query, batches[query], snapshot_id=record.id, plan=plan.name,
                              instance=key.instance, instance_id=key.id, query=query,
                              value_names=outputs[query].state_value_names if query in outputs else ())
        exports.append(export)
        operators[query] = export.operators
        counted = expected_state_rows(db, key.id, query, lineages.get(query), batches[query])
        if counted is None:  # no progress row (listener lost it): count the live checkpoint's state instead
            counted = _count_live_state(spark, live[query], batches[query], export.operators)
            log.warning("snapshot %s: no recorded state row count for %s batch %d; counted %d in the live "
                        "checkpoint", record.id, query, batches[query], counted)
        expected += counted + export.timer_rows  # Spark does not count a transformWithState's timers as state rows
    state = pa.concat_tables([e.rows for e in exports]) if exports else STATE_SCHEMA.empty_table()
    fields = pa.concat_tables([e.fields for e in exports], promote_options="default") if exports else pa.table({})
    append_state(delta_table_dir(cluster, plan.name, STATE_TABLE), state, record.id)
    catalog.record_contents(db, record.id, state_rows=state.num_rows, state_bytes=state.nbytes)

    verdict = validate_snapshot(cluster, plan, record.id, target, batches, state, fields, operators, expected)
    if verdict.success:
        record = catalog.mark_good(db, record.id, verdict.to_dict())
    else:
        record = catalog.mark_bad(db, record.id, verdict.reason[:2000], verdict.to_dict())
    log.info("%s", verdict.summary())
    return TakenSnapshot(record, verdict)


def _count_live_state(spark, query_dir: Path, batch_id: int, operators: list[StateOperator]) -> int:
    return sum(read_operator_state(spark, query_dir, batch_id, op, store).count()
               for op in operators for store in op.stores if store != TIMERS)


def prune_snapshots(cluster: ClusterConfig, plan: PlanConfig, *, db: Database | None = None,
                    instance: str | None = None) -> RetentionPlan:
    """Prune the plan's snapshots as retention decides: delete their cut copies and exported state, mark PRUNED.

    Keeps the newest ``snapshot.keep`` GOOD snapshots per instance (never the newest good one). Then
    vacuums ``state_snapshots``: files of rows deleted over ``VACUUM_RETENTION_H`` ago go for good (not
    at once: a snapshot of another instance may be appending to the table right now).
    """
    with plan_lock(cluster.database_url, plan.name, "snapshot pruning"):
        owned = db is None
        db = db or Database(cluster.database_url, "tandem-snapshot")
        try:
            abandon_stale(db, plan.name)  # TAKING ones whose taker is gone: BAD, pruned as such
            rows = catalog.list_snapshots(db, plan.name, instance=instance,
                                          statuses=(catalog.TAKING, catalog.GOOD, catalog.BAD))
            decisions = decide_retention(rows, plan.snapshot.keep, catalog.database_now(db))
            pruned = []
            for decision in (d for d in decisions.decisions if d.action == PRUNE):
                try:
                    copy = snapshot_dir(cluster, plan.name, decision.snapshot_id)
                except PathOutsideRoot as exc:  # a catalog row is data: never delete where it points outside
                    log.error("retention: not pruning snapshot %r: %s", decision.snapshot_id, exc)
                    continue
                shutil.rmtree(copy, ignore_errors=True)
                pruned.append(decision)
            state_path = delta_table_dir(cluster, plan.name, STATE_TABLE)
            delete_state(state_path, [d.snapshot_id for d in pruned])
            for decision in pruned:
                catalog.mark_pruned(db, decision.snapshot_id, decision.reason)
            _vacuum(state_path)
            for line in decisions.describe():
                log.info("retention: %s", line)
            return decisions
        finally:
            if owned:
                db.close()


def _vacuum(path: Path) -> None:
    from deltalake import DeltaTable

    from tandem.lake.tables import table_exists

    if table_exists(path):
        DeltaTable(str(path)).vacuum(retention_hours=VACUUM_RETENTION_H, enforce_retention_duration=False, dry_run=False)
