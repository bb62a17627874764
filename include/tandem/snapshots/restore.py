"""Restore an instance of a plan from a snapshot: checkpoint cut, Delta outputs, PostgreSQL outputs, restart.

Purpose
    After a whole-cluster crash (every instance gone, checkpoints lost or suspect), or to undo bad
    processing, ``tandem restore`` and the restore DAG put an instance back to a snapshot's consistent
    cut. The plan then reprocesses the input after the cut, and its outputs end up exactly as an
    uninterrupted run would have left them: nothing lost, nothing counted twice.

How it works
    Under the instance's supervision lock (the supervisor cannot relaunch anything meanwhile):

    1. choose the snapshot (:func:`tandem.snapshots.retention.choose_snapshot`: by id, or the
       newest GOOD one; BAD only with ``force``) and re-check its files; a GOOD snapshot whose
       files broke since is marked BAD and refused; one whose cut would go on from messages a
       ``nats`` stream no longer holds is refused (even with ``force``), naming the stream and range;
    2. stop the instance on every node (SIGKILL after ``STOP_TIMEOUT_S``: what they did since the
       snapshot is rolled back anyway);
    3. record a RESTORING event and, holding the instance's restore lock, launch the ACTIVE instance
       (on ``node``, default the node the snapshot was cut from): its JVM and Spark session start
       while steps 4 and 5 run, and it waits for the lock before it touches a checkpoint or an output.
       A node that finds a RESTORING event with no RESTORED after it (the restore failed or died
       half-way) refuses to run until a restore finishes;
    4. replace each node's checkpoint with the snapshot's cut (every query; a query the snapshot
       does not hold starts from nothing). Each gets a fresh query id: a new lineage, so the
       batches after the cut are published again instead of being taken for replays;
    5. put every Delta output of the plan (each table in ``delta/<plan>/`` but the state export)
       back to the snapshot's cut for this instance only, as its output kind says
       (:meth:`tandem.outputs.OutputKind.restore`): outputs published by id (events, tables,
       aggregations of facts, the quarantine by source file) are kept as they are, since every row
       the replay emits again has the same id and one already published is not applied again;
       Spark's partial aggregates are rolled back in Delta and PostgreSQL. A table no declared
       output owns (any more) has its Delta slice rolled back (:func:`tandem.lake.history.roll_back_slice`).
       Then forget the instance's published positions (``publish_log``), which lie after the cut;
    6. record a RESTORED event and release the restore lock; wait until the ACTIVE instance RUNS.

    Then, outside the lock, the supervisor brings the standbys up (re-synced from the new active).

What it does not do
    It does not touch other instances, and does not bring back landing files retention deleted (a
    forced restore of a BAD snapshot older than the kept ones may lack input).
"""

from __future__ import annotations

import logging
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.checkpoints import cut_checkpoint, query_dirs
from tandem.cutover import refusal_before_cut
from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import ConfigError, SnapshotError, SnapshotRefused
from tandem.lake.history import roll_back_slice, vacuumed_files
from tandem.lake.tables import table_exists
from tandem.layout import checkpoint_dir, delta_table_dir, under_root
from tandem.names import ACTIVE
from tandem.outputs import kind_of
from tandem.snapshots.retention import choose_snapshot
from tandem.snapshots.state_export import STATE_TABLE
from tandem.snapshots.validation import check_files, lost_input
from tandem.store import backfills
from tandem.store import snapshots as catalog
from tandem.store.db import Database
from tandem.store.locks import plan_lock
from tandem.store.migrations import migrate
from tandem.store.publish_log import forget_instance
from tandem.store.supervision import RESTORED, RESTORING, mark, restore_lock
from tandem.supervisor.launcher import LaunchError, wait_until_running
from tandem.supervisor.node_actions import NodeHost, ThisHost
from tandem.supervisor.reconcile import Supervisor, instance_lock

