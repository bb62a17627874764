"""Streaming sources: JSON-lines files in a landing directory."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F


def landing_lines(spark: SparkSession, directory: Path, max_files_per_trigger: int) -> DataFrame:
    """Every line of every file that appears in ``directory``, with the file it came from.

    Producers must write a file elsewhere (or under a name starting with ``.`` or ``_``, which
    Spark ignores) and rename it into place, so a half-written file is never read.
    """
    directory.mkdir(parents=True, exist_ok=True)
    return (
        spark.readStream.format("text")
        .option("maxFilesPerTrigger", max_files_per_trigger)
        .load(str(directory))
        .select(F.col("value").alias("raw"), F.col("_metadata.file_path").alias("source_file"))
    )
