#!/usr/bin/env python
"""Cut-over benchmark: what a rescale of the trades plan costs, against a plain relaunch in the same run.

The trades plan (8 partitions) runs its group at parallel 2 over ``--files`` landing files (one Spark session,
``available_now`` runs, private storage and database). Then, per round, for the same new input:

- **baseline**: the group stopped and relaunched unchanged (its checkpoints resume);
- **rescale**: the group's ``parallel`` 2 -> 4 (and back 4 -> 2 in the next round), ``tandem plan cutover``
  (timed on its own: recording the cut, relabelling the partials, retiring the checkpoints), then the launch of
  the new instances; their first batches skip the files read before the cut (``--files`` of them).

Reported: the cut-over's own time, the time from its start to the first batch a new instance published (the
publishing pause of an offline cut-over after the plan stopped, compared with the issue's target for a hand-over, a
hot failover's 3 s) and both against the unchanged relaunch as ratios. The
outputs are checked against the aggregates of every event written after each step (exact, or the run fails).

Results: ``bench/results/upgrade.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))

import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402

from _common import git_commit, machine_info, now_iso, private_storage, scalar  # noqa: E402
from _ha import expected_aggregates  # noqa: E402
from tandem.config import load_cluster, load_plan  # noqa: E402
from tandem.cutover import cut_over  # noqa: E402
from tandem.layout import landing_dir  # noqa: E402
from tandem.reading import read_output  # noqa: E402
from tandem.runtime.node import run_instance  # noqa: E402
from tandem.runtime.plan_api import partial_outputs_by_query  # noqa: E402
from tandem.sources.files import write_atomically  # noqa: E402
from tandem.spark_session import build_session  # noqa: E402
from tandem.store import Database, migrate  # noqa: E402

console = Console()
SERVER_URL = os.environ.get("TANDEM_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/tandem")
PARTITIONS = 8
SYMBOLS = [f"S{i:02d}" for i in range(PARTITIONS * 4)]
T0 = 1_735_689_600_000  # 2025-01-01T00:00:00Z


def edit_trades(conf: Path, change) -> None:
    path = conf / "plans" / "trades.yaml"
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def land(cluster, files: int, per_file: int, seed: int, start_ms: int) -> list[dict]:
    rng = random.Random(seed)
    written = []
    for _ in range(files):
        events = [{"symbol": rng.choice(SYMBOLS), "price": round(rng.uniform(1, 500), 2),
                   "quantity": rng.randint(1, 1000), "timestamp": start_ms + rng.randint(0, 60_000)}
                  for _ in range(per_file)]
        by_partition: dict[int, list[dict]] = {}
        for event in events:
            by_partition.setdefault(SYMBOLS.index(event["symbol"]) % PARTITIONS, []).append(event)
        for partition, mine in by_partition.items():
            write_atomically(landing_dir(cluster, "trades", partition), [json.dumps(e) for e in mine])
        written += events
    return written


def run_group(spark, url: str, since: float) -> tuple[float, float]:
    """Run every instance (available now, one after the other); (seconds from ``since`` (POSIX time) to the first
    batch an instance published, seconds from ``since`` to the end)."""
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    for instance in plan.instances:
        result = run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True)
        if result.status != "STOPPED":
            raise SystemExit(f"{instance}: {result.error}")
    first = scalar(url, "SELECT EXTRACT(EPOCH FROM min(published_at)) FROM tandem.publish_log WHERE output = "
                        "'trade_aggregates' AND published_at > to_timestamp(%s)", (since,))
    return float(first) - since, time.time() - since


def check(cluster, events: list[dict], label: str) -> None:
    rows = read_output(cluster, "trades", "second", None, None)
    got = {(r["bucket_start"], r["symbol"]): r["trade_count"] for r in rows}
    want = {key: values["trade_count"] for key, values in
            expected_aggregates([(e["timestamp"], e["symbol"], e["price"], e["quantity"]) for e in events],
                                "second").items()}
    if got != want:
        raise SystemExit(f"{label}: outputs differ from the reference: {len(set(got.items()) ^ set(want.items()))} "
                         f"rows, {sum(got.values())} events counted, {sum(want.values())} written")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=400, help="landing files read before each cut")
    parser.add_argument("--per-file", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=2, help="rescale rounds (2 -> 4, 4 -> 2, ...)")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "upgrade.json")
    args = parser.parse_args()

    with private_storage("upgrade", ROOT, SERVER_URL) as (project, url):
        conf = project / "conf"
        edit_trades(conf, lambda d: d["streams"]["trades"].update(partitions=PARTITIONS))
        cluster = load_cluster()
        with Database(url) as db:
            migrate(db)
        spark = build_session("tandem-bench-upgrade", "local[2]", ROOT / "conf" / "spark-defaults.conf")
        events = land(cluster, args.files, args.per_file, 1, T0)
        run_group(spark, url, time.time())
        check(cluster, events, "parallel 2")
        rounds = []
        with Progress(console=console) as progress:
            task = progress.add_task("rounds", total=args.rounds)
            for round_no in range(args.rounds):
                # each landing a minute of event time after the last: nothing late for a watermark kept across runs
                events += land(cluster, args.files, args.per_file, 100 + round_no, T0 + (2 * round_no + 1) * 70_000)
                baseline_first, baseline_all = run_group(spark, url, time.time())
                check(cluster, events, f"round {round_no + 1}: relaunch")
                parallel = 4 if round_no % 2 == 0 else 2
                edit_trades(conf, lambda d: d["groups"]["shard"].update(parallel=parallel))
                events += land(cluster, args.files, args.per_file, 200 + round_no, T0 + (2 * round_no + 2) * 70_000)
                plan = load_plan("trades", load_cluster())
                began = time.time()
                with Database(url) as db:
                    cut = cut_over(load_cluster(), plan, db, partial_outputs=partial_outputs_by_query(plan))
                cutover_s = time.time() - began
                first, whole = run_group(spark, url, began)
                check(cluster, events, f"round {round_no + 1}: after the cut-over to {parallel}")
                rounds.append({"parallel": parallel, "files_read_before_cut": sum(map(len, cut.consumed.values())),
                               "cutover_s": round(cutover_s, 3), "first_publish_s": round(first, 3),
                               "run_s": round(whole, 3), "baseline_first_publish_s": round(baseline_first, 3),
                               "baseline_run_s": round(baseline_all, 3),
                               "first_publish_ratio": round(first / baseline_first, 2),
                               "run_ratio": round(whole / baseline_all, 2)})
                progress.advance(task)
        spark.stop()
    pauses = [r["first_publish_s"] for r in rounds]
    result = {"bench": "upgrade", "at": now_iso(), "commit": git_commit(ROOT), "machine": machine_info(),
              "files": args.files, "events_per_file": args.per_file, "rounds": rounds,
              "median_first_publish_s": statistics.median(pauses), "target_pause_s": 3.0,
              "meets_target": statistics.median(pauses) <= 3.0,
              "note": "an offline cut-over of a stopped plan: first_publish_s runs from the cut-over's start to the "
                      "first batch a new instance published (the publishing pause, beside the time the plan was "
                      "stopped); the baseline relaunches the unchanged group the same way (available-now runs, one "
                      "after the other, in one Spark session)"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    console.print_json(json.dumps({k: v for k, v in result.items() if k != "machine"}))


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