log = logging.getLogger(__name__)
STOP_TIMEOUT_S = 5.0
"""SIGTERM, then SIGKILL after this: a restore discards what the stopped instances did since the snapshot anyway."""


@dataclass
class RestoreReport:
    """What a restore did, step by step (for the CLI, task logs and the DAG-run note)."""

    plan: str
    instance: str
    snapshot: catalog.SnapshotRecord
    node: str
    steps: list[str] = field(default_factory=list)
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, line: str) -> None:
        self.steps.append(line)
        log.info("restore %s/%s: %s", self.plan, self.instance, line)

    def lines(self) -> list[str]:
        s = self.snapshot
        return [f"restored {self.plan}/{self.instance} from {s.id} ({s.status}, cut at batch {s.batch_id} of "
                f"{s.instance_id}); ACTIVE on {self.node}", *("  " + line for line in self.steps)]


def plan_output_tables(cluster: ClusterConfig, plan: PlanConfig) -> dict[str, Path]:
    """The plan's Delta outputs: every table under ``delta/<plan>/`` except the state export."""
    root = delta_table_dir(cluster, plan.name, STATE_TABLE).parent
    if not root.is_dir():
        return {}
    return {p.name: p for p in sorted(root.iterdir()) if p.name != STATE_TABLE and table_exists(p)}


def instances_to_restore(cluster: ClusterConfig, plan: PlanConfig, snapshot_id: str | None = None,
                      instance: str | None = None) -> list[str]:
    """The instances a restore request covers: the snapshot's instance when an id is given, else ``instance`` or all.

    Raises:
        SnapshotError: no snapshot with that id belongs to ``plan``.
    """
    if not snapshot_id:
        return [plan.check_instance(instance)] if instance else list(plan.instances)
    with Database(cluster.database_url, "tandem-restore") as db:
        record = catalog.get_snapshot(db, snapshot_id)
    if record is None or record.plan != plan.name:
        raise SnapshotError(f"no snapshot {snapshot_id!r} of plan {plan.name} (see `tandem snapshots {plan.name}`)")
    return [record.instance]


