"""The Spark half of the ``files`` source kind (:mod:`tandem.sources.files`): the lines of landing folders, read by
Spark's file source. Imported only when a query is built."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F


def landing_lines(spark: SparkSession, directories: list[Path], max_files_per_trigger: int) -> DataFrame:
    """Every line of every file that appears in ``directories`` (partitions of one stream), with its file.

    Producers must write a file elsewhere (or under a name starting with ``.`` or ``_``, which
    Spark ignores) and rename it into place, so a half-written file is never read. Several
    folders are read as one glob (``landing/<stream>/{0,2}``): one source, one offset log.
    """
    if not directories:
        raise ValueError("an instance must read at least one partition")
    for directory in directories:
        directory.mkdir(parents=True, exist_ok=True)
    parent = directories[0].parent
    path = str(directories[0]) if len(directories) == 1 else f"{parent}/{{{','.join(d.name for d in directories)}}}"
    return (
        spark.readStream.format("text")
        .option("maxFilesPerTrigger", max_files_per_trigger)
        .load(path)
        .select(F.col("value").alias("raw"), F.col("_metadata.file_path").alias("source_file"))
    )
