#!/usr/bin/env python
"""Trades plan through Tandem versus a plain PySpark job doing the same work, on the same files.

One process, one local SparkSession (``conf/spark-defaults.conf``), input written once:

1. warm-up: one untimed small run of each side;
2. throughput: alternating Tandem / plain runs (``availableNow`` trigger, fresh checkpoints, Delta
   tables and PostgreSQL databases every run); events/s = input lines / wall time of the streaming
   part; after every pair the two sides' outputs are compared (all six granularities in PostgreSQL,
   Delta against PostgreSQL, quarantine counts, hourly ground truth computed from the generator);
3. profile: one more run of each side with timers around the sink steps (not part of the medians);
4. latency: the plan with a processing-time trigger in a background thread, files written at a
   steady rate, each file's unique marker symbol polled in PostgreSQL until visible.

Results go to ``bench/results/trades_throughput.json``. See bench/README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import pandas as pd  # noqa: E402
import psycopg2  # noqa: E402
import yaml  # noqa: E402
from deltalake import DeltaTable  # noqa: E402
from pyspark.sql.streaming import StreamingQueryListener  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

import _common as C  # noqa: E402
import engine  # noqa: E402
import flink_peer  # noqa: E402
import levers  # noqa: E402
import plain_trades  # noqa: E402
from tandem.config import load_cluster, load_plan  # noqa: E402
from tandem.lake.tables import read_table  # noqa: E402
from tandem.sources.files import write_atomically  # noqa: E402
from tandem.runtime.node import run_instance  # noqa: E402
from tandem.spark_session import build_session  # noqa: E402

GRANULARITIES = ("second", "minute", "hour", "day", "month", "year")
KEY = list(C.TRADE_KEY)
console = Console()


# ---------------------------------------------------------------------------------------------
# Options


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--events", type=int, default=1_500_000, help="input lines (valid + bad)")
    parser.add_argument("--files", type=int, default=1_000, help="input files")
    parser.add_argument("--symbols", type=int, default=200)
    parser.add_argument("--span-hours", type=float, default=1.0,
                        help="event-time span of the input, centred on 2025-01-01T00:00Z")
    parser.add_argument("--bad-ratio", type=float, default=0.005, help="share of bad lines")
    parser.add_argument("--max-files-per-trigger", type=int, default=None,
                        help="same on both sides; default: the plan's own admission (conf/plans/trades.yaml)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per side (alternating)")
    parser.add_argument("--warmup-events", type=int, default=100_000)
    parser.add_argument("--no-profile", action="store_true",
                        help="skip the instrumented profile runs and the JSON-parse micro-benchmark")
    parser.add_argument("--no-latency", action="store_true", help="skip the latency measurement")
    parser.add_argument("--no-engine", action="store_true",
                        help="skip the engine anchor (the plan's queries into materialise-only sinks, bench/engine.py)")
    parser.add_argument("--no-levers", action="store_true",
                        help="skip the levers (engine variants of the plan's work, bench/levers.py)")
    parser.add_argument("--flink", action=argparse.BooleanOptionalAction, default=None,
                        help="also run the peer, Apache Flink (bench/flink_peer.py; needs `make bench-flink`); "
                             "default: when its venv is there")
    parser.add_argument("--flink-parallelism", type=int, default=2)
    parser.add_argument("--latency-rate", type=int, default=2_000, help="events per second")
    parser.add_argument("--latency-files-per-s", type=int, default=5)
    parser.add_argument("--latency-duration", type=float, default=60.0, help="measured seconds")
    parser.add_argument("--latency-trigger", type=float, default=1.0, help="processing-time trigger, seconds")
    parser.add_argument("--latency-plain", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure the plain job's latency (for comparison)")
    parser.add_argument("--wait-for-quiet", action=argparse.BooleanOptionalAction, default=True,
                        help="before every run, wait until other processes use < 0.15 cores")
    parser.add_argument("--max-wait", type=float, default=3600, help="longest wait for a quiet machine, seconds")
    parser.add_argument("--max-foreign-cpu", type=float, default=5.0,
                        help="a pair during which other processes used more CPU seconds than this (or 5%% of the "
                             "run) is discarded and repeated, up to 3 times")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run with the same parameters (completed pairs are kept)")
    parser.add_argument("--quick", action="store_true",
                        help="CI-size run: 100k events, 100 files, 2 runs, 15 s latency")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "tandem_bench",
                        help="input files, checkpoints and Delta tables")
    parser.add_argument("--database-url", default=os.environ.get("TANDEM_BENCH_DATABASE_URL",
                                                                 "postgresql://postgres@127.0.0.1:5432/postgres"),
                        help="server to create the throw-away tandem_bench_* databases on")
    parser.add_argument("--output", type=Path, default=BENCH / "results" / "trades_throughput.json")
    args = parser.parse_args(argv)
    if args.quick:  # CI size, unless an option was given explicitly
        quick = {"events": 100_000, "files": 100, "runs": 2, "max_files_per_trigger": 10, "warmup_events": 20_000,
                 "latency_duration": 15.0}
        for name, value in quick.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
        if args.output == BENCH / "results" / "trades_throughput.json":  # keep CI-size numbers out of results/
            args.output = args.workdir / "trades_throughput.quick.json"
    args.flink = flink_peer.wanted(parser, args.flink)
    if args.max_files_per_trigger is None:  # catch-up at the admission the plan itself runs with
        plan = yaml.safe_load((ROOT / "conf" / "plans" / "trades.yaml").read_text())
        args.max_files_per_trigger = plan["streams"]["trades"]["max_files_per_trigger"]
    return args


# ---------------------------------------------------------------------------------------------
# Progress of every micro-batch of both sides (one listener for the whole session)


class BatchLog(StreamingQueryListener):
    def __init__(self) -> None:
        self.rows: list[dict] = []
        self.lock = threading.Lock()

    def onQueryStarted(self, event) -> None:  # noqa: N802
        pass

    def onQueryIdle(self, event) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event) -> None:  # noqa: N802
        pass

    def onQueryProgress(self, event) -> None:  # noqa: N802
        p = event.progress
        states = p.stateOperators or []
        row = {"query": (p.name or "").rsplit(":", 1)[-1].removeprefix("plain-"), "batch": p.batchId,
               "input_rows": p.numInputRows, "duration_ms": dict(p.durationMs or {}),
               "late_rows": sum(s.numRowsDroppedByWatermark for s in states), "at": time.time()}
        with self.lock:
            self.rows.append(row)

    def take(self) -> list[dict]:
        time.sleep(1.0)  # progress events arrive asynchronously on the listener bus
        with self.lock:
            rows, self.rows = self.rows, []
        return rows


def summarize_batches(rows: list[dict]) -> dict:
    out = {}
    for query in sorted({r["query"] for r in rows}):
        mine = [r for r in rows if r["query"] == query]
        with_data = [r for r in mine if r["input_rows"]]
        phases = defaultdict(int)
        for r in mine:
            for phase, ms in r["duration_ms"].items():
                phases[phase] += ms
        out[query] = {
            "batches": len(mine), "batches_with_data": len(with_data),
            "input_rows": sum(r["input_rows"] for r in mine),
            "late_rows": sum(r["late_rows"] for r in mine),
            "batch_ms_median": statistics.median([r["duration_ms"].get("triggerExecution", 0) for r in with_data])
            if with_data else None,
            "phase_ms_total": dict(sorted(phases.items())),
        }
    return out


# ---------------------------------------------------------------------------------------------
# Running the two sides


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.workdir: Path = args.workdir.resolve()
        self.server = args.database_url
        self.databases: list[str] = []
        self.project = self.workdir / "project"
        self.spark = None
        self.batches = BatchLog()

    # -- setup ---------------------------------------------------------------------------------

    def make_project(self) -> None:
        """A copy of conf/ whose trades plan reads ``max_files_per_trigger`` files per batch."""
        shutil.rmtree(self.project, ignore_errors=True)
        shutil.copytree(ROOT / "conf", self.project / "conf")
        plan_file = self.project / "conf" / "plans" / "trades.yaml"
        plan = yaml.safe_load(plan_file.read_text())
        plan["streams"]["trades"]["max_files_per_trigger"] = self.args.max_files_per_trigger
        plan_file.write_text(yaml.safe_dump(plan, sort_keys=False))

    def use_tandem_project(self, storage_root: Path, database_url: str):
        os.environ.update({"TANDEM_HOME": str(self.project), "TANDEM_CONF_DIR": str(self.project / "conf"),
                           "TANDEM_STORAGE_ROOT": str(storage_root), "TANDEM_DATABASE_URL": database_url})
        cluster = load_cluster()
        return cluster, load_plan("trades", cluster)

    def new_database(self, label: str) -> str:
        url = C.create_database(self.server, label)
        self.databases.append(url)
        return url

    def drop_databases(self, keep: tuple[str, ...] = ()) -> None:
        for url in list(self.databases):
            if url not in keep:
                C.drop_database(url)
                self.databases.remove(url)

    def settle(self) -> dict:
        """Same starting conditions for every run: no dirty PostgreSQL pages, collected garbage,
        and (on this shared machine) no other busy process; returns what the run should record."""
        C.checkpoint(self.server)
        gc.collect()
        self.spark.sparkContext._jvm.System.gc()
        ours = {os.getpid(), int(self.spark.sparkContext._jvm.ProcessHandle.current().pid())}
        told = []

        def waiting(busy: float) -> None:
            if not told:
                console.print(f"[yellow]other processes use {busy:.1f} cores: waiting for the machine to be quiet[/]")
                told.append(True)

        waited = (C.wait_for_quiet(ours, max_wait_s=self.args.max_wait, on_wait=waiting)
                  if self.args.wait_for_quiet else 0.0)
        self.foreign = C.ForeignCpu(ours)
        self.cpu = C.CpuSplit(ours)
        return {"waited_for_quiet_s": round(waited, 1)}

    def pair(self, inp: C.InputSet, label: str, discarded: list[dict]) -> tuple[dict, dict]:
        """Tandem then plain; repeated (up to 3 times) when other processes disturbed either run."""
        for attempt in range(4):
            tandem = self.run_tandem(inp, label)
            plain = self.run_plain(inp, label)
            if attempt == 3 or not (self.disturbed(tandem) or self.disturbed(plain)):
                return tandem, plain
            console.print(f"[yellow]pair {label} disturbed by other processes ({tandem['other_processes_cpu_s']} / "
                          f"{plain['other_processes_cpu_s']} CPU s): repeating it[/]")
            for run in (tandem, plain):
                discarded.append({k: v for k, v in run.items() if k not in ("batches", "database")})
            self.drop_databases()
        raise AssertionError("unreachable")

    def disturbed(self, run: dict) -> bool:
        return run["other_processes_cpu_s"] > max(self.args.max_foreign_cpu, 0.05 * run["wall_s"])

    def disturbance(self) -> float:
        """CPU seconds other processes used since :meth:`settle` (0 on a quiet machine)."""
        return round(self.foreign.seconds(), 1)

    def used(self) -> dict:
        """What a run recorded at its end: the CPU others used (:meth:`disturbance`) and its own, split (and by kind of
        thread)."""
        return {"other_processes_cpu_s": self.disturbance(), "cpu_s": self.cpu.seconds(),
                "cpu_s_by_thread": self.cpu.by_thread()}

    # -- one run of each side ------------------------------------------------------------------

    def run_tandem(self, inp: C.InputSet, label: str) -> dict:
        storage_root = inp.directory.parents[2]
        for sub in ("checkpoints", "delta"):
            shutil.rmtree(storage_root / sub, ignore_errors=True)
        database = self.new_database(f"t{label}")
        cluster, plan = self.use_tandem_project(storage_root, database)
        self.batches.take()
        conditions = self.settle()
        started = time.perf_counter()
        result = run_instance(cluster, plan, "node-a", "shard-1", spark=self.spark, available_now=True)
        wall = time.perf_counter() - started
        conditions.update(self.used())
        if result.status != "STOPPED":
            raise RuntimeError(f"tandem run {label} failed: {result.error}")
        return {"side": "tandem", "label": label, "wall_s": round(wall, 3),
                "events_per_s": round(inp.lines / wall), "database": database, **conditions,
                "delta_root": str(storage_root / "delta" / "trades"),
                "batches": summarize_batches(self.batches.take())}

    def run_plain(self, inp: C.InputSet, label: str) -> dict:
        out = self.workdir / "plain" / label
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        database = self.new_database(f"p{label}")
        self.batches.take()
        conditions = self.settle()
        started = time.perf_counter()
        plain_trades.run(self.spark, str(inp.directory), database, str(out),
                         max_files_per_trigger=self.args.max_files_per_trigger)
        wall = time.perf_counter() - started
        conditions.update(self.used())
        return {"side": "plain", "label": label, "wall_s": round(wall, 3),
                "events_per_s": round(inp.lines / wall), "database": database, "delta_root": str(out), **conditions,
                "batches": summarize_batches(self.batches.take())}

    def run_engine(self, inp: C.InputSet, config: engine.EngineConfig) -> dict:
        """The engine anchor (:mod:`engine`) over the same input: no database, no Delta table is written."""
        cluster, plan = self.use_tandem_project(inp.directory.parents[2], self.server)
        conditions = self.settle()
        wall = engine.run_engine(cluster, plan, self.spark, config, self.workdir / "engine-checkpoints")
        return {"config": config.name, "wall_s": round(wall, 3), **conditions, **self.used()}

    def run_lever(self, inp: C.InputSet, lever: levers.Lever) -> dict:
        """One engine variant (:mod:`levers`) over the same input: nothing published."""
        _, plan = self.use_tandem_project(inp.directory.parents[2], self.server)
        conditions = self.settle()
        wall, counted = levers.run_lever(plan, self.spark, lever, inp.directory, self.workdir / "lever-checkpoints")
        return {"lever": lever.name, "wall_s": round(wall, 3), "events_per_s": round(inp.lines / wall),
                "counted": counted, "counts_right": counted == {"events": inp.valid, "bad_lines": inp.invalid},
                **conditions, **self.used()}

    def run_flink(self, inp: C.InputSet, mode: str, watermark_ms: int, output: Path | None = None) -> dict:
        """One run of the peer (:mod:`flink_peer`) over the same files, in a child JVM: a blackhole sink, or CSV rows
        in ``output``."""
        if output is not None:
            shutil.rmtree(output, ignore_errors=True)
        conditions = self.settle()
        run = flink_peer.run("trades", {"trades": inp.directory}, mode=mode, parallelism=self.args.flink_parallelism,
                             watermark_ms=watermark_ms, output=output)
        used = self.used()  # Flink's JVM is not reaped by its parent: its CPU comes from the child's own report
        used["other_processes_cpu_s"] = round(max(0.0, used["other_processes_cpu_s"] - run.cpu_s), 1)
        used["cpu_s"]["flink"] = run.cpu_s
        return {"mode": mode, "watermark_ms": watermark_ms, "sink": "debezium-json files" if output else "blackhole",
                "wall_s": run.job_s, "events_per_s": round(inp.lines / run.job_s), "jvm_start_s": run.jvm_start_s,
                "process_s": run.process_s, "flink_version": run.flink_version, **conditions, **used}


def lever_part(bench: Bench, inp: C.InputSet, state, progress, phase, engine_best: int | None) -> dict:
    """Each lever (:mod:`levers`) ``--runs`` times, alternating; its median beside the engine anchor's best."""
    runs: list[dict] = state.get("lever_runs", [])
    progress.update(phase, description="levers (engine variants, nothing published)",
                    total=bench.args.runs * len(levers.LEVERS), completed=len(runs))
    for index in range(bench.args.runs):
        for lever in levers.LEVERS:
            if sum(r["lever"] == lever.name for r in runs) > index:
                continue
            runs.append(bench.run_lever(inp, lever))
            state.put("lever_runs", runs)
            console.print(f"lever {lever.name}: {runs[-1]['wall_s']:.1f} s = {runs[-1]['events_per_s']:,}/s, "
                          f"counts right: {runs[-1]['counts_right']}")
            progress.advance(phase)
    out: dict = {"method": levers.__doc__.strip(), "runs": runs, "levers": {}}
    for lever in levers.LEVERS:
        mine = [r for r in runs if r["lever"] == lever.name]
        rate = round(inp.lines / statistics.median(r["wall_s"] for r in mine))
        out["levers"][lever.name] = {"events_per_s": rate, "counts_right": all(r["counts_right"] for r in mine),
                                     "over_engine_best": round(rate / engine_best, 3) if engine_best else None}
    return out