def restore_instance(cluster: ClusterConfig, plan: PlanConfig, instance: str, *, snapshot_id: str | None = None,
                  force: bool = False, undo_backfills: bool = False, node: str | None = None, start: bool = True,
                  launched_by: str = "tandem restore", py_files: Path | None = None,
                  node_host: NodeHost | None = None) -> RestoreReport:
    """Restore one instance of ``plan`` from ``snapshot_id`` (default: its newest GOOD snapshot).

    ``node_host`` stops the instances, then starts the ACTIVE instance, and then the supervisor's
    standbys, on their nodes' hosts (inside Airflow: through the nodes' queues); by default here.

    ``force`` restores a snapshot marked BAD (or whose files are found broken); ``undo_backfills`` one taken before
    backfills of the instance were done (the replay after its cut drops their late events again). Each says yes to
    one risk only.

    Raises:
        SnapshotRefused: the snapshot is BAD (without ``force``), TAKING, PRUNED, or its files are broken; a backfill
            was done after it (without ``undo_backfills``).
        SnapshotError: no such snapshot, or no GOOD one to fall back on.
    """
    with plan_lock(cluster.database_url, plan.name, f"the restore of instance {instance}"):
        try:
            plan.check_instance(instance)
            if node is not None:
                plan.check_node(node)
        except ConfigError as exc:
            raise SnapshotRefused(str(exc)) from None
        with Database(cluster.database_url, "tandem-restore") as db:
            migrate(db)
            chosen = choose_snapshot(catalog.list_snapshots(db, plan.name, instance=instance), snapshot_id,
                                     latest_good=False, force=force)
            cut = under_root(cluster, chosen.checkpoint_path)
            problems = check_files(cut, chosen.query_batches)
            if problems:
                reason = "files: " + "; ".join(problems[:3])
                if chosen.status == catalog.GOOD:
                    chosen = catalog.mark_bad(db, chosen.id, f"found broken before a restore: {reason}")
                if not force:
                    raise SnapshotRefused(f"snapshot {chosen.id} cannot be restored: {reason}")
            before_cut = refusal_before_cut(cluster, plan, chosen.taken_at.timestamp(), f"snapshot {chosen.id}")
            if before_cut:  # even with force: its checkpoints are of retired instances
                raise SnapshotRefused(f"snapshot {chosen.id} cannot be restored: {before_cut}")
            lost = lost_input(cluster, cut, chosen.query_batches)
            if lost:  # even with force: the replay after the cut would miss input, and nothing says what it was
                raise SnapshotRefused(f"snapshot {chosen.id} cannot be restored: the input after its cut is gone: "
                                      + "; ".join(lost[:3]))
            gone = vacuumed_versions(cluster, plan, chosen)
            if gone:  # even with force: the instance's rows at the cut cannot be read back
                raise SnapshotRefused(f"snapshot {chosen.id} cannot be restored: " + "; ".join(gone[:3]))
            undone = undone_backfills(backfills.done_since(db, plan.name, chosen.taken_at), instance)
            if undone and not undo_backfills:
                raise SnapshotRefused(f"restoring snapshot {chosen.id} of instance {instance} would undo "
                                      f"{describe_backfills(undone)}, done after it was taken (the replay after its "
                                      "cut drops their late events again): pass --undo-backfills (Param "
                                      "undo_backfills) and backfill those ranges again after the restore")
            target = node or (chosen.node if chosen.node in plan.nodes else plan.nodes[0])
            report = RestoreReport(plan.name, instance, chosen, target)
            if undone:
                report.add(f"this restore undoes {describe_backfills(undone)}: backfill them again")
            node_host = node_host or ThisHost(cluster, plan, launched_by, py_files)
            with instance_lock(cluster.database_url, plan.name, instance) as lock:
                for each in plan.nodes:  # whatever they were doing is rolled back: no need to wait for a clean stop
                    lock.check()
                    stopped = node_host.stop(instance, each, STOP_TIMEOUT_S)
                    report.add(f"stop {each}: {stopped.detail}")
                launcher = ThreadPoolExecutor(1, thread_name_prefix="tandem-restore-launch")
                try:
                    with restore_lock(cluster.database_url, plan.name, instance):
                        lock.check()
                        mark(db, plan.name, instance, RESTORING,
                             f"restoring from snapshot {chosen.id} (batch {chosen.batch_id})", node=target,
                             detail={"snapshot": chosen.id})
                        # Its JVM starts while the cut is put back; it waits for this lock before touching either.
                        launching = launcher.submit(node_host.launch, instance, target, ACTIVE, None) if start else None
                        for each in plan.nodes:
                            lock.check()
                            report.add(f"checkpoint of {each}: {_put_cut(cluster, plan, instance, each, chosen)}")
                        lock.check()
                        _restore_outputs(cluster, plan, instance, chosen, db, report)
                        lock.check()
                        mark(db, plan.name, instance, RESTORED,
                             f"restored from snapshot {chosen.id} (batch {chosen.batch_id})", node=target,
                             detail={"snapshot": chosen.id, "outputs": report.outputs, "forced": force,
                                     "undid_backfills": bool(undone)})
                    if launching is not None:
                        _launched(launching, node_host, instance, target, report)
                        row = wait_until_running(cluster, plan, instance, target)
                        report.add(f"launched {target} as ACTIVE: pid {row['pid']}")
                finally:
                    launcher.shutdown(wait=False)  # a launch still waiting after a failure ends on its own
        if start and len(plan.nodes) > 1:
            with Supervisor(cluster, plan, launched_by=launched_by, py_files=py_files,
                            node_host=node_host) as supervisor:
                for line in supervisor.reconcile(instance, cause=f"restore from {chosen.id}").lines():
                    report.add(line)
        return report


