"""Nodes and plan instances: who runs what, where, and how to find the job again."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem.config import ClusterConfig
from tandem.store.db import Database


def instance_id(plan: str, shard_id: str, node: str) -> str:
    """The stable id of a plan instance: ``<plan>/<shard_id>/<node>``."""
    return f"{plan}/{shard_id}/{node}"


@dataclass(frozen=True)
class InstanceKey:
    plan: str
    shard_id: str
    node: str

    @property
    def id(self) -> str:
        return instance_id(self.plan, self.shard_id, self.node)


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


def record_launch(db: Database, key: InstanceKey, *, submit_pid: int, log_path: str, launched_by: str,
                  trigger_interval_s: float, checkpoint_root: str) -> None:
    """Record that a launcher started ``spark-submit`` for an instance (status LAUNCHING)."""
    db.run(lambda cursor: cursor.execute(
        """INSERT INTO plan_instances (instance_id, plan, shard_id, node, status, submit_pid, pid, log_path,
                                       launched_by, launched_at, trigger_interval_s, checkpoint_root,
                                       error, stopped_at, started_at, updated_at)
           VALUES (%s, %s, %s, %s, 'LAUNCHING', %s, NULL, %s, %s, now(), %s, %s, NULL, NULL, NULL, now())
           ON CONFLICT (instance_id) DO UPDATE SET
               status = 'LAUNCHING', submit_pid = EXCLUDED.submit_pid, pid = NULL, log_path = EXCLUDED.log_path,
               launched_by = EXCLUDED.launched_by, launched_at = now(),
               trigger_interval_s = EXCLUDED.trigger_interval_s, checkpoint_root = EXCLUDED.checkpoint_root,
               error = NULL, stopped_at = NULL, started_at = NULL, spark_app_id = NULL, updated_at = now()""",
        (key.id, key.plan, key.shard_id, key.node, submit_pid, log_path, launched_by, trigger_interval_s,
         checkpoint_root),
    ))


def record_start(db: Database, key: InstanceKey, *, host: str, pid: int, spark_app_id: str,
                 trigger_interval_s: float, checkpoint_root: str) -> None:
    """The driver announces itself (status STARTING): host, PID and Spark application id."""
    db.run(lambda cursor: cursor.execute(
        """INSERT INTO plan_instances (instance_id, plan, shard_id, node, status, host, pid, spark_app_id,
                                       trigger_interval_s, checkpoint_root, started_at, updated_at)
           VALUES (%s, %s, %s, %s, 'STARTING', %s, %s, %s, %s, %s, now(), now())
           ON CONFLICT (instance_id) DO UPDATE SET
               status = 'STARTING', host = EXCLUDED.host, pid = EXCLUDED.pid, spark_app_id = EXCLUDED.spark_app_id,
               trigger_interval_s = EXCLUDED.trigger_interval_s, checkpoint_root = EXCLUDED.checkpoint_root,
               started_at = now(), stopped_at = NULL, error = NULL, updated_at = now()""",
        (key.id, key.plan, key.shard_id, key.node, host, pid, spark_app_id, trigger_interval_s, checkpoint_root),
    ))


def record_status(db: Database, key: InstanceKey, status: str, error: str | None = None) -> None:
    """Move an instance to RUNNING, STOPPED or FAILED (with the error text)."""
    stopped = status in ("STOPPED", "FAILED")
    db.run(lambda cursor: cursor.execute(
        """UPDATE plan_instances SET status = %s, error = %s, updated_at = now(),
                  stopped_at = CASE WHEN %s THEN now() ELSE stopped_at END
           WHERE instance_id = %s""",
        (status, error, stopped, key.id),
    ))


def get_instance(db: Database, instance: str) -> dict[str, Any] | None:
    def work(cursor):
        cursor.execute(
            """SELECT i.*, l.beat_at, l.beats, EXTRACT(EPOCH FROM now() - l.beat_at) AS beat_age_s
               FROM plan_instances i LEFT JOIN liveness l USING (instance_id) WHERE i.instance_id = %s""",
            (instance,),
        )
        return cursor.fetchone()

    return db.run(work)


def list_instances(db: Database, plan: str | None = None) -> list[dict[str, Any]]:
    def work(cursor):
        cursor.execute(
            """SELECT i.*, l.beat_at, l.beats, EXTRACT(EPOCH FROM now() - l.beat_at) AS beat_age_s
               FROM plan_instances i LEFT JOIN liveness l USING (instance_id)
               WHERE %s::text IS NULL OR i.plan = %s ORDER BY i.plan, i.shard_id, i.node""",
            (plan, plan),
        )
        return cursor.fetchall()

    return db.run(work)