def exact_watermark_ms(spec: C.InputSpec) -> int:
    """A watermark as wide as the input's event-time span (plus its jitter): Flink's file source reads the files in
    parallel and out of order, and only this wide a watermark drops nothing as late."""
    return int(spec.span_hours * 3_600_000) + spec.jitter_ms + 1_000


def flink_part(bench: Bench, inp: C.InputSet, state, progress, phase, streaming_in_pairs: list[dict]) -> dict:
    """The peer on the same input: checked once against the ground truth (exact watermark, CSV rows), once with the
    plan's own watermark (what a narrower watermark silently loses), then timed runs of batch mode (blackhole sink),
    and of streaming mode too unless ``streaming_in_pairs`` holds them (one right after each Tandem/plain pair)."""
    flink = state.get("flink", {})
    exact = exact_watermark_ms(inp.spec)
    truth = None  # computed once, and only when a checked run is still to do (a resumed run may have both)
    plan_watermark_ms = int(bench.use_tandem_project(inp.directory.parents[2], bench.server)[1].watermark_s * 1000)
    for key, watermark in (("check", exact), ("check_plan_watermark", plan_watermark_ms)):
        if key in flink:
            continue
        progress.update(phase, description=f"flink: checked run, watermark {watermark / 1000:g} s", total=None)
        out = bench.workdir / "flink-out" / key
        run = bench.run_flink(inp, "streaming", watermark, out)
        rows = flink_peer.read_rows(out)
        truth = C.ground_truth(inp.spec, 1000) if truth is None else truth
        counted = int(rows["trade_count"].sum()) if len(rows) else 0
        flink[key] = {**run, "vs_ground_truth_second": C.compare_frames(rows, truth), "valid_events": inp.valid,
                      "events_counted": counted, "events_lost": inp.valid - counted}
        shutil.rmtree(out, ignore_errors=True)
        state.put("flink", flink)
        console.print(f"flink check (watermark {watermark / 1000:g} s): {counted:,} of {inp.valid:,} valid events "
                      f"counted, matches ground truth: {flink[key]['vs_ground_truth_second']['match']}")
    runs: list[dict] = flink.get("runs", [])
    modes = ("batch",) if streaming_in_pairs else ("streaming", "batch")
    progress.update(phase, description=f"flink: timed runs ({', '.join(modes)})",
                    total=len(modes) * bench.args.runs, completed=len(runs))
    for index in range(bench.args.runs):
        for mode in modes:
            if sum(r["mode"] == mode for r in runs) > index:
                continue
            runs.append(bench.run_flink(inp, mode, exact))
            flink["runs"] = runs
            state.put("flink", flink)
            console.print(f"flink {mode}: {runs[-1]['wall_s']:.1f} s = {runs[-1]['events_per_s']:,}/s")
            progress.advance(phase)
    timed = [*streaming_in_pairs, *runs]
    for mode in ("streaming", "batch"):
        flink[f"{mode}_events_per_s"] = round(statistics.median(r["events_per_s"] for r in timed if r["mode"] == mode))
    flink["streaming_runs_in_pairs"] = len(streaming_in_pairs)
    flink["jvm_start_s_median"] = statistics.median(r["jvm_start_s"] for r in timed)
    flink["version"] = runs[0]["flink_version"]
    flink["parallelism"] = bench.args.flink_parallelism
    flink["method"] = flink_peer.__doc__.strip()
    return flink