def _launched(launching: Future, node_host: NodeHost, instance: str, node: str, report: RestoreReport) -> None:
    """The launch begun before the rollback, once the node may run; launched again if it gave up waiting (a launch
    through a node's queue waits for RUNNING, and a long rollback may outlast that wait)."""
    try:
        launching.result()
    except LaunchError as exc:
        report.add(f"the launch of {node} begun before the rollback did not end well ({exc}): launching it again")
        node_host.launch(instance, node, ACTIVE, None)


def undone_backfills(done: list[backfills.BackfillRecord], instance: str) -> list[backfills.BackfillRecord]:
    """Of the backfills done since a snapshot was taken, those a restore of ``instance`` from it undoes (pure)."""
    return [record for record in done if instance in record.instances]


def describe_backfills(records: list[backfills.BackfillRecord]) -> str:
    """``backfill <id> [start, end)`` for each, as a refusal names them (pure)."""
    return ", ".join(f"backfill {r.id} [{r.range_start.isoformat()}, {r.range_end.isoformat()})" for r in records)


def vacuumed_versions(cluster: ClusterConfig, plan: PlanConfig, snapshot: catalog.SnapshotRecord) -> list[str]:
    """For each Delta table a restore from ``snapshot`` rolls back (not those published once by id, which are kept),
    why its recorded version can no longer be read: files vacuumed, or the version gone from the log."""
    problems = []
    for table, path in plan_output_tables(cluster, plan).items():
        version = snapshot.output_versions.get(table)
        kept_as_is = table in plan.outputs and not kind_of(plan, table).rolled_back_on_restore(plan.outputs[table])
        if version is None or kept_as_is:
            continue
        gone = vacuumed_files(path, version)
        if gone:
            problems.append(f"Delta table {table} at version {version} lost {len(gone)} file(s) "
                            f"({gone[0]}): vacuumed after the snapshot was no longer kept")
    return problems


def _put_cut(cluster: ClusterConfig, plan: PlanConfig, instance: str, node: str,
             snapshot: catalog.SnapshotRecord) -> str:
    root = checkpoint_dir(cluster, plan.name, instance, node, "")
    for query, directory in query_dirs(root).items():
        if query not in snapshot.query_batches:
            shutil.rmtree(directory)
    done = []
    for query in sorted(snapshot.query_batches):
        cut = cut_checkpoint(under_root(cluster, snapshot.checkpoint_path) / query,
                             checkpoint_dir(cluster, plan.name, instance, node, query))
        done.append(f"{query} at batch {cut.batch_id}")
    return ", ".join(done)


def _restore_outputs(cluster: ClusterConfig, plan: PlanConfig, instance: str, snapshot: catalog.SnapshotRecord,
                     db: Database, report: RestoreReport) -> None:
    for table, path in plan_output_tables(cluster, plan).items():
        version = snapshot.output_versions.get(table)
        if table in plan.outputs:
            outcome = kind_of(plan, table).restore(db, plan, table, path, instance, version)
        else:  # no declared output owns it (any more): its Delta slice is put back, nothing else knows it
            outcome = roll_back_slice(path, instance, version).outcome()
        if outcome is None:
            report.add(f"{table}: kept (published once by id: the replay after the cut adds only what is missing)")
            continue
        report.outputs[table] = outcome
        changed = "unknown (files vacuumed): all" if outcome["changed_rows"] is None else outcome["changed_rows"]
        report.add(f"{table}: {changed} rows of {instance} changed since version "
                   f"{version if version is not None else '(none: table empty at the cut)'}; "
                   + ("nothing to roll back" if outcome["changed_rows"] == 0 else
                      f"Delta slice restored ({outcome['delta_rows']} rows, now version {outcome['new_version']})"
                      + (f", PostgreSQL: {outcome['postgres_rows']} rows rewritten" if "postgres_rows" in outcome
                         else "")))
    report.add(f"published positions forgotten: {forget_instance(db, plan.name, instance)} publish_log rows")
