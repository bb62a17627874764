#!/usr/bin/env python
"""The aggregates' PostgreSQL publish of one catch-up batch, this tree's SQL against a git revision's.

A catch-up at the trades plan's admission is one micro-batch, so nothing overlaps its publish: the per-second
partials are staged (``COPY``), upserted and rolled up to every coarser bucket in one transaction while Spark
waits. This times that step alone, on the trades plan's aggregation: the same per-second partials (symbols ×
span, most seconds of each symbol traded, in the random order Spark's hash partitions hand them over) into a
fresh table, through ``tandem.store.aggregates`` as it is in this tree and as it was at ``--baseline`` (the
module loaded from git), alternating from round to round. Each round starts from an empty table and a
checkpoint and commits. The figures are the wall time of the transaction and the CPU of its PostgreSQL backend;
the ratio is this tree / baseline, per round and of the medians. Both sides' rows must be equal.

    python bench/publish_step.py --baseline 22c0eb2 [--rounds 4] [--symbols 200] [--span-s 3600]

Results: ``bench/results/publish_step.json``.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "include"))
sys.path.insert(0, str(BENCH))

import _common as C  # noqa: E402
import pyarrow as pa  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402

from tandem.aggregation.spec import MERGE_SQL, UTC_MICROS, aggregation_outputs, spec_for  # noqa: E402
from tandem.config import load_plan  # noqa: E402
from tandem.store import aggregates  # noqa: E402
from tandem.store.db import Database  # noqa: E402
from tandem.store.migrations import migrate  # noqa: E402

RESULTS = BENCH / "results" / "publish_step.json"
MODULE = "include/tandem/store/aggregates.py"


def partials(symbols: int, span_s: int, seed: int) -> pa.Table:
    """Per-second partials of ``symbols`` over ``span_s`` seconds (7 in 8 traded), in a random order."""
    rng = random.Random(seed)
    rows = []
    for second in range(span_s):
        for symbol in range(symbols):
            if rng.random() < 0.875:
                prices = [rng.uniform(10, 500) for _ in range(rng.randint(1, 5))]
                rows.append((C.NEW_YEAR + timedelta(seconds=second), f"S{symbol:04d}", sum(prices), len(prices),
                             10 * len(prices), min(prices), max(prices)))
    rng.shuffle(rows)
    columns = list(zip(*rows))
    return pa.table({"bucket_start": pa.array(columns[0], UTC_MICROS), "symbol": pa.array(columns[1]),
                     **{name: pa.array(values) for name, values in zip(C.MEASURES, columns[2:])}})


def backend_cpu_s(cursor) -> float:
    cursor.execute("SELECT pg_backend_pid() AS pid")
    return C.process_cpu_s(cursor.fetchone()["pid"])


def publish_once(db: Database, module, spec, seconds: pa.Table) -> dict:
    """Empty the table, checkpoint, then stage + upsert + roll up ``seconds`` in one committed transaction."""
    db.run(lambda cursor: cursor.execute(f"TRUNCATE {spec.table}"))
    db.run(lambda cursor: cursor.execute("CHECKPOINT"))
    steps: dict[str, float] = {}

    def timed(name: str, work):
        started = time.perf_counter()
        result = work()
        steps[name] = round(time.perf_counter() - started, 3)
        return result

    with db.transaction() as cursor:
        cpu_before, started = backend_cpu_s(cursor), time.perf_counter()
        timed("stage", lambda: module.stage_batch(cursor, spec, seconds))
        takes_seconds = "seconds" in inspect.signature(module.upsert_seconds).parameters  # since 2026-12
        upsert = functools.partial(module.upsert_seconds, seconds=seconds) if takes_seconds else module.upsert_seconds
        written = timed("upsert", lambda: upsert(cursor, spec, "trades", "shard-1", 1, 0)).num_rows
        for granularity in spec.granularities[1:]:
            written += timed(granularity, lambda: module.roll_up(
                cursor, spec, MERGE_SQL, "trades", "shard-1", 1, 0, granularity,
                spec.child_of(granularity))).num_rows
        cpu = backend_cpu_s(cursor) - cpu_before
    return {"wall_s": round(time.perf_counter() - started, 3), "postgresql_cpu_s": round(cpu, 2),
            "rows_written": written, "steps_s": steps}


def stored(db: Database, spec) -> list[tuple]:
    def read(cursor):
        cursor.execute(f"SELECT granularity, bucket_start, symbol, price_sum, trade_count, quantity_sum, price_min, "
                       f"price_max FROM {spec.table} ORDER BY 1, 2, 3")
        return [(r["granularity"], r["bucket_start"], r["symbol"], r["price_sum"], r["trade_count"],
                 r["quantity_sum"], r["price_min"], r["price_max"]) for r in cursor.fetchall()]
    return db.run(read)


def same_rows(left: list[tuple], right: list[tuple]) -> bool:
    """Equal keys, counts, minima and maxima; float sums equal up to their order of addition (rel 1e-9)."""
    return len(left) == len(right) and all(
        a[:3] == b[:3] and a[4:] == b[4:] and math.isclose(a[3], b[3], rel_tol=1e-9) for a, b in zip(left, right))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", required=True, help="the git revision whose SQL is the baseline")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--symbols", type=int, default=200)
    parser.add_argument("--span-s", type=int, default=3600)
    parser.add_argument("--database-url", default=os.environ.get("TANDEM_DATABASE_URL",
                                                                 "postgresql://postgres@127.0.0.1:5432/tandem"))
    args = parser.parse_args()
    console = Console(stderr=True)
    plan = load_plan("trades")
    spec = spec_for(plan, aggregation_outputs(plan)[0])
    sides = {"this tree": aggregates, "baseline": C.module_at(ROOT, MODULE, args.baseline)}
    seconds = partials(args.symbols, args.span_s, seed=7)
    url = C.create_database(args.database_url, "publish")
    rounds, rows = [], {}
    try:
        with Database(url) as db:
            migrate(db)
            with Progress(console=console) as progress:
                task = progress.add_task(f"publish of {seconds.num_rows:,} seconds", total=args.rounds)
                for n in range(args.rounds):
                    order = list(sides) if n % 2 == 0 else list(reversed(sides))
                    runs = {}
                    for side in order:
                        runs[side] = publish_once(db, sides[side], spec, seconds)
                        rows.setdefault(side, stored(db, spec))
                    rounds.append({**runs, "ratio": round(runs["this tree"]["wall_s"] / runs["baseline"]["wall_s"], 3)})
                    progress.advance(task)
    finally:
        C.drop_database(url)
    if not same_rows(rows["this tree"], rows["baseline"]):
        raise SystemExit("the two sides wrote different rows")
    medians = {side: statistics.median(r[side]["wall_s"] for r in rounds) for side in sides}
    cpu = {side: statistics.median(r[side]["postgresql_cpu_s"] for r in rounds) for side in sides}
    result = {"started_at": C.now_iso(), "git_commit": C.git_commit(ROOT), "baseline": args.baseline,
              "machine": C.machine_info(server_url=args.database_url),
              "input": {"seconds": seconds.num_rows, "symbols": args.symbols, "span_s": args.span_s},
              "rows_equal": True, "rounds": rounds, "median_wall_s": medians, "median_postgresql_cpu_s": cpu,
              "ratio": round(medians["this tree"] / medians["baseline"], 3)}
    RESULTS.write_text(json.dumps(result, indent=2, default=str) + "\n")
    console.print(f"median {medians['this tree']:.2f} s this tree, {medians['baseline']:.2f} s at {args.baseline} "
                  f"(ratio {result['ratio']}; PostgreSQL CPU {cpu['this tree']} / {cpu['baseline']} s); {RESULTS}")


if __name__ == "__main__":
    main()
