#!/usr/bin/env python
"""The peer a user weighs Tandem against: Apache Flink (PyPI ``apache-flink``), local, on the same files.

One module, two sides:

- imported by the benchmarks (the project's venv): :func:`run` starts this file as a subprocess in Flink's own venv
  (``.tandem/flink-venv``, made by ``make bench-flink``; Flink pins its own pyarrow, numpy and py4j, so it never
  shares Tandem's venv and is never a runtime dependency), reads back one JSON line and, for a checked run, the
  rows the job wrote (:func:`read_outputs`);
- run as a script in that venv (``python flink_peer.py --plan trades …``): builds a local mini-cluster
  ``TableEnvironment``, declares each stream's files as a ``filesystem`` table in the ``json`` format and runs the
  plan (:data:`PLANS`) as one job, a statement set with one ``INSERT`` per output: into ``blackhole`` sinks (timed
  runs) or ``filesystem`` sinks in the ``debezium-json`` changelog format (checked runs, which checkpoint every 10 s
  to a temporary folder: the sink commits its files on checkpoints; a changelog, because the plans' top-1s and
  counts update their rows).

Each plan's bad-line rule is a ``WHERE`` over its streams: a line counts only when it is a JSON object whose
declared fields have their types and pass their checks (for trades: a non-empty ``symbol`` without NUL, a
``price`` > 0, an integral ``quantity`` > 0 and an integral ``timestamp`` between 1970 and 9999). Unparseable lines
are skipped by the format (``json.ignore-parse-errors``), the rest by the ``WHERE`` clause; Flink keeps no record
of either (Tandem writes each to its quarantine with the reason: work Flink's figure does not include). Flink's
``json`` format reads a nested value into a ``STRING`` column as its JSON text, so the queries also refuse a string
starting with ``{`` or ``[`` (the nearest they can say "must be a JSON string").

Event time: Flink's file source reads the files in parallel splits, out of their order, so a watermark narrower
than the input's event-time span drops rows as late, silently. ``--watermark-ms`` defaults to the whole span of
the input (exact); the benchmark also runs the plan's own 10 s once and reports how many rows that loses.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLINK_PYTHON = Path(os.environ.get("TANDEM_FLINK_PYTHON", ROOT / ".tandem" / "flink-venv" / "bin" / "python"))

MAX_EPOCH_MILLIS = 253_402_300_799_999  # the plans' bound for epoch_millis fields (9999-12-31T23:59:59.999Z)


def _text(column: str) -> str:
    """A declared string field that must not be empty: a JSON string (Flink's ``json`` format reads a nested value
    into a ``STRING`` column as its JSON text: the nearest it can say "a string" is "not starting with ``{`` or
    ``[``"), not blank, without NUL."""
    return (f"{column} IS NOT NULL AND CHAR_LENGTH(TRIM({column})) > 0 AND POSITION(CHR(0) IN {column}) = 0 "
            f"AND {column} NOT LIKE '{{%' AND {column} NOT LIKE '[%'")


def _integer(column: str, low: int, high: int) -> str:
    """A declared integer field (read as ``DOUBLE``: an integral value) between ``low`` and ``high``."""
    return f"{column} IS NOT NULL AND {column} = FLOOR({column}) AND {column} BETWEEN {low} AND {high}"


@dataclass(frozen=True)
class OutputSql:
    """One output of a plan in Flink SQL: its columns, its query, and its key when the query updates its rows (a
    top-1, a count per customer): its sink then takes upserts by that key."""

    columns: str
    query: str
    key: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanSql:
    """A plan in Flink SQL: a table per stream, views between, one query per output."""

    streams: dict[str, tuple[str, str]]
    """Stream → (its columns, its event-time column): each becomes a ``filesystem`` table in the ``json`` format
    (parse errors skipped) with a rowtime ``ts`` and the run's watermark."""
    views: tuple[str, ...]
    outputs: dict[str, OutputSql]


TRADES = PlanSql(
    streams={"trades": ("symbol STRING, price DOUBLE, quantity DOUBLE, `timestamp` DOUBLE", "`timestamp`")},
    views=(),
    outputs={"trade_aggregates": OutputSql(
        "bucket_start STRING, symbol STRING, price_sum DOUBLE, trade_count BIGINT, quantity_sum BIGINT, "
        "price_min DOUBLE, price_max DOUBLE",
        f"""
SELECT CAST(window_start AS STRING) AS bucket_start, symbol,
       SUM(price) AS price_sum, COUNT(*) AS trade_count, SUM(CAST(quantity AS BIGINT)) AS quantity_sum,
       MIN(price) AS price_min, MAX(price) AS price_max
FROM TABLE(TUMBLE(TABLE trades, DESCRIPTOR(ts), INTERVAL '1' SECOND))
WHERE {_text('symbol')} AND price > 0 AND {_integer('quantity', 1, 2**63 - 1)}
  AND {_integer('`timestamp`', 0, MAX_EPOCH_MILLIS)}
GROUP BY window_start, window_end, symbol""")},
)
"""1-second tumbling event-time windows per symbol, the plan's five measures, its bad-line rule as a ``WHERE``."""

PIZZA_SHOP = PlanSql(
    streams={"orders": ("order_no STRING, customer_name STRING, `time` DOUBLE", "`time`"),
             "deliveries": ("order_no STRING, `time` DOUBLE", "`time`")},
    views=(
        f"""CREATE TEMPORARY VIEW good_orders AS
SELECT order_no, customer_name, CAST(`time` AS BIGINT) AS order_time, ts FROM orders
WHERE {_text('order_no')} AND {_text('customer_name')} AND {_integer('`time`', 0, MAX_EPOCH_MILLIS)}""",
        f"""CREATE TEMPORARY VIEW good_deliveries AS
SELECT order_no, ts FROM deliveries WHERE {_text('order_no')} AND {_integer('`time`', 0, MAX_EPOCH_MILLIS)}""",
        # an interval LEFT JOIN: a matching delivery, or the order alone once no delivery can match any more
        """CREATE TEMPORARY VIEW joined AS
SELECT o.order_no, o.customer_name, o.order_time, o.ts, CASE WHEN d.order_no IS NULL THEN 0 ELSE 1 END AS on_time
FROM good_orders o LEFT JOIN good_deliveries d
  ON o.order_no = d.order_no AND d.ts BETWEEN o.ts AND o.ts + INTERVAL '30' SECOND""",
        # one outcome per order (several deliveries in time count once), still at the order's time
        """CREATE TEMPORARY VIEW outcomes AS
SELECT order_no, customer_name, order_time, MAX(on_time) AS delivered, window_time AS ts
FROM TABLE(TUMBLE(TABLE joined, DESCRIPTOR(ts), INTERVAL '0.001' SECOND))
GROUP BY window_start, window_end, window_time, order_no, customer_name, order_time""",
    ),
    outputs={
        "delivered_orders": OutputSql("customer_name STRING, delivered BIGINT", """
SELECT customer_name, COUNT(*) AS delivered FROM outcomes WHERE delivered = 1 GROUP BY customer_name""",
                                      key=("customer_name",)),
        "overdue_orders": OutputSql(
            "order_no STRING, customer_name STRING, order_time BIGINT, expiry_time BIGINT", """
SELECT order_no, customer_name, order_time, order_time + 30000 AS expiry_time FROM outcomes WHERE delivered = 0"""),
        # the latest order by order time; a tie: the higher event id (the plan's `id: [order_no]`, Tandem's
        # tandem.declarations.event_id: sha256 of the sorted-keys JSON of plan, output and key, 32 hex digits)
        "last_orders": OutputSql(
            "customer_name STRING, order_no STRING, order_time BIGINT, outcome STRING, delivered INT", """
SELECT customer_name, order_no, order_time, CASE delivered WHEN 1 THEN 'delivered' ELSE 'overdue' END AS outcome,
       delivered
FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY customer_name ORDER BY order_time DESC, SUBSTRING(SHA256(CONCAT(
        '{"order_no":', JSON_STRING(order_no), ',"output":"last_orders","plan":"pizza_shop"}')), 1, 32) DESC) AS rn
      FROM outcomes)
WHERE rn = 1""", key=("customer_name",)),
        "order_stats": OutputSql(
            "granularity STRING, bucket_start STRING, orders BIGINT, on_time BIGINT, customers BIGINT",
            "\nUNION ALL".join(f"""
SELECT '{unit}' AS granularity, CAST(window_start AS STRING) AS bucket_start, COUNT(*) AS orders,
       CAST(SUM(delivered) AS BIGINT) AS on_time, COUNT(DISTINCT customer_name) AS customers
FROM TABLE(TUMBLE(TABLE outcomes, DESCRIPTOR(ts), INTERVAL '1' {unit.upper()})) GROUP BY window_start, window_end"""
                                for unit in ("minute", "hour", "day"))),
    },
)
"""Each order's outcome by an interval join; delivered orders per customer, overdue orders, each customer's latest
order (a top-1), and orders, on time and distinct customers per minute, hour and day of order time. Differs from
the plan where the generator never goes: an order placed twice is two orders here, and ``JSON_STRING`` escapes
non-ASCII characters otherwise than Python's ``json.dumps`` (the tie-break of ``last_orders``)."""

TEMPERATURES = PlanSql(
    streams={"temps": ("room_no DOUBLE, device_id STRING, temp DOUBLE, `time` DOUBLE", "`time`")},
    views=(
        f"""CREATE TEMPORARY VIEW readings AS
SELECT CAST(room_no AS BIGINT) AS room_no, device_id, temp, CAST(`time` AS BIGINT) AS `time`, ts FROM temps
WHERE {_integer('room_no', 0, 2**63 - 1)} AND {_text('device_id')} AND temp > -273.15
  AND {_integer('`time`', 0, MAX_EPOCH_MILLIS)}""",
        # every (reading, a warmer one within 10 minutes after it) of a room: an interval self-join
        """CREATE TEMPORARY VIEW rises AS
SELECT e1.room_no, e1.device_id AS initial_device_id, e1.temp AS initial_temp, e1.`time` AS initial_time,
       e2.device_id AS final_device_id, e2.temp AS final_temp, e2.`time` AS final_time, e1.ts
FROM readings e1 JOIN readings e2
  ON e1.room_no = e2.room_no AND e2.ts > e1.ts AND e2.ts <= e1.ts + INTERVAL '10' MINUTE AND e2.temp >= e1.temp + 5""",
    ),
    outputs={
        # (t - 2 min, t]: RANGE takes the rows at t itself and those at least t - 119.999 s
        "avg_temps": OutputSql(
            "room_no BIGINT, device_id STRING, temp DOUBLE, `time` BIGINT, avg_temp DOUBLE, readings BIGINT", """
SELECT room_no, device_id, temp, `time`, AVG(temp) OVER w AS avg_temp, COUNT(*) OVER w AS readings FROM readings
WINDOW w AS (PARTITION BY room_no ORDER BY ts RANGE BETWEEN INTERVAL '119.999' SECOND(3) PRECEDING AND CURRENT ROW)"""),
        # each reading's earliest warmer reading (ties: device, then temperature): a window top-1 per reading, final
        # at the reading's time (MATCH_RECOGNIZE (A B*? C) says it too, but ran for over 12 minutes on 20,000 readings)
        "temp_alerts": OutputSql(
            "room_no BIGINT, initial_device_id STRING, initial_temp DOUBLE, initial_time BIGINT, "
            "final_device_id STRING, final_temp DOUBLE, final_time BIGINT", """
SELECT room_no, initial_device_id, initial_temp, initial_time, final_device_id, final_temp, final_time
FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, room_no, initial_device_id, initial_temp,
                                                initial_time
                                   ORDER BY final_time, final_device_id, final_temp) AS rn
      FROM TABLE(TUMBLE(TABLE rises, DESCRIPTOR(ts), INTERVAL '0.001' SECOND)))
WHERE rn = 1"""),
        "high_temps": OutputSql("room_no BIGINT, device_id STRING, temp DOUBLE, `time` BIGINT", """
SELECT room_no, device_id, temp, `time` FROM readings WHERE room_no >= 100 AND room_no < 110 AND temp > 40"""),
    },
)
"""Each reading's 2-minute average (an ``OVER`` window), each reading's earliest reading at least 5° warmer within 10
minutes (an interval self-join and a window top-1), and the high temperatures of rooms 100-109 (a filter)."""

PLANS = {"trades": TRADES, "pizza_shop": PIZZA_SHOP, "temperatures": TEMPERATURES}
"""Every plan of ``bench/plans.py`` in Flink SQL."""


def source_table(stream: str, columns: str, time_column: str, path: Path, watermark_ms: int) -> str:
    """The ``CREATE TABLE`` of a stream's files: its columns, ``ts`` from the event-time column, the watermark."""
    return f"""
CREATE TEMPORARY TABLE {stream} (
  {columns},
  ts AS TO_TIMESTAMP_LTZ(CAST(COALESCE({time_column}, 0) AS BIGINT), 3),
  WATERMARK FOR ts AS ts - INTERVAL '0.001' SECOND * {watermark_ms}
) WITH (
  'connector' = 'filesystem',
  'path' = 'file://{path}',
  'format' = 'json',
  'json.ignore-parse-errors' = 'true',
  'json.fail-on-missing-field' = 'false'
)"""


@dataclass(frozen=True)
class FlinkRun:
    """What one Flink run measured (seconds) and, for a checked run, where its rows are."""

    mode: str
    parallelism: int
    watermark_ms: int
    job_s: float
    """From submitting the INSERT to the job's end: planning, the run and the sink (the JVM's start excluded, as
    Tandem's and Spark's session start are)."""
    jvm_start_s: float
    process_s: float
    cpu_s: float
    """CPU seconds of the child process and its JVM, start included."""
    output: Path | None
    flink_version: str


def available() -> bool:
    """Whether Flink's venv is there (``make bench-flink``)."""
    return FLINK_PYTHON.is_file()


def wanted(parser: argparse.ArgumentParser, choice: bool | None) -> bool:
    """A benchmark's ``--flink/--no-flink``: unset means "when Flink's venv is there"; ``--flink`` without it is a
    usage error naming the make target."""
    if choice is None:
        return available()
    if choice and not available():
        parser.error(f"--flink: no Flink venv at {FLINK_PYTHON} (make bench-flink)")
    return choice


def run(plan: str, inputs: Mapping[str, Path], *, mode: str = "streaming", parallelism: int = 2, watermark_ms: int,
        output: Path | None = None, checkpoint_ms: int | None = None, timeout_s: float = 1800) -> FlinkRun:
    """Run ``plan`` (:data:`PLANS`) in Flink over each stream's files (``inputs``: stream → directory) in a child
    process (Flink's venv), all its outputs in one job; ``output``: a directory for the outputs' rows (a checked
    run, :func:`read_outputs`), else blackhole sinks."""
    command = [str(FLINK_PYTHON), __file__, "--plan", plan, "--mode", mode, "--parallelism", str(parallelism),
               "--watermark-ms", str(watermark_ms)]
    for stream, path in inputs.items():
        command += ["--input", f"{stream}={path}"]
    if output is not None:
        command += ["--output", str(output)]
    if checkpoint_ms:
        command += ["--checkpoint-ms", str(checkpoint_ms)]
    started = time.perf_counter()
    # a session of its own: a run that times out or is interrupted takes its JVM (a grandchild) down with it
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        stdout, stderr = child.communicate(timeout=timeout_s)
    finally:
        try:
            os.killpg(child.pid, signal.SIGKILL)  # whatever of the run is left: none after a clean end
        except ProcessLookupError:
            pass
        child.wait()
    process_s = time.perf_counter() - started
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        raise RuntimeError(f"flink {plan} ({mode}) failed with exit code {child.returncode}:\n{stderr[-4000:]}")
    report = json.loads(lines[-1])
    return FlinkRun(mode=mode, parallelism=parallelism, watermark_ms=watermark_ms, job_s=report["job_s"],
                    jvm_start_s=report["jvm_start_s"], process_s=round(process_s, 3), cpu_s=report["cpu_s"],
                    output=output, flink_version=report["flink_version"])


def read_outputs(output: Path, plan: str) -> dict[str, list[dict]]:
    """The rows each output of a checked run of ``plan`` holds at its end (output → rows), from its sink's
    ``debezium-json`` change records; files still in progress (hidden) are not read.

    An output without a key is a multiset: a record's ``before`` is taken out and its ``after`` put in, in any
    order (a row taken out more often than put in means records are missing: an error). An output with a key
    (:attr:`OutputSql.key`) takes upserts: Flink writes an update as its new row alone, so each key's records are
    applied in the order its sink subtask wrote them (one subtask per key: a key in two is an error)."""
    outputs: dict[str, list[dict]] = {}
    for directory in sorted(p for p in output.iterdir() if p.is_dir()):
        key = PLANS[plan].outputs[directory.name].key
        parts = sorted((_written_order(p), p) for p in directory.rglob("*")
                       if p.is_file() and not p.name.startswith((".", "_")))
        held: Counter[tuple] = Counter()
        latest: dict[tuple, tuple[int, dict]] = {}
        for (subtask, _), part in parts:
            for line in part.read_text().splitlines():
                before, after = (json.loads(line).get(side) for side in ("before", "after"))
                if not key:
                    if before is not None:
                        held[tuple(before.items())] -= 1
                    if after is not None:
                        held[tuple(after.items())] += 1
                    continue
                row = after if after is not None else before
                at = tuple(row[column] for column in key)
                if latest.get(at, (subtask,))[0] != subtask:
                    raise ValueError(f"{directory}: key {at} written by two sink subtasks")
                latest[at] = (subtask, after)
        if any(count < 0 for count in held.values()):
            raise ValueError(f"{directory}: a row is taken out more often than it was put in (records missing)")
        outputs[directory.name] = ([row for _, row in latest.values() if row is not None] if key else
                                   [dict(row) for row, count in held.items() for _ in range(count)])
    return outputs


def _written_order(part: Path) -> tuple[int, int]:
    """A sink file's (subtask, counter) from its name, ``part-<uuid>-<subtask>-<counter>``: a subtask's files in the
    order it wrote them (a file named otherwise is an error: its order is unknown)."""
    *_, subtask, counter = part.name.split("-")
    if not (subtask.isdigit() and counter.isdigit()):
        raise ValueError(f"{part}: not a Flink sink file (part-<uuid>-<subtask>-<counter>)")
    return int(subtask), int(counter)


def read_rows(output: Path):
    """The rows a checked trades run wrote, as a pandas frame keyed by ``bucket_start`` (epoch ms) and ``symbol``
    (the benchmarks' comparison layout)."""
    import pandas as pd
    from _common import MEASURES  # the benchmarks' side only: Flink's venv lacks _common's packages

    names = ["bucket_start", "symbol", *MEASURES]
    frame = pd.DataFrame(read_outputs(output, "trades").get("trade_aggregates", []), columns=names)
    stamps = pd.to_datetime(frame["bucket_start"], utc=True)
    frame["bucket_start"] = (stamps - pd.Timestamp("1970-01-01", tz="UTC")) // pd.Timedelta(milliseconds=1)
    return frame


# ---------------------------------------------------------------------------------------------
# The job (runs in Flink's venv: imports nothing from Tandem or the project's venv)


def _statements(plan: str, args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The plan's tables, views and sinks, and one ``INSERT`` per output (run together as one statement set)."""
    if plan not in PLANS:
        raise SystemExit(f"no Flink SQL for plan {plan!r}")
    declared = PLANS[plan]
    inputs = dict(item.split("=", 1) for item in args.input)
    ddl = [source_table(stream, columns, time_column, Path(inputs[stream]).resolve(), args.watermark_ms)
           for stream, (columns, time_column) in declared.streams.items()]
    ddl += declared.views
    inserts = []
    for name, output in declared.outputs.items():
        columns = output.columns + (f", PRIMARY KEY ({', '.join(output.key)}) NOT ENFORCED" if output.key else "")
        if args.output:  # a changelog format: the top-1s and the counts per customer update their rows
            sink = (f"'connector' = 'filesystem', 'path' = 'file://{Path(args.output).resolve() / name}', "
                    f"'format' = 'debezium-json'")
        else:
            sink = "'connector' = 'blackhole'"
        ddl.append(f"CREATE TEMPORARY TABLE sink_{name} ({columns}) WITH ({sink})")
        inserts.append(f"INSERT INTO sink_{name} {output.query}")
    return ddl, inserts


def _cpu_s() -> float:
    """CPU seconds this process and Flink's JVM used so far: the JVM is not reaped by this process when it exits,
    so the benchmark's accounting of its own processes would miss it (and take it for another process's)."""
    import resource

    from pyflink.java_gateway import get_gateway

    jvm = int(get_gateway().jvm.java.lang.ProcessHandle.current().pid())
    fields = Path(f"/proc/{jvm}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    own = resource.getrusage(resource.RUSAGE_SELF)
    return (int(fields[11]) + int(fields[12])) / ticks + own.ru_utime + own.ru_stime


def job_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one Flink run of a plan (Flink's venv)")
    parser.add_argument("--plan", required=True)
    parser.add_argument("--input", action="append", required=True, help="stream=directory, once per stream")
    parser.add_argument("--mode", choices=("streaming", "batch"), default="streaming")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--watermark-ms", type=int, required=True)
    parser.add_argument("--output")
    parser.add_argument("--checkpoint-ms", type=int)
    args = parser.parse_args(argv)

    from pyflink.table import EnvironmentSettings, TableEnvironment
    from pyflink.version import __version__ as flink_version

    started = time.perf_counter()
    settings = (EnvironmentSettings.in_batch_mode() if args.mode == "batch"
                else EnvironmentSettings.in_streaming_mode())
    env = TableEnvironment.create(settings)
    config = env.get_config()
    config.set("parallelism.default", str(args.parallelism))
    config.set("table.local-time-zone", "UTC")
    config.set("restart-strategy.type", "none")  # a failure ends the run (and the benchmark says so)
    checkpoints = Path(tempfile.mkdtemp(prefix="tandem-flink-checkpoints-"))
    checkpoint_ms = args.checkpoint_ms or (10_000 if args.output and args.mode == "streaming" else None)
    if checkpoint_ms:  # the file sink commits its files on checkpoints; the windows' state outgrows memory storage
        config.set("execution.checkpointing.interval", f"{checkpoint_ms} ms")
        config.set("execution.checkpointing.dir", checkpoints.as_uri())
    ddl, inserts = _statements(args.plan, args)
    for statement in ddl:
        env.execute_sql(statement)
    job = env.create_statement_set()
    for insert in inserts:
        job.add_insert_sql(insert)
    jvm_start_s = time.perf_counter() - started

    started = time.perf_counter()
    try:
        job.execute().wait()
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)
    job_s = time.perf_counter() - started
    print(json.dumps({"job_s": round(job_s, 3), "jvm_start_s": round(jvm_start_s, 3), "cpu_s": round(_cpu_s(), 1),
                      "flink_version": flink_version}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(job_main())
