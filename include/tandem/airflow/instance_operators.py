"""Airflow operators that launch and stop one plan instance on its node's host (the run DAG's tasks).

They carry out :mod:`tandem.supervisor.node_actions` and :mod:`tandem.supervisor.stopping` on the
node's queue, so the PIDs an instance recorded are the host's own (see
:mod:`tandem.airflow.operator_support` for the cluster configuration and which errors are retried).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tandem.airflow.dags import LAUNCH, RELAUNCH
from tandem.airflow.operator_support import task_cluster
from tandem.config import ClusterConfig, PlanConfig, load_plan
from tandem.declarations import parse_duration
from tandem.errors import ConfigError
from tandem.names import ACTIVE


class LaunchPlanInstanceOperator(BaseOperator):
    """Make sure one plan instance runs on a node, as a detached ``spark-submit`` job, and wait for RUNNING.

    Runs on the node's host (the node's queue, :func:`~tandem.airflow.dags.node_task_args`) and
    carries out :func:`tandem.supervisor.node_actions.resync_then_launch` there: the re-sync when
    ``resync_from`` is set, then the launch, which returns the existing job when the instance is
    already alive, so a retry of this task (or a second run with the same Params) never submits a
    second job. Pushes ``instance_id``, ``pid``, ``submit_pid``, ``spark_app_id``, ``log_path``,
    ``host`` and ``reused`` to XCom and returns them as a dict.

    Airflow 3.3's task SDK offers no call to set the note of the task's own DAG run (the
    Execution API takes a note only when a task triggers a new run), so the summary goes to the
    task log instead.

    :param plan: plan name (``conf/plans/<plan>.yaml``). Templated.
    :param node: node name from ``cluster.yaml``, one of the plan's nodes. Templated.
    :param instance: one of the plan's instances. Templated.
    :param trigger_interval: micro-batch interval such as ``"1 second"``; empty means the plan's. Templated.
    :param role: ACTIVE, PASSIVE, BACKUP or WARM. Templated.
    :param resync_from: a node whose checkpoint is cut and copied over this node's first; empty: none. Templated.
    :param expires_at: ISO time after which the launch is refused (a late task of an old decision). Templated.
    :param action: ``launch`` keeps a live instance; ``relaunch`` stops it here first. Templated.
    :param cluster_config: path of ``cluster.yaml`` (default: ``$TANDEM_CONF_DIR/cluster.yaml``).
    :param running_timeout_s: how long to wait for the instance to report RUNNING.
    """

    template_fields = ("plan", "node", "instance", "trigger_interval", "role", "resync_from", "expires_at", "action")
    ui_color = "#dcefe3"

    def __init__(self, *, plan: str, node: str, instance: str, trigger_interval: str | None = None,
                 role: str = ACTIVE, resync_from: str = "", expires_at: str = "", action: str = LAUNCH,
                 cluster_config: str | None = None, running_timeout_s: float = 300.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.action = action
        self.plan = plan
        self.node = node
        self.instance = instance
        self.trigger_interval = trigger_interval
        self.role = role
        self.resync_from = resync_from
        self.expires_at = expires_at
        self.cluster_config = cluster_config
        self.running_timeout_s = running_timeout_s

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem.supervisor.launcher import LaunchError, LaunchRejected, wait_until_running
        from tandem.supervisor.node_actions import check_deadline, resync_then_launch

        if self.action not in (LAUNCH, RELAUNCH):
            raise AirflowFailException(f"Param action: {self.action!r} is not {LAUNCH} or {RELAUNCH}")
        interval = self._checked_interval()
        cluster = task_cluster(self.cluster_config)
        plan, deadline = _plan_node_deadline(cluster, self.plan, self.node, self.expires_at)
        ti = context["ti"]
        launched_by = f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id} try {ti.try_number}"
        try:
            check_deadline(deadline, datetime.now(timezone.utc), f"launch of {self.node}")
            job = resync_then_launch(cluster, plan, self.instance, self.node, role=self.role or ACTIVE,
                                     resync_from=self.resync_from or None, replace=self.action == RELAUNCH,
                                     trigger_interval=interval, launched_by=launched_by, logger=self.log).job
        except LaunchRejected as exc:
            raise AirflowFailException(str(exc)) from None
        except LaunchError as exc:
            raise AirflowException(str(exc)) from None
        verb = "found running" if job.reused else "launched"
        self.log.info("%s %s (%s); log %s", verb, job.instance_id, job.reason, job.log_path)
        try:
            row = wait_until_running(cluster, plan, self.instance, self.node, timeout_s=self.running_timeout_s)
        except LaunchError as exc:
            raise AirflowException(str(exc)) from None
        result = {
            "instance_id": row["instance_id"],
            "pid": row["pid"],
            "submit_pid": row["submit_pid"],
            "spark_app_id": row["spark_app_id"],
            "log_path": row["log_path"],
            "host": row["host"],
            "reused": job.reused,
        }
        for key, value in result.items():
            ti.xcom_push(key=key, value=value)
        self.log.info("%s RUNNING on %s: pid %s, Spark application %s, log %s", row["instance_id"], row["host"],
                      row["pid"], row["spark_app_id"], row["log_path"])
        return result

    def _checked_interval(self) -> str | None:
        text = (self.trigger_interval or "").strip()
        if not text:
            return None
        try:
            parse_duration(text)
        except ValueError as exc:
            raise AirflowFailException(f"Param trigger_interval: {exc}") from None
        return text


def _plan_node_deadline(cluster: ClusterConfig, plan_name: str, node: str,
                        expires_at: str) -> tuple[PlanConfig, datetime | None]:
    """The plan, the node checked against the cluster, and the request's deadline (UTC), or AirflowFailException."""
    try:
        plan = load_plan(plan_name, cluster)
        cluster.node(node)
        deadline = datetime.fromisoformat(expires_at) if (expires_at or "").strip() else None
    except ConfigError as exc:
        raise AirflowFailException(str(exc)) from None
    except ValueError as exc:
        raise AirflowFailException(f"Param expires_at: {exc}") from None
    if deadline is not None and deadline.tzinfo is None:
        deadline = deadline.replace(tzinfo=timezone.utc)
    return plan, deadline


