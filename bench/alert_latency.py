#!/usr/bin/env python
"""Kill-to-alert benchmark: from ``kill -9`` of the ACTIVE to Prometheus' TandemFailover alert at an Alertmanager
webhook receiver (issue 49 §2).

The trades plan on shard-1, a hot pair of real detached ``spark-submit`` instances under a steady writer, and per run
a fresh monitoring stack (``tests/support/_monitoring.py``): ``tandem exporter`` with a bearer token, Prometheus
scraping it and evaluating ``conf/prometheus/tandem-rules.yml`` every ``--scrape-interval``, Alertmanager with
``group_wait: 0s`` posting to an HTTP server of this script. A fresh stack per run because the alert stays firing
for the five minutes of its ``increase`` window. Each run kills the ACTIVE at a random point of its heartbeat
(``bench/failover.py``'s ``one_failover``), then records:

- ``detection_s``: kill → the standby's PROMOTED event (the baseline: what any alert has to wait for);
- ``alert_s``: kill → the firing TandemFailover alert received by the webhook;
- ``alert_after_takeover_s`` = ``alert_s - detection_s``: what the monitoring path adds (a scrape, a rule
  evaluation, Alertmanager's dispatch), and ``ratio`` = ``alert_s / detection_s``.

The killed node rejoins as the PASSIVE between runs. After the runs every output is compared with the events
written. Results: ``bench/results/alert_latency.json`` (bench/README.md, "Kill-to-alert").
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from failover import _check_outputs, one_failover, private_project  # noqa: E402 - tests/support is on the path
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: E402

import _ha  # noqa: E402
from _common import machine_info, now_iso  # noqa: E402
from _monitoring import monitoring_stack  # noqa: E402
from tandem.config import load_cluster, load_plan  # noqa: E402

console = Console()


def run(runs: int, rate: int, scrape_interval: str, progress: Progress) -> dict:
    task = progress.add_task("kill-to-alert: starting node-a ACTIVE + node-b PASSIVE", total=runs + 2)
    with private_project("alerts") as project, tempfile.TemporaryDirectory(prefix="tandem-alerts-") as folder:
        cluster = load_cluster()
        plan = load_plan("trades", cluster)
        pair = _ha.Pair(cluster, plan, project.root / "dist" / "tandem.zip", project.groups)
        writer = _ha.start_writer(cluster, rate=rate, seed=23)
        try:
            pair.start_pair("node-a", "node-b")
            pair.wait_caught_up("node-b")
            progress.advance(task)
            active, standby, results = "node-a", "node-b", []
            for number in range(1, runs + 1):
                progress.update(task, description=f"kill-to-alert {number}/{runs}: monitoring stack up")
                with monitoring_stack(Path(folder) / f"run-{number}", scrape_interval) as stack:
                    at = 'plan="trades", plan_instance="shard-1"'
                    stack.wait_scraped(f'tandem_failovers_total{{{at}, cause="takeover"}}')
                    killed: list[float] = []

                    def kill(node: str) -> float:
                        killed.append(pair.kill(node, signal.SIGKILL))
                        return killed[-1]

                    progress.update(task, description=f"kill-to-alert {number}/{runs}: kill -9 {active}")
                    failover = one_failover(pair, active, standby, fail=kill)
                    alert = stack.wait_alert("TandemFailover", timeout_s=120, plan="trades", plan_instance="shard-1")
                alert_s = round(alert.at - killed[0], 3)
                results.append({"killed": active, "detection_s": failover["detection_s"], "alert_s": alert_s,
                                "alert_after_takeover_s": round(alert_s - failover["detection_s"], 3),
                                "ratio": round(alert_s / failover["detection_s"], 2),
                                "first_publish_s": failover["first_publish_s"]})
                progress.console.log(f"run {number}: kill -9 {active} → PROMOTED {failover['detection_s']:.2f}s, "
                                     f"TandemFailover at the webhook {alert_s:.2f}s")
                if number < runs:
                    progress.update(task, description=f"kill-to-alert {number}/{runs}: relaunching {active}")
                    pair.launch(active, "PASSIVE")
                    pair.wait_running(active)
                    pair.wait_caught_up(active)
                progress.advance(task)
                active, standby = standby, active
            progress.update(task, description="kill-to-alert: checking the outputs against every event written")
            events, problems = _check_outputs(writer, cluster, pair.url)
            progress.advance(task)
        finally:
            writer.stopping.set()
    alerts = [r["alert_s"] for r in results]
    added = [r["alert_after_takeover_s"] for r in results]
    return {"runs": results, "alert_s_median": statistics.median(alerts), "alert_s_max": max(alerts),
            "alert_after_takeover_s_median": statistics.median(added),
            "ratio_median": statistics.median(r["ratio"] for r in results),
            "events_written": len(events), "outputs_exact": not problems, "output_problems": problems[:10]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rate", type=int, default=200, help="trade events per second")
    parser.add_argument("--scrape-interval", default="1s",
                        help="Prometheus' scrape and rule evaluation interval (its default is 1m, with 15s common)")
    parser.add_argument("--output", type=Path, default=BENCH / "results" / "alert_latency.json")
    args = parser.parse_args(argv)
    started = now_iso()
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        result = run(args.runs, args.rate, args.scrape_interval, progress)
    report = {"benchmark": "alert_latency", "started": started, "finished": now_iso(), "machine": machine_info(),
              "settings": {"runs": args.runs, "rate": args.rate, "scrape_interval": args.scrape_interval,
                           "evaluation_interval": args.scrape_interval, "alertmanager_group_wait": "0s",
                           "rules": "conf/prometheus/tandem-rules.yml"}, **result}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    console.print(f"kill → alert median {report['alert_s_median']:.2f}s (max {report['alert_s_max']:.2f}s), "
                  f"{report['alert_after_takeover_s_median']:.2f}s after the take-over; outputs exact: "
                  f"{report['outputs_exact']} → {args.output}")
    return 0 if report["outputs_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
