"""Airflow operators for a plan's snapshots: choose the host, take, prune, restore; and landing retention.

The scheduled snapshot DAG branches to one ``snapshot_<instance>_on_<node>`` task per instance
(:class:`ChooseSnapshotHostOperator`, :class:`TakeSnapshotOperator`) and prunes
(:class:`PruneSnapshotsOperator`); the restore DAG restores (:class:`RestoreSnapshotOperator`); the
maintenance DAG deletes the landing files no instance and no kept snapshot needs
(:class:`CleanLandingOperator`). :func:`snapshot_on_hosts` and :func:`take_snapshots` take snapshots
for ``snapshot_now`` as well. See :mod:`tandem.airflow.operator_support` for the cluster
configuration and which errors are retried.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.branch import BaseBranchOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from tandem.airflow.dags import snapshot_task_id
from tandem.airflow.operator_support import requested_instance, set_run_note, task_cluster
from tandem.airflow.run_rights import check_triggering_user
from tandem.config import ClusterConfig, PlanConfig, load_plan
from tandem.errors import ConfigError
from tandem.names import plan_dag_id
from tandem.store.job_runs import recorded_run


SNAPSHOT_RUN_TIMEOUT_S = 1800.0


def snapshot_on_hosts(log: Any, plan: Any, instance: str, ti: Any, *, poll_s: float = 2.0) -> dict[str, Any]:
    """Snapshot now through a run of ``tandem_<plan>_snapshot`` (one instance, or every instance when empty),
    so that each snapshot runs on a live standby's host as scheduled ones do; wait for the run and
    report where each instance's snapshot ran. Fails when the run fails."""
    import time
    import uuid

    from tandem.airflow.node_launch import FINISHED, TriggerRefused, dag_run_state, state_text, trigger_dag_run

    dag_id = plan_dag_id(plan.name, "snapshot")
    run_id = f"tandem_snapshot_now__{instance or 'all'}__{uuid.uuid4().hex[:8]}"
    try:
        trigger_dag_run(ti, dag_id, run_id, {"instance": instance}, f"snapshot_now of {instance or 'every instance'}")
    except TriggerRefused as exc:
        raise AirflowFailException(f"could not trigger {dag_id}: {exc}") from None
    log.info("snapshot_now: waiting for %s run %s", dag_id, run_id)
    deadline = time.monotonic() + SNAPSHOT_RUN_TIMEOUT_S
    state = dag_run_state(ti, dag_id, run_id)
    while state not in FINISHED and time.monotonic() < deadline:
        time.sleep(poll_s)
        state = dag_run_state(ti, dag_id, run_id)
    task_ids = [snapshot_task_id(s, n) for s in ([instance] if instance else plan.instances) for n in plan.nodes]
    states = (ti.get_task_states(dag_id=dag_id, task_ids=task_ids, run_ids=[run_id]) or {}).get(run_id) or {}
    ran = sorted(task for task, task_state in states.items() if state_text(task_state) not in ("skipped", "None", ""))
    summary = f"snapshot_now {plan.name} {instance or 'every instance'}: {dag_id} run {run_id} {state}; " \
              f"snapshot tasks that ran: {', '.join(ran) or 'none (no ACTIVE instance)'}"
    log.info("%s", summary)
    set_run_note(log, ti, summary)
    if state != "success":
        raise AirflowFailException(summary if state in FINISHED else
                                   f"{summary} (not finished after {SNAPSHOT_RUN_TIMEOUT_S:.0f}s)")
    return {"plan": plan.name, "dag_id": dag_id, "run_id": run_id, "state": state, "snapshot_tasks": ran}


