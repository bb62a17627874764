"""spark-submit entrypoint: recompute and replace a closed range of a plan's outputs (a backfill).

    spark-submit --properties-file conf/spark-defaults.conf --py-files dist/tandem.zip \
        jobs/backfill.py --plan trades --start 2026-11-26T10:00:00Z --end 2026-11-26T10:30:00Z [--instance shard-1]
    ... jobs/backfill.py --plan trades --backfill-id ID      (one the backfill DAG's first task registered)
"""

from __future__ import annotations

import argparse
import sys

from tandem.batch.backfill import run_backfill
from tandem.batch.job import run_plan_job
from tandem.declarations import instant_argument


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", required=True, help="plan name (conf/plans/<plan>.yaml)")
    parser.add_argument("--start", type=instant_argument, help="first instant of the range (ISO; UTC when no zone)")
    parser.add_argument("--end", type=instant_argument, help="end of the range, excluded")
    parser.add_argument("--instance", action="append", help="an instance to backfill (repeatable; default: all)")
    parser.add_argument("--backfill-id", help="run a backfill registered already (its range and instances)")
    args = parser.parse_args(argv)
    if args.backfill_id is None and (args.start is None or args.end is None):
        parser.error("give --start and --end, or --backfill-id")

    def work(cluster, plan, db, spark, log) -> None:
        done = run_backfill(cluster, plan, db, spark, args.start, args.end, instances=args.instance,
                            backfill_id=args.backfill_id, requested_by="spark-submit jobs/backfill.py")
        log.info("backfill %s %s: %s", done.id, done.status, done.report)

    return run_plan_job("backfill", args.plan, work)


if __name__ == "__main__":
    sys.exit(main())
