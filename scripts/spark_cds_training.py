"""The Spark job `scripts/setup.sh` runs once to record a class-data sharing archive for the Spark JVMs.

Run under ``spark-submit`` with ``-XX:ArchiveClassesAtExit=<archive>``: the JVM writes the classes this job
loaded into the archive when it exits, and every later JVM started with ``-XX:SharedArchiveFile=<archive>``
maps them instead of loading and verifying them again (a driver's start and first query measured here:
14-15 s without, 9 s with). The job touches much of what a plan's driver does first: a session, a file source, a
stateful streaming query with a watermark under ``availableNow`` into ``foreachBatch``, Arrow to Python.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession
from pyspark.sql import functions as F


def main(workdir: Path) -> None:
    spark = (SparkSession.builder.appName("tandem-cds-training").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    landing = workdir / "landing"
    landing.mkdir()
    (landing / "events.jsonl").write_text("".join(
        f'{{"key": "k{i % 3}", "value": {i}, "timestamp": {1_700_000_000_000 + i * 1000}}}\n' for i in range(50)))
    events = (spark.readStream.schema("key string, value long, timestamp long").json(str(landing))
              .withColumn("at", F.timestamp_millis("timestamp")).withWatermark("at", "5 seconds"))
    counts = events.groupBy(F.window("at", "10 seconds"), "key").agg(F.count("*").alias("n"), F.sum("value"))
    seen: list[int] = []
    query = (counts.writeStream.outputMode("update").option("checkpointLocation", str(workdir / "checkpoint"))
             .trigger(availableNow=True).foreachBatch(lambda frame, _batch: seen.append(len(frame.toArrow())))
             .start())
    query.awaitTermination()
    spark.range(1000).groupBy((F.col("id") % 7).alias("k")).count().toPandas()
    spark.stop()
    if not seen:
        sys.exit("the training query produced no batch")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="tandem-cds-") as scratch:
        main(Path(scratch))
