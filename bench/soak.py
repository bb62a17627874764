#!/usr/bin/env python
"""Soak benchmark: the three plans supervised by Airflow for hours, with failovers, snapshots, upkeep, a reconcile.

A private project (a copy of conf/ with trades, pizza_shop and temperatures only, one instance per group on
node-a/node-b at ``local[1]``: trades as a hot pair, the others with cold standbys, see :data:`HOT`), a private database and a private Airflow stack
(``scripts/airflow_stack.sh``: API server, scheduler, triggerer, DAG processor). Each plan's supervision DAG and
scheduled snapshot DAG run unpaused; the harness

- writes each plan's events at a steady rate at the wall clock (its generator, ``PlanWriter``), remembering them;
- kills the lease holder of the next instance in turn with ``kill -9`` every ``--kill-every`` (the standby takes
  over by itself, the supervisor brings the killed node back as PASSIVE);
- triggers each plan's maintenance DAG every ``--maintain-every``, its only runs (``maintenance.schedule:
  manual``): landing retention, Delta compaction and vacuum (files removed ``--vacuum-retention`` ago),
  PostgreSQL retention; the soak's plans keep rows ``--retention`` long, so the storage reaches a steady state
  within the first hour;
- after ``--reconcile-after`` reconciles each plan's last closed ``--reconcile-span`` with ``jobs/reconcile.py``
  through ``spark-submit`` (differences recorded; none expected);
- every ``--sample-every`` records: Delta data files and log entries per table, PostgreSQL size per table (bytes,
  ``pg_total_relation_size``), files per landing folder (what each stream lists every trigger) and per
  ``retained/`` folder, each instance's memory (the PSS of every process of its ``spark-submit`` group and its driver; each
  process is recorded too), the ACTIVE queries' micro-batch durations (p50/p99/max from their progress rows),
  end-to-end latency p50/p99 (trades: a second's last event written at the wall clock → its per-second partial
  committed, ``updated_at - (bucket end)``, over the seconds of the last sample period), and the lag (the largest
  ``now - watermark`` of the ACTIVE instances' newest progress rows; it includes each plan's 10 s watermark delay).

At the end the writers stop, an event an hour later moves every watermark past the input, and the outputs are
compared with plain-Python references over every event written: trades' merged minute and hour aggregates
(PostgreSQL and Delta; per-second partials are trimmed by the retention by then), the pizza shop's overdue orders,
orders delivered per customer and order counts, the temperatures' averages, alerts and high temperatures.

Bounded: after a warm-up (the first hour, or the first half of a shorter run), a series is bounded when the mean
of its last quarter-of-the-rest samples is within 10 % (plus a small absolute slack) of the mean of the samples
before them, i.e. it does not keep growing. Both windows span whole maintenance cycles (``--maintain-every``
over ``--sample-every`` samples each, the older window trimmed at its start): storage is a sawtooth that upkeep
cuts down each cycle, and a window of part of a cycle sees only its rising edge. A driver's memory is judged by
its peaks instead (the last quarter's highest sample against the highest before): a killed driver launched again regrows to its working size. The
published events table is an output, not upkeep: its growth per hour is reported, not judged. Latency: the p99 of the last sample periods (a quarter of the run) is
compared with the first hour's (target within 20 %).

    python bench/soak.py [--hours 2] [--kill-every 15m] [--sample-every 5m] [--maintain-every 20m]
                         [--rates trades=40,pizza_shop=8,temperatures=4] [--keep]

Results: ``bench/results/soak.json`` (top level: ``hours``, ``bounded``, ``outputs_exact``, then the series).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "include"))
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import _common as C  # noqa: E402
import psutil  # noqa: E402
from _ha import fetch  # noqa: E402
import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn  # noqa: E402
from tandem.reading import read_output  # noqa: E402

SERVER_URL = os.environ.get("TANDEM_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/tandem")
RESULTS = BENCH / "results" / "soak.json"
PLANS = ("trades", "pizza_shop", "temperatures")
UTC = timezone.utc
WARMUP_S = 3600.0
GROWTH_LIMIT = 0.10
WATERMARK_KEY = "~watermark-"
"""The keys of the events ``advance_watermark`` writes last (one per partition, an hour ahead)."""
SLACK = {"delta_files": 16, "delta_log_entries": 16, "postgres_bytes": 2 << 20, "memory_bytes": 96 << 20,
         "landing_files": 600}
"""Absolute growth a series may show on top of :data:`GROWTH_LIMIT` (a file or two per table, a few pages; a landing
folder: five minutes of a partition's files, which maintenance moves out in steps)."""
PUBLISHED = {"postgres_bytes:output_events": "the events the plans published (an output, kept like a topic's messages)"}
"""Series that are what the plans publish, not upkeep: they grow with the input by design, so their growth per
hour is reported beside the verdicts instead of being judged."""


def duration(text: str) -> float:
    """``90s``, ``15m``, ``2h`` or plain seconds."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: write e.g. 90s, 15m or 2h")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


HOT = ("trades",)
"""The plans run as hot pairs (both nodes run); the others have cold standbys (started on failover from the failed
active's checkpoint): on 2 cores, eight drivers (every instance twice) spent 30 to 60 s per micro-batch."""


def soak_plans(conf: Path, retention: str, vacuum_retention: str, snapshot_every: str, keep_input: str,
               trigger: str) -> None:
    """The project's plans for the soak: the three plans only, one instance per group (hot pairs for :data:`HOT`,
    cold standbys for the others), short retentions (so storage reaches its steady state in the soak's first hour),
    scheduled snapshots, ``trigger`` between micro-batches, maintenance only when the harness triggers it."""
    for path in (conf / "plans").glob("*.yaml"):
        if path.stem not in PLANS:
            path.unlink()
            continue
        plan = yaml.safe_load(path.read_text())
        for group in plan["groups"].values():
            group["parallel"] = 1
        plan["ha"] = {"standby": "hot" if path.stem in HOT else "cold", "stall_timeout": "60 seconds",
                      "launch_timeout": "4 minutes"}
        plan["trigger_interval"] = trigger
        plan["snapshot"] = {**plan.get("snapshot", {}), "interval": snapshot_every, "keep": 2}
        plan["maintenance"] = {"schedule": "manual", "compact": True, "vacuum_retention": vacuum_retention,
                               "keep_input": keep_input,
                               "retention": {"partials": {"second": retention}, "heartbeats": retention,
                                             "publish_log": retention, "contributions": retention,
                                             "failover_events": "1 day"}}
        path.write_text(yaml.safe_dump(plan, sort_keys=False))
    cluster_path = conf / "cluster.yaml"
    cluster = yaml.safe_load(cluster_path.read_text())
    for node in cluster["nodes"].values():
        node["spark_master"] = "local[1]"
    cluster_path.write_text(yaml.safe_dump(cluster, sort_keys=False))


# --- samples --------------------------------------------------------------------------------------------------


def delta_counts(storage: Path) -> dict[str, dict[str, int]]:
    """Per Delta table (``<plan>/<table>``): data files and log entries (commits and checkpoints)."""
    counts = {}
    for log in sorted((storage / "delta").glob("*/*/_delta_log")):
        table = log.parent
        counts[f"{table.parent.name}/{table.name}"] = {
            "files": sum(1 for _ in table.rglob("*.parquet") if "_delta_log" not in _.parts),
            "log_entries": sum(1 for e in log.iterdir() if e.suffix in (".json", ".parquet"))}
    return counts


def postgres_sizes(url: str) -> dict[str, int]:
    rows = fetch(url, "SELECT c.relname AS name, pg_total_relation_size(c.oid) AS bytes FROM pg_class c "
                      "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'tandem' "
                      "AND c.relkind = 'r' ORDER BY 1")
    return {row["name"]: int(row["bytes"]) for row in rows}


def input_files(storage: Path) -> dict[str, int]:
    """Files per ``landing/<stream>/<partition>`` (what each stream lists every trigger) and per ``retained/…``
    (processed input kept for backfills and reconciles, never listed by the streams)."""
    return {f"{place}/{folder.parent.name}/{folder.name}": sum(1 for f in folder.iterdir() if f.is_file())
            for place in ("landing", "retained") for folder in sorted((storage / place).glob("*/*"))
            if folder.is_dir()}


def instance_processes_memory(url: str) -> dict[str, list[dict]]:
    """Each RUNNING instance's processes (its spark-submit group and its driver) with their RSS and PSS, by instance
    id. Their PSS adds up to the instance's memory: a child the JVM has forked and not yet exec'd (named after the
    forking thread, e.g. "stream executio") and the pyspark daemon's forked workers share their parent's pages,
    which their RSS counts again."""
    from tandem.supervisor.processes import instance_processes
    from tandem.supervisor.stopping import instance_key

    found = {}
    for record in fetch(url, "SELECT * FROM plan_instances WHERE status = 'RUNNING'"):
        processes = instance_processes(record, instance_key(record["plan"], record["instance"], record["node"]))
        found[record["instance_id"]] = []
        for process in processes.members:
            try:
                memory = process.memory_full_info()
                found[record["instance_id"]].append({"pid": process.pid, "name": process.name(),
                                                     "rss": memory.rss, "pss": memory.pss,
                                                     "cmd": " ".join(process.cmdline()[-2:])[-80:]})
            except psutil.Error:
                continue
    return found


def batch_durations(url: str, since: datetime) -> dict[str, dict]:
    """Per plan and query of the ACTIVE instances: micro-batch durations (ms) since ``since``, p50/p99/max."""
    rows = fetch(url, """SELECT h.plan || '/' || h.query_name AS query, h.batch_duration_ms AS ms FROM heartbeats h
                         JOIN plan_instances i USING (instance_id)
                         WHERE i.role = 'ACTIVE' AND h.recorded_at >= %s AND h.batch_duration_ms IS NOT NULL""",
                 (since,))
    by_query: dict[str, list[float]] = {}
    for row in rows:
        by_query.setdefault(row["query"], []).append(float(row["ms"]))
    return {query: {"n": len(values), "p50": C.percentile(values, 50), "p99": C.percentile(values, 99),
                    "max": max(values)} for query, values in sorted(by_query.items())}


def latencies(url: str, since: datetime) -> list[float]:
    """Trades: seconds from the end of each second (its last event written) to its partial's last commit."""
    rows = fetch(url, "SELECT EXTRACT(EPOCH FROM updated_at - bucket_start)::float8 - 1 AS s FROM trade_aggregates "
                      "WHERE granularity = 'second' AND bucket_start >= %s AND bucket_start < now() - interval '30 seconds'",
                 (since,))
    return [row["s"] for row in rows]


def lag_s(url: str) -> float | None:
    [row] = fetch(url, """SELECT max(EXTRACT(EPOCH FROM now() - h.watermark))::float8 AS lag FROM (
                             SELECT DISTINCT ON (instance_id, query_name) instance_id, watermark FROM heartbeats
                             WHERE recorded_at > now() - interval '2 minutes' AND watermark IS NOT NULL
                             ORDER BY instance_id, query_name, recorded_at DESC) h
                         JOIN plan_instances i USING (instance_id) WHERE i.role = 'ACTIVE'""")
    return row["lag"]


def sample(url: str, storage: Path, started: float, since: datetime) -> dict:
    values = latencies(url, since)
    processes = instance_processes_memory(url)
    return {"t_s": round(time.time() - started, 1), "delta": delta_counts(storage), "postgres_bytes": postgres_sizes(url),
            "input_files": input_files(storage),
            "memory_bytes": {instance: sum(p["pss"] for p in members) for instance, members in processes.items()},
            "processes": processes, "latency_s": {"count": len(values), "p50": C.percentile(values, 50),
                                                  "p99": C.percentile(values, 99)},
            "batch_ms": batch_durations(url, since), "lag_s": lag_s(url)}


def series_of(samples: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """Every sampled quantity as (t, value) points, by name (``delta_files:<table>``, ``postgres_bytes:<table>``,
    ``memory_bytes:<instance>``)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for point in samples:
        for table, counts in point["delta"].items():
            series.setdefault(f"delta_files:{table}", []).append((point["t_s"], counts["files"]))
            series.setdefault(f"delta_log_entries:{table}", []).append((point["t_s"], counts["log_entries"]))
        for table, size in point["postgres_bytes"].items():
            series.setdefault(f"postgres_bytes:{table}", []).append((point["t_s"], size))
        for instance, size in point["memory_bytes"].items():
            series.setdefault(f"memory_bytes:{instance}", []).append((point["t_s"], size))
        for folder, count in point.get("input_files", {}).items():
            if folder.startswith("landing/"):  # retained/ grows with keep_input by design, like the input itself
                series.setdefault(f"landing_files:{folder.removeprefix('landing/')}", []).append((point["t_s"], count))
    return series


def boundedness(points: list[tuple[float, float]], warmup_s: float, slack: float, by: str = "mean",
                cycle: int = 1) -> dict:
    """Whether a series stopped growing after ``warmup_s`` (pure): the mean (``by="peak"``: the highest) of the
    last quarter of the samples after the warm-up against that of the ones between (see the module's docstring),
    both windows a whole number of ``cycle`` samples (one maintenance cycle). Peaks suit a process's memory: a
    driver killed and launched again starts small and grows back to its working size, which is not growth; a
    leak raises the peak."""
    after = [v for t, v in points if t >= warmup_s]
    cycle = max(1, min(cycle, len(after) // 2))
    if len(after) < 4 or len(after) < 2 * cycle:
        return {"bounded": None, "why": f"{len(after)} samples after the warm-up: too few to tell"}
    tail = max(cycle, len(after) // 4 // cycle * cycle)
    head = (len(after) - tail) % cycle
    summary = {"mean": statistics.fmean, "peak": max}[by]
    before, last = summary(after[head:-tail]), summary(after[-tail:])
    limit = before * (1 + GROWTH_LIMIT) + slack
    return {"bounded": last <= limit, f"before_{by}": round(before, 1), f"last_{by}": round(last, 1),
            "limit": round(limit, 1)}


def growth_per_hour(points: list[tuple[float, float]], warmup_s: float) -> float | None:
    """The least-squares slope of a series after the warm-up, per hour (pure; None: fewer than two samples)."""
    after = [(t, v) for t, v in points if t >= warmup_s]
    if len(after) < 2:
        return None
    return round(statistics.linear_regression([t for t, _ in after], [v for _, v in after]).slope * 3600, 1)


def summarise(samples: list[dict], warmup_s: float, cycle: int = 1) -> dict:
    """Every series' verdict; ``cycle``: samples per maintenance cycle (see :func:`boundedness`)."""
    verdicts = {}
    for name, points in series_of(samples).items():
        if name in PUBLISHED:
            verdicts[name] = {"bounded": None, "why": f"{PUBLISHED[name]}: grows with the input by design",
                              "growth_per_hour": growth_per_hour(points, warmup_s)}
            continue
        kind = name.split(":")[0]
        verdicts[name] = boundedness(points, warmup_s, SLACK[kind], by="peak" if kind == "memory_bytes" else "mean",
                                     cycle=cycle)
    known = [v["bounded"] for v in verdicts.values() if v["bounded"] is not None]
    return {"bounded": bool(known) and all(known), "series": verdicts}


def latency_summary(samples: list[dict], warmup_s: float) -> dict:
    first = [s["latency_s"]["p99"] for s in samples if s["t_s"] <= warmup_s and s["latency_s"]["p99"] is not None]
    rest = [s for s in samples if s["t_s"] > warmup_s]
    last = [s["latency_s"]["p99"] for s in rest[-max(1, len(rest) // 2):] if s["latency_s"]["p99"] is not None]
    if not first or not last:
        return {"ratio": None}
    baseline, final = statistics.median(first), statistics.median(last)
    return {"first_hour_p99_s": round(baseline, 3), "end_p99_s": round(final, 3),
            "ratio": round(final / baseline, 3) if baseline else None, "target_ratio": 1.2,
            "met": bool(baseline) and final <= 1.2 * baseline}


# --- the run --------------------------------------------------------------------------------------------------


def instances(cluster, plans: dict) -> list[tuple[str, str]]:
    return [(name, instance) for name, plan in plans.items() for instance in plan.instances]


def kill_holder(cluster, plan, instance: str, url: str) -> dict:
    """kill -9 of the instance's lease holder; what was killed and when (by the database's clock)."""
    from tandem.supervisor.stopping import kill_instance

    [row] = fetch(url, "SELECT holder, epoch, now() AS at FROM leases WHERE plan = %s AND instance = %s",
                  (plan.name, instance)) or [{}]
    if not row.get("holder"):
        return {"plan": plan.name, "instance": instance, "skipped": "no lease holder"}
    signalled = kill_instance(cluster, plan, instance, row["holder"], signal.SIGKILL)
    return {"plan": plan.name, "instance": instance, "node": row["holder"], "epoch": int(row["epoch"]),
            "at": row["at"], "processes": signalled}


def takeover(url: str, kill: dict) -> dict:
    """Seconds from a kill to the next PROMOTED of the instance and to that epoch's first publish (None: not seen).

    Asked at the next kill (and at the end for the last), while the publish log still holds that first publish:
    the plans' retention trims it later."""
    if "at" not in kill or "promoted_after_s" in kill:
        return kill
    params = (kill["plan"], kill["instance"], kill["epoch"])
    [promoted] = fetch(url, "SELECT min(happened_at) AS t FROM failover_events WHERE plan = %s AND instance = %s "
                            "AND kind = 'PROMOTED' AND epoch > %s", params)
    [first] = fetch(url, "SELECT min(published_at) AS t FROM publish_log WHERE plan = %s AND instance = %s "
                         "AND epoch > %s", params)

    def after(moment) -> float | None:
        return None if moment is None else round((moment - kill["at"]).total_seconds(), 2)

    return {**kill, "at": kill["at"].isoformat(), "promoted_after_s": after(promoted["t"]),
            "first_publish_after_s": after(first["t"])}


class ReconcileThread(threading.Thread):
    """:func:`reconcile_recent` beside the soak's loop (a recomputation takes minutes on a loaded machine)."""

    def __init__(self, *args) -> None:
        super().__init__(name="soak-reconcile", daemon=True)
        self.args = args
        self.results: dict = {}

    def run(self) -> None:
        try:
            self.results = reconcile_recent(*self.args)
        except Exception as exc:  # noqa: BLE001 - recorded in the results
            self.results = {"error": repr(exc)}


RECONCILE_TIMEOUT_S = 2400.0
"""A reconcile is background work (lowered priority) on a saturated machine: the pizza shop's took over 30 min."""


def reconcile_recent(cluster, plans: dict, span_s: float, dist: Path, log_dir: Path) -> dict:
    """``jobs/reconcile.py`` through spark-submit for each plan over its last closed ``span_s`` seconds."""
    from tandem.batch.backfill import instances_closed_until
    from tandem.store import Database

    results = {}
    with Database(cluster.database_url) as db:
        for name, plan in plans.items():
            try:
                closed = min(filter(None, instances_closed_until(cluster, db, plan, list(plan.instances)).values()),
                             default=datetime.now(UTC))
            except Exception as exc:  # noqa: BLE001 - recorded; the next plan's reconcile still runs
                results[name] = {"error": repr(exc)}
                continue
            end = closed.replace(second=0, microsecond=0) - timedelta(minutes=1)
            start = end - timedelta(seconds=span_s)
            command = ["spark-submit", "--master", "local[1]", "--properties-file", str(ROOT / "conf" / "spark-defaults.conf"),
                       "--py-files", str(dist), str(dist.parent.parent / "jobs" / "reconcile.py"),
                       "--plan", name, "--start", start.isoformat(), "--end", end.isoformat(), "--run-id", f"soak-{name}"]
            began = time.monotonic()
            results[name] = {"start": start.isoformat(), "end": end.isoformat()}
            try:
                with open(log_dir / f"reconcile-{name}.log", "w") as log:
                    done = subprocess.run(command, env={**os.environ, "PYSPARK_PYTHON": sys.executable}, stdout=log,
                                          stderr=subprocess.STDOUT, timeout=RECONCILE_TIMEOUT_S)
                results[name] |= {"exit_code": done.returncode, **reconcile_counts(cluster, plan)}
            except subprocess.TimeoutExpired:  # the next plan's reconcile still runs
                results[name]["error"] = f"not done after {RECONCILE_TIMEOUT_S:.0f} s (log: {log.name})"
            results[name]["seconds"] = round(time.monotonic() - began, 1)
    return results


def reconcile_counts(cluster, plan) -> dict:
    from tandem.batch.reconciliations import reconciliation_rows, summary

    try:
        rows = reconciliation_rows(cluster, plan)
    except Exception as exc:  # noqa: BLE001 - reported in the results
        return {"error": str(exc).splitlines()[0]}
    return {"outcomes": summary(rows) if rows else None}


# --- the outputs at the end -----------------------------------------------------------------------------------


def trades_problems(cluster, events: list[dict]) -> list[str]:
    """Merged minute and hour aggregates (PostgreSQL and Delta) against the reference over every trade."""
    from _ha import ALL_TIME, compare, expected_aggregates


    trades = [(e["timestamp"], e["symbol"], e["price"], e["quantity"]) for e in events]
    problems = []
    for granularity in ("minute", "hour"):
        expected = expected_aggregates(trades, granularity)
        for source in ("postgres", "delta"):
            rows = [row for row in read_output(cluster, "trades", granularity, *ALL_TIME, source=source)
                    if not row["symbol"].startswith(WATERMARK_KEY)]  # the harness's own last events
            problems += compare(rows, expected, f"trades {source} {granularity}")
    return problems


def pizza_problems(cluster, plan, url: str, events: dict[str, list[dict]]) -> list[str]:
    """Overdue orders (each once), orders delivered per customer and orders counted, PostgreSQL and Delta."""
    from _ha import ALL_TIME
    from _references import pizza_reference

    from tandem.layout import delta_table_dir
    from tandem.outputs.events import read_events_lake
    from tandem.outputs.table import read_table_lake

    per_customer, overdue = pizza_reference(events["orders"], events["deliveries"])
    got_overdue = [r["o"] for r in fetch(url, "SELECT payload->>'order_no' AS o FROM output_events "
                                              "WHERE plan = 'pizza_shop' AND output = 'overdue_orders'")]
    got_table = {r["c"]: int(r["n"]) for r in fetch(
        url, "SELECT key->>'customer_name' AS c, sum((value->>'delivered')::numeric) AS n FROM output_table_rows "
             "WHERE plan = 'pizza_shop' AND output = 'delivered_orders' GROUP BY 1")}
    lake_overdue = read_events_lake(delta_table_dir(cluster, "pizza_shop", "overdue_orders")).column("order_no").to_pylist()
    lake_table = {r["customer_name"]: int(r["delivered"]) for r in read_table_lake(
        delta_table_dir(cluster, "pizza_shop", "delivered_orders"), plan.outputs["delivered_orders"])}
    problems = []
    for label, got in (("postgres", got_overdue), ("delta", lake_overdue)):
        if sorted(got) != sorted(overdue):
            problems.append(f"pizza_shop {label} overdue_orders: {len(got)} published ({len(set(got))} distinct), "
                            f"{len(overdue)} expected")
    for label, got in (("postgres", got_table), ("delta", lake_table)):
        if got != per_customer:
            wrong = sorted(c for c in set(got) | set(per_customer) if got.get(c) != per_customer.get(c))
            problems.append(f"pizza_shop {label} delivered_orders: {len(wrong)} customers differ, e.g. {wrong[:3]}")
    for source in ("postgres", "delta"):
        days = read_output(cluster, "pizza_shop", "day", *ALL_TIME, output="order_stats", source=source)
        counted = (sum(r["orders"] for r in days), sum(r["on_time"] for r in days))
        if counted != (len(events["orders"]), sum(per_customer.values())):
            problems.append(f"pizza_shop {source} order_stats: (orders, on time) {counted}, expected "
                            f"{(len(events['orders']), sum(per_customer.values()))}")
    return problems


def temperature_problems(cluster, url: str, events: dict[str, list[dict]]) -> list[str]:
    """Room averages, alerts and high temperatures (each once) against the reference, PostgreSQL and Delta."""
    from _references import temperature_reference, temperature_row
    from tandem.layout import delta_table_dir
    from tandem.outputs.events import read_events_lake

    expected = temperature_reference(events["temps"])
    problems = []
    for output, rows in expected.items():
        published = fetch(url, "SELECT event_id, payload FROM output_events WHERE plan = 'temperatures' "
                               "AND output = %s", (output,))
        got = [temperature_row(output, r["payload"]) for r in published]
        if len(got) != len(set(got)) or set(got) != rows:
            problems.append(f"temperatures postgres {output}: {len(got)} published ({len(set(got))} distinct), "
                            f"{len(rows)} expected, {len(rows - set(got))} missing, {len(set(got) - rows)} extra")
        table = read_events_lake(delta_table_dir(cluster, "temperatures", output))  # no table: nothing published
        lake = table.column("event_id").to_pylist() if table.num_rows else []
        if sorted(lake) != sorted(r["event_id"] for r in published):
            problems.append(f"temperatures delta {output}: {len(lake)} rows, {len(published)} in PostgreSQL")
    return problems


def output_problems(cluster, plans: dict, url: str, events: dict[str, dict[str, list[dict]]]) -> dict[str, list[str]]:
    return {"trades": trades_problems(cluster, events["trades"]["trades"]),
            "pizza_shop": pizza_problems(cluster, plans["pizza_shop"], url, events["pizza_shop"]),
            "temperatures": temperature_problems(cluster, url, events["temperatures"])}


# --- main -----------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=2.0, help="how long the plans run under load")
    parser.add_argument("--kill-every", type=duration, default=15 * 60.0, help="a kill -9 failover this often")
    parser.add_argument("--sample-every", type=duration, default=5 * 60.0, help="a sample of every series this often")
    parser.add_argument("--maintain-every", type=duration, default=20 * 60.0, help="each plan's maintenance DAG")
    parser.add_argument("--snapshot-every", default="10 minutes", help="the plans' snapshot.interval")
    parser.add_argument("--trigger", default="5 seconds", help="the plans' trigger_interval")
    parser.add_argument("--retention", default="20 minutes",
                        help="the plans' PostgreSQL retention of partials, progress, publish log, contributions")
    parser.add_argument("--vacuum-retention", default="10 minutes",
                        help="the plans' Delta vacuum retention; shorter than --maintain-every, so that each "
                             "vacuum deletes what the compaction before it removed (equal to it, a few seconds "
                             "of jitter decide whether it does)")
    parser.add_argument("--reconcile-after", type=duration, default=None,
                        help="when the reconcile runs (default: after the warm-up, or half-way in a shorter run)")
    parser.add_argument("--reconcile-span", type=duration, default=10 * 60.0, help="the closed range it reconciles")
    parser.add_argument("--rates", default="trades=40,pizza_shop=8,temperatures=4", help="events per second per plan")
    parser.add_argument("--keep", action="store_true", help="keep the project folder and the database")
    args = parser.parse_args(argv)
    rates = {name: int(rate) for name, rate in (item.split("=") for item in args.rates.split(","))}
    run_s = args.hours * 3600
    warmup_s = min(WARMUP_S, run_s / 2)
    reconcile_at = args.reconcile_after if args.reconcile_after is not None else warmup_s
    keep_input = f"{int(run_s // 60) + 60} minutes"  # a reconcile recomputes from the input: keep all of it

    from _airflow import airflow_stack, code_home
    from _ha import PlanWriter
    from tandem.config import load_cluster, load_plan
    from tandem.names import plan_dag_id
    from tandem.producer import advance_watermark
    from tandem.store import Database, migrate
    from tandem.store import snapshots as catalog

    console = Console()
    results: dict = {"hours": args.hours, "bounded": None, "outputs_exact": None, "started_at": C.now_iso(),
                     "git_commit": C.git_commit(ROOT), "machine": C.machine_info(None, SERVER_URL),
                     "settings": {**{k: v for k, v in vars(args).items() if k != "keep"}, "warmup_s": warmup_s,
                                  "keep_input": keep_input, "growth_limit": GROWTH_LIMIT, "slack": SLACK}}
    RESULTS.parent.mkdir(exist_ok=True)
    with C.private_storage("soak", ROOT, SERVER_URL, keep=args.keep) as (project, url):
        soak_plans(project / "conf", args.retention, args.vacuum_retention, args.snapshot_every, keep_input,
                   args.trigger)
        cluster = load_cluster()
        plans = {name: load_plan(name, cluster) for name in PLANS}
        with Database(url) as db:
            migrate(db)
        env_file = code_home(project)
        log_dir = project / "logs"
        log_dir.mkdir()
        writers: dict[str, PlanWriter] = {}
        samples: list[dict] = []
        failovers: list[dict] = []
        maintenance_runs: list[tuple[str, str]] = []
        console.print(f"soak: project {project}, database {url.rsplit('/', 1)[-1]}")
        try:
            with airflow_stack(project / "airflow", {"TANDEM_ENV_FILE": str(env_file)}) as airflow:
                for name in PLANS:
                    for purpose in ("supervise", "snapshot", "maintenance"):
                        airflow.wait_for_dag(plan_dag_id(name, purpose))
                        airflow.set_paused(plan_dag_id(name, purpose), False)
                wait_running(console, url, plans)
                started = time.time()
                since = datetime.now(UTC)
                for name in PLANS:
                    writers[name] = PlanWriter(cluster, plans[name], rate=rates[name], seed=11 + PLANS.index(name))
                    writers[name].start()
                targets = instances(cluster, plans)
                next_kill, next_sample, next_maintain = args.kill_every, 0.0, args.maintain_every
                reconciling: ReconcileThread | None = None
                with Progress(TextColumn("[bold]soak"), BarColumn(), TextColumn("{task.description}"),
                              TimeElapsedColumn(), TimeRemainingColumn(), console=console) as progress:
                    task = progress.add_task("", total=run_s)
                    while (elapsed := time.time() - started) < run_s:
                        if elapsed >= next_sample:
                            samples.append(sample(url, cluster.storage_root, started, since))
                            since = datetime.now(UTC)
                            next_sample += args.sample_every
                            RESULTS.write_text(json.dumps({**results, "samples": samples, "failovers": failovers},
                                                          indent=1, default=str) + "\n")
                        if elapsed >= next_kill:
                            if failovers:
                                failovers[-1] = takeover(url, failovers[-1])
                            plan_name, instance = targets[len(failovers) % len(targets)]
                            failovers.append(kill_holder(cluster, plans[plan_name], instance, url))
                            next_kill += args.kill_every
                        if elapsed >= next_maintain:
                            for name in PLANS:
                                maintenance_runs.append((name, airflow.trigger(plan_dag_id(name, "maintenance"), {})))
                            next_maintain += args.maintain_every
                        if reconciling is None and elapsed >= reconcile_at:
                            reconciling = ReconcileThread(cluster, plans, args.reconcile_span,
                                                          project / "code" / "dist" / "tandem.zip", log_dir)
                            reconciling.start()
                        for name, writer in writers.items():
                            if writer.error is not None:
                                raise RuntimeError(f"the {name} writer failed: {writer.error!r}")
                        progress.update(task, completed=elapsed,
                                        description=f"{len(samples)} samples, {len(failovers)} kills")
                        time.sleep(1.0)
                events = {name: writer.stop() for name, writer in writers.items()}
                for name in PLANS:
                    advance_watermark(cluster, plans[name], int(time.time() * 1000) + 3_600_000)
                samples.append(sample(url, cluster.storage_root, started, since))
                results["failovers"] = [takeover(url, kill) for kill in failovers]
                results["maintenance"] = [{"plan": name, "run_id": run, "state": airflow.run_state(
                    plan_dag_id(name, "maintenance"), run)} for name, run in maintenance_runs]
                if reconciling is not None:
                    reconciling.join()
                results["reconcile"] = reconciling.results if reconciling is not None else None
                problems = wait_exact(console, cluster, plans, url, events)
                if any(problems.values()):  # the database is dropped at the end: keep what tells lag from loss
                    results["diagnostics"] = diagnostics(url, events)
                with Database(url) as db:  # GOOD (kept), PRUNED (good, replaced by newer ones), BAD, TAKING
                    results["snapshots"] = {name: dict(Counter(s.status for s in catalog.list_snapshots(db, name)))
                                            for name in PLANS}
                for name in PLANS:
                    for purpose in ("supervise", "snapshot", "maintenance"):
                        airflow.set_paused(plan_dag_id(name, purpose), True)
        finally:
            for writer in writers.values():
                writer.stopping.set()
            stop_instances(url)
        results.update(summarise(samples, warmup_s, cycle=max(1, round(args.maintain_every / args.sample_every))))
        results["outputs_exact"] = not any(problems.values())
        results["output_problems"] = problems
        results["latency"] = latency_summary(samples, warmup_s)
        results["events"] = {name: {stream: len(items) for stream, items in by_stream.items()}
                             for name, by_stream in events.items()}
        results["samples"] = samples
        results["finished_at"] = C.now_iso()
        RESULTS.write_text(json.dumps(results, indent=1, default=str) + "\n")
    unbounded = [name for name, verdict in results["series"].items() if verdict["bounded"] is False]
    console.print(f"soak: {args.hours} h, bounded {results['bounded']} (unbounded: {unbounded or 'none'}), outputs exact "
                  f"{results['outputs_exact']}, latency {results['latency']}; wrote {RESULTS}")
    return 0 if results["bounded"] and results["outputs_exact"] else 1


def wait_running(console: Console, url: str, plans: dict) -> None:
    """Until every instance of every plan runs: its ACTIVE, and its PASSIVE for a hot standby."""
    expected = sum(len(plan.instances) for plan in plans.values())
    wanted = {name: ["ACTIVE", "PASSIVE"] if plan.ha.standby == "hot" else ["ACTIVE"] for name, plan in plans.items()}
    deadline = time.monotonic() + 900
    with console.status("waiting for the supervisors to launch every pair") as status:
        while time.monotonic() < deadline:
            rows = fetch(url, "SELECT plan, instance, array_agg(role ORDER BY role) AS roles FROM plan_instances "
                              "WHERE status = 'RUNNING' GROUP BY 1, 2")
            pairs = sum(1 for row in rows if row["roles"] == wanted[row["plan"]])
            status.update(f"waiting for the supervisors to launch every instance: {pairs} of {expected}")
            if pairs == expected:
                return
            time.sleep(5)
    raise RuntimeError(f"the supervisors did not launch every pair within 15 minutes ({pairs} of {expected})")


def diagnostics(url: str, events: dict) -> dict:
    """When the outputs differ: each instance's status and newest watermark against its plan's newest event (behind
    it: the instance had not caught up; past it with rows missing: lost), and the last failover events."""
    newest = {name: max((int(e.get("time") or e.get("timestamp") or 0) for items in by_stream.values()
                         for e in items), default=0) for name, by_stream in events.items()}
    instances = fetch(url, "SELECT plan, instance, node, role, status, error, started_at FROM plan_instances "
                           "ORDER BY plan, instance, node")
    watermarks = fetch(url, "SELECT instance_id, query_name, max(watermark) AS watermark, max(batch_id) AS batch, "
                            "max(recorded_at) AS recorded_at FROM heartbeats GROUP BY 1, 2 ORDER BY 1, 2")
    recent = fetch(url, "SELECT plan, instance, node, kind, epoch, happened_at, detail FROM failover_events "
                        "ORDER BY happened_at DESC LIMIT 60")
    return {"newest_event_ms": newest, "instances": instances, "watermarks": watermarks, "failover_events": recent}


def wait_exact(console: Console, cluster, plans: dict, url: str, events: dict) -> dict[str, list[str]]:
    """The output problems once they are gone, or after 10 minutes (the last batches may still be on their way)."""
    deadline = time.monotonic() + 600
    with console.status("comparing the outputs with the references"):
        while True:
            problems = output_problems(cluster, plans, url, events)
            if not any(problems.values()) or time.monotonic() > deadline:
                return problems
            time.sleep(20)


def stop_instances(url: str) -> None:
    """kill -9 every process group the supervisors launched (they outlive Airflow; the database goes next)."""
    from _project import kill_groups

    try:
        rows = fetch(url, "SELECT submit_pid FROM plan_instances WHERE submit_pid IS NOT NULL")
    except Exception:  # noqa: BLE001 - best effort: nothing to kill when the database is gone
        return
    kill_groups([row["submit_pid"] for row in rows])


if __name__ == "__main__":
    sys.exit(main())
