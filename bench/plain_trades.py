"""The plain PySpark baseline of the trades benchmark: no Tandem code, written by hand.

Reads JSON-lines trade events from a directory, keeps the valid ones, aggregates them per second
and symbol (sum/count/min/max, 10 s watermark, update mode) and writes every micro-batch to

- PostgreSQL ``plain_trades.trade_aggregates``: the seconds upserted, then minute, hour, day, month
  and year recomputed from their children (one transaction per micro-batch);
- a Delta table with the rows written to PostgreSQL (all six granularities, partitioned by
  granularity);
- a quarantine Delta table with the bad lines, a short reason and the file they came from.

Usable on its own::

    python bench/plain_trades.py <input-dir> <postgresql-url> <output-dir>
"""

from __future__ import annotations

import io
import sys
from datetime import datetime, timezone

import psycopg2
import pyarrow as pa
import pyarrow.csv as pacsv
from deltalake import write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

EVENT = StructType([
    StructField("symbol", StringType()),
    StructField("price", DoubleType()),
    StructField("quantity", LongType()),
    StructField("timestamp", LongType()),
])
MAX_MILLIS = 253402300799999  # 9999-12-31T23:59:59.999Z

DDL = """
CREATE SCHEMA IF NOT EXISTS plain_trades;
CREATE TABLE IF NOT EXISTS plain_trades.trade_aggregates (
    granularity  text NOT NULL,
    bucket_start timestamptz NOT NULL,
    symbol       text NOT NULL,
    price_sum    double precision NOT NULL,
    trade_count  bigint NOT NULL,
    quantity_sum bigint NOT NULL,
    price_min    double precision NOT NULL,
    price_max    double precision NOT NULL,
    batch_id     bigint NOT NULL,
    PRIMARY KEY (granularity, symbol, bucket_start)
);
"""
COLUMNS = "granularity, bucket_start, symbol, price_sum, trade_count, quantity_sum, price_min, price_max, batch_id"
UPSERT = """ON CONFLICT (granularity, symbol, bucket_start) DO UPDATE SET
    price_sum = EXCLUDED.price_sum, trade_count = EXCLUDED.trade_count, quantity_sum = EXCLUDED.quantity_sum,
    price_min = EXCLUDED.price_min, price_max = EXCLUDED.price_max, batch_id = EXCLUDED.batch_id
RETURNING """ + COLUMNS
ROLLUP = """
INSERT INTO plain_trades.trade_aggregates AS t (""" + COLUMNS + """)
SELECT %(parent)s, p.bucket, p.symbol, sum(c.price_sum), sum(c.trade_count), sum(c.quantity_sum),
       min(c.price_min), max(c.price_max), %(batch_id)s
FROM (SELECT DISTINCT symbol, date_trunc(%(parent)s, bucket_start) AS bucket FROM batch) p
JOIN plain_trades.trade_aggregates c
  ON c.granularity = %(child)s AND c.symbol = p.symbol
 AND c.bucket_start >= p.bucket AND c.bucket_start < p.bucket + ('1 ' || %(parent)s)::interval
GROUP BY p.bucket, p.symbol
""" + UPSERT
LEVELS = ["second", "minute", "hour", "day", "month", "year"]

DELTA_SCHEMA = pa.schema([
    ("granularity", pa.string()), ("bucket_start", pa.timestamp("us", tz="UTC")), ("symbol", pa.string()),
    ("price_sum", pa.float64()), ("trade_count", pa.int64()), ("quantity_sum", pa.int64()),
    ("price_min", pa.float64()), ("price_max", pa.float64()), ("batch_id", pa.int64()),
])


def read_events(spark: SparkSession, input_dir: str, max_files_per_trigger: int):
    """Every line of every new file, parsed (see :func:`parse_events`)."""
    lines = (spark.readStream.option("maxFilesPerTrigger", max_files_per_trigger).text(input_dir)
             .select(F.col("value").alias("raw"), F.col("_metadata.file_path").alias("source_file")))
    return parse_events(lines)


def parse_events(lines):
    """``lines(raw, source_file)`` → the parsed fields and, for bad lines, why they are bad."""
    parsed = lines.select("raw", "source_file", F.from_json("raw", EVENT).alias("e")).select("raw", "source_file", "e.*")
    symbol, price, quantity, ts = F.col("symbol"), F.col("price"), F.col("quantity"), F.col("timestamp")
    reason = (F.when(symbol.isNull() & price.isNull() & quantity.isNull() & ts.isNull(), "not a trade event")
              .when(symbol.isNull() | (F.trim(symbol) == ""), "bad symbol")
              .when(price.isNull() | F.isnan(price) | (price <= 0), "bad price")
              .when(quantity.isNull() | (quantity <= 0), "bad quantity")
              .when(ts.isNull() | (ts < 0) | (ts > MAX_MILLIS), "bad timestamp"))
    return parsed.withColumn("reason", reason)