# ---------------------------------------------------------------------------------------------
# Checking that both sides computed the same thing

MEASURE_SQL = ", ".join(C.MEASURES)


def _epoch_ms(values: pd.Series) -> pd.Series:
    stamps = pd.to_datetime(values, utc=True)
    return (stamps - pd.Timestamp("1970-01-01", tz="UTC")) // pd.Timedelta(milliseconds=1)


def postgres_rows(run: dict, granularity: str) -> pd.DataFrame:
    table = "tandem.trade_aggregates" if run["side"] == "tandem" else "plain_trades.trade_aggregates"
    frame = C.read_query(run["database"], f"SELECT bucket_start, symbol, {MEASURE_SQL} FROM {table} "
                                          f"WHERE granularity = '{granularity}'")
    if frame.empty:
        return pd.DataFrame(columns=KEY + list(C.MEASURES))
    frame["bucket_start"] = _epoch_ms(frame["bucket_start"])
    frame["symbol"] = frame["symbol"].astype(str)
    return frame


def delta_paths(run: dict) -> tuple[Path, Path]:
    root = Path(run["delta_root"])
    return root / "trade_aggregates", root / "quarantine"


def delta_latest(run: dict) -> pd.DataFrame:
    """The newest version of every (granularity, bucket, symbol) row in the side's Delta table."""
    path, _ = delta_paths(run)
    frame = read_table(path, columns=["granularity", "bucket_start", "symbol", *C.MEASURES, "batch_id"]).to_pandas()
    frame["bucket_start"] = _epoch_ms(frame["bucket_start"])
    frame = frame.sort_values("batch_id").drop_duplicates(["granularity", *KEY], keep="last")
    return frame.drop(columns="batch_id")


