"""spark-submit entrypoint: run one plan instance until stopped.

    spark-submit --properties-file conf/spark-defaults.conf --py-files dist/tandem.zip \
        jobs/run_plan.py --plan trades --node node-a [--instance shard-1] [--trigger-interval "1 second"]
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading

from tandem.config import load_cluster, load_plan
from tandem.cli import add_instance_option
from tandem.declarations import parse_duration
from tandem.errors import TandemError
from tandem.logs import configure_logging, log_context
from tandem.names import ACTIVE, ROLES
from tandem.runtime.node import install_stop_signals, run_instance


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", required=True, help="plan name (conf/plans/<plan>.yaml)")
    parser.add_argument("--node", required=True, help="node name from conf/cluster.yaml")
    add_instance_option(parser, "the instance, e.g. shard-1 (default: the plan's first)")
    parser.add_argument("--trigger-interval", type=parse_duration, help="micro-batch interval, e.g. '1 second'")
    parser.add_argument("--role", default=ACTIVE, choices=ROLES,
                        help="role to launch for: ACTIVE takes the lease if free; standbys take over on expiry")
    parser.add_argument("--available-now", action="store_true", help="process the input present now, then exit")
    args = parser.parse_args(argv)

    configure_logging()
    cluster = load_cluster()
    plan = load_plan(args.plan, cluster)
    instance = args.instance or plan.instances[0]
    log_context(plan=plan.name, instance=instance, node=args.node)
    stop = threading.Event()
    install_stop_signals(stop)
    try:
        result = run_instance(cluster, plan, args.node, instance,
                              trigger_interval_s=args.trigger_interval, available_now=args.available_now, stop=stop,
                              role=args.role)
    except TandemError as exc:  # refused before any query started (recorded as the instance's failure): one line
        logging.getLogger("tandem.run_plan").error("refused: %s", exc)
        return 1
    return 0 if result.status == "STOPPED" else 1


if __name__ == "__main__":
    sys.exit(main())
