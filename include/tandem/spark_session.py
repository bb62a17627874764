"""SparkSession for Tandem jobs: settings from ``conf/spark-defaults.conf``, no Maven packages."""

from __future__ import annotations

import os
from pathlib import Path

from pyspark.sql import SparkSession

BACKGROUND_NICENESS = 10
"""Snapshots, backfills and reconciles are background work: their processes (and Spark JVMs) yield CPU to the
plans' live queries on the same host."""


def read_spark_defaults(path: Path) -> dict[str, str]:
    """Parse a ``spark-defaults.conf`` file (``key value`` lines, ``#`` comments)."""
    settings: dict[str, str] = {}
    if not path.is_file():
        return settings
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            settings[key.strip()] = value.strip()
    return settings


def build_session(app_name: str, master: str | None, defaults: Path, extra: dict[str, str] | None = None) -> SparkSession:
    """Get or create the session; under ``spark-submit`` its ``--master`` wins over ``master``."""
    builder = SparkSession.builder.appName(app_name)
    if master and not os.environ.get("PYSPARK_GATEWAY_PORT"):  # set by spark-submit for the Python driver
        builder = builder.master(master)
    for key, value in {**read_spark_defaults(defaults), **(extra or {})}.items():
        if key == "spark.jars.packages":
            raise ValueError(f"{defaults}: spark.jars.packages is not allowed (no Maven access)")
        builder = builder.config(key, value)
    return builder.getOrCreate()


def lower_priority() -> int:
    """Give this driver, and its Spark JVM, :data:`BACKGROUND_NICENESS`; returns this process's new niceness.

    In process (a snapshot task, ``tandem snapshot``), call it before building the session: the JVM started then
    inherits it. Under ``spark-submit`` the JVM is already running as this process's parent: each of its threads
    is lowered (Linux sets niceness per thread; threads started later inherit their creator's).
    """
    current = os.nice(0)
    niceness = current if current >= BACKGROUND_NICENESS else os.nice(BACKGROUND_NICENESS - current)
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        _lower_threads(os.getppid())
    return niceness


def _lower_threads(pid: int) -> None:
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:  # not Linux, or the parent is gone
        return
    for thread in threads:
        try:
            if os.getpriority(os.PRIO_PROCESS, int(thread)) < BACKGROUND_NICENESS:
                os.setpriority(os.PRIO_PROCESS, int(thread), BACKGROUND_NICENESS)
        except OSError:  # ended meanwhile, or not ours
            continue