def quarantine_rows(run: dict) -> int:
    _, path = delta_paths(run)
    return read_table(path, columns=["raw"]).num_rows if DeltaTable.is_deltatable(str(path)) else 0


def check_pair(tandem: dict, plain: dict, inp: C.InputSet) -> dict:
    """Both sides against each other (all granularities), against the ground truth and their own Delta."""
    truth = inp.truth_hour.rename(columns={"hour": "bucket_start"})
    report: dict = {"tandem_vs_plain": {}, "vs_ground_truth_hour": {}, "delta_vs_postgres": {}}
    pg: dict[str, dict[str, pd.DataFrame]] = {"tandem": {}, "plain": {}}
    for granularity in GRANULARITIES:
        for run in (tandem, plain):
            pg[run["side"]][granularity] = postgres_rows(run, granularity)
        report["tandem_vs_plain"][granularity] = C.compare_frames(pg["tandem"][granularity], pg["plain"][granularity])
    for run in (tandem, plain):
        side = run["side"]
        report["vs_ground_truth_hour"][side] = C.compare_frames(pg[side]["hour"], truth)
        latest = delta_latest(run)
        report["delta_vs_postgres"][side] = {
            g: C.compare_frames(latest[latest["granularity"] == g].drop(columns="granularity"), pg[side][g])
            for g in GRANULARITIES}
        run["postgres_rows"] = {g: int(len(pg[side][g])) for g in GRANULARITIES}
        run["delta_rows"] = int(read_table(delta_paths(run)[0], columns=["batch_id"]).num_rows)
        run["quarantine_rows"] = quarantine_rows(run)
        run["late_rows"] = run["batches"].get("aggregates", {}).get("late_rows")
    report["quarantine"] = {"expected": inp.invalid, "tandem": tandem["quarantine_rows"], "plain": plain["quarantine_rows"]}
    ok = all(c["match"] for c in report["tandem_vs_plain"].values())
    ok &= all(c["match"] for c in report["vs_ground_truth_hour"].values())
    ok &= all(c["match"] for side in report["delta_vs_postgres"].values() for c in side.values())
    ok &= tandem["quarantine_rows"] == plain["quarantine_rows"] == inp.invalid
    report["outputs_match"] = bool(ok)
    return report


# ---------------------------------------------------------------------------------------------
# Profile: timers around the sink steps of both sides (separate runs, not in the medians)


class Timers:
    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.lock = threading.Lock()
        self.restore: list[tuple[object, str, object]] = []

    def wrap(self, owner, name: str, label: str | None = None, label_of=None) -> None:
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                key = label_of(args) if label_of else (label or name)
                with self.lock:
                    self.totals[key] += time.perf_counter() - started
                    self.counts[key] += 1

        setattr(owner, name, timed)
        self.restore.append((owner, name, original))

    def undo(self) -> None:
        for owner, name, original in reversed(self.restore):
            setattr(owner, name, original)
        self.restore.clear()

    def report(self) -> dict:
        return {k: {"seconds": round(v, 3), "calls": self.counts[k]} for k, v in sorted(self.totals.items())}


def _frame_label(args) -> str:
    frame = args[0]
    return "spark batch → Arrow (quarantine)" if "raw" in frame.columns else "spark batch → Arrow (aggregates)"


@contextmanager
def instrumented(side: str):
    from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

    timers = Timers()
    timers.wrap(ClassicDataFrame, "toArrow", label_of=_frame_label)
    if side == "tandem":
        import tandem.aggregation.delta as agg_delta
        import tandem.aggregation.postgres as agg_postgres
        import tandem.lake.tables as tables
        import tandem.store.aggregates as aggregates
        import tandem.outputs.aggregation as aggregation_kind
        import tandem.outputs.quarantine as quarantine_kind
        import tandem.runtime.listener as listener

        timers.wrap(aggregation_kind.AggregateSink, "publish", "aggregates sink total")
        timers.wrap(quarantine_kind.QuarantineSink, "publish", "quarantine sink total")
        timers.wrap(aggregates, "stage_batch", "pg: COPY into temp table")
        timers.wrap(agg_postgres, "upsert_and_roll_up", "pg: upsert + roll-ups (incl. RETURNING copied out)")
        timers.wrap(aggregates, "copied_out", "pg: rows copied out as Arrow (part of upsert)")
        timers.wrap(aggregation_kind, "record_published", "pg: publish_log row")
        timers.wrap(agg_delta, "append_rows", "delta: aggregates append_rows total")
        timers.wrap(agg_delta, "append_once", "delta: aggregates append_once")
        timers.wrap(quarantine_kind, "append_once", "delta: quarantine append_once")
        timers.wrap(tables, "committed_version", "delta: committed_version (log load)")
        timers.wrap(tables, "write_deltalake", "delta: write_deltalake")
        timers.wrap(listener, "record_progress", "heartbeat rows (listener thread)")
    else:
        timers.wrap(plain_trades, "upsert_and_roll_up", "pg: COPY + upsert + roll-ups (incl. fetch)")
        timers.wrap(plain_trades, "append_delta", "delta: aggregates append total")
        timers.wrap(plain_trades, "write_deltalake", "delta: write_deltalake")
    try:
        yield timers
    finally:
        timers.undo()