def take_snapshots(log: Any, cluster: ClusterConfig, plan: Any, instances: list[str], ti: Any, *,
                   node: str | None = None) -> dict[str, Any]:
    """Snapshot each instance's ACTIVE node (or ``node``'s); fail the task when one is BAD, skip when none runs."""
    from airflow.sdk.exceptions import AirflowSkipException

    from tandem.errors import SnapshotError
    from tandem.snapshots.take import snapshot_session, take_snapshot

    unknown = [s for s in instances if s not in plan.instances]
    if unknown:
        raise AirflowFailException(f"{plan.path}: instances: {', '.join(unknown)} not in the plan's instances")
    spark = snapshot_session(cluster, plan)  # at nice 10: background work, the running queries keep the CPU first
    taken, skipped, lines = [], [], []
    try:
        for instance in instances:
            try:
                snapshot = take_snapshot(cluster, plan, instance, spark, node=node)
            except SnapshotError as exc:
                if "has no ACTIVE instance" in str(exc) or "nothing to snapshot" in str(exc):
                    log.warning("%s/%s: %s", plan.name, instance, exc)
                    skipped.append(instance)
                    lines.append(f"{instance}: skipped: {exc}")
                    continue
                raise AirflowFailException(str(exc)) from None
            log.info("%s", snapshot.summary())
            log.info("%s", snapshot.validation.summary())
            taken.append(snapshot)
            lines.append(snapshot.summary())
    finally:
        spark.stop()
    set_run_note(log, ti, "\n".join(lines))
    bad = [t for t in taken if not t.good]
    if bad:
        raise AirflowFailException("snapshots marked BAD: " + "; ".join(t.summary() for t in bad))
    if not taken:
        raise AirflowSkipException(f"nothing to snapshot: {'; '.join(lines)}")
    return {"plan": plan.name, "snapshots": [t.record.id for t in taken], "skipped": skipped, "summary": lines}


