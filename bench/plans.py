#!/usr/bin/env python
"""Plans benchmark: events/s of each plan through Tandem versus the same Spark queries through plain sinks.

For each of the three plans (trades, pizza_shop, temperatures) the same pre-written input (the
plan's own generator at simulated times, through the partition layout, ~0.5 % bad lines) is run
to the end (available-now) in one Spark session, alternately:

- **tandem**: ``run_instance`` for every instance of every group: registration, lease, fenced
  PostgreSQL transactions with ids, Delta copies, publish_log, heartbeats;
- **plain**: the very DataFrames the plan's ``build()`` returns for the same instances, each
  ``foreachBatch`` writing its rows to a plain PostgreSQL table (``COPY`` of JSON rows, no fence,
  no ids, no position) and appending them to a Delta table (no application transaction).

events/s = events of the plan's primary stream (trades, orders, readings) ÷ wall seconds of the
whole run (all instances); the ratio is tandem ÷ plain of the medians. Target ≥ 0.9.

With ``--flink`` (the default once ``make bench-flink`` has made its venv) each plan also runs in the peer, Apache
Flink, on the same files (``bench/flink_peer.py``: every plan in Flink SQL, one job per run): one checked run, every
output's rows against plain-Python references of the plan over the good lines, then ``--repeats`` timed streaming
runs into blackhole sinks; ``tandem_over_flink`` = Tandem's events/s ÷ Flink's (target ≥ 0.6).

Then the hot failover time per plan: the first instance of the plan's first group (every group
at parallel 1) on node-a ACTIVE and node-b hot PASSIVE, two real detached ``spark-submit``
processes (the master of the nodes' Airflow connections, ``local[2]`` here), the plan's generator
writing ``--rate`` events per second at the wall clock. Each run waits until the standby is hot
(its slowest query's watermark within 5 s of the active's: ``Pair.wait_level``), kills the active's
process group with SIGKILL at a random point of the heartbeat and times the first ``publish_log``
commit of the new active (``bench/failover.py``'s ``one_failover``); the killed node then rejoins
as the standby and gets level again before the next run. Target: median ≤ 5 s.

    python bench/plans.py [--events N] [--repeats 3] [--failovers 3] [--rate 10]
        [--plans trades,pizza_shop,temperatures] [--flink] [--merge]

Results: ``bench/results/plans.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "include"))
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "tests" / "support"))

import _common as C  # noqa: E402
import engine  # noqa: E402
import flink_peer  # noqa: E402
from psycopg2 import sql  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

SERVER_URL = os.environ.get("TANDEM_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/tandem")
PRIMARY = {"trades": "trades", "pizza_shop": "orders", "temperatures": "temps"}
DEFAULT_EVENTS = {"trades": 100_000, "pizza_shop": 20_000, "temperatures": 20_000}
"""Input sizes that make every run last about 20-60 s on this machine: an instance's start and stop
(registration, lease, the last progress heartbeat: ~0.3 s each) are paid once per run, not per event,
and at 20 000 trades (3 s per instance) they were a tenth of the run."""
RESULTS = BENCH / "results" / "plans.json"
START_MS = 1_750_000_000_000
FINAL_MS = START_MS + 30 * 86_400_000


def write_input(plan, events: int, seed: int, input_dir: Path) -> int:
    """The plan's events at simulated times (100 per simulated second) in ``input_dir/<stream>/<partition>/``."""
    from tandem.producer import bad_line, generator_for, partitioned
    from tandem.sources.files import write_atomically

    generator = generator_for(plan, seed)
    start_ms, per_tick, written = START_MS, 100, 0
    for tick in range(max(1, events // per_tick)):
        by_stream = generator.events(start_ms + tick * 1000, per_tick)
        lines = {stream: [(e, bad_line(plan.streams[stream], e, generator.random) if generator.random.random() < 0.005
                           else json.dumps(e)) for e in items] for stream, items in by_stream.items()}
        for (stream, partition), chunk in partitioned(plan, lines).items():
            write_atomically(input_dir / stream / str(partition), chunk)
        written += len(by_stream[PRIMARY[plan.name]])
    return written


def land(input_dir: Path, storage: Path) -> None:
    shutil.copytree(input_dir, storage / "landing", dirs_exist_ok=True)


class PlainSink:
    """Rows to a plain PostgreSQL table (COPY of JSON) and appended to Delta: no fence, no ids, no position."""

    def __init__(self, url: str, table: str, delta_path: Path) -> None:
        import psycopg2

        self.table = sql.Identifier(f"plain_{table}")  # an output name from the plan's YAML
        self.conn = psycopg2.connect(url)
        self.delta_path = delta_path
        with self.conn, self.conn.cursor() as cursor:
            cursor.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (row jsonb NOT NULL)").format(self.table))

    def __call__(self, frame, batch_id: int) -> None:
        from deltalake import write_deltalake

        rows = frame.toArrow()
        if rows.num_rows == 0:
            return
        buffer = io.StringIO("".join(json.dumps(r, default=str).replace("\\", "\\\\") + "\n" for r in rows.to_pylist()))
        with self.conn, self.conn.cursor() as cursor:
            cursor.copy_expert(sql.SQL("COPY {} (row) FROM STDIN").format(self.table), buffer)
        write_deltalake(str(self.delta_path), rows, mode="append")


def run_tandem(cluster, plan, spark) -> None:
    from tandem.runtime.node import run_instance

    for instance in plan.instances:
        result = run_instance(cluster, plan, plan.nodes[0], instance, spark=spark, available_now=True)
        if result.status != "STOPPED":
            raise RuntimeError(f"{plan.name}/{instance}: {result.error}")


def run_plain(cluster, plan, spark, url: str) -> None:
    from tandem.layout import checkpoint_dir, delta_table_dir
    from tandem.runtime.plan_api import PlanContext, instance_queries
    from tandem.runtime.node import start_query
    from tandem.store.registry import InstanceKey

    class PlainContext(PlanContext):
        def sink(self, output: str):
            return PlainSink(url, output, delta_table_dir(self.cluster, "plain", output))

        def routed(self, column: str, outputs: dict[str, tuple[str, ...]]):
            from tandem.runtime.publisher import ALL_ROWS

            sinks = [(value, self.sink(output)) for value, names in outputs.items() for output in names]

            def route(frame, batch_id: int) -> None:
                from pyspark.sql import functions as F

                frame.persist()
                for value, sink in sinks:
                    sink(frame if value == ALL_ROWS else frame.where(F.col(column) == value), batch_id)
                frame.unpersist()
            route.output = "+".join(name for names in outputs.values() for name in names)
            return route

    for instance in plan.instances:
        ctx = PlainContext(cluster, plan, InstanceKey(plan.name, instance, "plain"), spark)
        queries = [start_query(spark, definition, definition.frame.writeStream.outputMode(definition.output_mode)
                               .option("checkpointLocation", str(checkpoint_dir(cluster, "plain", instance, "plain",
                                                                                definition.name)))
                               .foreachBatch(definition.sink).trigger(availableNow=True))
                   for definition in instance_queries(ctx)]
        for query in queries:
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(f"plain {plan.name}/{instance}: {query.exception()}")


def measure(name: str, events: int, repeats: int, spark, progress: Progress, task, with_flink: bool) -> dict:
    from tandem.config import load_cluster, load_plan
    from tandem.producer import advance_watermark
    from tandem.store import Database, migrate

    input_dir = Path(tempfile.mkdtemp(prefix=f"tandem-plans-input-{name}-"))
    anchors = {f"engine{index}": config for index, config in enumerate(engine.CONFIGS, start=1)}
    seconds: dict[str, list[float]] = {"tandem": [], "plain": [], **{side: [] for side in anchors}}
    try:
        plan = load_plan(name, load_cluster(ROOT / "conf" / "cluster.yaml"))
        primary = write_input(plan, events, 7, input_dir)
        # one untimed run of each side first: the JVM's JIT and the Python workers warm up on whichever runs first
        runs = [(side, False) for side in ("plain", "tandem")] + [
            (side, True) for repeat in range(repeats)
            for side in (("plain", "tandem") if repeat % 2 == 0 else ("tandem", "plain")) + tuple(anchors)]
        for side, timed in runs:
            with C.private_storage(f"plans_{name}_{side}", ROOT, SERVER_URL) as (root, url):
                cluster = load_cluster()
                plan = load_plan(name, cluster)
                land(input_dir, cluster.storage_root)
                advance_watermark(cluster, plan, FINAL_MS)  # every result final by the end of the run
                with Database(url) as db:
                    migrate(db)
                started = time.perf_counter()
                if side in anchors:
                    engine.run_engine(cluster, plan, spark, anchors[side], root / "engine-checkpoints")
                else:
                    run_tandem(cluster, plan, spark) if side == "tandem" else run_plain(cluster, plan, spark, url)
                if timed:
                    seconds[side].append(round(time.perf_counter() - started, 2))
            progress.advance(task)
        flink = flink_part(name, plan, input_dir, primary, repeats, progress) if with_flink else None
    finally:
        shutil.rmtree(input_dir, ignore_errors=True)
    tandem_rate = primary / statistics.median(seconds["tandem"])
    plain_rate = primary / statistics.median(seconds["plain"])
    anchor = engine.summary(primary, {anchors[side].name: seconds.pop(side) for side in anchors}, tandem_rate)
    return {"events": primary, "seconds": seconds, "tandem_events_per_s": round(tandem_rate, 1),
            "engine_best_events_per_s": anchor["best_events_per_s"], "engine_ratio": anchor["engine_ratio"],
            "engine_ratio_met": anchor["engine_ratio"] >= 0.9, "engine": anchor,
            "plain_events_per_s": round(plain_rate, 1), "ratio": round(tandem_rate / plain_rate, 3),
            "target_ratio": 0.9, "met": tandem_rate / plain_rate >= 0.9,
            **({"flink": flink} if flink else {}),
            **({"tandem_over_flink": round(tandem_rate / flink["events_per_s"], 3),
                "engine_over_flink": round(anchor["best_events_per_s"] / flink["events_per_s"], 3),
                "target_tandem_over_flink": 0.6} if flink and flink["ran"] else {}),
            "failover": None}


def flink_part(name: str, plan, input_dir: Path, primary: int, repeats: int, progress: Progress) -> dict:
    """The peer (:mod:`flink_peer`) on the same files: one checked run (every output's rows against a plain-Python
    reference of the plan over the lines, :func:`flink_check`), then ``repeats`` timed streaming runs into blackhole
    sinks, each once the machine is quiet (this process's Spark JVM included), with the CPU anything else used
    meanwhile."""
    inputs = {stream: input_dir / stream for stream in flink_peer.PLANS[name].streams}
    events = {stream: valid_events(plan, stream, path) for stream, path in inputs.items()}
    times = [e[plan.streams[stream].event_time] for stream, (good, _) in events.items() for e in good]
    watermark_ms = max(times) - min(times) + 10_000  # the whole span: Flink reads the files out of their order

    def timed_run():
        C.wait_for_quiet(set(), max_wait_s=300)  # nothing busy: not even this process's Spark JVM
        others = C.ForeignCpu(set())
        run = flink_peer.run(name, inputs, watermark_ms=watermark_ms)
        return run, round(max(0.0, others.seconds() - run.cpu_s), 1)

    out = input_dir.parent / f"{input_dir.name}-flink-out"
    try:
        checked = flink_peer.run(name, inputs, watermark_ms=watermark_ms, output=out)
        comparison = flink_check(name, out, {stream: good for stream, (good, _) in events.items()})
    finally:
        shutil.rmtree(out, ignore_errors=True)
    measured = [timed_run() for _ in range(repeats)]
    timed = [run for run, _ in measured]
    progress.console.log(f"{name}: flink streaming {[r.job_s for r in timed]} s, checked run matches the "
                         f"reference: {comparison['match']}")
    return {"ran": True, "mode": "streaming", "parallelism": checked.parallelism, "version": checked.flink_version,
            "watermark_ms": watermark_ms, "seconds": [r.job_s for r in timed], "cpu_s": [r.cpu_s for r in timed],
            "other_processes_cpu_s": [other for _, other in measured],
            "jvm_start_s": [r.jvm_start_s for r in timed],
            "valid_lines": {stream: len(good) for stream, (good, _) in events.items()},
            "invalid_lines": {stream: bad for stream, (_, bad) in events.items()},
            "check": comparison, "events_per_s": round(primary / statistics.median(r.job_s for r in timed), 1)}


def valid_events(plan, stream: str, directory: Path) -> tuple[list[dict], int]:
    """The good events of a stream's files (the plan's declared rule in plain Python, :func:`_common.valid_event`),
    and how many lines were bad."""
    fields = plan.streams[stream].fields
    return C.good_events(sorted(directory.rglob("*.jsonl")), lambda line: C.valid_event(line, fields))


def flink_check(name: str, output: Path, events: dict[str, list[dict]]) -> dict:
    """A checked Flink run's outputs against the plan's semantics in plain Python over the good events
    (``tests/support/_references.py``; trades: :func:`_common.trades_reference`'s measures): per output, the rows on
    one side only (a multiset of rows: a row twice is a difference too)."""
    from collections import Counter

    if name == "trades":
        return C.compare_frames(flink_peer.read_rows(output), C.trades_measures(events["trades"]))
    rows = flink_peer.read_outputs(output, name)
    expected, as_row = (pizza_expected(events["orders"], events["deliveries"]) if name == "pizza_shop"
                        else temperatures_expected(events["temps"]))
    outputs = {}
    for output_name, want in expected.items():
        got = Counter(as_row(output_name, row) for row in rows.get(output_name, []))
        if name == "temperatures":  # keyed events: a reading given twice is one event (the reference's sets)
            got = Counter(set(got))
        outputs[output_name] = {"rows": sum(got.values()), "expected": sum(want.values()),
                                "only_flink": sum((got - want).values()), "only_reference": sum((want - got).values()),
                                "examples_only_flink": [list(r) for r in list(got - want)[:3]],
                                "examples_only_reference": [list(r) for r in list(want - got)[:3]]}
    return {"outputs": outputs,
            "match": all(o["only_flink"] == o["only_reference"] == 0 for o in outputs.values())}


def _millis(iso: str) -> int:
    """A time as Tandem reads it (ISO 8601 text) in epoch milliseconds, as the Flink job writes it (exact)."""
    from datetime import datetime, timedelta, timezone

    return (datetime.fromisoformat(iso) - datetime(1970, 1, 1, tzinfo=timezone.utc)) // timedelta(milliseconds=1)


def pizza_expected(orders: list[dict], deliveries: list[dict]):
    """The pizza shop's outputs as multisets of rows, and how a Flink row becomes one."""
    from collections import Counter
    from datetime import datetime, timezone

    from _references import ORDER_EXPIRY_MS, last_orders_reference, pizza_reference

    per_customer, overdue = pizza_reference(orders, deliveries)
    stats: dict[tuple[str, int], list] = {}
    for order in orders:
        for unit, size in (("minute", 60_000), ("hour", 3_600_000), ("day", 86_400_000)):
            bucket = stats.setdefault((unit, order["time"] // size * size), [0, 0, set()])
            bucket[0] += 1
            bucket[1] += order["order_no"] not in overdue
            bucket[2].add(order["customer_name"])
    expected = {
        "delivered_orders": Counter(per_customer.items()),
        "overdue_orders": Counter((o["order_no"], o["customer_name"], o["time"], o["time"] + ORDER_EXPIRY_MS)
                                  for o in orders if o["order_no"] in overdue),
        "last_orders": Counter((c, r["order_no"], _millis(r["order_time"]), r["outcome"], r["delivered"])
                               for c, r in last_orders_reference(orders, deliveries).items()),
        "order_stats": Counter((unit, start, n, on_time, len(customers))
                               for (unit, start), (n, on_time, customers) in stats.items()),
    }

    def as_row(output: str, row: dict) -> tuple:
        if output == "order_stats":
            start = datetime.fromisoformat(row["bucket_start"]).replace(tzinfo=timezone.utc)
            return (row["granularity"], int(start.timestamp() * 1000), row["orders"], row["on_time"], row["customers"])
        return tuple(row.values())

    return expected, as_row


def temperatures_expected(readings: list[dict]):
    """The temperature outputs as multisets of rows (:func:`_references.temperature_row`'s tuples)."""
    from collections import Counter

    from _references import temperature_reference, temperature_row

    expected = {output: Counter(rows) for output, rows in temperature_reference(readings).items()}
    return expected, temperature_row


def hot_failovers(name: str, runs: int, rate: int, progress: Progress, task) -> dict:
    """``runs`` kill -9 failovers of the plan's first instance under load; seconds to the new active's first output."""
    import random
    import signal

    import _ha
    import yaml
    from failover import one_failover, summary
    from tandem.config import load_cluster, load_plan
    from tandem.packaging import build_dist

    with C.private_storage(f"plans_{name}_failover", ROOT, SERVER_URL) as (root, url):
        path = root / "conf" / "plans" / f"{name}.yaml"
        declared = yaml.safe_load(path.read_text())
        for group in declared["groups"].values():
            group["parallel"] = 1
        path.write_text(yaml.safe_dump(declared))
        _ha.one_core_nodes(root)
        build_dist(root)
        cluster = load_cluster()
        plan = load_plan(name, cluster)
        groups: list[int] = []
        pair = _ha.Pair(cluster, plan, root / "dist" / "tandem.zip", groups, instance=plan.instances[0])
        writer = _ha.PlanWriter(cluster, plan, rate=rate, seed=random.randint(1, 1000))
        writer.start()
        results: list[dict] = []
        relaunched: list[str] = []
        error = None
        try:
            pair.start_pair("node-a", "node-b")
            _ha.wait_for(lambda: pair.first_publish("node-a", 1), 240, "node-a to publish",
                         detail=lambda: pair.log_tail("node-a"))
            pair.wait_level("node-b", "node-a")
            active, standby = "node-a", "node-b"
            for run in range(1, runs + 1):
                relaunch_failed_standby(pair, standby, active, relaunched)
                results.append(one_failover(pair, active, standby))
                progress.console.log(f"{name} run {run}: kill -9 {active} → first output of {standby} "
                                     f"{results[-1]['first_publish_s']:.2f}s")
                progress.advance(task)
                if run < runs:
                    pair.launch(active, "PASSIVE")
                    pair.wait_running(active)
                    pair.wait_level(active, standby)
                active, standby = standby, active
        except (RuntimeError, AssertionError) as exc:  # the runs measured so far are kept
            if not results:
                raise
            error = str(exc).splitlines()[0]
        finally:
            writer.stopping.set()
            for pgid in groups:
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(2)
    timed = summary([r["first_publish_s"] for r in results])
    return {**timed, "detection_s": [r["detection_s"] for r in results], "target_median_s": 5.0,
            "met": timed["median_s"] <= 5.0, "instance": plan.instances[0], "standby_relaunches": relaunched,
            "details": results, **({"error_after_last_run": error} if error else {})}


def relaunch_failed_standby(pair, node: str, active: str, relaunched: list[str]) -> None:
    """Relaunch the standby when it is not RUNNING (what the supervision DAG does), and note why.

    Under CPU pressure a ``transformWithStateInPandas`` query can fail at start: Spark waits a fixed
    10 s for its Python worker to connect back ("Python worker failed to connect back").
    """
    import _ha

    row = _ha.instance_row(pair.url, node, pair.plan.name, pair.instance)
    if row is not None and row["status"] == "RUNNING":
        return
    relaunched.append(f"{node}: {row['status'] if row else 'no instance'}: {(row or {}).get('error') or ''}"[:300])
    pair.launch(node, "PASSIVE")
    pair.wait_running(node)
    pair.wait_level(node, active)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=None,
                        help="events of each plan's primary stream (default: per plan, DEFAULT_EVENTS)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side (alternating order)")
    parser.add_argument("--failovers", type=int, default=3, help="hot failovers per plan (0: skip)")
    parser.add_argument("--rate", type=int, default=10,
                        help="events per second during the failovers (10: on 2 cores both nodes of every plan keep up)")
    parser.add_argument("--plans", default="trades,pizza_shop,temperatures")
    parser.add_argument("--flink", action=argparse.BooleanOptionalAction, default=None,
                        help="also run the peer, Apache Flink, on the same files (bench/flink_peer.py: every plan in "
                             "Flink SQL; needs `make bench-flink`); default: when its venv is there")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other plans' entries of results/plans.json (each names its own run), and with "
                             "--failovers 0 each plan's earlier failover figures (marked with their run)")
    args = parser.parse_args(argv)
    args.flink = flink_peer.wanted(parser, args.flink)
    from tandem.spark_session import build_session

    console = Console()
    spark = build_session("tandem-bench-plans", "local[2]", ROOT / "conf" / "spark-defaults.conf")
    spark.sparkContext.setLogLevel("ERROR")
    names = args.plans.split(",")
    kept = json.loads(RESULTS.read_text())["plans"] if args.merge and RESULTS.exists() else {}
    results: dict = {"plans": {k: v for k, v in kept.items() if k not in names},
                     "input": {"bad_ratio": 0.005, "mode": "available-now, one Spark session"},
                     "machine": C.machine_info(spark, SERVER_URL), "started_at": C.now_iso()}
    sizes = {name: args.events or DEFAULT_EVENTS[name] for name in names}
    run = {"started_at": results["started_at"], "git_commit": C.git_commit(ROOT), "events_per_plan": sizes,
           "repeats": args.repeats, "warmup_runs_per_side": 1, "failover_events_per_s": args.rate}
    RESULTS.parent.mkdir(exist_ok=True)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        for name in names:
            task = progress.add_task(name, total=(2 + len(engine.CONFIGS)) * args.repeats + 2 + args.failovers)
            results["plans"][name] = {"run": run, **measure(name, sizes[name], args.repeats, spark, progress, task,
                                                                 args.flink)}
            if not args.failovers and name in kept and kept[name].get("failover"):
                results["plans"][name]["failover"] = {**kept[name]["failover"],
                                                      "from_run": kept[name].get("run", {}).get("started_at")}
            elif args.failovers:
                try:
                    results["plans"][name]["failover"] = hot_failovers(name, args.failovers, args.rate, progress,
                                                                       task)
                except (RuntimeError, AssertionError) as exc:  # recorded, and the other plans still run
                    results["plans"][name]["failover"] = {"error": str(exc).splitlines()[0]}
            RESULTS.write_text(json.dumps(results, indent=2, default=str) + "\n")  # what is measured so far
            summary = {k: v for k, v in results["plans"][name].items() if k not in ("failover", "run")}
            console.print(f"{name}: {summary}, failover {(results['plans'][name]['failover'] or {}).get('runs')}")
    results["finished_at"] = C.now_iso()
    RESULTS.write_text(json.dumps(results, indent=2, default=str) + "\n")
    console.print(f"wrote {RESULTS}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
