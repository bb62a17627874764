"""Nodes and plan instances: who runs what, where, and how to find the job again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tandem.store.db import Database, storable_text

if TYPE_CHECKING:
    from tandem.config import ClusterConfig


def instance_id(plan: str, instance: str, node: str) -> str:
    """The stable id of a plan instance: ``<plan>/<instance>/<node>``."""
    return f"{plan}/{instance}/{node}"


@dataclass(frozen=True)
class InstanceKey:
    plan: str
    instance: str
    node: str

    @property
    def id(self) -> str:
        return instance_id(self.plan, self.instance, self.node)


def register_nodes(db: Database, cluster: ClusterConfig) -> None:
    """Upsert every node of ``cluster.yaml`` into ``tandem.nodes``."""

    def work(cursor) -> None:
        for node in cluster.nodes.values():
            cursor.execute(
                """INSERT INTO nodes (name, spark_master, airflow_conn_id) VALUES (%s, %s, %s)
                   ON CONFLICT (name) DO UPDATE
                   SET spark_master = EXCLUDED.spark_master, airflow_conn_id = EXCLUDED.airflow_conn_id""",
                (node.name, node.spark_master, node.airflow_conn_id),
            )

    db.run(work)


def record_launch(db: Database, key: InstanceKey, *, submit_pid: int, submit_started_at: float | None, log_path: str,
                  launched_by: str, trigger_interval_s: float, checkpoint_root: str, host: str | None = None,
                  host_id: str | None = None) -> None:
    """Record that a launcher started ``spark-submit`` for an instance (status LAUNCHING).

    ``submit_started_at`` is the process's start time in seconds from boot (:mod:`tandem.process_start`): a PID
    alone names whichever process has it now, and nothing is ever signalled unless both still match. ``host`` and
    ``host_id`` (:mod:`tandem.host_identity`): where it runs (not given: the host recorded before stays).
    """
    db.run(lambda cursor: cursor.execute(
        """INSERT INTO plan_instances (instance_id, plan, instance, node, status, submit_pid, submit_started_at,
                                       pid, pid_started_at, log_path, launched_by, launched_at, trigger_interval_s,
                                       checkpoint_root, error, stopped_at, started_at, updated_at, host, host_id)
           VALUES (%s, %s, %s, %s, 'LAUNCHING', %s, %s, NULL, NULL, %s, %s, now(), %s, %s, NULL, NULL, NULL, now(),
                   %s, %s)
           ON CONFLICT (instance_id) DO UPDATE SET
               status = 'LAUNCHING', submit_pid = EXCLUDED.submit_pid, submit_started_at = EXCLUDED.submit_started_at,
               host = COALESCE(EXCLUDED.host, plan_instances.host),
               host_id = CASE WHEN EXCLUDED.host IS NULL THEN plan_instances.host_id ELSE EXCLUDED.host_id END,
               pid = NULL, pid_started_at = NULL, log_path = EXCLUDED.log_path,
               launched_by = EXCLUDED.launched_by, launched_at = now(),
               trigger_interval_s = EXCLUDED.trigger_interval_s, checkpoint_root = EXCLUDED.checkpoint_root,
               error = NULL, stopped_at = NULL, started_at = NULL, spark_app_id = NULL,
               stop_requested_at = NULL, stop_requested_by = NULL, updated_at = now()""",
        (key.id, key.plan, key.instance, key.node, submit_pid, submit_started_at, log_path, launched_by,
         trigger_interval_s, checkpoint_root, host, host_id),
    ))


def record_start(db: Database, key: InstanceKey, *, host: str, pid: int, pid_started_at: float,
                 ancestors: list[int], spark_app_id: str, trigger_interval_s: float, checkpoint_root: str,
                 plan_version: str | None = None, host_id: str | None = None) -> None:
    """The driver announces itself (status STARTING): host and its identity (:mod:`tandem.host_identity`), PID and
    its start time, Spark application id, the version of the plan it runs (:mod:`tandem.plan_version`).

    The recorded ``submit_pid`` is kept only when it is one of the driver's ``ancestors`` (the
    launcher's ``spark-submit`` is the driver's parent JVM). A driver started by hand clears it:
    the PID of an earlier launch may belong to any process by now. A stop request is kept while
    the run it was made against may still be starting (LAUNCHING); one left over from an ended run
    is cleared.
    """
    db.run(lambda cursor: cursor.execute(
        """INSERT INTO plan_instances (instance_id, plan, instance, node, status, host, host_id, pid, pid_started_at,
                                       spark_app_id, trigger_interval_s, checkpoint_root, plan_version, started_at,
                                       updated_at)
           VALUES (%(id)s, %(plan)s, %(instance)s, %(node)s, 'STARTING', %(host)s, %(host_id)s, %(pid)s,
                   %(pid_started_at)s, %(app)s, %(interval)s, %(checkpoint)s, %(version)s, now(), now())
           ON CONFLICT (instance_id) DO UPDATE SET
               status = 'STARTING', host = EXCLUDED.host, host_id = EXCLUDED.host_id, pid = EXCLUDED.pid,
               pid_started_at = EXCLUDED.pid_started_at,
               submit_pid = CASE WHEN plan_instances.submit_pid = ANY(%(ancestors)s) THEN plan_instances.submit_pid END,
               submit_started_at = CASE WHEN plan_instances.submit_pid = ANY(%(ancestors)s)
                                        THEN plan_instances.submit_started_at END,
               spark_app_id = EXCLUDED.spark_app_id,
               trigger_interval_s = EXCLUDED.trigger_interval_s, checkpoint_root = EXCLUDED.checkpoint_root,
               plan_version = EXCLUDED.plan_version,
               stop_requested_at = CASE WHEN plan_instances.status IN ('STOPPED', 'FAILED', 'BLOCKED') THEN NULL
                                        ELSE plan_instances.stop_requested_at END,
               stop_requested_by = CASE WHEN plan_instances.status IN ('STOPPED', 'FAILED', 'BLOCKED') THEN NULL
                                        ELSE plan_instances.stop_requested_by END,
               started_at = now(), stopped_at = NULL, error = NULL, updated_at = now()""",
        {"id": key.id, "plan": key.plan, "instance": key.instance, "node": key.node, "host": host, "host_id": host_id,
         "pid": pid,
         "pid_started_at": pid_started_at, "ancestors": list(ancestors), "app": spark_app_id,
         "interval": trigger_interval_s, "checkpoint": checkpoint_root, "version": plan_version},
    ))


def record_takeover(db: Database, key: InstanceKey) -> None:
    """A warm standby that took the lease starts its queries: STARTING again, its run's clock from now (its
    first micro-batch is judged from here, not from when its session was built)."""
    db.run(lambda cursor: cursor.execute(
        "UPDATE plan_instances SET status = 'STARTING', started_at = now(), updated_at = now() WHERE instance_id = %s",
        (key.id,)))


def record_status(db: Database, key: InstanceKey, status: str, error: str | None = None, *,
                  failure: str | None = None) -> None:
    """Move an instance to RUNNING, STOPPED or FAILED (with the error text).

    A FAILED run also records its ``failure``: what failed, in words that are the same when it
    fails again the same way (the query, the batch of its checkpoint, the error's first line).
    ``failure_repeats`` counts the runs in a row that failed with it (see :func:`block`).
    """
    stopped = status in ("STOPPED", "FAILED")
    db.run(lambda cursor: cursor.execute(
        """UPDATE plan_instances SET status = %(status)s, error = %(error)s, updated_at = now(),
                  stopped_at = CASE WHEN %(stopped)s THEN now() ELSE stopped_at END,
                  failure_repeats = CASE WHEN %(status)s <> 'FAILED' THEN failure_repeats
                                         WHEN failure = %(failure)s THEN failure_repeats + 1 ELSE 1 END,
                  failure = CASE WHEN %(status)s = 'FAILED' THEN %(failure)s ELSE failure END
           WHERE instance_id = %(id)s""",
        {"status": status, "error": storable_text(error), "stopped": stopped, "failure": storable_text(failure),
         "id": key.id},
    ))


def block(db: Database, key: InstanceKey, reason: str) -> bool:
    """Mark a FAILED instance BLOCKED (its failure repeats: relaunching it again would fail again).

    Returns whether it was FAILED (a run that started since is left alone).
    """
    def work(cursor) -> bool:
        cursor.execute("UPDATE plan_instances SET status = 'BLOCKED', error = %s, updated_at = now() "
                       "WHERE instance_id = %s AND status = 'FAILED'", (storable_text(reason), key.id))
        return cursor.rowcount == 1

    return db.run(work)


def clear_failures(db: Database, key: InstanceKey) -> None:
    """Forget an instance's failures (an operator restarts the node): a BLOCKED instance counts as STOPPED."""
    db.run(lambda cursor: cursor.execute(
        """UPDATE plan_instances SET failure = NULL, failure_repeats = 0,
                  status = CASE WHEN status = 'BLOCKED' THEN 'STOPPED' ELSE status END, updated_at = now()
           WHERE instance_id = %s""", (key.id,)))


def request_stop(db: Database, key: InstanceKey, requested_by: str) -> bool:
    """Ask the instance's driver, wherever it runs, to stop (it reads the request with its next beat).

    Returns whether there was a run to ask (status LAUNCHING, STARTING or RUNNING). A request made
    again keeps its first time; a new launch clears it.
    """
    def work(cursor) -> bool:
        cursor.execute(
            """UPDATE plan_instances SET stop_requested_at = COALESCE(stop_requested_at, now()),
                      stop_requested_by = COALESCE(stop_requested_by, %s), updated_at = now()
               WHERE instance_id = %s AND status IN ('LAUNCHING', 'STARTING', 'RUNNING')""",
            (requested_by, key.id))
        return cursor.rowcount == 1

    return db.run(work)


def get_instance(db: Database, instance: str) -> dict[str, Any] | None:
    def work(cursor):
        cursor.execute(
            """SELECT i.*, l.beat_at, l.beats, EXTRACT(EPOCH FROM now() - l.beat_at) AS beat_age_s
               FROM plan_instances i LEFT JOIN liveness l USING (instance_id) WHERE i.instance_id = %s""",
            (instance,),
        )
        return cursor.fetchone()

    return db.run(work)
