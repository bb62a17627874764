"""What Tandem's operators share: the cluster configuration, resolved when a task runs, the group instance a
run asks for, and the run note.

Every operator resolves the cluster configuration at run time (``cluster_config``, a path to
``cluster.yaml``, or the environment), so DAG files stay free of I/O beyond reading ``conf/``.
Errors a retry cannot fix (bad Params, unknown node or instance, failed validation) raise
``AirflowFailException``; anything else may be retried.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from tandem.config import ClusterConfig, load_cluster

DEPRECATED_INSTANCE_KEY = "shard_id"
"""The former name of the Param ``instance`` of ``tandem_ops`` and ``tandem_restore``: a run triggered with it
(by a client older than the rename) is obeyed until the next release."""


def task_cluster(path: str | None) -> ClusterConfig:
    """The cluster configuration of a task: ``path`` (an operator's ``cluster_config``), else the environment's."""
    return load_cluster(Path(path) if path else None)


def requested_instance(log: Any, instance: str, params: Mapping[str, Any]) -> str:
    """The group instance a run asks for: the Param ``instance``, else the deprecated conf key ``shard_id``
    (empty: every instance). Both given and different: ``AirflowFailException`` (no retry can fix it)."""
    former = str(params.get(DEPRECATED_INSTANCE_KEY) or "")
    if not former:
        return instance
    if instance and instance != former:
        raise AirflowFailException(f"the conf gives instance {instance!r} and {DEPRECATED_INSTANCE_KEY} {former!r} "
                                   f"(its deprecated name): give instance only")
    log.warning("the conf key %s is deprecated: name the group instance with instance", DEPRECATED_INSTANCE_KEY)
    return former


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
