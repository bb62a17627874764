"""A supervisor inside Airflow acts on a node through that node's queue, i.e. on the node's own host.

Purpose
    The supervisor runs in a task on the control host (``tandem_<plan>_supervise``,
    ``tandem_ops``, ``tandem_restore``); what a node does must happen on the node's host.
    :class:`NodeQueue` is the supervisor's :class:`~tandem.supervisor.node_actions.NodeHost`: it
    triggers a run of ``tandem_<plan>_run`` for the node, whose task runs on the node's Airflow
    queue (served by the worker on that host, see ``airflow_queue`` in ``cluster.yaml``), and waits
    for that run.

How it works
    The run is created through the Task SDK (the same Execution API call as
    ``TriggerDagRunOperator``), with the request in its conf: the action, node, instance, role, the
    node to re-sync from, and a deadline. A relaunch runs
    :func:`~tandem.supervisor.node_actions.resync_then_launch` on the host (which first stops
    what is left of the instance there) and waits for RUNNING.

    A stop first goes through PostgreSQL from here (the driver obeys the request with its next
    beat). Only when that is not confirmed does the stop run on the node's host, where
    :func:`~tandem.supervisor.stopping.stop_instance` signals the instance's processes:

    - the driver beats but does not stop: its host is up, and the supervisor waits for the stop
      there;
    - it no longer beats: its host is down or cut off (nothing will run the task, which expires),
      or the driver hangs (the host's worker ends it within seconds). The stop is requested there
      and the supervisor goes on, so that a failover never waits for a dead host; a restore,
      which rewrites the checkpoints next, waits (``await_unconfirmed_stops``).

    If no worker starts the task before the deadline (the node's host is down), the supervisor
    gives up on that action; the task refuses if a worker picks it up later, because the
    supervisor has decided again since.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

from tandem.airflow.dags import RELAUNCH, STOP, human_duration, launch_task_id, stop_task_id
from tandem.config import ClusterConfig, PlanConfig
from tandem.names import plan_dag_id
from tandem.store.db import Database
from tandem.store.registry import get_instance
from tandem.supervisor.launcher import LaunchedJob, LaunchError, instance_key
from tandem.supervisor.node_actions import NodeLaunch
from tandem.supervisor.stopping import StopResult, stop_instance

FINISHED = ("success", "failed")


class NodeQueue:
    """The :class:`~tandem.supervisor.node_actions.NodeHost` of a supervisor that runs in an Airflow task.

    Args:
        ti: the running task instance (its DAG run is named in the note of the runs it triggers).
        start_timeout_s: how long a worker of the node's queue may take to start a launch task:
            the request's deadline on the node's host.
        running_timeout_s: how long the launched instance may then take to report RUNNING.
        stop_start_timeout_s: the same deadline for a stop on the node's host (a live worker takes a
            task within seconds; a host that is down should not hold the supervisor long).
        await_unconfirmed_stops: also wait for the host's stop of an instance that no longer beats
            (a restore, which rewrites the checkpoints next); the supervisor does not, so that a
            failover never waits for a host that is down.
    """

    def __init__(self, cluster: ClusterConfig, plan: PlanConfig, ti: Any, *, start_timeout_s: float = 120.0,
                 running_timeout_s: float = 300.0, stop_start_timeout_s: float = 30.0,
                 await_unconfirmed_stops: bool = False, log: logging.Logger | logging.LoggerAdapter,
                 poll_s: float = 1.0) -> None:
        self.cluster = cluster
        self.plan = plan
        self.ti = ti
        self.start_timeout_s = start_timeout_s
        self.running_timeout_s = running_timeout_s
        self.stop_start_timeout_s = stop_start_timeout_s
        self.await_unconfirmed_stops = await_unconfirmed_stops
        self.log = log
        self.poll_s = poll_s

    @property
    def run_dag(self) -> str:
        """The plan's run DAG, whose runs launch and stop nodes on their hosts."""
        return plan_dag_id(self.plan.name, "run")

    def launch(self, instance: str, node: str, role: str, resync_from: str | None) -> NodeLaunch:
        conf = {"role": role, "resync_from": resync_from or "",
                "trigger_interval": human_duration(self.plan.trigger_interval_s)}
        run_id = self._trigger(RELAUNCH, instance, node, conf, f"{role} on {node} for {instance}", self.start_timeout_s)
        dag_id, task_id = self.run_dag, launch_task_id(node)
        state = self._wait(dag_id, run_id, task_id, self.start_timeout_s, self.running_timeout_s)
        if state == "failed":
            raise LaunchError(f"the launch of {node} failed on its host: see {dag_id} run {run_id}, task {task_id}")
        if state != "success":
            raise LaunchError(f"the launch of {node} did not end within "
                              f"{self.start_timeout_s + self.running_timeout_s:g}s ({dag_id} run {run_id} is "
                              f"{state}): is a worker of {self._queue(node)} up on {node}'s host?")
        row = self._row(instance, node)
        if row is None:
            raise LaunchError(f"{dag_id} run {run_id} succeeded but {node} has no instance row")
        return NodeLaunch(LaunchedJob.from_row(row, reused=False, reason=f"{dag_id} run {run_id}"), None)

    def stop(self, instance: str, node: str, timeout_s: float) -> StopResult:
        requested_by = f"airflow {self.ti.dag_id}/{self.ti.run_id}/{self.ti.task_id}"
        row = self._row(instance, node)
        launch = row["launched_at"].isoformat() if row and row["launched_at"] else ""  # a later one is left alone
        unconfirmed = None
        try:
            stopped = stop_instance(self.cluster, self.plan, instance, node, timeout_s=timeout_s,
                                    requested_by=requested_by)
        except LaunchError as exc:  # it beats (its host is up) but has not obeyed its stop request
            why = str(exc)
        else:
            if stopped.confirmed:
                return stopped
            unconfirmed, why = stopped, stopped.detail
        self.log.warning("%s/%s %s: %s; stopping it on its host", self.plan.name, instance, node, why)
        run_id = self._trigger(STOP, instance, node, {"stop_timeout": human_duration(timeout_s), "launched_at": launch},
                               f"stop {node} for {instance}", self.stop_start_timeout_s)
        where = f"{self.run_dag} run {run_id}"
        if unconfirmed is not None and not self.await_unconfirmed_stops:
            # no beat: its host is down (nothing runs the task; it expires) or its driver hangs (the
            # host's worker ends it within seconds). Either way no one needs to wait for it.
            return replace(unconfirmed, detail=f"{why}; a stop on its host was requested ({where})")
        state = self._wait(self.run_dag, run_id, stop_task_id(node), self.stop_start_timeout_s,
                           timeout_s + 30)
        if state == "success":
            row = self._row(instance, node)
            return StopResult(row["instance_id"], row["status"], False, f"{why}; stopped on its host by {where}")
        if unconfirmed is not None:  # nothing answers on its host either: most likely it is down
            return replace(unconfirmed, detail=f"{why}; the stop on its host did not run ({where} is {state})")
        raise LaunchError(f"{why}; the stop on its host did not run either ({where} is {state})")

    def _trigger(self, action: str, instance: str, node: str, conf: dict[str, Any], what: str,
                 start_timeout_s: float) -> str:
        """Trigger ``action`` for ``node`` in ``tandem_<plan>_run`` with a deadline; its run id."""
        dag_id = self.run_dag
        run_id = f"tandem_{action}__{node}__{instance}__{uuid.uuid4().hex[:8]}"
        deadline = datetime.now(timezone.utc) + timedelta(seconds=start_timeout_s)
        conf = {"action": action, "node": node, "instance": instance, "expires_at": deadline.isoformat(), **conf}
        try:
            trigger_dag_run(self.ti, dag_id, run_id, conf, what)
        except TriggerRefused as exc:
            raise LaunchError(f"could not trigger {dag_id} for {node}: {exc}") from None
        task_id = (stop_task_id if action == STOP else launch_task_id)(node)
        self.log.info("%s %s/%s on %s through %s run %s (task %s on %s)", action, self.plan.name, instance, node,
                      dag_id, run_id, task_id, self._queue(node))
        return run_id

    def _queue(self, node: str) -> str:
        return self.cluster.node(node).airflow_queue or "the default queue"

    def _row(self, instance: str, node: str) -> dict | None:
        with Database(self.cluster.database_url, "tandem-supervisor") as db:
            return get_instance(db, instance_key(self.plan, instance, node).id)

    def _wait(self, dag_id: str, run_id: str, task_id: str, start_timeout_s: float, run_timeout_s: float) -> str:
        """The run's final state, or its state when its task did not start in time (the node's host is
        down or its worker does not serve the queue) or the run did not end in time."""
        start = time.monotonic()
        state = "queued"
        while True:
            state = dag_run_state(self.ti, dag_id, run_id)
            if state in FINISHED:
                return state
            waited = time.monotonic() - start
            if waited > start_timeout_s + 10 and not self._started(dag_id, run_id, task_id):
                return f"{state}, its task {task_id} not started after {waited:.0f}s"
            if waited > start_timeout_s + run_timeout_s + 30:
                return state
            time.sleep(self.poll_s)

    def _started(self, dag_id: str, run_id: str, task_id: str) -> bool:
        return task_started(self.ti.get_task_states(dag_id=dag_id, task_ids=[task_id], run_ids=[run_id]),
                            run_id, task_id)


