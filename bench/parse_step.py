#!/usr/bin/env python
"""The parse and validation of landing lines, this tree's against a git revision's.

Every query of a plan reading files starts with ``tandem.runtime.records.parse_and_validate``: each line parsed
into the declared fields, checked, and told good or bad (with the reason). This times that step alone, on the
trades plan's stream, over the trades bench's own input (``_common.prepare_input``: good lines and the usual share
of bad ones, cached in memory first so reading the files is not timed): the good lines' count as a query of good
events asks for it (reasons pruned), through the module as it is in this tree and as it was at ``--baseline``
(loaded from git), alternating from round to round in one local Spark session. Both sides must tell the same lines
bad, for the same reasons. The ratio is this tree / baseline, of the medians.

    python bench/parse_step.py --baseline e97a3cb [--rounds 4] [--events 600000]

Results: ``bench/results/parse_step.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "include"))
sys.path.insert(0, str(BENCH))

import _common as C  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402

from tandem.config import load_plan  # noqa: E402
from tandem.runtime import records  # noqa: E402
from tandem.sources.files import write_atomically  # noqa: E402
from tandem.spark_session import build_session  # noqa: E402

RESULTS = BENCH / "results" / "parse_step.json"
MODULE = "include/tandem/runtime/records.py"


def timed_count(module, lines, stream) -> tuple[float, int]:
    """Seconds to count the good lines as ``module`` parses and validates them, and the count."""
    validated = module.parse_and_validate(lines, module.record_schema(stream))
    started = time.perf_counter()
    good = validated.where("valid").agg(F.count(F.lit(1)).alias("good")).collect()[0]["good"]
    return time.perf_counter() - started, good


def bad_lines(module, lines, stream) -> list[tuple[str, str]]:
    """Every bad line and its reason, as ``module`` tells them."""
    validated = module.parse_and_validate(lines, module.record_schema(stream))
    return sorted((row["raw"], row["reason"]) for row in validated.where(~F.col("valid")).select("raw", "reason")
                  .collect())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", required=True, help="the git revision whose parse is the baseline")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--events", type=int, default=600_000)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "tandem_bench_parse")
    args = parser.parse_args()
    console = Console(stderr=True)
    stream = load_plan("trades").streams["trades"]
    spec = C.InputSpec(events=args.events, files=args.files)
    sides = {"this tree": records, "baseline": C.module_at(ROOT, MODULE, args.baseline)}
    with Progress(console=console) as progress:
        inp = C.prepare_input(spec, args.workdir / spec.key, write_atomically, progress)
        spark = build_session("tandem-bench-parse", "local[2]", ROOT / "conf" / "spark-defaults.conf")
        spark.sparkContext.setLogLevel("ERROR")
        lines = (spark.read.text(str(inp.directory)).withColumnRenamed("value", "raw")
                 .withColumn("source_file", F.col("_metadata.file_path")).cache())
        count = lines.count()
        same = bad_lines(sides["this tree"], lines, stream) == bad_lines(sides["baseline"], lines, stream)
        if not same:
            raise SystemExit("the two sides told different lines bad, or gave different reasons")
        rounds, good = [], {}
        task = progress.add_task(f"parse of {count:,} lines", total=args.rounds)
        for n in range(args.rounds):
            order = list(sides) if n % 2 == 0 else list(reversed(sides))
            runs = {}
            for side in order:
                runs[side], good[side] = timed_count(sides[side], lines, stream)
            rounds.append({**{side: round(seconds, 3) for side, seconds in runs.items()},
                           "ratio": round(runs["this tree"] / runs["baseline"], 3)})
            progress.advance(task)
        machine = C.machine_info(spark)
        spark.stop()
    if good["this tree"] != good["baseline"] or good["this tree"] != inp.valid:
        raise SystemExit(f"good lines: {good} against {inp.valid:,} written")
    medians = {side: statistics.median(r[side] for r in rounds) for side in sides}
    result = {"started_at": C.now_iso(), "git_commit": C.git_commit(ROOT), "baseline": args.baseline,
              "machine": machine, "input": {"lines": count, "good": inp.valid, "bad": inp.invalid},
              "same_bad_lines_and_reasons": True, "rounds": rounds, "median_s": medians,
              "lines_per_s": {side: round(count / seconds) for side, seconds in medians.items()},
              "ratio": round(medians["this tree"] / medians["baseline"], 3)}
    RESULTS.write_text(json.dumps(result, indent=2, default=str) + "\n")
    console.print(f"median {medians['this tree']:.2f} s this tree, {medians['baseline']:.2f} s at {args.baseline} "
                  f"(ratio {result['ratio']}); {RESULTS}")


if __name__ == "__main__":
    main()
