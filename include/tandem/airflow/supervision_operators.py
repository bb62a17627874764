"""Airflow operators that supervise a plan: the supervision DAG's reconcile, and an operator's actions.

:class:`ReconcilePlanOperator` observes every instance, decides and acts
(:class:`tandem.supervisor.reconcile.Supervisor`); :class:`PlanOpsOperator` carries out
``failover_now``, ``drain_node``, ``restart_node`` and ``snapshot_now`` (the ops DAG). See
:mod:`tandem.airflow.operator_support` for the cluster configuration and which errors are retried.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tandem.airflow.operator_support import requested_instance, set_run_note, task_cluster
from tandem.airflow.run_rights import check_triggering_user
from tandem.airflow.snapshot_operators import snapshot_on_hosts, take_snapshots
from tandem.config import load_plan
from tandem.errors import ConfigError
from tandem.names import plan_dag_id
from tandem.ops import CUTOVER, FINISH_UPGRADE, ROLLBACK, SNAPSHOT_NOW, UPGRADE_ACTIONS


class ReconcilePlanOperator(BaseOperator):
    """Supervise a plan: observe every instance, decide, act (launch, stop, re-sync, wait for promotion).

    ``ensure`` (no ``watch_task_id``): make sure every node of the plan runs in its role at the
    start of a supervision run. ``react`` (``watch_task_id`` set): record what the watch sensor
    detected (``DETECTED`` in ``tandem.failover_events``), then reconcile, the detected instance
    first. Every decision goes to ``tandem.failover_events`` and to this task's log. Fails (and
    is retried) when an action failed; an instance the supervisor gave up on (BLOCKED) is logged
    and recorded but does not fail the task. Returns the reports' lines per instance. With
    ``notify_conn_ids``, the plan's failovers and BLOCKED instances recorded since the last
    notification are notified through those connections
    (:func:`tandem.airflow.notifications.notify_supervision_events`), once each.

    :param plan: plan name. Templated.
    :param watch_task_id: the sensor whose event (XCom ``return_value``) caused this reconcile.
    :param cluster_config: path of ``cluster.yaml`` (default: from the environment).
    :param running_timeout_s: how long a launched instance may take to report RUNNING.
    :param notify_conn_ids: Airflow connections to notify of failovers and BLOCKED instances (none: no notice).
    """

    template_fields = ("plan",)
    ui_color = "#d5e8fd"

    def __init__(self, *, plan: str, watch_task_id: str | None = None, cluster_config: str | None = None,
                 running_timeout_s: float = 300.0, notify_conn_ids: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.watch_task_id = watch_task_id
        self.cluster_config = cluster_config
        self.running_timeout_s = running_timeout_s
        self.notify_conn_ids = list(notify_conn_ids)

    def execute(self, context: Any) -> dict[str, list[str]]:
        from tandem.airflow.node_launch import NodeQueue
        from tandem.airflow.notifications import notify_supervision_events
        from tandem.store.supervision import mark
        from tandem.supervisor.reconcile import Supervisor

        cluster = task_cluster(self.cluster_config)
        plan = load_plan(self.plan, cluster)
        ti = context["ti"]
        event = ti.xcom_pull(task_ids=self.watch_task_id) if self.watch_task_id else None
        instances = list(plan.instances)
        cause = f"{ti.dag_id} {ti.run_id}: {'start of the supervision run' if event is None else 'watch'}"
        with Supervisor(cluster, plan, launched_by=f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id} try {ti.try_number}",
                        log=self.log, running_timeout_s=self.running_timeout_s,
                        node_host=NodeQueue(cluster, plan, ti, running_timeout_s=self.running_timeout_s,
                                            log=self.log)) as supervisor:
            if event and event.get("status") == "unhealthy":
                cause = (f"{ti.dag_id} {ti.run_id}: {event['health']} on {event['node']}: {event['evidence']}")
                self.log.info("detected: %s", cause)
                if ti.try_number == 1:
                    mark(supervisor.db, plan.name, event["instance"], "DETECTED", event["evidence"],
                         node=event["node"], detail={"health": event["health"], "decisions": event.get("decisions", []),
                                                     "instances": event.get("instances", {}),
                                                     "lease": event.get("lease")})
                instances.sort(key=lambda s: s != event["instance"])
            elif event:
                self.log.info("the watch ended quietly: %s", event)
            reports = {instance: supervisor.reconcile(instance, cause=cause) for instance in instances}
            notify_supervision_events(self.log, supervisor.db, plan.name, self.notify_conn_ids, context,
                                      cause=cause if event and event.get("status") == "unhealthy" else "")
        summary = {instance: report.lines() for instance, report in reports.items()}
        for lines in summary.values():
            for line in lines:
                self.log.info("%s", line)
        failed = [step.line() for report in reports.values() for step in report.failed]
        if failed:
            raise AirflowException("supervisor actions failed: " + "; ".join(failed))
        return summary


class PlanOpsOperator(BaseOperator):
    """An operator's action on a plan: ``failover_now``, ``drain_node`` or ``restart_node``.

    - ``failover_now``: hand the ACTIVE role of each selected instance to a live standby (``node``,
      when given, is the preferred one); in warm mode stop the active and start the plan on
      another node from a cut of its checkpoint.
    - ``drain_node``: keep ``node`` out of the selected instances: hand its ACTIVE roles to others,
      wait for their promotion, then stop its instances. The supervision DAG leaves it down.
    - ``restart_node``: stop ``node``'s instances (failing over first where it is ACTIVE) and
      relaunch them as standbys after re-syncing them from the active; undoes a drain.
    - ``snapshot_now``: take a snapshot of each selected instance's ACTIVE node now through a run
      of the snapshot DAG (on a live standby's host, as scheduled snapshots are); with ``node``, of
      that node's instance, in this task.

    The run acts only for a user Airflow lets act on the plan, however it was triggered
    (:func:`~tandem.airflow.run_rights.check_triggering_user`). Airflow 3.3's task SDK cannot set the note of the
    task's own DAG run; the summary goes to
    the task log, and to the run note through the REST API when the Airflow connection
    ``tandem_airflow_api`` (host = API URL, login, password) is defined.

    - ``cutover``: carry out a change the group's checkpoints refuse (its parallel, an aggregation's measures)
      by a cut-over of the stopped plan (:mod:`tandem.cutover`); ``instance`` names the group, if several need one.

    :param action: one of failover_now, drain_node, restart_node, snapshot_now, cutover. Templated.
    :param plan: plan name. Templated.
    :param instance: one group instance, or empty for every one of the plan. Templated. A run whose conf
        has ``instance``, its deprecated former name, is obeyed too (until the next release).
    :param node: the node (required for drain_node and restart_node). Templated.
    """

    template_fields = ("action", "plan", "instance", "node")
    ui_color = "#f5dcdc"

    def __init__(self, *, action: str, plan: str, instance: str = "", node: str = "",
                 cluster_config: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.action = action
        self.plan = plan
        self.instance = instance
        self.node = node
        self.cluster_config = cluster_config

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem.airflow.node_launch import NodeQueue
        from tandem.supervisor.reconcile import OpsRefused, run_ops_action

        ti = context["ti"]
        check_triggering_user(self.log, context, self.plan, ti.dag_id)
        cluster = task_cluster(self.cluster_config)
        try:
            plan = load_plan(self.plan, cluster)
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None
        instance = requested_instance(self.log, self.instance, context["params"])
        instances = [instance] if instance else list(plan.instances)
        if self.action == CUTOVER:
            return cut_over_plan(self.log, cluster, plan, instance, ti)
        if self.action in UPGRADE_ACTIONS:
            return upgrade_plan(self.log, cluster, plan, self.action, instances, ti,
                                expect_changes=bool(context["params"].get("expect_changes")))
        if self.action == SNAPSHOT_NOW and not self.node and not _paused(ti, plan_dag_id(plan.name, "snapshot")):
            return snapshot_on_hosts(self.log, plan, instance, ti)
        if self.action == SNAPSHOT_NOW:
            if not self.node:
                self.log.warning("%s is paused (its runs would wait): snapshotting in this task instead",
                                 plan_dag_id(plan.name, "snapshot"))
            return take_snapshots(self.log, cluster, plan, instances, ti, node=self.node or None)
        try:
            reports = run_ops_action(cluster, plan, self.action, self.node or None, instances,
                                     launched_by=f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id}", log=self.log,
                                     node_host=NodeQueue(cluster, plan, ti, log=self.log))
        except OpsRefused as exc:
            raise AirflowFailException(str(exc)) from None
        lines = [f"{self.action} {plan.name} {self.node or ''} on {', '.join(instances)}"]
        for report in reports:
            lines += report.lines()
        summary = "\n".join(lines)
        self.log.info("summary of %s:\n%s", self.action, summary)
        set_run_note(self.log, ti, summary)
        failed = [step.line() for report in reports for step in report.failed]
        if failed:
            raise AirflowException(f"{self.action}: actions failed: " + "; ".join(failed))
        return {"action": self.action, "plan": plan.name, "node": self.node, "instances": instances, "summary": lines,
                "converged": all(report.converged for report in reports)}


def cut_over_plan(log: Any, cluster: Any, plan: Any, instance: str | None, ti: Any) -> dict[str, Any]:
    """The ``cutover`` action: :func:`tandem.cutover.cut_over` of the group of ``instance`` (default: the one whose
    checkpoints refuse the plan); the plan must be stopped."""
    from tandem.cutover import CutoverRefused, cut_over
    from tandem.runtime.plan_api import partial_outputs_by_query
    from tandem.store import Database, migrate

    group = plan.group_of(instance)[0] if instance else None
    with Database(cluster.database_url, "tandem-ops") as db:
        migrate(db)
        try:
            cut = cut_over(cluster, plan, db, group, partial_outputs=partial_outputs_by_query(plan))
        except CutoverRefused as exc:
            raise AirflowFailException(str(exc)) from None
    summary = (f"cutover {plan.name}: group {cut.group} cut over (generation {cut.generation}); retired "
               f"{', '.join(cut.retired)}; {sum(len(f) for f in cut.consumed.values())} file(s) read before the cut")
    log.info("%s", summary)
    set_run_note(log, ti, summary)
    return {"action": CUTOVER, "plan": plan.name, "group": cut.group, "generation": cut.generation,
            "retired": list(cut.retired)}


def upgrade_plan(log: Any, cluster: Any, plan: Any, action: str, instances: list[str], ti: Any, *,
                 expect_changes: bool) -> dict[str, Any]:
    """The ``upgrade``, ``finish_upgrade`` and ``rollback`` actions (:mod:`tandem.supervisor.upgrade`), launching
    through the nodes' queues; the task fails when an instance is refused or its step failed."""
    from tandem.airflow.node_launch import NodeQueue
    from tandem.supervisor.reconcile import Supervisor
    from tandem.supervisor.upgrade import Upgrader, each_instance

    def confirm(checks: Any) -> bool:
        for check in checks:
            log.warning("%s: %s", check.line(), " | ".join(check.samples))
        return expect_changes

    lines, failed = [], []
    with Supervisor(cluster, plan, launched_by=f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id}", log=log,
                    node_host=NodeQueue(cluster, plan, ti, log=log)) as supervisor:
        upgrader = Upgrader(supervisor, confirm=confirm)
        step = {FINISH_UPGRADE: upgrader.finish, ROLLBACK: upgrader.rollback}.get(action, upgrader.upgrade)
        for _, result, refused in each_instance(step, instances):
            if refused is not None:
                failed.append(str(refused))
                continue
            lines.append(result.summary(plan.name))
            if not result.ok:
                failed.append(lines[-1])
    summary = "\n".join([f"{action} {plan.name}", *lines, *failed])
    log.info("summary of %s:\n%s", action, summary)
    set_run_note(log, ti, summary)
    if failed:
        raise AirflowFailException(f"{action}: " + "; ".join(failed))
    return {"action": action, "plan": plan.name, "instances": instances, "summary": lines}


def _paused(ti: Any, dag_id: str) -> bool:
    """Whether ``dag_id`` is paused: the scheduler starts no run of a paused DAG, triggered ones included."""
    return bool(ti.get_dag(dag_id).is_paused)