def second_aggregates(events):
    return (events.where(F.col("reason").isNull())
            .withColumn("event_time", F.timestamp_millis("timestamp"))
            .withWatermark("event_time", "10 seconds")
            .groupBy(F.window("event_time", "1 second"), "symbol")
            .agg(F.sum("price").alias("price_sum"), F.count("*").alias("trade_count"),
                 F.sum("quantity").alias("quantity_sum"), F.min("price").alias("price_min"),
                 F.max("price").alias("price_max"))
            .select(F.col("window.start").alias("bucket_start"), "symbol", "price_sum", "trade_count",
                    "quantity_sum", "price_min", "price_max"))


def upsert_and_roll_up(conn, seconds: pa.Table, batch_id: int) -> list[tuple]:
    """Upsert the seconds, recompute the touched minutes … years; return every row written."""
    buffer = io.BytesIO()
    pacsv.write_csv(seconds, buffer)
    buffer.seek(0)
    written: list[tuple] = []
    with conn, conn.cursor() as cur:
        cur.execute("""CREATE TEMP TABLE batch (bucket_start timestamptz, symbol text, price_sum float8,
                       trade_count bigint, quantity_sum bigint, price_min float8, price_max float8) ON COMMIT DROP""")
        cur.copy_expert("COPY batch FROM STDIN WITH (FORMAT csv, HEADER true)", buffer)
        cur.execute("INSERT INTO plain_trades.trade_aggregates (" + COLUMNS + """)
                     SELECT 'second', bucket_start, symbol, price_sum, trade_count, quantity_sum, price_min,
                            price_max, %(batch_id)s FROM batch """ + UPSERT, {"batch_id": batch_id})
        written += cur.fetchall()
        for child, parent in zip(LEVELS, LEVELS[1:]):
            cur.execute(ROLLUP, {"parent": parent, "child": child, "batch_id": batch_id})
            written += cur.fetchall()
    return written


def append_delta(path: str, rows: list[tuple]) -> None:
    columns = list(zip(*rows))
    table = pa.Table.from_arrays([pa.array(col, type=field.type) for col, field in zip(columns, DELTA_SCHEMA)],
                                 schema=DELTA_SCHEMA)
    write_deltalake(path, table, mode="append", partition_by=["granularity"])


def start(spark: SparkSession, input_dir: str, database_url: str, output_dir: str, *,
          max_files_per_trigger: int = 1000, available_now: bool = True, trigger: str = "1 second"):
    """Start the two streaming queries (aggregates, quarantine); return them and a close function."""
    conn = psycopg2.connect(database_url, options="-c TimeZone=UTC")
    with conn, conn.cursor() as cur:
        cur.execute(DDL)
    events = read_events(spark, input_dir, max_files_per_trigger)

    def write_aggregates(frame, batch_id: int) -> None:
        seconds = frame.toArrow()
        if seconds.num_rows:
            append_delta(f"{output_dir}/trade_aggregates", upsert_and_roll_up(conn, seconds, batch_id))

    def write_quarantine(frame, batch_id: int) -> None:
        bad = frame.toArrow()
        if bad.num_rows:
            bad = bad.append_column("batch_id", pa.repeat(pa.scalar(batch_id, pa.int64()), bad.num_rows))
            bad = bad.append_column("quarantined_at", pa.repeat(
                pa.scalar(datetime.now(timezone.utc), pa.timestamp("us", tz="UTC")), bad.num_rows))
            write_deltalake(f"{output_dir}/quarantine", bad, mode="append")

    def stream(frame, name: str, mode: str, sink):
        writer = (frame.writeStream.queryName(name).outputMode(mode).foreachBatch(sink)
                  .option("checkpointLocation", f"{output_dir}/checkpoints/{name}"))
        writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=trigger)
        return writer.start()

    queries = [
        stream(second_aggregates(events), "plain-aggregates", "update", write_aggregates),
        stream(events.where(F.col("reason").isNotNull()).select("raw", "source_file", "reason"),
               "plain-quarantine", "append", write_quarantine),
    ]
    return queries, conn.close


def run(spark: SparkSession, input_dir: str, database_url: str, output_dir: str, *,
        max_files_per_trigger: int = 1000) -> None:
    """Process every file present now, then return."""
    queries, close = start(spark, input_dir, database_url, output_dir, max_files_per_trigger=max_files_per_trigger)
    try:
        for query in queries:
            query.awaitTermination()
    finally:
        close()


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    session = (SparkSession.builder.appName("plain-trades").config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.json.enablePartialResults", "true").getOrCreate())
    run(session, *sys.argv[1:])
