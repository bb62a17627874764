"""spark-submit entrypoint: reconcile a closed range (by default one UTC day) of a plan's outputs against a batch
recomputation, store the differences, and repair them with a backfill when the plan says so.

    spark-submit --properties-file conf/spark-defaults.conf --py-files dist/tandem.zip \
        jobs/reconcile.py --plan trades --day 2026-11-25 --run-id manual-1
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta, timezone

from tandem.batch.backfill import run_backfill
from tandem.batch.job import run_plan_job
from tandem.batch.reconcile import reconcile
from tandem.batch.reconciliations import summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", required=True, help="plan name (conf/plans/<plan>.yaml)")
    parser.add_argument("--day", required=True, help="the UTC day to reconcile, YYYY-MM-DD")
    parser.add_argument("--run-id", required=True, help="stored with the differences (once per run id)")
    args = parser.parse_args(argv)

    start = datetime.strptime(args.day, "%Y-%m-%d").replace(tzinfo=timezone.utc)
    end = start + timedelta(days=1)

    def work(cluster, plan, db, spark, log) -> None:
        outcomes = reconcile(cluster, plan, db, spark, start, end, run_id=args.run_id)
        counts = summary(outcomes)
        log.info("reconcile %s %s: %s", plan.name, args.day, counts)
        if plan.reconcile.repair and (counts["late"] or counts["different"]):
            done = run_backfill(cluster, plan, db, spark, start, end, requested_by=f"reconcile {args.run_id}")
            log.info("repaired by backfill %s: %s", done.id, done.status)

    return run_plan_job("reconcile", args.plan, work)


if __name__ == "__main__":
    sys.exit(main())
