"""The ``spark-submit`` command of a plan instance and the environment its driver starts with.

:func:`build_submit_command` assembles the command with the apache-spark provider's
``SparkSubmitHook``: the master comes from the node's Airflow connection, or from ``spark_master``
in ``cluster.yaml`` when no connection is available (e.g. from the CLI). The application is
``jobs/run_plan.py`` with :func:`application_args`; :func:`child_environment` is all the driver
gets of its launcher's environment (:data:`DRIVER_ENVIRONMENT`), with its temporary files in the
instance's own :func:`scratch_dir`.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem.config import ClusterConfig, NodeConfig, spark_interval
from tandem.layout import make_private_dirs, place_under
from tandem.names import ACTIVE
from tandem.redaction import redact_command
from tandem.store.registry import InstanceKey

APPLICATION_SCRIPT = "run_plan.py"
DRIVER_ENVIRONMENT = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH",  # the process
    "JAVA_HOME", "HADOOP_CONF_DIR", "YARN_CONF_DIR",  # spark-submit and the JVM
    "PYTHONPATH", "PYTHONHASHSEED",  # the Python driver and its workers
    "SSL_CERT_FILE", "SSL_CERT_DIR",  # the CAs TLS connections trust (NATS's), when not the system's
    "TANDEM_LOG_FORMAT",  # text or json lines in the driver's log (tandem.logs)
})
"""The variables a driver takes from its launcher's environment as they are, besides ``LC_*`` and ``SPARK_*``
(:data:`DRIVER_ENVIRONMENT_PREFIXES`). Nothing else passes: not Airflow's settings and secrets
(``AIRFLOW__API_AUTH__JWT_SECRET``, ``AIRFLOW_CONN_*``), not the other ``TANDEM_*`` variables
(``TANDEM_AIRFLOW_DB_URL`` may hold a password), not a parent driver's ``PYSPARK_GATEWAY_SECRET``. Java
options go through ``conf/spark-defaults.conf`` (``spark.driver.extraJavaOptions``) or ``SPARK_SUBMIT_OPTS``."""
DRIVER_ENVIRONMENT_PREFIXES = ("LC_", "SPARK_")
SHORT_LIVED_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
"""``SPARK_SUBMIT_OPTS`` for drivers that live seconds to minutes (the test suite's, the demo's): C1 only, since C2's
compiles never pay off in that time (a trades driver at 200 trades a second: 49.6 CPU s a minute with C1, 57.7
with both compilers: bench/results/driver_cost.json; 42.2 against 53.8 on a faster host). C1 alone gets a code cache of
48 MB, which a test worker's session filled after three modules of stateful queries ("Out of space in CodeCache for
adapters"): it gets the tiered default's 240 MB. A plan run for real keeps the JVM's default."""


@dataclass(frozen=True)
class SubmitCommand:
    """A ``spark-submit`` command line and where its master URL came from."""

    argv: list[str]
    master: str
    master_source: str


def application_args(key: InstanceKey, trigger_interval_s: float, role: str = ACTIVE) -> list[str]:
    """The arguments of ``jobs/run_plan.py`` for one instance."""
    return ["--plan", key.plan, "--node", key.node, "--instance", key.instance,
            "--trigger-interval", spark_interval(trigger_interval_s), "--role", role]


def build_submit_command(cluster: ClusterConfig, node: NodeConfig, key: InstanceKey, trigger_interval_s: float, *,
                         py_files: Path, application: Path, role: str = ACTIVE) -> SubmitCommand:
    """The ``spark-submit`` command of one instance, assembled by the provider's ``SparkSubmitHook``.

    The master comes from the node's Airflow connection (``node.airflow_conn_id``); when that
    connection cannot be read (not defined, or no Airflow around), from ``node.spark_master``.
    """
    hook = _node_submit_hook(
        fallback_master=node.spark_master,
        conn_id=node.airflow_conn_id,
        properties_file=str(cluster.spark_defaults),
        py_files=str(py_files),
        driver_memory=node.driver_memory,
        name=f"tandem:{key.id}",
        application_args=application_args(key, trigger_interval_s, role),
    )
    argv = hook._build_spark_submit_command(str(application))
    if hook.connection_error is None:
        source = f"Airflow connection {node.airflow_conn_id!r}"
    else:
        source = f"cluster.yaml nodes.{node.name}.spark_master (connection {node.airflow_conn_id!r} unavailable)"
    return SubmitCommand(argv=argv, master=hook._connection["master"], master_source=source)


