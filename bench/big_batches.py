#!/usr/bin/env python
"""One micro-batch of 1,000,000 rows over as many keys through each output kind's sink (issue 46 §1).

A backlog makes such a batch (a catch-up at the default admission, a standby's flush). Per kind, in a process of
its own (so that each peak of memory is its own), on a fresh database and Delta root: the batch is generated
(``tests/support/_big_batches.py``, the same as ``tests/integration/test_big_batches.py`` at 100,000), the sink's
``publish`` is timed, with the peak RSS of the process during it (``VmHWM`` reset just before) and the CPU of the
sink's PostgreSQL backend; then what was published is checked against the input's totals (rows, counts and sums
per granularity in PostgreSQL and Delta; every id once, marked as in the lake). The aggregations keep every
granularity, second to year.

    python bench/big_batches.py [--rows 1000000] [--kinds aggregation,fact_aggregation,table,events,quarantine]

Results: ``bench/results/big_batches.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "include"))
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "tests" / "support"))  # _big_batches: the batches, sinks and checks of the test

import _common as C  # noqa: E402
from _big_batches import KINDS  # noqa: E402 - the kinds the test runs at 100,000 rows
from rich.console import Console  # noqa: E402

RESULTS = BENCH / "results" / "big_batches.json"


def _status_mb(field: str) -> float:
    """A ``VmRSS``/``VmHWM`` line of this process's ``/proc/self/status``, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak_rss() -> None:
    """Start ``VmHWM`` again from the current RSS (Linux ``clear_refs`` 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def measure(kind: str, rows: int, server_url: str) -> dict:
    """Publish one batch of ``kind`` through its sink on a fresh database; the figures and the check."""
    import _big_batches as B

    from tandem.store.db import Database
    from tandem.store.migrations import migrate

    run = B.BigBatches()
    url = C.create_database(server_url, "big")
    root = Path(tempfile.mkdtemp(prefix="tandem-big-"))
    try:
        with Database(url) as db:
            migrate(db)
            started = time.perf_counter()
            batch = B.batch_of(kind, rows)
            generated_s = time.perf_counter() - started
            sink = run.sink(kind, url, root)
            info = B.batch_info(db)
            backend = sink.db.run(lambda cursor: (cursor.execute("SELECT pg_backend_pid() AS pid"),
                                                  cursor.fetchone())[1]["pid"])
            rss_before = _status_mb("VmRSS")
            _reset_peak_rss()
            cpu_before, started = C.process_cpu_s(backend), time.perf_counter()
            sink.publish(batch, info)
            publish_s = time.perf_counter() - started
            postgresql_cpu_s = C.process_cpu_s(backend) - cpu_before
            peak = _status_mb("VmHWM")
            started = time.perf_counter()
            found, expected = run.totals(kind, db, root), run.expected_totals(kind, batch)
            check_s = time.perf_counter() - started
    finally:
        C.drop_database(url)
        shutil.rmtree(root, ignore_errors=True)
    return {"kind": kind, "rows": rows, "publish_s": round(publish_s, 2), "peak_rss_mb": peak,
            "rss_before_publish_mb": rss_before,
            "process_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "sink_backend_cpu_s": round(postgresql_cpu_s, 1), "generate_s": round(generated_s, 2),
            "check_s": round(check_s, 2), "published_as_expected": found == expected,
            **({} if found == expected else {"found": found, "expected": expected})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of " + ", ".join(KINDS))
    parser.add_argument("--database-url", default=os.environ.get("TANDEM_BENCH_DATABASE_URL",
                                                                 "postgresql://postgres@127.0.0.1:5432/postgres"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one kind, in this process: prints its JSON
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child, args.rows, args.database_url)))
        return
    console = Console(stderr=True)
    result = {"started_at": C.now_iso(), "git_commit": C.git_commit(ROOT),
              "machine": C.machine_info(server_url=args.database_url), "rows": args.rows, "kinds": {}}
    for kind in args.kinds.split(","):
        console.print(f"{kind}: {args.rows:,} rows …")
        foreign = C.ForeignCpu({os.getpid()})
        started = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--child", kind, "--rows", str(args.rows),
                               "--database-url", args.database_url], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{kind} failed:\n{done.stderr[-4000:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        figures.update(wall_s=round(time.perf_counter() - started, 1),
                       other_processes_cpu_s=round(foreign.seconds(), 1))
        result["kinds"][kind] = figures
        console.print(f"  publish {figures['publish_s']} s, peak RSS {figures['peak_rss_mb']} MB, "
                      f"as expected: {figures['published_as_expected']}")
    result["finished_at"] = C.now_iso()
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2, default=str) + "\n")
    console.print(f"{args.results}")
    if not all(k["published_as_expected"] for k in result["kinds"].values()):
        raise SystemExit("a sink did not publish what its batch holds")


if __name__ == "__main__":
    main()
