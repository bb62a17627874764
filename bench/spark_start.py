#!/usr/bin/env python
"""Spark driver start-up with and without the class-data sharing archive that ``make setup`` records.

Each round runs ``scripts/spark_cds_training.py`` (a session, a stateful streaming query under ``availableNow``, a
batch aggregation to pandas: what a plan's driver does first) under ``spark-submit --master local[1]`` twice, once
with ``SPARK_SUBMIT_OPTS=-XX:SharedArchiveFile=.tandem/spark-cds.jsa`` and once without, the order alternating
from round to round so that a change in the shared machine's speed falls on both. The figure is the wall time of
the whole ``spark-submit`` (JVM launch to exit); the ratio is with / without, per round and of the medians.

    python bench/spark_start.py [--rounds 5]

Results: ``bench/results/spark_start.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "include"))
sys.path.insert(0, str(BENCH))

import _common as C  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402

ARCHIVE = ROOT / ".tandem" / "spark-cds.jsa"
TRAINING = ROOT / "scripts" / "spark_cds_training.py"
RESULTS = BENCH / "results" / "spark_start.json"


def one_start(with_archive: bool) -> float:
    """Wall seconds of one ``spark-submit`` of the training job."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_SUBMIT_OPTS"}
    if with_archive:
        env["SPARK_SUBMIT_OPTS"] = f"-XX:SharedArchiveFile={ARCHIVE}"
    started = time.monotonic()
    done = subprocess.run(["spark-submit", "--master", "local[1]", str(TRAINING)], env=env,
                          capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0 or (with_archive and "Unable to use shared archive" in done.stderr):
        raise SystemExit(f"spark-submit failed or did not use the archive:\n{done.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if not ARCHIVE.is_file():
        raise SystemExit(f"{ARCHIVE} is missing: `make setup` records it")
    console = Console(stderr=True)
    rounds = []
    with Progress(console=console) as progress:
        task = progress.add_task("spark-submit with / without the archive", total=args.rounds)
        for n in range(args.rounds):
            order = (True, False) if n % 2 == 0 else (False, True)
            times = {with_archive: one_start(with_archive) for with_archive in order}
            rounds.append({"with_archive_s": round(times[True], 2), "without_s": round(times[False], 2),
                           "ratio": round(times[True] / times[False], 3)})
            progress.advance(task)
    with_median = statistics.median(r["with_archive_s"] for r in rounds)
    without_median = statistics.median(r["without_s"] for r in rounds)
    result = {"started_at": C.now_iso(), "git_commit": C.git_commit(ROOT), "machine": C.machine_info(),
              "archive_bytes": ARCHIVE.stat().st_size, "rounds": rounds,
              "median_with_archive_s": with_median, "median_without_s": without_median,
              "ratio": round(with_median / without_median, 3)}
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"median {with_median:.2f} s with the archive, {without_median:.2f} s without "
                  f"(ratio {result['ratio']}); {RESULTS}")


if __name__ == "__main__":
    main()
