#!/usr/bin/env python
"""What one plan driver costs in CPU: its start, each minute it runs with no input, and each minute under load.

The test suite is CPU-bound on two cores (``tests/README.md``): what its drivers burn while they start and while
they wait between a test's steps decides its length. Each variant launches one ACTIVE instance of the trades plan
(``spark-submit``, detached, as a node's launcher does) in a private project and database, and measures the CPU
seconds of its process tree (the ``spark-submit`` JVM, the Python driver and what they fork):

- ``start``: from the launch until the instance reports RUNNING;
- ``idle``: per minute afterwards, with no input (``--idle-s`` seconds measured);
- ``loaded``: per minute while the producer writes ``--rate`` trades a second (``--load-s`` seconds measured).

Variants differ in ``SPARK_SUBMIT_OPTS`` (JVM options) or in lines added to the project's
``conf/spark-defaults.conf``; the first variant (``baseline``: the suite's settings) is the reference and each
ratio is against it, in the same run, variants alternating over ``--rounds``.

    python bench/driver_cost.py [--idle-s 60] [--load-s 60] [--rate 200] [--rounds 1] [--variants ...]

Results: ``bench/results/driver_cost.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "include"))
sys.path.insert(0, str(BENCH))

import _common as C  # noqa: E402
from tandem.supervisor.submit_command import SHORT_LIVED_JVM_OPTIONS  # noqa: E402
from rich.console import Console  # noqa: E402

RESULTS = BENCH / "results" / "driver_cost.json"
VARIANTS: dict[str, dict] = {
    "baseline": {},
    "trigger 5 s": {"trigger": "5 seconds"},
    "one GC thread, serial GC": {"jvm": "-XX:+UseSerialGC"},
    "no progress events between batches": {"conf": ["spark.sql.streaming.noDataProgressEventInterval 3600000"]},
    "tiered JIT (production drivers)": {"tiered": True},
    # conf/spark-defaults.conf renames checkpoint files through Hadoop's FileSystem (no `readlink` fork per rename);
    # what it cost before, and Hadoop's checksummed local filesystem, which forks a `chmod` per file it creates
    "checkpoints through FileContext (Spark's default)": {"conf": [
        "spark.sql.streaming.checkpointFileManagerClass "
        "org.apache.spark.sql.execution.streaming.checkpointing.FileContextBasedCheckpointFileManager"]},
    "raw local filesystem (no .crc files)": {"conf": ["spark.hadoop.fs.file.impl org.apache.hadoop.fs.RawLocalFileSystem"]},
}
METRICS = ("start_wall_s", "start_cpu_s", "idle_cpu_s_per_min", "loaded_cpu_s_per_min")


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants (live ones, and those they reaped)."""
    processes = C._cpu_by_process()
    mine = C.family({pid}, {p: stat[3] for p, stat in processes.items()})
    return sum(own + reaped for p, (_comm, own, reaped, _parent) in processes.items() if p in mine)


def one_driver(name: str, variant: dict, idle_s: float, load_s: float, rate: int, server_url: str) -> dict:
    """Launch one ACTIVE trades instance under ``variant``; its start, idle and loaded CPU seconds."""
    from tandem.config import load_cluster, load_plan
    from tandem.packaging import build_dist
    from tandem.producer import produce
    from tandem.supervisor import launch_instance, wait_until_running
    from tandem.store import Database, migrate

    saved = os.environ.get("SPARK_SUBMIT_OPTS", "")
    with C.private_storage("driver-cost", ROOT, server_url) as (root, url):
        if variant.get("conf"):
            with open(root / "conf" / "spark-defaults.conf", "a") as conf:
                conf.write("\n" + "\n".join(variant["conf"]) + "\n")
        jit = "" if variant.get("tiered") else SHORT_LIVED_JVM_OPTIONS
        os.environ["SPARK_SUBMIT_OPTS"] = " ".join(filter(None, [saved, jit, variant.get("jvm", "")]))
        try:
            with Database(url) as db:
                migrate(db)
            cluster, plan = load_cluster(), load_plan("trades")
            dist = build_dist(ROOT)
            launched = time.monotonic()
            job = launch_instance(cluster, plan, "shard-1", "node-a", variant.get("trigger", "1 second"),
                                  launched_by="bench/driver_cost", py_files=dist)
            try:
                wait_until_running(cluster, plan.name, "shard-1", "node-a", timeout_s=300)
                start_s, start_cpu = time.monotonic() - launched, tree_cpu(job.submit_pid)
                time.sleep(10)  # the first batches after RUNNING settle
                before = tree_cpu(job.submit_pid)
                time.sleep(idle_s)
                idle_cpu = tree_cpu(job.submit_pid) - before
                before = tree_cpu(job.submit_pid)
                for _ in produce(cluster, plan, rate=rate, duration_s=load_s, seed=7):
                    pass
                loaded_cpu = tree_cpu(job.submit_pid) - before
            finally:
                os.killpg(job.submit_pid, signal.SIGKILL)
        finally:
            os.environ["SPARK_SUBMIT_OPTS"] = saved
    return {"variant": name, "start_wall_s": round(start_s, 1), "start_cpu_s": round(start_cpu, 1),
            "idle_cpu_s_per_min": round(idle_cpu * 60 / idle_s, 1),
            "loaded_cpu_s_per_min": round(loaded_cpu * 60 / load_s, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--idle-s", type=float, default=60)
    parser.add_argument("--load-s", type=float, default=60)
    parser.add_argument("--rate", type=int, default=200, help="trades a second while loaded")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()
    console = Console(stderr=True)
    server_url = os.environ.get("TANDEM_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/tandem")
    runs = []
    for n in range(args.rounds):
        order = args.variants if n % 2 == 0 else list(reversed(args.variants))
        for name in order:
            with console.status(f"round {n + 1}: {name}"):
                run = one_driver(name, VARIANTS[name], args.idle_s, args.load_s, args.rate, server_url)
            console.print(run)
            runs.append(run)
    medians = {name: {key: statistics.median(r[key] for r in runs if r["variant"] == name)
                      for key in METRICS} for name in args.variants}
    reference = medians[args.variants[0]]
    ratios = {name: {key: round(value / reference[key], 3) if reference[key] else None for key, value in m.items()}
              for name, m in medians.items()}
    result = {"started_at": C.now_iso(), "git_commit": C.git_commit(ROOT), "machine": C.machine_info(),
              "idle_s": args.idle_s, "load_s": args.load_s, "rate": args.rate, "runs": runs, "medians": medians,
              "ratio_to_first": ratios}
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    for name, m in medians.items():
        console.print(f"{name:<40} start {m['start_cpu_s']:6.1f} CPU s ({m['start_wall_s']:.0f} s), idle "
                      f"{m['idle_cpu_s_per_min']:5.1f} CPU s/min  x{ratios[name]['idle_cpu_s_per_min']}, loaded "
                      f"{m['loaded_cpu_s_per_min']:5.1f} CPU s/min  x{ratios[name]['loaded_cpu_s_per_min']}")
    console.print(str(RESULTS))


if __name__ == "__main__":
    main()
