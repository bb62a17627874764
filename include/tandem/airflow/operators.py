"""Airflow operators for Tandem: launch a plan instance, validate a plan's serving table, supervise, ops.

Both resolve the cluster configuration at run time (``cluster_config``, a path to
``cluster.yaml``, or the environment), so DAG files stay free of I/O beyond reading ``conf/``.
Errors a retry cannot fix (bad Params, unknown node or shard, failed validation) raise
``AirflowFailException``; anything else may be retried.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from airflow.providers.standard.operators.branch import BaseBranchOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tandem.airflow.dags import LAUNCH, RELAUNCH, snapshot_task_id
from tandem.config import ClusterConfig, PlanConfig, load_cluster, load_plan, parse_duration
from tandem.errors import ConfigError
from tandem.names import ACTIVE, plan_dag_id
from tandem.ops import SNAPSHOT_NOW


def _cluster(path: str | None) -> ClusterConfig:
    return load_cluster(Path(path) if path else None)


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
    :param shard_id: one of the plan's shards. Templated.
    :param trigger_interval: micro-batch interval such as ``"1 second"``; empty means the plan's. Templated.
    :param role: ACTIVE, PASSIVE or BACKUP. Templated.
    :param resync_from: a node whose checkpoint is cut and copied over this node's first; empty: none. Templated.
    :param expires_at: ISO time after which the launch is refused (a late task of an old decision). Templated.
    :param action: ``launch`` keeps a live instance; ``relaunch`` stops it here first. Templated.
    :param cluster_config: path of ``cluster.yaml`` (default: ``$TANDEM_CONF_DIR/cluster.yaml``).
    :param running_timeout_s: how long to wait for the instance to report RUNNING.
    """

    template_fields = ("plan", "node", "shard_id", "trigger_interval", "role", "resync_from", "expires_at", "action")
    ui_color = "#dcefe3"

    def __init__(self, *, plan: str, node: str, shard_id: str, trigger_interval: str | None = None,
                 role: str = ACTIVE, resync_from: str = "", expires_at: str = "", action: str = LAUNCH,
                 cluster_config: str | None = None, running_timeout_s: float = 300.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.action = action
        self.plan = plan
        self.node = node
        self.shard_id = shard_id
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
        cluster = _cluster(self.cluster_config)
        plan, deadline = _plan_node_deadline(cluster, self.plan, self.node, self.expires_at)
        ti = context["ti"]
        launched_by = f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id} try {ti.try_number}"
        try:
            check_deadline(deadline, datetime.now(timezone.utc), f"launch of {self.node}")
            job = resync_then_launch(cluster, plan, self.shard_id, self.node, role=self.role or ACTIVE,
                                     resync_from=self.resync_from or None, replace=self.action == RELAUNCH,
                                     trigger_interval=interval, launched_by=launched_by, logger=self.log).job
        except LaunchRejected as exc:
            raise AirflowFailException(str(exc)) from None
        except LaunchError as exc:
            raise AirflowException(str(exc)) from None
        verb = "found running" if job.reused else "launched"
        self.log.info("%s %s (%s); log %s", verb, job.instance_id, job.reason, job.log_path)
        if job.command:
            self.log.info("command: %s", " ".join(job.command))
        try:
            row = wait_until_running(cluster, plan, self.shard_id, self.node, timeout_s=self.running_timeout_s)
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
    (:func:`~tandem.supervisor.launcher.stop_launch`). Returns ``{"instance_id", "status",
    "graceful", "detail"}``.

    :param plan: plan name. Templated.
    :param node: the node whose instance stops; the task runs on its host. Templated.
    :param shard_id: one of the plan's shards. Templated.
    :param stop_timeout: e.g. ``"1 minute"``: how long after SIGTERM before SIGKILL. Templated.
    :param expires_at: ISO time after which the stop is refused (a late task of an old decision). Templated.
    :param launched_at: ISO time of the launch to stop (the row's ``launched_at``); a newer launch is
        left alone. Empty: whichever runs. Templated.
    """

    template_fields = ("plan", "node", "shard_id", "stop_timeout", "expires_at", "launched_at")
    ui_color = "#f3dcdc"

    def __init__(self, *, plan: str, node: str, shard_id: str, stop_timeout: str = "1 minute",
                 expires_at: str = "", launched_at: str = "", cluster_config: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.node = node
        self.shard_id = shard_id
        self.stop_timeout = stop_timeout
        self.expires_at = expires_at
        self.launched_at = launched_at
        self.cluster_config = cluster_config

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem.supervisor.launcher import LaunchError, LaunchRejected, stop_launch
        from tandem.supervisor.node_actions import check_deadline

        try:
            timeout_s = parse_duration(self.stop_timeout)
        except ValueError as exc:
            raise AirflowFailException(f"Param stop_timeout: {exc}") from None
        try:
            launched_at = datetime.fromisoformat(self.launched_at) if (self.launched_at or "").strip() else None
        except ValueError as exc:
            raise AirflowFailException(f"Param launched_at: {exc}") from None
        cluster = _cluster(self.cluster_config)
        plan, deadline = _plan_node_deadline(cluster, self.plan, self.node, self.expires_at)
        ti = context["ti"]
        try:
            check_deadline(deadline, datetime.now(timezone.utc), f"stop of {self.node}")
            plan.check_shard(self.shard_id)
            result = stop_launch(cluster, plan, self.shard_id, self.node, launched_at, timeout_s=timeout_s,
                                 requested_by=f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id}")
        except (LaunchRejected, ConfigError) as exc:
            raise AirflowFailException(str(exc)) from None
        except LaunchError as exc:
            raise AirflowException(str(exc)) from None
        self.log.info("%s on this host: %s (%s)", result.instance_id, result.detail, result.status)
        return {"instance_id": result.instance_id, "status": result.status, "graceful": result.graceful,
                "detail": result.detail}


class ValidateServingTableOperator(BaseOperator):
    """Validate every output of a plan with Great Expectations and log the merged hourly aggregates.

    Aggregations as serving tables, events by event time, tables whole (:mod:`tandem.quality.outputs`).
    The window is ``lookback`` (default: the plan's ``validation.lookback``) up to the run's
    ``data_interval_end`` (now for runs without one). Fails the task (no retry) when an
    expectation fails; the log and the exception name each failed expectation with sample rows.
    Returns the reports as a JSON-able dict.

    :param plan: plan name. Templated.
    :param lookback: window length such as ``"1 day"``.
    :param granularity: validate only this granularity (default: all).
    :param log_rows: how many merged hourly rows to write to the log at most.
    """

    template_fields = ("plan",)
    ui_color = "#e6e0f5"

    def __init__(self, *, plan: str, lookback: str | float | None = None, granularity: str | None = None,
                 cluster_config: str | None = None, log_rows: int = 200, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.lookback = lookback
        self.granularity = granularity
        self.cluster_config = cluster_config
        self.log_rows = log_rows

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem import aggregation
        from tandem.aggregation.spec import aggregation_outputs
        from tandem.quality.outputs import validate_plan_outputs

        cluster = _cluster(self.cluster_config)
        plan = load_plan(self.plan, cluster)
        lookback_s = parse_duration(self.lookback) if self.lookback is not None else plan.validation.lookback_s
        interval_end = context.get("data_interval_end")
        end = datetime.fromtimestamp(interval_end.timestamp(), timezone.utc) if interval_end else datetime.now(timezone.utc)
        since = end - timedelta(seconds=lookback_s)

        reports = validate_plan_outputs(cluster, plan, since, end, granularity=self.granularity)
        hourly_rows = 0
        for output in aggregation_outputs(plan):
            hourly = aggregation.query(cluster, plan.name, "hour", aggregation.bucket_start(since, "hour"), end,
                                       output=output)
            hourly_rows += len(hourly)
            self.log.info("merged hourly %s aggregates of %s, %s .. %s: %d rows", plan.name, output,
                          since.isoformat(), end.isoformat(), len(hourly))
            for line in format_rows(hourly, self.log_rows):
                self.log.info("%s", line)
        for report in reports:
            self.log.info("%s", report.summary())
            if report.row_count == 0:
                self.log.warning("%s: no rows in the window: nothing was validated", report.suite)
        failed = [r for r in reports if not r.success]
        if failed:
            raise AirflowFailException("\n".join(r.summary() for r in failed))
        return {"plan": plan.name, "success": True, "row_count": sum(r.row_count for r in reports),
                "hourly_rows": hourly_rows, "reports": [r.to_dict() for r in reports]}


def format_rows(rows: list[dict[str, Any]], limit: int) -> list[str]:
    """Merged aggregate rows as text lines, one ``column=value`` pair per column (pure)."""
    def shown(value: Any) -> str:
        if isinstance(value, datetime):
            return f"{value:%Y-%m-%d %H:%M:%S}"
        return f"{value:.4f}" if isinstance(value, float) else str(value)

    lines = [" ".join(f"{column}={shown(value)}" for column, value in row.items()) for row in rows[:limit]]
    if len(rows) > limit:
        lines.append(f"... {len(rows) - limit} more rows")
    return lines


class ReconcilePlanOperator(BaseOperator):
    """Supervise a plan: observe every shard, decide, act (launch, stop, re-sync, wait for promotion).

    ``ensure`` (no ``watch_task_id``): make sure every node of the plan runs in its role at the
    start of a supervision run. ``react`` (``watch_task_id`` set): record what the watch sensor
    detected (``DETECTED`` in ``tandem.failover_events``), then reconcile, the detected shard
    first. Every decision goes to ``tandem.failover_events`` and to this task's log. Fails (and
    is retried) when an action failed; a shard the supervisor gave up on (BLOCKED) is logged
    and recorded but does not fail the task. Returns the reports' lines per shard.

    :param plan: plan name. Templated.
    :param watch_task_id: the sensor whose event (XCom ``return_value``) caused this reconcile.
    :param cluster_config: path of ``cluster.yaml`` (default: from the environment).
    :param running_timeout_s: how long a launched instance may take to report RUNNING.
    """

    template_fields = ("plan",)
    ui_color = "#d5e8fd"

    def __init__(self, *, plan: str, watch_task_id: str | None = None, cluster_config: str | None = None,
                 running_timeout_s: float = 300.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.watch_task_id = watch_task_id
        self.cluster_config = cluster_config
        self.running_timeout_s = running_timeout_s

    def execute(self, context: Any) -> dict[str, list[str]]:
        from tandem.airflow.node_launch import NodeQueue
        from tandem.store.supervision import mark
        from tandem.supervisor.reconcile import Supervisor

        cluster = _cluster(self.cluster_config)
        plan = load_plan(self.plan, cluster)
        ti = context["ti"]
        event = ti.xcom_pull(task_ids=self.watch_task_id) if self.watch_task_id else None
        shards = list(plan.shards)
        cause = f"{ti.dag_id} {ti.run_id}: {'start of the supervision run' if event is None else 'watch'}"
        with Supervisor(cluster, plan, launched_by=f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id} try {ti.try_number}",
                        log=self.log, running_timeout_s=self.running_timeout_s,
                        node_host=NodeQueue(cluster, plan, ti, running_timeout_s=self.running_timeout_s, log=self.log)) as supervisor:
            if event and event.get("status") == "unhealthy":
                cause = (f"{ti.dag_id} {ti.run_id}: {event['health']} on {event['node']}: {event['evidence']}")
                self.log.info("detected: %s", cause)
                if ti.try_number == 1:
                    mark(supervisor.db, plan.name, event["shard_id"], "DETECTED", event["evidence"],
                         node=event["node"], detail={"health": event["health"], "decisions": event.get("decisions", []),
                                                     "instances": event.get("instances", {}),
                                                     "lease": event.get("lease")})
                shards.sort(key=lambda s: s != event["shard_id"])
            elif event:
                self.log.info("the watch ended quietly: %s", event)
            reports = {shard: supervisor.reconcile(shard, cause=cause) for shard in shards}
        summary = {shard: report.lines() for shard, report in reports.items()}
        for lines in summary.values():
            for line in lines:
                self.log.info("%s", line)
        failed = [step.line() for report in reports.values() for step in report.failed]
        if failed:
            raise AirflowException("supervisor actions failed: " + "; ".join(failed))
        return summary


class PlanOpsOperator(BaseOperator):
    """An operator's action on a plan: ``failover_now``, ``drain_node`` or ``restart_node``.

    - ``failover_now``: hand the ACTIVE role of each selected shard to a live standby (``node``,
      when given, is the preferred one); in warm mode stop the active and start the plan on
      another node from a cut of its checkpoint.
    - ``drain_node``: keep ``node`` out of the selected shards: hand its ACTIVE roles to others,
      wait for their promotion, then stop its instances. The supervision DAG leaves it down.
    - ``restart_node``: stop ``node``'s instances (failing over first where it is ACTIVE) and
      relaunch them as standbys after re-syncing them from the active; undoes a drain.
    - ``snapshot_now``: take a snapshot of each selected shard's ACTIVE instance now through a run
      of the snapshot DAG (on a live standby's host, as scheduled snapshots are); with ``node``, of
      that node's instance, in this task.

    Airflow 3.3's task SDK cannot set the note of the task's own DAG run; the summary goes to
    the task log, and to the run note through the REST API when the Airflow connection
    ``tandem_airflow_api`` (host = API URL, login, password) is defined.

    :param action: one of failover_now, drain_node, restart_node, snapshot_now. Templated.
    :param plan: plan name. Templated.
    :param shard_id: one shard, or empty for every shard of the plan. Templated.
    :param node: the node (required for drain_node and restart_node). Templated.
    """

    template_fields = ("action", "plan", "shard_id", "node")
    ui_color = "#f5dcdc"

    def __init__(self, *, action: str, plan: str, shard_id: str = "", node: str = "",
                 cluster_config: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.action = action
        self.plan = plan
        self.shard_id = shard_id
        self.node = node
        self.cluster_config = cluster_config

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem.airflow.node_launch import NodeQueue
        from tandem.supervisor.reconcile import OpsRefused, run_ops_action

        cluster = _cluster(self.cluster_config)
        try:
            plan = load_plan(self.plan, cluster)
        except ConfigError as exc:
            raise AirflowFailException(str(exc)) from None
        shards = [self.shard_id] if self.shard_id else list(plan.shards)
        ti = context["ti"]
        if self.action == SNAPSHOT_NOW and not self.node and not _paused(ti, plan_dag_id(plan.name, "snapshot")):
            return snapshot_on_hosts(self.log, plan, self.shard_id, ti)
        if self.action == SNAPSHOT_NOW:
            if not self.node:
                self.log.warning("%s is paused (its runs would wait): snapshotting in this task instead",
                                 plan_dag_id(plan.name, "snapshot"))
            return take_snapshots(self.log, cluster, plan, shards, ti, node=self.node or None)
        try:
            reports = run_ops_action(cluster, plan, self.action, self.node or None, shards,
                                     launched_by=f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id}", log=self.log,
                                     node_host=NodeQueue(cluster, plan, ti, log=self.log))
        except OpsRefused as exc:
            raise AirflowFailException(str(exc)) from None
        lines = [f"{self.action} {plan.name} {self.node or ''} on {', '.join(shards)}"]
        for report in reports:
            lines += report.lines()
        summary = "\n".join(lines)
        self.log.info("summary of %s:\n%s", self.action, summary)
        set_run_note(self.log, ti, summary)
        failed = [step.line() for report in reports for step in report.failed]
        if failed:
            raise AirflowException(f"{self.action}: actions failed: " + "; ".join(failed))
        return {"action": self.action, "plan": plan.name, "node": self.node, "shards": shards, "summary": lines,
                "converged": all(report.converged for report in reports)}


def set_run_note(log: Any, ti: Any, summary: str) -> None:
    """Best effort: set the DAG run's note through the public REST API (the task SDK cannot).

    Needs the Airflow connection ``tandem_airflow_api`` (host = API URL, login, password); without
    it the summary stays in the task log only.
    """
    try:
        from airflow.sdk import Connection

        conn = Connection.get("tandem_airflow_api")
    except Exception:  # noqa: BLE001 - not defined: the log has the summary
        log.info("no Airflow connection 'tandem_airflow_api': the summary is in this log only")
        return
    try:
        from tandem.airflow_rest import AirflowClient

        if not conn.login or not conn.password:
            log.info("the Airflow connection 'tandem_airflow_api' has no login and password: the summary is in "
                     "this log only")
            return
        base = conn.host if "://" in (conn.host or "") else f"http://{conn.host}:{conn.port or 8080}"
        client = AirflowClient(base.rstrip("/"), conn.login, conn.password, timeout_s=10)
        response = client.request("PATCH", f"/dags/{ti.dag_id}/dagRuns/{ti.run_id}",
                                  params={"update_mask": "note"}, json={"note": summary[:1000]})
        if response.ok:
            log.info("run note set")
        else:
            log.warning("could not set the run note: %s %s", response.status_code, response.text[:200])
    except Exception as exc:  # noqa: BLE001 - best effort: never fail the task for its note
        log.warning("could not set the run note: %s", exc)


SNAPSHOT_RUN_TIMEOUT_S = 1800.0


def _paused(ti: Any, dag_id: str) -> bool:
    """Whether ``dag_id`` is paused: the scheduler starts no run of a paused DAG, triggered ones included."""
    return bool(ti.get_dag(dag_id).is_paused)


def snapshot_on_hosts(log: Any, plan: Any, shard_id: str, ti: Any, *, poll_s: float = 2.0) -> dict[str, Any]:
    """Snapshot now through a run of ``tandem_<plan>_snapshot`` (one shard, or every shard when empty),
    so that each snapshot runs on a live standby's host as scheduled ones do; wait for the run and
    report where each shard's snapshot ran. Fails when the run fails."""
    import time
    import uuid

    from tandem.airflow.node_launch import FINISHED, TriggerRefused, dag_run_state, state_text, trigger_dag_run

    dag_id = plan_dag_id(plan.name, "snapshot")
    run_id = f"tandem_snapshot_now__{shard_id or 'all'}__{uuid.uuid4().hex[:8]}"
    try:
        trigger_dag_run(ti, dag_id, run_id, {"shard_id": shard_id}, f"snapshot_now of {shard_id or 'every shard'}")
    except TriggerRefused as exc:
        raise AirflowFailException(f"could not trigger {dag_id}: {exc}") from None
    log.info("snapshot_now: waiting for %s run %s", dag_id, run_id)
    deadline = time.monotonic() + SNAPSHOT_RUN_TIMEOUT_S
    state = dag_run_state(ti, dag_id, run_id)
    while state not in FINISHED and time.monotonic() < deadline:
        time.sleep(poll_s)
        state = dag_run_state(ti, dag_id, run_id)
    task_ids = [snapshot_task_id(s, n) for s in ([shard_id] if shard_id else plan.shards) for n in plan.nodes]
    states = (ti.get_task_states(dag_id=dag_id, task_ids=task_ids, run_ids=[run_id]) or {}).get(run_id) or {}
    ran = sorted(task for task, task_state in states.items() if state_text(task_state) not in ("skipped", "None", ""))
    summary = f"snapshot_now {plan.name} {shard_id or 'every shard'}: {dag_id} run {run_id} {state}; " \
              f"snapshot tasks that ran: {', '.join(ran) or 'none (no ACTIVE instance)'}"
    log.info("%s", summary)
    set_run_note(log, ti, summary)
    if state != "success":
        raise AirflowFailException(summary if state in FINISHED else
                                   f"{summary} (not finished after {SNAPSHOT_RUN_TIMEOUT_S:.0f}s)")
    return {"plan": plan.name, "dag_id": dag_id, "run_id": run_id, "state": state, "snapshot_tasks": ran}


def take_snapshots(log: Any, cluster: ClusterConfig, plan: Any, shards: list[str], ti: Any, *,
                   node: str | None = None) -> dict[str, Any]:
    """Snapshot each shard's ACTIVE instance (or ``node``'s); fail the task when one is BAD, skip when none runs."""
    from airflow.sdk.exceptions import AirflowSkipException

    from tandem.errors import SnapshotError
    from tandem.snapshots.take import snapshot_session, take_snapshot

    unknown = [s for s in shards if s not in plan.shards]
    if unknown:
        raise AirflowFailException(f"{plan.path}: shards: {', '.join(unknown)} not in the plan's shards")
    spark = snapshot_session(cluster, plan)  # at nice 10: background work, the running queries keep the CPU first
    taken, skipped, lines = [], [], []
    try:
        for shard in shards:
            try:
                snapshot = take_snapshot(cluster, plan, shard, spark, node=node)
            except SnapshotError as exc:
                if "has no ACTIVE instance" in str(exc) or "nothing to snapshot" in str(exc):
                    log.warning("%s/%s: %s", plan.name, shard, exc)
                    skipped.append(shard)
                    lines.append(f"{shard}: skipped: {exc}")
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
    """Choose the host that snapshots one shard: follow the task ``snapshot_<shard>_on_<node>`` of that host.

    :func:`tandem.supervisor.decisions.snapshot_node` decides: a live standby's host (the snapshot
    then costs the ACTIVE's host nothing), else the ACTIVE's own; with no ACTIVE, every snapshot
    task of the shard is skipped.

    :param plan: plan name.
    :param shard_id: the shard.
    :param selected_shard: the shard the run was triggered for; empty: every shard. Templated.
    """

    template_fields = ("selected_shard",)
    ui_color = "#dcecf5"

    def __init__(self, *, plan: str, shard_id: str, selected_shard: str = "", cluster_config: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.shard_id = shard_id
        self.selected_shard = selected_shard
        self.cluster_config = cluster_config

    def choose_branch(self, context: Any) -> str | None:
        from tandem.store.db import Database
        from tandem.supervisor.decisions import snapshot_node
        from tandem.supervisor.observe import observe_shard

        if self.selected_shard and self.selected_shard != self.shard_id:
            self.log.info("this run snapshots %s only", self.selected_shard)
            return None
        cluster = _cluster(self.cluster_config)
        plan = load_plan(self.plan, cluster)
        with Database(cluster.database_url, "tandem-snapshot-host") as db:
            view = observe_shard(db, cluster, plan, self.shard_id).view
        node = snapshot_node(view)
        states = ", ".join(f"{n} {h.role or '-'} {h.state}" for n, h in view.instances.items())
        if node is None:
            self.log.warning("%s/%s: no node holds the ACTIVE lease (%s): nothing to snapshot", plan.name,
                             self.shard_id, states)
            return None
        self.log.info("%s/%s: the ACTIVE instance on %s is snapshotted on %s's host (%s)", plan.name,
                      self.shard_id, view.lease.holder, node, states)
        return snapshot_task_id(self.shard_id, node)


class TakeSnapshotOperator(BaseOperator):
    """Take a snapshot of one shard's ACTIVE instance: cut, state export, validation (GOOD or BAD).

    Fails (no retry) when the snapshot is BAD; skips when no instance of the shard is ACTIVE. It
    runs wherever its task's queue sends it: the scheduled DAG puts one task per node on that
    node's queue (:class:`ChooseSnapshotHostOperator` picks one); the cut reads the ACTIVE's
    checkpoint from the shared storage.

    :param plan: plan name. Templated.
    :param shard_id: the shard. Templated.
    :param node: snapshot this node's instance instead of the ACTIVE one. Templated.
    """

    template_fields = ("plan", "shard_id", "node")
    ui_color = "#dcecf5"

    def __init__(self, *, plan: str, shard_id: str, node: str = "", cluster_config: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.shard_id = shard_id
        self.node = node
        self.cluster_config = cluster_config

    def execute(self, context: Any) -> dict[str, Any]:
        cluster = _cluster(self.cluster_config)
        plan = load_plan(self.plan, cluster)
        return take_snapshots(self.log, cluster, plan, [self.shard_id], context["ti"], node=self.node or None)


class PruneSnapshotsOperator(BaseOperator):
    """Apply snapshot retention to a plan: keep the newest ``snapshot.keep`` GOOD per shard, prune the rest.

    :param plan: plan name. Templated.
    """

    template_fields = ("plan",)
    ui_color = "#dcecf5"

    def __init__(self, *, plan: str, cluster_config: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.cluster_config = cluster_config

    def execute(self, context: Any) -> list[str]:
        from tandem.snapshots.take import prune_snapshots

        cluster = _cluster(self.cluster_config)
        decisions = prune_snapshots(cluster, load_plan(self.plan, cluster)).describe()
        for line in decisions:
            self.log.info("%s", line)
        return decisions


class RestoreSnapshotOperator(BaseOperator):
    """Restore a plan's shards from a snapshot (by id, or each shard's newest GOOD one) and start them.

    A BAD snapshot is refused unless ``force``. The steps go to the log and the run note. The
    restore itself works on the shared storage and PostgreSQL from wherever this task runs; the
    ACTIVE instance, and the standbys after it, are launched on their nodes' hosts through
    ``tandem_<plan>_run`` (:class:`~tandem.airflow.node_launch.NodeQueue`).

    :param plan: plan name. Templated.
    :param shard_id: one shard, or empty for every shard (ignored with a snapshot id). Templated.
    :param snapshot_id: a snapshot id, or empty for the newest GOOD one. Templated.
    :param node: the node to start ACTIVE (default: the node the snapshot was cut from). Templated.
    :param force: restore a BAD snapshot anyway.
    """

    template_fields = ("plan", "shard_id", "snapshot_id", "node", "force")
    ui_color = "#f5ecdc"

    def __init__(self, *, plan: str, shard_id: str = "", snapshot_id: str = "", node: str = "",
                 force: bool | str = False, cluster_config: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.shard_id = shard_id
        self.snapshot_id = snapshot_id
        self.node = node
        self.force = force
        self.cluster_config = cluster_config

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem.airflow.node_launch import NodeQueue
        from tandem.errors import SnapshotError
        from tandem.snapshots.restore import restore_shard, shards_to_restore

        cluster = _cluster(self.cluster_config)
        try:
            plan = load_plan(self.plan, cluster)
            shards = shards_to_restore(cluster, plan, self.snapshot_id, self.shard_id)
        except (ConfigError, SnapshotError) as exc:
            raise AirflowFailException(str(exc)) from None
        force = self.force if isinstance(self.force, bool) else str(self.force).lower() == "true"
        ti = context["ti"]
        lines = []
        for shard in shards:
            try:
                report = restore_shard(cluster, plan, shard, snapshot_id=self.snapshot_id or None, force=force,
                                       node=self.node or None,
                                       launched_by=f"airflow {ti.dag_id}/{ti.run_id}/{ti.task_id}",
                                       node_host=NodeQueue(cluster, plan, ti, await_unconfirmed_stops=True,
                                                           log=self.log))
            except SnapshotError as exc:
                raise AirflowFailException(str(exc)) from None
            for line in report.lines():
                self.log.info("%s", line)
            lines += report.lines()
        set_run_note(self.log, ti, "\n".join(lines))
        return {"plan": plan.name, "shards": shards, "summary": lines}


class CleanLandingOperator(BaseOperator):
    """Delete a plan's landing files that every instance and every kept GOOD snapshot have processed.

    :param plan: plan name. Templated.
    """

    template_fields = ("plan",)
    ui_color = "#e8f5dc"

    def __init__(self, *, plan: str, cluster_config: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = plan
        self.cluster_config = cluster_config

    def execute(self, context: Any) -> dict[str, Any]:
        from tandem.snapshots.landing import clean_plan_landing

        cluster = _cluster(self.cluster_config)
        decisions = clean_plan_landing(cluster, load_plan(self.plan, cluster))
        for partition, decision in decisions.items():
            for line in decision.describe() or ["no landing files"]:
                self.log.info("landing/%s: %s", partition, line)
        return {partition: len(decision.delete) for partition, decision in decisions.items()}