class TriggerRefused(Exception):
    """The Execution API refused to create a DAG run."""


def trigger_dag_run(ti: Any, dag_id: str, run_id: str, conf: dict[str, Any], what: str) -> None:
    """Create a run of ``dag_id`` from inside a running task (the Execution API call of
    ``TriggerDagRunOperator``), its note saying ``what`` and which run asked for it."""
    from airflow.sdk.execution_time.comms import ErrorResponse, TriggerDagRun
    from airflow.sdk.execution_time.task_runner import SUPERVISOR_COMMS

    response = SUPERVISOR_COMMS.send(TriggerDagRun(
        dag_id=dag_id, run_id=run_id, conf=conf, logical_date=None, reset_dag_run=False,
        note=f"{what}, requested by {ti.dag_id}/{ti.run_id}"))
    if isinstance(response, ErrorResponse):
        raise TriggerRefused(f"{response.error} {response.detail or ''}".strip())


def state_text(state: Any) -> str:
    """A state the Execution API reports (an enum, a string or ``None``) as text: ``success``, ``None``, ..."""
    return str(getattr(state, "value", state))


def dag_run_state(ti: Any, dag_id: str, run_id: str) -> str:
    """A DAG run's state as text (``queued``, ``running``, ``success``, ``failed``)."""
    return state_text(ti.get_dagrun_state(dag_id=dag_id, run_id=run_id))


NOT_STARTED = frozenset({"None", "", "scheduled", "queued"})


def task_started(states: dict[str, dict[str, Any]], run_id: str, task_id: str) -> bool:
    """Whether a worker has taken the task, from the Execution API's ``{run_id: {task_id: state}}`` (pure)."""
    return state_text((states.get(run_id) or {}).get(task_id)) not in NOT_STARTED
