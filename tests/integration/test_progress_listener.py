"""An instance's listener records each micro-batch's progress as Spark reports it: the recorder reads a progress as
one JSON text (``ProgressAsJson``), and every field it keeps equals PySpark's own reading of the same progress
(``query.recentProgress``, read object by object through Py4J) on a real streaming query with a watermark, state,
late rows and observed metrics."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest
from _ha import fetch
from pyspark.sql import functions as F

from tandem.runtime.listener import QUALITY_METRICS, ProgressRecorder, instance_query_name
from tandem.store import Database, migrate
from tandem.store.registry import InstanceKey

pytestmark = pytest.mark.integration
KEY = InstanceKey("trades", "shard-1", "node-a")


def land(folder: Path, name: str, rows: list[dict]) -> None:
    (folder / name).write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_the_recorded_progress_equals_pysparks_own_reading(spark, database_url: str, tmp_path: Path) -> None:
    with Database(database_url) as db:
        migrate(db)
    landing = tmp_path / "landing"
    landing.mkdir()
    readings = (spark.readStream.schema("room STRING, at TIMESTAMP, celsius DOUBLE").option("maxFilesPerTrigger", 1)
                .json(str(landing)))
    counted = (readings.observe(QUALITY_METRICS, F.count(F.when(F.col("celsius").isNull(), 1)).alias("quarantined_rows"))
               .withWatermark("at", "10 seconds").groupBy(F.window("at", "5 seconds"), "room").count())
    recorder = ProgressRecorder(KEY, database_url)
    spark.streams.addListener(recorder)
    query = (counted.writeStream.queryName(instance_query_name(KEY, "aggregates")).outputMode("append")
             .format("noop").option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        land(landing, "1.json", [{"room": "a", "at": "2026-12-07T10:00:01Z", "celsius": 20.5},
                                 {"room": "b", "at": "2026-12-07T10:00:02Z", "celsius": None},
                                 {"room": "a", "at": "2026-12-07T10:00:40Z", "celsius": 21.0}])
        query.processAllAvailable()
        land(landing, "2.json", [{"room": "a", "at": "2026-12-07T10:00:03Z", "celsius": 19.0},  # late: dropped
                                 {"room": "c", "at": "2026-12-07T10:01:00Z", "celsius": None}])
        query.processAllAvailable()
        assert recorder.wait_until_recorded([query])
        progress = {p.batchId: p for p in query.recentProgress}
    finally:
        query.stop()
        spark.streams.removeListener(recorder)

    rows = fetch(database_url, "SELECT * FROM heartbeats ORDER BY batch_id")
    assert [r["batch_id"] for r in rows] == sorted(progress), rows
    for row in rows:
        p = progress[row["batch_id"]]
        watermark = p.eventTime.get("watermark")
        expected = {
            "query_name": "aggregates", "query_id": str(p.id), "run_id": str(p.runId), "input_rows": p.numInputRows,
            "batch_duration_ms": p.batchDuration,
            "watermark": None if not watermark or watermark.startswith("1970")
            else datetime.fromisoformat(watermark.replace("Z", "+00:00")),
            "state_rows": sum(s.numRowsTotal for s in p.stateOperators),
            "late_rows": sum(s.numRowsDroppedByWatermark for s in p.stateOperators),
            "quarantined_rows": p.observedMetrics[QUALITY_METRICS]["quarantined_rows"]
            if QUALITY_METRICS in p.observedMetrics else None,
        }
        assert {key: row[key] for key in expected} == expected
    # the test's own account of the two files: one null reading in each, one late row in the second
    assert sum(r["quarantined_rows"] or 0 for r in rows) == 2
    assert sum(r["input_rows"] for r in rows) == 5
    assert sum(r["late_rows"] for r in rows) == 1
    assert any(r["watermark"] is not None for r in rows)
