#!/usr/bin/env python
"""The peer a user weighs Tandem against: Apache Flink (PyPI ``apache-flink``), local, on the same files.

One module, two sides:

- imported by the benchmarks (the project's venv): :func:`run` starts this file as a subprocess in Flink's own venv
  (``.tandem/flink-venv``, made by ``make bench-flink``; Flink pins its own pyarrow, numpy and py4j, so it never
  shares Tandem's venv and is never a runtime dependency), reads back one JSON line and, for a checked run, the
  CSV rows the job wrote;
- run as a script in that venv (``python flink_peer.py --plan trades …``): builds a local mini-cluster
  ``TableEnvironment``, declares the input as a ``filesystem`` table in the ``json`` format and runs the plan as one
  Flink SQL statement into a ``blackhole`` sink (timed runs) or a CSV ``filesystem`` sink (checked runs, which checkpoint every 10 s to a
  temporary folder: the sink commits its files on checkpoints).

The trades plan in Flink SQL: 1-second tumbling event-time windows per symbol with the plan's five measures
(``price_sum``, ``trade_count``, ``quantity_sum``, ``price_min``, ``price_max``), and the plan's bad-line rule:
a line counts only when it is a JSON object with a non-empty ``symbol`` (no NUL), a ``price`` > 0, an integral
``quantity`` > 0 and an integral ``timestamp`` between 1970 and 9999. Unparseable lines are skipped by the format
(``json.ignore-parse-errors``), the rest by the ``WHERE`` clause; Flink keeps no record of either (Tandem writes
each to its quarantine with the reason: work Flink's figure does not include). Flink's ``json`` format reads a
nested value into a ``STRING`` column as its JSON text, so the query also refuses a ``symbol`` starting with ``{``
or ``[`` (the nearest it can say "must be a JSON string").

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
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FLINK_PYTHON = Path(os.environ.get("TANDEM_FLINK_PYTHON", ROOT / ".tandem" / "flink-venv" / "bin" / "python"))

TRADES_SOURCE = """
CREATE TEMPORARY TABLE trades (
  symbol STRING,
  price DOUBLE,
  quantity DOUBLE,
  `timestamp` DOUBLE,
  ts AS TO_TIMESTAMP_LTZ(CAST(COALESCE(`timestamp`, 0) AS BIGINT), 3),
  WATERMARK FOR ts AS ts - INTERVAL '0.001' SECOND * {watermark_ms}
) WITH (
  'connector' = 'filesystem',
  'path' = 'file://{input}',
  'format' = 'json',
  'json.ignore-parse-errors' = 'true',
  'json.fail-on-missing-field' = 'false'
)"""

TRADES_QUERY = """
SELECT CAST(window_start AS STRING) AS bucket_start, symbol,
       SUM(price) AS price_sum, COUNT(*) AS trade_count, SUM(CAST(quantity AS BIGINT)) AS quantity_sum,
       MIN(price) AS price_min, MAX(price) AS price_max
FROM TABLE(TUMBLE(TABLE trades, DESCRIPTOR(ts), INTERVAL '1' SECOND))
WHERE symbol IS NOT NULL AND CHAR_LENGTH(TRIM(symbol)) > 0 AND POSITION(CHR(0) IN symbol) = 0
  AND symbol NOT LIKE '{%' AND symbol NOT LIKE '[%'
  AND price > 0
  AND quantity > 0 AND quantity = FLOOR(quantity)
  AND `timestamp` IS NOT NULL AND `timestamp` = FLOOR(`timestamp`)
  AND `timestamp` BETWEEN 0 AND 253402300799999