class StopPlanInstanceOperator(BaseOperator):
    """Stop a plan instance on its node's host: SIGTERM to its processes, SIGKILL after ``stop_timeout``.

    Runs on the node's queue, so the PIDs the instance recorded are this host's: it ends a driver
    that did not obey its stop request in PostgreSQL, or hangs, or whose row already says STOPPED
    while its processes live on; a newer launch than ``launched_at`` is left alone
    (:func:`~tandem.supervisor.stopping.stop_launch`). Returns ``{"instance_id", "status",
    "graceful", "detail"}``.

    :param plan: plan name. Templated.
    :param node: the node whose instance stops; the task runs on its host. Templated.
    :param instance: one of the plan's instances. Templated.
    :param stop_timeout: e.g. ``"1 minute"``: how long after SIGTERM before SIGKILL. Templated.
    :param expires_at: ISO time after which the stop is refused (a late task of an old decision). Templated.
    :param launched_at: ISO time of the launch to stop (the row's ``launched_at``); a newer launch is
        left alone. Empty: whichever runs. Templated.
    """

    template_fields = ("plan", "node", "instance", "stop_timeout", "expires_at", "launched_at")
    ui_color = "#f3dcdc"

    def __init__(self, *, plan: str, node: str, instance: str, stop_timeout: str = "1 minute",
                 expires_at: str = "", launched_at: str = "", cluster_config: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.node = node
        self.instance = instance
        self.stop_timeout = stop_timeout
        self.expires_at = expires_at
        self.launched_at = launched_at
        self.cluster_config = cluster_config

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem.supervisor.launcher import LaunchError, LaunchRejected
        from tandem.supervisor.node_actions import check_deadline
        from tandem.supervisor.stopping import stop_launch

        try:
            timeout_s = parse_duration(self.stop_timeout)
        except ValueError as exc:
            raise AirflowFailException(f"Param stop_timeout: {exc}") from None
        try:
            launched_at = datetime.fromisoformat(self.launched_at) if (self.launched_at or "").strip() else None
        except ValueError as exc:
            raise AirflowFailException(f"Param launched_at: {exc}") from None
        cluster = task_cluster(self.cluster_config)
        plan, deadline = _plan_node_deadline(cluster, self.plan, self.node, self.expires_at)
        ti = context["ti"]
        try:
            check_deadline(deadline, datetime.now(timezone.utc), f"stop of {self.node}")
            plan.check_instance(self.instance)
            result = stop_launch(cluster, plan, self.instance, self.node, launched_at, timeout_s=timeout_s,
                                 requested_by=f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id}")
        except (LaunchRejected, ConfigError) as exc:
            raise AirflowFailException(str(exc)) from None
        except LaunchError as exc:
            raise AirflowException(str(exc)) from None
        self.log.info("%s on this host: %s (%s)", result.instance_id, result.detail, result.status)
        return {"instance_id": result.instance_id, "status": result.status, "graceful": result.graceful,
                "detail": result.detail}