def parse_microbenchmark(spark, inp: C.InputSet, files: int, progress: Progress, settle) -> dict:
    """Batch read of ``files`` input files, written to the noop sink (every column computed).

    Isolates the Spark-side cost of parsing + validation per query: the good rows as the
    aggregation query sees them and the bad rows as the quarantine query sees them.
    """
    from pyspark.sql import functions as F
    from tandem.config import load_plan
    from tandem.plans import good_events
    from tandem.runtime.records import parse_and_validate, record_schema

    plan = load_plan("trades")
    trade_event = record_schema(plan.streams["trades"])

    def good_trades(frame):
        return good_events(frame, plan, "trades")

    paths = [str(p) for p in sorted(inp.directory.glob("*.jsonl"))[:files]]
    lines_count = 0

    def lines():
        return spark.read.text(paths).select(F.col("value").alias("raw"), F.col("_metadata.file_path").alias("source_file"))

    def plain_good(frame):
        return frame.where(F.col("reason").isNull()).select(
            "symbol", "price", "quantity", F.timestamp_millis("timestamp").alias("event_time"))

    def bad(frame):
        return frame.where(F.col("reason").isNotNull()).select("raw", "source_file", "reason")

    variants = {
        "tandem parse_and_validate": lambda: parse_and_validate(lines(), trade_event),
        "plain parse_events": lambda: plain_trades.parse_events(lines()),
    }
    lines_count = lines().count()
    settle()
    out: dict = {"files": len(paths), "lines": lines_count, "seconds": {}}
    task = progress.add_task("parse micro-benchmark", total=len(variants) * 2 * 2)
    for name, make in variants.items():
        good_of = good_trades if name.startswith("tandem") else plain_good
        for kind, shape in (("good rows (aggregation query)", good_of), ("bad rows (quarantine query)", bad)):
            times = []
            for _ in range(2):
                started = time.perf_counter()
                shape(make()).write.format("noop").mode("overwrite").save()
                times.append(time.perf_counter() - started)
                progress.advance(task)
            out["seconds"][f"{name}: {kind}"] = round(min(times), 2)
            out.setdefault("lines_per_s", {})[f"{name}: {kind}"] = round(lines_count / min(times))
    progress.remove_task(task)
    return out


def heartbeat_summary(database: str) -> list[dict]:
    """Per query: batches and batch durations as Tandem itself recorded them (tandem.heartbeats)."""
    frame = C.read_query(database, """
        SELECT query_name, count(*) AS batches, sum(input_rows) AS input_rows,
               sum(batch_duration_ms) AS batch_ms_total,
               percentile_cont(0.5) WITHIN GROUP (ORDER BY batch_duration_ms) AS batch_ms_p50,
               max(batch_duration_ms) AS batch_ms_max, sum(late_rows)::bigint AS late_rows,
               sum(quarantined_rows)::bigint AS quarantined_rows
        FROM tandem.heartbeats WHERE input_rows > 0 GROUP BY query_name ORDER BY query_name""")
    return json.loads(frame.to_json(orient="records"))


# ---------------------------------------------------------------------------------------------
# Latency at a steady input rate


