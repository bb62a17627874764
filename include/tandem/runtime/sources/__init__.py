"""Source kinds: where the lines of a stream come from, one module per kind, registered in :data:`SOURCE_KINDS`.

A stream declares its kind (``source:`` in the plan's YAML, default ``files``; ``nats``: a JetStream
stream). A kind's reader gives a streaming DataFrame of ``raw`` (the line's text) and ``source_file``
(where it came from: a file, or ``nats:<subject>:<sequence>``; the id of its bad lines in the
quarantine); the runtime parses and validates the lines the same way for every kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession

from tandem.config import ClusterConfig, PlanConfig
from tandem.runtime.sources import files, nats


class SourceReader(Protocol):
    def __call__(self, spark: SparkSession, cluster: ClusterConfig, plan: PlanConfig, instance: str,
                 stream: str) -> DataFrame: ...


SOURCE_KINDS: dict[str, SourceReader] = {"files": files.read, "nats": nats.read}


def stream_lines(spark: SparkSession, cluster: ClusterConfig, plan: PlanConfig, instance: str,
                 stream: str, folders: list[Path] | None = None) -> DataFrame:
    """The lines of ``stream`` that instance ``instance`` reads, from the stream's declared source kind; or, given
    ``folders`` (a recomputation's gathered input of a ``files`` stream), the files in those."""
    if folders is not None:
        return files.landing_lines(spark, folders, plan.streams[stream].max_files_per_trigger)
    return SOURCE_KINDS[plan.streams[stream].source](spark, cluster, plan, instance, stream)