class ChooseSnapshotHostOperator(BaseBranchOperator):
    """Choose the host that snapshots one instance: follow the task ``snapshot_<instance>_on_<node>`` of that host.

    :func:`tandem.supervisor.decisions.snapshot_node` decides: a live standby's host (the snapshot
    then costs the ACTIVE's host nothing), else the ACTIVE's own; with no ACTIVE, every snapshot
    task of the instance is skipped.

    :param plan: plan name.
    :param instance: the instance.
    :param selected_instance: the instance the run was triggered for; empty: every instance. Templated.
    """

    template_fields = ("selected_instance",)
    ui_color = "#dcecf5"

    def __init__(self, *, plan: str, instance: str, selected_instance: str = "", cluster_config: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.instance = instance
        self.selected_instance = selected_instance
        self.cluster_config = cluster_config

    def choose_branch(self, context: Any) -> str | None:
        from tandem.store.db import Database
        from tandem.supervisor.decisions import snapshot_node
        from tandem.supervisor.observe import observe_instance

        if self.selected_instance and self.selected_instance != self.instance:
            self.log.info("this run snapshots %s only", self.selected_instance)
            return None
        cluster = task_cluster(self.cluster_config)
        plan = load_plan(self.plan, cluster)
        with Database(cluster.database_url, "tandem-snapshot-host") as db:
            view = observe_instance(db, cluster, plan, self.instance).view
        node = snapshot_node(view)
        states = ", ".join(f"{n} {h.role or '-'} {h.state}" for n, h in view.instances.items())
        if node is None:
            self.log.warning("%s/%s: no node holds the ACTIVE lease (%s): nothing to snapshot", plan.name,
                             self.instance, states)
            return None
        self.log.info("%s/%s: the ACTIVE instance on %s is snapshotted on %s's host (%s)", plan.name,
                      self.instance, view.lease.holder, node, states)
        return snapshot_task_id(self.instance, node)


class TakeSnapshotOperator(BaseOperator):
    """Take a snapshot of one instance's ACTIVE node: cut, state export, validation (GOOD or BAD).

    Fails (no retry) when the snapshot is BAD; skips when no node of the instance is ACTIVE. It
    runs wherever its task's queue sends it: the scheduled DAG puts one task per node on that
    node's queue (:class:`ChooseSnapshotHostOperator` picks one); the cut reads the ACTIVE's
    checkpoint from the shared storage.

    :param plan: plan name. Templated.
    :param instance: the instance. Templated.
    :param node: snapshot this node's instance instead of the ACTIVE one. Templated.
    """

    template_fields = ("plan", "instance", "node")
    ui_color = "#dcecf5"

    def __init__(self, *, plan: str, instance: str, node: str = "", cluster_config: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.instance = instance
        self.node = node
        self.cluster_config = cluster_config

    def execute(self, context: Any) -> dict[str, Any]:
        cluster = task_cluster(self.cluster_config)
        plan = load_plan(self.plan, cluster)
        return take_snapshots(self.log, cluster, plan, [self.instance], context["ti"], node=self.node or None)


class PlanTaskOperator(BaseOperator):
    """A task over one whole plan (its name templated), with the cluster and the plan loaded where it runs.

    :param plan: plan name. Templated.
    """

    template_fields = ("plan",)

    def __init__(self, *, plan: str, cluster_config: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.cluster_config = cluster_config

    def loaded(self) -> tuple[ClusterConfig, PlanConfig]:
        cluster = task_cluster(self.cluster_config)
        return cluster, load_plan(self.plan, cluster)


class PruneSnapshotsOperator(PlanTaskOperator):
    """Apply snapshot retention to a plan: keep the newest ``snapshot.keep`` GOOD per instance, prune the rest."""

    ui_color = "#dcecf5"

    def execute(self, context: Any) -> list[str]:
        from tandem.snapshots.take import prune_snapshots

        decisions = prune_snapshots(*self.loaded()).describe()
        for line in decisions:
            self.log.info("%s", line)
        return decisions


def _flag(value: bool | str) -> bool:
    """A boolean Param as the operator gets it: ``True``, or ``"True"`` / ``"true"`` once a template rendered it."""
    return value if isinstance(value, bool) else str(value).strip().lower() == "true"


class RestoreSnapshotOperator(BaseOperator):
    """Restore a plan's instances from a snapshot (by id, or each instance's newest GOOD one) and start them.

    The run acts only for a user Airflow lets act on the plan, however it was triggered
    (:func:`~tandem.airflow.run_rights.check_triggering_user`). A run without ``confirm`` fails next, before it
    reads anything: a restore rewinds the plan's outputs, and
    the Param's default (false) must not do it, however the run was triggered. A BAD snapshot is refused unless
    ``force``, a snapshot taken before backfills of the instance unless ``undo_backfills``. The steps go to the log
    and the run note. The
    restore itself works on the shared storage and PostgreSQL from wherever this task runs; the
    ACTIVE instance, and the standbys after it, are launched on their nodes' hosts through
    ``tandem_<plan>_run`` (:class:`~tandem.airflow.node_launch.NodeQueue`).

    :param plan: plan name. Templated.
    :param instance: one group instance, or empty for every one (ignored with a snapshot id). Templated. A
        run whose conf has ``instance``, its deprecated former name, is obeyed too (until the next release).
    :param snapshot_id: a snapshot id, or empty for the newest GOOD one. Templated.
    :param node: the node to start ACTIVE (default: the node the snapshot was cut from). Templated.
    :param force: restore a BAD snapshot anyway. Templated.
    :param undo_backfills: restore a snapshot taken before backfills of the instance anyway (they are undone).
        Templated.
    :param confirm: must be true (or ``"True"``, as a template renders it), else the task fails. Templated.
    """

    template_fields = ("plan", "instance", "snapshot_id", "node", "force", "undo_backfills", "confirm")
    ui_color = "#f5ecdc"

    def __init__(self, *, plan: str, instance: str = "", snapshot_id: str = "", node: str = "",
                 force: bool | str = False, undo_backfills: bool | str = False, confirm: bool | str = False,
                 cluster_config: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.instance = instance
        self.snapshot_id = snapshot_id
        self.node = node
        self.force = force
        self.undo_backfills = undo_backfills
        self.confirm = confirm
        self.cluster_config = cluster_config

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem.airflow.node_launch import NodeQueue
        from tandem.errors import SnapshotError
        from tandem.snapshots.restore import restore_instance, instances_to_restore

        check_triggering_user(self.log, context, self.plan, context["ti"].dag_id)
        if not _flag(self.confirm):
            raise AirflowFailException(f"restore of {self.plan} refused: it rewinds the plan's outputs to the snapshot; "
                                       f"trigger it with the Param confirm = true")
        cluster = task_cluster(self.cluster_config)
        try:
            plan = load_plan(self.plan, cluster)
            requested = requested_instance(self.log, self.instance, context["params"])
            instances = instances_to_restore(cluster, plan, self.snapshot_id, requested)
        except (ConfigError, SnapshotError) as exc:
            raise AirflowFailException(str(exc)) from None
        force = _flag(self.force)
        ti = context["ti"]
        lines = []
        for instance in instances:
            try:
                report = restore_instance(cluster, plan, instance, snapshot_id=self.snapshot_id or None, force=force,
                                       undo_backfills=_flag(self.undo_backfills), node=self.node or None,
                                       launched_by=f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id}",
                                       node_host=NodeQueue(cluster, plan, ti, await_unconfirmed_stops=True,
                                                           log=self.log))
            except SnapshotError as exc:
                raise AirflowFailException(str(exc)) from None
            for line in report.lines():
                self.log.info("%s", line)
            lines += report.lines()
        set_run_note(self.log, ti, "\n".join(lines))
        return {"plan": plan.name, "instances": instances, "summary": lines}


class CleanLandingOperator(PlanTaskOperator):
    """Delete a plan's landing files that every instance and every kept GOOD snapshot have processed."""

    ui_color = "#e8f5dc"

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem.snapshots.landing import clean_plan_landing
        from tandem.store import Database

        cluster, plan = self.loaded()
        with Database(cluster.database_url, "tandem-maintenance") as db, \
                recorded_run(db, plan.name, "landing_retention"):
            decisions = clean_plan_landing(cluster, plan)
        for partition, decision in decisions.items():
            for line in decision.describe() or ["no landing files"]:
                self.log.info("landing/%s: %s", partition, line)
        return {partition: len(decision.delete) for partition, decision in decisions.items()}


class DeltaUpkeepOperator(PlanTaskOperator):
    """Compact, checkpoint and vacuum a plan's Delta tables under its live appends, keeping every version a kept
    snapshot needs (:func:`tandem.batch.upkeep.maintain_plan_tables`); an asset event per output compacted or expired
    (:mod:`tandem.airflow.assets`)."""

    ui_color = "#e8f5dc"

    def execute(self, context: Any) -> list[dict[str, Any]]:
        from tandem.airflow.assets import emit_output_events, upkeep_changes
        from tandem.batch.upkeep import maintain_plan_tables
        from tandem.store import Database

        cluster, plan = self.loaded()
        with Database(cluster.database_url, "tandem-maintenance") as db, recorded_run(db, plan.name, "delta_upkeep"):
            upkeeps = maintain_plan_tables(cluster, plan, db)
        for upkeep in upkeeps:
            self.log.info("%s", upkeep.describe())
        emit_output_events(context, plan.name, upkeep_changes(plan.outputs, upkeeps), self.log)
        if not upkeeps:
            self.log.info("%s: no Delta table to maintain (maintenance.compact off, or no output written yet)",
                          plan.name)
        return [{"table": u.path, "files_before": u.files_before, "files_after": u.files_after,
                 "files_vacuumed": u.files_vacuumed, "log_entries_removed": u.log_entries_removed} for u in upkeeps]



class PostgresRetentionOperator(PlanTaskOperator):
    """Delete a plan's PostgreSQL rows older than its ``maintenance.retention`` (:func:`tandem.batch.trim.trim_plan_rows`):
    aggregation partials per granularity, progress, published positions, contribution ids, supervision events; then
    VACUUM of the tables with many dead rows; an asset event per output rows were deleted of
    (:mod:`tandem.airflow.assets`)."""

    ui_color = "#e8f5dc"

    def execute(self, context: Any) -> dict[str, int]:
        from tandem.airflow.assets import emit_output_events, retention_changes
        from tandem.batch.trim import trim_plan_rows
        from tandem.store import Database

        cluster, plan = self.loaded()
        with Database(cluster.database_url, "tandem-maintenance") as db, \
                recorded_run(db, plan.name, "postgres_retention"):
            retention = trim_plan_rows(plan, db)
        for line in retention.describe():
            self.log.info("%s", line)
        emit_output_events(context, plan.name, retention_changes(plan.outputs, retention.trimmed), self.log)
        totals: dict[str, int] = {}
        for part in retention.trimmed:
            totals[part.table] = totals.get(part.table, 0) + part.rows
        return totals