def latency_run(bench: Bench, side: str, symbols: list[str], progress: Progress) -> dict:
    args = bench.args
    root = bench.workdir / "latency" / side
    shutil.rmtree(root, ignore_errors=True)
    landing = root / "landing" / "trades" / "0"  # shard-1 reads partition 0
    landing.mkdir(parents=True)
    database = bench.new_database(f"l{side[0]}")
    conditions = bench.settle()
    stop = threading.Event()
    outcome: list = []
    if side == "tandem":
        cluster, plan = bench.use_tandem_project(root, database)
        table = "tandem.trade_aggregates"
        runner = threading.Thread(name="tandem-latency", daemon=True, target=lambda: outcome.append(run_instance(
            cluster, plan, "node-a", "shard-1", spark=bench.spark, trigger_interval_s=args.latency_trigger, stop=stop)))
        runner.start()
        close = None
    else:
        table = "plain_trades.trade_aggregates"
        queries, close_conn = plain_trades.start(
            bench.spark, str(landing), database, str(root / "out"), max_files_per_trigger=args.max_files_per_trigger,
            available_now=False, trigger=f"{round(args.latency_trigger * 1000)} milliseconds")

        def close() -> None:
            for query in queries:
                query.stop()
            close_conn()

    conn = psycopg2.connect(database)
    conn.autocommit = True
    cursor = conn.cursor()
    deadline = time.time() + 120
    while True:  # the sink's table exists once the run has started
        cursor.execute("SELECT to_regclass(%s)", (table,))
        if cursor.fetchone()[0] or time.time() > deadline:
            break
        time.sleep(0.2)
    time.sleep(3.0)
    bench.batches.take()

    rng = random.Random(11)
    prices = {s: rng.uniform(5, 900) for s in symbols}
    per_file = max(1, args.latency_rate // args.latency_files_per_s)
    interval = 1.0 / args.latency_files_per_s
    warmup_files = 5 * args.latency_files_per_s
    total_files = warmup_files + int(args.latency_duration * args.latency_files_per_s)
    written: dict[str, float] = {}
    visible: dict[str, float] = {}
    lines_valid = 0
    lock = threading.Lock()
    feeding_done = threading.Event()
    poll_until = [float("inf")]  # after feeding: give the last files this long to become visible

    def poll() -> None:
        poll_conn = psycopg2.connect(database)
        poll_conn.autocommit = True
        poll_cursor = poll_conn.cursor()
        while True:
            with lock:
                pending = [s for s in written if s not in visible]
            if not pending and feeding_done.is_set():
                break
            if pending:
                asked = time.time()
                poll_cursor.execute(f"SELECT DISTINCT symbol FROM {table} WHERE granularity = 'second' "
                                    "AND symbol = ANY(%s)", (pending,))
                found = [row[0] for row in poll_cursor.fetchall()]
                with lock:
                    for symbol in found:
                        visible.setdefault(symbol, asked)
            if time.time() > poll_until[0]:
                break
            time.sleep(0.02)
        poll_conn.close()

    poller = threading.Thread(name="latency-poller", target=poll, daemon=True)
    poller.start()
    task = progress.add_task(f"latency: {side} ({args.latency_rate} events/s)", total=total_files)
    started = time.time()
    for index in range(total_files):
        delay = started + index * interval - time.time()
        if delay > 0:
            time.sleep(delay)
        now_ms = int(time.time() * 1000)
        marker = f"LAT{index:06d}"
        lines = [json.dumps({"symbol": marker, "price": 1.0, "quantity": 1, "timestamp": now_ms})]
        for _ in range(per_file - 1):
            if rng.random() < args.bad_ratio:
                lines.append(rng.choice(C.BAD_TEMPLATES).format(sym=rng.choice(symbols), ts=now_ms))
                continue
            symbol = rng.choice(symbols)
            prices[symbol] = max(0.01, round(prices[symbol] * (1 + rng.uniform(-0.002, 0.002)), 2))
            lines.append(json.dumps({"symbol": symbol, "price": prices[symbol], "quantity": rng.randint(1, 500),
                                     "timestamp": now_ms}))
            lines_valid += 1
        write_atomically(landing, lines, prefix="lat")
        with lock:
            written[marker] = time.time()
        lines_valid += 1
        progress.advance(task)
    feed_seconds = time.time() - started
    poll_until[0] = time.time() + 60
    feeding_done.set()
    poller.join()
    progress.remove_task(task)
    time.sleep(2 * args.latency_trigger + 1)
    cursor.execute(f"SELECT coalesce(sum(trade_count), 0) FROM {table} WHERE granularity = 'second'")
    aggregated = int(cursor.fetchone()[0])
    conn.close()
    stop.set()
    if close:
        close()
    else:
        runner.join(timeout=60)
        if outcome and outcome[0].status != "STOPPED":
            raise RuntimeError(f"tandem latency run failed: {outcome[0].error}")
    conditions["other_processes_cpu_s"] = bench.disturbance()
    batches = [r for r in bench.batches.take() if r["query"] == "aggregates" and r["input_rows"]]

    measured = [f"LAT{i:06d}" for i in range(warmup_files, total_files)]
    latencies = [visible[m] - written[m] for m in measured if m in visible]
    batch_ms = [r["duration_ms"].get("triggerExecution", 0) for r in batches]
    return {
        "side": side, "trigger_s": args.latency_trigger, "rate_events_per_s": args.latency_rate,
        "files_per_s": args.latency_files_per_s, "events_per_file": per_file,
        "achieved_events_per_s": round(total_files * per_file / feed_seconds),
        "measured_seconds": args.latency_duration, "warmup_seconds_not_measured": 5,
        "files_measured": len(measured), "files_never_visible": len(measured) - len(latencies),
        "p50_s": _r(C.percentile(latencies, 50)), "p95_s": _r(C.percentile(latencies, 95)),
        "p99_s": _r(C.percentile(latencies, 99)), "max_s": _r(max(latencies) if latencies else None),
        "mean_s": _r(statistics.fmean(latencies) if latencies else None),
        "aggregates_batch_ms_p50": _r(C.percentile(batch_ms, 50)), "aggregates_batch_ms_p95": _r(C.percentile(batch_ms, 95)),
        "all_valid_events_aggregated": aggregated == lines_valid,
        "valid_events_written": lines_valid, "valid_events_aggregated": aggregated, **conditions,
    }


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


# ---------------------------------------------------------------------------------------------
# Main


class State:
    """Completed steps, saved after each one so ``--resume`` can continue an interrupted run
    (this machine is shared: other people's tests start, load and kill processes)."""

    def __init__(self, path: Path, identity: dict, resume: bool) -> None:
        self.path = path
        self.identity = identity
        self.data: dict = {"identity": identity}
        if resume and path.is_file():
            saved = json.loads(path.read_text())
            if saved.get("identity") == identity:
                self.data = saved
                console.print(f"resuming: {', '.join(k for k in saved if k != 'identity') or 'nothing done yet'}")
            else:
                console.print("[yellow]saved state is for other parameters: starting over[/]")

    def get(self, key: str, default=None):
        return self.data.get(key, default)

    def put(self, key: str, value) -> None:
        self.data[key] = value
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.data, default=str))
        os.replace(temporary, self.path)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    bench = Bench(args)
    bench.workdir.mkdir(parents=True, exist_ok=True)
    bench.make_project()
    spec = C.InputSpec(events=args.events, files=args.files, symbols=args.symbols, span_hours=args.span_hours,
                       bad_ratio=args.bad_ratio)
    warm_spec = C.InputSpec(events=args.warmup_events, files=max(10, args.warmup_events // 2000),
                            symbols=args.symbols, span_hours=0.5, bad_ratio=args.bad_ratio, seed=99)
    identity = {"input": spec.key, "max_files_per_trigger": args.max_files_per_trigger,
                "latency": [args.latency_rate, args.latency_files_per_s, args.latency_duration, args.latency_trigger],
                "output": str(args.output)}
    state = State(bench.workdir / f"state-{spec.key}.json", identity, args.resume)
    results: dict = {"benchmark": "trades_throughput", "started_at": state.get("started_at") or C.now_iso()}
    state.put("started_at", results["started_at"])
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
               TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            phase = progress.add_task("input", total=None)
            inp = C.prepare_input(spec, bench.workdir / "data" / spec.key, write_atomically, progress)
            warm = C.prepare_input(warm_spec, bench.workdir / "data" / warm_spec.key, write_atomically, progress)
            progress.update(phase, description="starting Spark", total=None)
            session_started = time.perf_counter()
            bench.spark = build_session("tandem-bench-throughput", "local[2]", ROOT / "conf" / "spark-defaults.conf")
            session_start_s = time.perf_counter() - session_started
            bench.spark.streams.addListener(bench.batches)
            results["machine"] = C.machine_info(bench.spark, bench.server)
            results["machine"]["session_start_s"] = round(session_start_s, 2)
            results["input"] = inp.describe()
            results["input"]["sizing"] = (
                f"{inp.lines:,} lines in {inp.files} files, {args.symbols} symbols, {args.span_hours:g} h of event time "
                f"centred on 2025-01-01T00:00Z: {inp.second_rows:,} second×symbol rows (≈{inp.valid / inp.second_rows:.1f} "
                "events each) plus minute…year roll-ups, two buckets per symbol from hour to year. The per-second "
                "upsert into PostgreSQL is a large share of both sides' work, so the span × symbols product is kept "
                "at a size where the plain job takes ~45 s on 2 cores; "
                f"{args.max_files_per_trigger} files per trigger gives "
                f"{-(-inp.files // args.max_files_per_trigger)} micro-batches, so state, watermark and per-batch "
                "costs are all exercised.")
            console.print(f"input: {inp.lines:,} lines ({inp.invalid:,} bad) in {inp.files} files, "
                          f"{inp.second_rows:,} second×symbol buckets; Spark started in {session_start_s:.1f} s")

            progress.update(phase, description="warm-up (untimed): tandem, plain")
            warm_t = bench.run_tandem(warm, "warm")
            warm_p = bench.run_plain(warm, "warm")
            warm_check = check_pair(warm_t, warm_p, warm)
            bench.drop_databases()
            console.print(f"warm-up: tandem {warm_t['wall_s']} s, plain {warm_p['wall_s']} s, "
                          f"outputs_match={warm_check['outputs_match']}")
            state.put("warm_outputs_match", state.get("warm_outputs_match", True) and warm_check["outputs_match"])

            runs: list[dict] = state.get("runs", [])
            pairs: list[dict] = state.get("pairs", [])
            discarded: list[dict] = state.get("discarded", [])
            progress.update(phase, description="timed runs (tandem, plain alternating)", total=args.runs,
                            completed=len(pairs))
            for index in range(len(pairs), args.runs):
                tandem, plain = bench.pair(inp, f"r{index}", discarded)
                check = check_pair(tandem, plain, inp)
                bench.drop_databases()
                for run in (tandem, plain):
                    run.pop("database")
                runs += [tandem, plain]
                ratio = tandem["events_per_s"] / plain["events_per_s"]
                pairs.append({"pair": index, "tandem_events_per_s": tandem["events_per_s"],
                              "plain_events_per_s": plain["events_per_s"], "ratio": round(ratio, 3),
                              "outputs_match": check["outputs_match"], "checks": check})
                if args.flink:  # the peer right after, so that a drifting host moves both sides of its ratio
                    peer = bench.run_flink(inp, "streaming", exact_watermark_ms(inp.spec))
                    pairs[-1].update({"flink": peer, "tandem_over_flink": round(
                        tandem["events_per_s"] / peer["events_per_s"], 3)})
                    console.print(f"pair {index}: flink streaming {peer['wall_s']:.1f} s = {peer['events_per_s']:,}/s")
                for key, value in (("runs", runs), ("discarded", discarded), ("pairs", pairs)):
                    state.put(key, value)
                console.print(f"pair {index}: tandem {tandem['wall_s']:.1f} s = {tandem['events_per_s']:,}/s, "
                              f"plain {plain['wall_s']:.1f} s = {plain['events_per_s']:,}/s, ratio {ratio:.3f}, "
                              f"outputs_match={check['outputs_match']}, other processes' CPU "
                              f"{tandem['other_processes_cpu_s']} s / {plain['other_processes_cpu_s']} s")
                progress.advance(phase)

            tandem_eps = statistics.median([p["tandem_events_per_s"] for p in pairs])
            plain_eps = statistics.median([p["plain_events_per_s"] for p in pairs])
            results.update({
                "tandem_events_per_s": round(tandem_eps),
                "plain_events_per_s": round(plain_eps),
                "ratio": round(statistics.median([p["ratio"] for p in pairs]), 3),
                "ratio_of_medians": round(tandem_eps / plain_eps, 3),
                "target_ratio": 0.9,
                "meets_target": statistics.median([p["ratio"] for p in pairs]) >= 0.9,
                "outputs_match": all(p["outputs_match"] for p in pairs) and state.get("warm_outputs_match"),
                "tandem_wall_s_median": statistics.median([r["wall_s"] for r in runs if r["side"] == "tandem"]),
                "plain_wall_s_median": statistics.median([r["wall_s"] for r in runs if r["side"] == "plain"]),
                "method": {
                    "session": "one local[2] SparkSession (tandem.spark_session.build_session + conf/spark-defaults.conf) "
                               "shared by both sides, in one Python process",
                    "trigger": "availableNow", "max_files_per_trigger": args.max_files_per_trigger,
                    "order": "warm-up (untimed, small input) then tandem, plain alternating; with --flink a Flink "
                             "streaming run right after each pair (tandem_over_flink: the median of the pairs' "
                             "tandem/flink ratios; tandem_over_flink_of_medians: of the medians)",
                    "runs_per_side": args.runs,
                    "events_per_s": "input lines (valid + bad) / wall time of the streaming part (run_instance for "
                                    "Tandem, plain_trades.run for the baseline; session start excluded)",
                    "ratio": "median of the per-pair ratios tandem/plain",
                    "fresh_per_run": "checkpoints, Delta tables, PostgreSQL database; CHECKPOINT + GC before each run",
                    "shared_machine": "before each run the harness waits until other processes use < 0.15 cores; "
                                      "a pair during which they used more than max(5 CPU s, 5 % of the run) is "
                                      "repeated (see discarded_disturbed_runs)",
                    "outputs_match": "per pair: all six granularities equal between the two PostgreSQL tables "
                                     "(counts and integer sums exact, float sums/min/max rel 1e-9), hourly rows equal "
                                     "to a ground truth computed from the generator, each side's Delta table (newest "
                                     "row per key) equal to its PostgreSQL table, quarantine rows = bad lines",
                },
                "pairs": pairs, "runs": runs, "discarded_disturbed_runs": discarded,
            })

            if not args.no_engine:
                progress.update(phase, description="engine anchor (the plan's queries, materialise-only sinks)",
                                total=args.runs * len(engine.CONFIGS), completed=0)
                anchor_runs: list[dict] = state.get("engine_runs", [])
                for index in range(args.runs):  # the configurations alternate, like the two sides
                    for config in engine.CONFIGS:
                        if sum(r["config"] == config.name for r in anchor_runs) <= index:
                            anchor_runs.append(bench.run_engine(inp, config))
                            state.put("engine_runs", anchor_runs)
                            console.print(f"engine anchor, {config.name}: {anchor_runs[-1]['wall_s']:.1f} s = "
                                          f"{inp.lines / anchor_runs[-1]['wall_s']:,.0f}/s")
                        progress.advance(phase)
                anchor = engine.summary(inp.lines, {c.name: [r["wall_s"] for r in anchor_runs if r["config"] == c.name]
                                                    for c in engine.CONFIGS}, tandem_eps)
                best_runs = [r for r in anchor_runs if r["config"] == anchor["best"]]
                anchor["ceiling"] = engine.ceiling(best_runs, [r for r in runs if r["side"] == "tandem"],
                                                   len(os.sched_getaffinity(0)))
                results.update({"engine_ratio": anchor["engine_ratio"], "engine_best_events_per_s":
                                anchor["best_events_per_s"], "engine": {**anchor, "runs": anchor_runs,
                                                                        "method": engine.__doc__.strip()}})

            if not args.no_levers:
                results["levers"] = lever_part(bench, inp, state, progress, phase,
                                               results.get("engine_best_events_per_s"))

            if args.flink:
                in_pairs = [p for p in pairs if "flink" in p]  # a run resumed from before the peer joined the pairs
                flink = flink_part(bench, inp, state, progress, phase, [p["flink"] for p in in_pairs])
                results["flink"] = flink
                results["flink_streaming_events_per_s"] = flink["streaming_events_per_s"]
                results["flink_batch_events_per_s"] = flink["batch_events_per_s"]
                results["tandem_over_flink_of_medians"] = round(tandem_eps / flink["streaming_events_per_s"], 3)
                results["tandem_over_flink"] = (round(statistics.median(p["tandem_over_flink"] for p in in_pairs), 3)
                                                if len(in_pairs) == len(pairs) else
                                                results["tandem_over_flink_of_medians"])
                results["target_tandem_over_flink"] = 0.6
                results["meets_flink_target"] = results["tandem_over_flink"] >= 0.6
                if "engine_best_events_per_s" in results:
                    results["engine_over_flink"] = round(
                        results["engine_best_events_per_s"] / flink["streaming_events_per_s"], 3)
                for measured in results.get("levers", {}).get("levers", {}).values():
                    measured["over_flink_streaming"] = round(measured["events_per_s"] / flink["streaming_events_per_s"],
                                                             3)

            if not args.no_profile:
                progress.update(phase, description="profile runs (instrumented, not in the medians)", total=None)
                profile = state.get("profile", {})
                for side, runner in (("tandem", bench.run_tandem), ("plain", bench.run_plain)):
                    if side in profile:
                        continue
                    with instrumented(side) as timers:
                        run = runner(inp, f"prof{side[0]}")
                    profile[side] = {"wall_s": run["wall_s"], "events_per_s": run["events_per_s"],
                                     "other_processes_cpu_s": run["other_processes_cpu_s"],
                                     "timers": timers.report(), "batches": run["batches"]}
                    if side == "tandem":
                        profile[side]["heartbeats"] = heartbeat_summary(run["database"])
                    bench.drop_databases()
                    state.put("profile", profile)
                if "parse_microbenchmark" not in profile:
                    profile["parse_microbenchmark"] = parse_microbenchmark(
                        bench.spark, inp, max(1, min(inp.files, round(inp.files * 300_000 / inp.lines))), progress,
                        bench.settle)
                    profile["parse_microbenchmark"]["other_processes_cpu_s"] = bench.disturbance()
                    state.put("profile", profile)
                profile["note"] = ("timers are wall time summed over calls; the two queries of a side run "
                                   "concurrently on 2 cores, so the sums exceed the run's wall time")
                results["profile"] = profile

            if not args.no_latency:
                progress.update(phase, description="latency", total=None)
                names = C.symbol_names(args.symbols, spec.seed)
                sides = [("latency", "tandem")] + ([("latency_plain_for_comparison", "plain")] if args.latency_plain else [])
                for key, side in sides:
                    if state.get(key) is None:
                        state.put(key, latency_run(bench, side, names, progress))
                        bench.drop_databases()
                    results[key] = state.get(key)
            progress.update(phase, description="done")
    finally:
        bench.drop_databases()
        if bench.spark is not None:
            bench.spark.stop()
    results["finished_at"] = C.now_iso()
    results["git_commit"] = C.git_commit(ROOT)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2, default=str) + "\n")
    show(results)
    console.print(f"results written to {args.output}")
    return 0