def _node_submit_hook(*, fallback_master: str, **kwargs: Any):
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk import Connection

    class NodeSparkSubmitHook(SparkSubmitHook):
        """``SparkSubmitHook`` that reads the node's ``spark_master`` when its connection is unavailable, and
        logs its command without secrets.

        The stand-in is an ordinary ``spark`` connection whose host is the master URL, so the
        provider resolves it exactly as one defined in Airflow.
        """

        def __init__(self, **hook_kwargs: Any) -> None:
            self.connection_error: str | None = "not looked up"
            super().__init__(**hook_kwargs)

        def _mask_cmd(self, connection_cmd: str | list[str]) -> str:
            """The command (or a line of spark-submit's output) as the provider logs it: Tandem's redaction
            (secret URLs and settings), then the provider's own masking."""
            return super()._mask_cmd(redact_command([connection_cmd] if isinstance(connection_cmd, str)
                                                    else list(connection_cmd)))

        def get_connection(self, conn_id: str):  # shadows the classmethod for this hook's lookup
            try:
                connection = SparkSubmitHook.get_connection(conn_id)
            except Exception as exc:  # not defined, or no Airflow secrets/API reachable from here
                self.connection_error = f"{type(exc).__name__}: {exc}"
                return Connection(conn_id=conn_id, conn_type="spark", host=fallback_master,
                                  description="stand-in built from cluster.yaml")
            self.connection_error = None
            return connection

    return NodeSparkSubmitHook(**kwargs)


def scratch_dir(cluster: ClusterConfig, key: InstanceKey) -> Path:
    """The host-local folder of one instance's temporary files: ``<scratch root>/<plan>/<instance>/<node>``.

    Its driver's ``java.io.tmpdir`` and ``TMPDIR`` (:func:`child_environment`), so Spark's ``spark-*`` and
    ``blockmgr-*`` folders and the native libraries it extracts go there: on the launcher's host
    (:attr:`~tandem.config.ClusterConfig.scratch_root`), not under the shared storage root, since Spark wants fast
    local disk for them. :func:`reset_scratch_dir` empties it before each launch: a driver killed with SIGKILL
    cannot remove them itself, and a host that fails over often would otherwise fill its temp dir.
    """
    return place_under(cluster.scratch_root, key.plan, key.instance, key.node, what="the scratch root")


def reset_scratch_dir(place: Path) -> Path:
    """Remove what an earlier run left in ``place`` (see :func:`scratch_dir`) and create it empty (the folders it
    creates private: a driver's temporary files hold its data)."""
    shutil.rmtree(place, ignore_errors=True)
    return make_private_dirs(place)


def child_environment(cluster: ClusterConfig, base: Mapping[str, str] | None = None,
                      scratch: Path | None = None) -> dict[str, str]:
    """A driver's environment: what it needs of the launcher's (``base``, default ``os.environ``; see
    :data:`DRIVER_ENVIRONMENT`), the resolved Tandem settings it reads, and this interpreter for PySpark.

    ``scratch``: the instance's :func:`scratch_dir`, made its ``TMPDIR`` and, appended to the launcher's
    ``SPARK_SUBMIT_OPTS``, the JVM's ``java.io.tmpdir``.

    ``TANDEM_DATABASE_URL`` and ``TANDEM_NATS_URL`` (set when the cluster has a messaging layer) may hold
    passwords: they reach the driver here, never on its command line; so do the messaging layer's files
    (``TANDEM_NATS_CREDS`` ..., :attr:`tandem.config.NatsConfig.file_variables`) and inbox prefix.
    """
    inherited = os.environ if base is None else base
    env = {name: value for name, value in inherited.items()
           if name in DRIVER_ENVIRONMENT or name.startswith(DRIVER_ENVIRONMENT_PREFIXES)}
    python_bin = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    env.update({
        "TANDEM_HOME": str(cluster.project_root),
        "TANDEM_CONF_DIR": str(cluster.conf_dir),
        "TANDEM_PLANS_DIR": str(cluster.plans_dir),
        "TANDEM_STORAGE_ROOT": str(cluster.storage_root),
        "TANDEM_DATABASE_URL": cluster.database_url,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PATH": path if path.split(os.pathsep)[:1] == [python_bin] else os.pathsep.join([python_bin, path]),
    })
    if cluster.nats is not None:
        env["TANDEM_NATS_URL"] = ",".join(cluster.nats.servers)
        env.update(cluster.nats.file_variables)  # the NATS user's and TLS files the launcher resolved
        env["TANDEM_NATS_INBOX_PREFIX"] = cluster.nats.inbox_prefix
    if scratch is not None:
        env["TMPDIR"] = str(scratch)
        env["SPARK_SUBMIT_OPTS"] = " ".join(
            filter(None, [env.get("SPARK_SUBMIT_OPTS", "").strip(), java_option("java.io.tmpdir", str(scratch))]))
    return env


def java_option(name: str, value: str) -> str:
    """``-D<name>=<value>``, quoted the way Spark's launcher splits ``SPARK_SUBMIT_OPTS`` when it must be."""
    option = f"-D{name}={value}"
    if not any(char.isspace() or char in "\"'\\" for char in option):
        return option
    return '"' + option.replace("\\", "\\\\").replace('"', '\\"') + '"'
