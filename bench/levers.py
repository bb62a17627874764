"""Levers that could close the gap to the peer, measured as engine variants of the trades plan (nothing published).

The engine anchor (:mod:`engine`) runs the plan's queries as the runtime builds them: two streaming queries over the
same files (``aggregates``: parse, validate, a stateful 1-second window per symbol; ``quarantine``: parse, validate,
the bad lines), each batch materialised in the driver. Flink reads the input once and keeps no state store of
Spark's kind. Each lever here is the same work done another way, timed like the anchor (one batch, availableNow, a
fresh checkpoint, ``toArrow()`` of everything a sink would get), so its figure beside the anchor's best in the same
run is the lever's effect on the engine's part of a Tandem run:

- ``one read, per-batch partials``: one query over the lines (today's ``parse_and_validate``); each micro-batch is
  cached, its good events grouped into per-second partials *of that batch* (no watermark, no state store: the
  partials of a second seen in two batches are added on read, each batch fenced by its id) and its bad lines
  taken for the quarantine;
- ``one read, per-batch partials, Spark's JSON source``: the same with the lines read by Spark's own JSON source
  (the declared schema, ``PERMISSIVE``, the malformed line kept in a corrupt-record column) instead of ``text`` +
  ``from_json``. A line that parses but fails a check keeps no raw text this way (the quarantine would rebuild it
  from the fields), and the reasons are shorter: what the figure does not pay for.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

CORRUPT = "_corrupt_record"


@dataclass(frozen=True)
class Lever:
    name: str
    source: str
    """``text`` (the runtime's ``parse_and_validate``) or ``json`` (Spark's JSON source with the declared schema)."""


LEVERS = (
    Lever("one read, per-batch partials (no state store)", "text"),
    Lever("one read, per-batch partials, Spark's JSON source", "json"),
)


def _validated_text(spark, plan, directory: Path, max_files: int):
    from tandem.runtime.plan_api import good_events
    from tandem.runtime.records import parse_and_validate, record_schema
    from tandem.sources.files_reader import landing_lines

    validated = parse_and_validate(landing_lines(spark, [directory], max_files),
                                   record_schema(plan.streams["trades"]))

    def split(frame):
        return good_events(frame, plan, "trades"), frame.where(~frame["valid"]).select("raw", "source_file", "reason")

    return validated, split


def _validated_json(spark, plan, directory: Path, max_files: int):
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    schema = StructType([StructField("symbol", StringType()), StructField("price", DoubleType()),
                         StructField("quantity", LongType()), StructField("timestamp", LongType()),
                         StructField(CORRUPT, StringType())])
    frame = (spark.readStream.schema(schema).option("mode", "PERMISSIVE")
             .option("columnNameOfCorruptRecord", CORRUPT).option("maxFilesPerTrigger", max_files)
             .json(str(directory)).withColumn("source_file", F.col("_metadata.file_path")))
    checks = (F.col(CORRUPT).isNull() & (F.length(F.trim("symbol")) > 0) & ~F.col("symbol").contains("\u0000")
              & (F.col("price") > 0) & (F.col("quantity") > 0) & F.col("timestamp").between(0, 253402300799999))
    validated = frame.withColumn("valid", F.coalesce(checks, F.lit(False)))

    def split(batch):
        good = batch.where("valid").select("symbol", "price", "quantity",
                                           F.timestamp_millis("timestamp").alias("event_time"))
        bad = batch.where(~F.col("valid")).select(
            F.coalesce(F.col(CORRUPT), F.to_json(F.struct("symbol", "price", "quantity", "timestamp"))).alias("raw"),
            "source_file", F.when(F.col(CORRUPT).isNotNull(), "malformed").otherwise("a check failed").alias("reason"))
        return good, bad

    return validated, split


def run_lever(plan, spark, lever: Lever, directory: Path, checkpoints: Path) -> tuple[float, dict[str, int]]:
    """The trades plan's work over the files in ``directory`` done as ``lever`` says, to the end of the input in one
    batch; returns the wall seconds and what it counted (events in the partials, bad lines), for the check."""
    import pyarrow.compute as pc
    from tandem.aggregation.spark import second_partials
    from tandem.aggregation.spec import spec_for

    spec = spec_for(plan, "trade_aggregates")
    files = sum(1 for _ in directory.iterdir())
    make = _validated_text if lever.source == "text" else _validated_json
    validated, split = make(spark, plan, directory, files)
    counted = {"events": 0, "bad_lines": 0}

    def both(frame, batch_id: int) -> None:
        frame.persist()
        good, bad = split(frame)
        partials = second_partials(good, spec, None).toArrow()
        counted["events"] += pc.sum(partials["trade_count"]).as_py() or 0
        counted["bad_lines"] += bad.toArrow().num_rows
        frame.unpersist()

    shutil.rmtree(checkpoints, ignore_errors=True)
    started = time.perf_counter()
    try:
        query = (validated.writeStream.option("checkpointLocation", str(checkpoints))
                 .foreachBatch(both).trigger(availableNow=True).start())
        query.awaitTermination()
        if query.exception() is not None:
            raise RuntimeError(f"lever {lever.name}: {query.exception()}")
        return time.perf_counter() - started, counted
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)
