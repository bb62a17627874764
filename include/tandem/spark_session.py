"""SparkSession for Tandem jobs: settings from ``conf/spark-defaults.conf``, no Maven packages."""

from __future__ import annotations

import os
from pathlib import Path

from pyspark.sql import SparkSession


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