GROUP BY window_start, window_end, symbol"""

NOT_WRITTEN = {
    "pizza_shop": "not written yet: Flink SQL can say it (an interval LEFT JOIN of orders and deliveries for each "
                  "order's outcome, a ROW_NUMBER() top-1 per customer for last_orders, tumbling windows with "
                  "COUNT(DISTINCT customer_name) for order_stats), but the generator puts 100 orders on each "
                  "simulated second and last_orders breaks those ties by the order's event id: a Flink version "
                  "must break them the same way to be checked",
    "temperatures": "not written yet: Flink SQL can say it (an OVER window RANGE INTERVAL '119.999' SECOND "
                    "PRECEDING per room for avg_temps, MATCH_RECOGNIZE (A B*? C) WITHIN INTERVAL '10' MINUTE for "
                    "temp_alerts, a WHERE for high_temps), but the generator puts 100 readings on each simulated "
                    "second and temp_alerts takes the earliest warmer reading, ties broken by device: a Flink "
                    "version must break them the same way to be checked",
}
"""Plans the peer does not run, and why."""

TRADES_SINK_COLUMNS = ("bucket_start STRING, symbol STRING, price_sum DOUBLE, trade_count BIGINT, "
                       "quantity_sum BIGINT, price_min DOUBLE, price_max DOUBLE")


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


def run(plan: str, input_dir: Path, *, mode: str = "streaming", parallelism: int = 2, watermark_ms: int,
        output: Path | None = None, checkpoint_ms: int | None = None, timeout_s: float = 1800) -> FlinkRun:
    """Run ``plan`` in Flink over the files in ``input_dir`` in a child process (Flink's venv); ``output``: a
    directory for CSV rows (a checked run), else the blackhole sink."""
    command = [str(FLINK_PYTHON), __file__, "--plan", plan, "--input", str(input_dir), "--mode", mode,
               "--parallelism", str(parallelism), "--watermark-ms", str(watermark_ms)]
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


def read_rows(output: Path):
    """The CSV rows a checked trades run wrote, as a pandas frame keyed by ``bucket_start`` (epoch ms) and
    ``symbol`` (the benchmarks' comparison layout)."""
    import pandas as pd
    from _common import MEASURES  # the benchmarks' side only: Flink's venv lacks _common's packages

    names = ["bucket_start", "symbol", *MEASURES]
    parts = [p for p in sorted(output.rglob("*")) if p.is_file() and not p.name.startswith((".", "_"))]
    frames = [pd.read_csv(p, header=None, names=names, dtype={"symbol": str}) for p in parts if p.stat().st_size]
    if not frames:
        return pd.DataFrame(columns=names)
    frame = pd.concat(frames, ignore_index=True)
    stamps = pd.to_datetime(frame["bucket_start"], utc=True)
    frame["bucket_start"] = (stamps - pd.Timestamp("1970-01-01", tz="UTC")) // pd.Timedelta(milliseconds=1)
    return frame


# ---------------------------------------------------------------------------------------------
# The job (runs in Flink's venv: imports nothing from Tandem or the project's venv)


def _statements(plan: str, args: argparse.Namespace) -> list[str]:
    if plan != "trades":
        raise SystemExit(f"no Flink SQL for plan {plan!r}")
    if args.output:
        sink = (f"CREATE TEMPORARY TABLE sink ({TRADES_SINK_COLUMNS}) WITH ('connector' = 'filesystem', "
                f"'path' = 'file://{Path(args.output).resolve()}', 'format' = 'csv')")
    else:
        sink = f"CREATE TEMPORARY TABLE sink ({TRADES_SINK_COLUMNS}) WITH ('connector' = 'blackhole')"
    source = TRADES_SOURCE.format(watermark_ms=args.watermark_ms, input=Path(args.input).resolve())
    return [source, sink, f"INSERT INTO sink {TRADES_QUERY}"]


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
    parser.add_argument("--input", required=True)
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
    *ddl, insert = _statements(args.plan, args)
    for statement in ddl:
        env.execute_sql(statement)
    jvm_start_s = time.perf_counter() - started

    started = time.perf_counter()
    try:
        env.execute_sql(insert).wait()
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)
    job_s = time.perf_counter() - started
    print(json.dumps({"job_s": round(job_s, 3), "jvm_start_s": round(jvm_start_s, 3), "cpu_s": round(_cpu_s(), 1),
                      "flink_version": flink_version}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(job_main())
