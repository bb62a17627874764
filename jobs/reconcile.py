"""spark-submit entrypoint: reconcile a closed range (by default one UTC day) of a plan's outputs against a batch
recomputation, store the differences, and repair them with a backfill when the plan says so.

    spark-submit --properties-file conf/spark-defaults.conf --py-files dist/tandem.zip \
        jobs/reconcile.py --plan trades --day 2026-11-25 --run-id manual-1
    ... jobs/reconcile.py --plan trades --start 2026-11-25T10:00:00+00:00 --end 2026-11-25T11:00:00+00:00 --run-id r-2
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta, timezone

from tandem.batch.backfill import run_backfill
from tandem.batch.job import run_plan_job
from tandem.batch.reconcile import reconcile
from tandem.batch.reconciliations import summary
from tandem.declarations import instant_argument
from tandem.names import REPAIR_REQUESTED_BY


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", required=True, help="plan name (conf/plans/<plan>.yaml)")
    span = parser.add_mutually_exclusive_group(required=True)
    span.add_argument("--day", help="the UTC day to reconcile, YYYY-MM-DD")
    span.add_argument("--start", type=instant_argument, help="the start of the range to reconcile (ISO; UTC when no zone)")
    parser.add_argument("--end", type=instant_argument, help="the end of the range (with --start)")
    parser.add_argument("--run-id", required=True, help="stored with the differences (once per run id)")
    args = parser.parse_args(argv)
    if (args.start is None) != (args.end is None):
        parser.error("--start and --end go together")

    if args.day:
        start = datetime.strptime(args.day, "%Y-%m-%d").replace(tzinfo=timezone.utc)
        end = start + timedelta(days=1)
    else:
        start, end = args.start, args.end
    label = args.day or f"{start.isoformat()} .. {end.isoformat()}"

    def work(cluster, plan, db, spark, log) -> None:
        outcomes = reconcile(cluster, plan, db, spark, start, end, run_id=args.run_id)
        counts = summary(outcomes)
        log.info("reconcile %s %s: %s", plan.name, label, counts)
        if plan.reconcile.repair and (counts["late"] or counts["different"]):
            done = run_backfill(cluster, plan, db, spark, start, end,
                                requested_by=REPAIR_REQUESTED_BY.format(run_id=args.run_id))
            log.info("repaired by backfill %s: %s", done.id, done.status)

    return run_plan_job("reconcile", args.plan, work)


if __name__ == "__main__":
    sys.exit(main())