def show(results: dict) -> None:
    table = Table(title="trades: Tandem vs plain PySpark")
    for column in ("", "events/s (median)", "wall s (median)"):
        table.add_column(column)
    table.add_row("tandem", f"{results['tandem_events_per_s']:,}", str(results["tandem_wall_s_median"]))
    table.add_row("plain", f"{results['plain_events_per_s']:,}", str(results["plain_wall_s_median"]))
    console.print(table)
    console.print(f"ratio (median of pairs) {results['ratio']} (target ≥ 0.9), outputs_match={results['outputs_match']}")
    if "engine" in results:
        console.print(f"engine anchor: best {results['engine']['best']} = {results['engine_best_events_per_s']:,}/s; "
                      f"Tandem / engine-best {results['engine_ratio']} (target ≥ 0.9)")
        ceiling = results["engine"]["ceiling"]
        console.print(f"ceiling with today's PostgreSQL work: {ceiling['engine_ratio_ceiling']} (engine "
                      f"{ceiling['engine_cpu_s']} CPU s in {ceiling['engine_wall_s']} s; Tandem's PostgreSQL "
                      f"{ceiling['tandem_postgresql_cpu_s']} CPU s on {ceiling['cores']} cores)")
    for name, measured in results.get("levers", {}).get("levers", {}).items():
        console.print(f"lever {name}: {measured['events_per_s']:,}/s, {measured['over_engine_best']} of the engine's "
                      f"best, counts right: {measured['counts_right']}")
    if "flink" in results:
        flink = results["flink"]
        console.print(f"flink {flink['version']} (parallelism {flink['parallelism']}): streaming "
                      f"{flink['streaming_events_per_s']:,}/s, batch {flink['batch_events_per_s']:,}/s; Tandem / "
                      f"Flink streaming {results['tandem_over_flink']} (target ≥ 0.6); with the plan's watermark "
                      f"Flink lost {flink['check_plan_watermark']['events_lost']:,} of "
                      f"{flink['check_plan_watermark']['valid_events']:,} events")
    if "latency" in results:
        lat = results["latency"]
        console.print(f"latency tandem @ {lat['rate_events_per_s']}/s, trigger {lat['trigger_s']} s: "
                      f"p50 {lat['p50_s']} s, p95 {lat['p95_s']} s, max {lat['max_s']} s")
    if "latency_plain_for_comparison" in results:
        lat = results["latency_plain_for_comparison"]
        console.print(f"latency plain  @ {lat['rate_events_per_s']}/s, trigger {lat['trigger_s']} s: "
                      f"p50 {lat['p50_s']} s, p95 {lat['p95_s']} s, max {lat['max_s']} s")


if __name__ == "__main__":
    sys.exit(main())
