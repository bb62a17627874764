#!/usr/bin/env python
"""NATS benchmark: the ``nats`` source against the file source, alone and under the trades plan through Tandem.

The same trades (the plan's generator at simulated times, through the partition layout, ~0.5 % bad
lines) are written once as landing files and published once to an embedded ``nats-server``
(JetStream, file storage) on their partition subjects, each with a message id. Then, in one Spark
session (``local[2]``), alternately:

- **source alone**: a streaming query over every partition, available-now, whose ``foreachBatch``
  materialises every column (``toArrow()``), from the file source (``text`` over the landing folders)
  and from the ``nats`` source (``tandem_nats``, ``max_events_per_trigger`` as the plan declares);
  events/s = lines ÷ wall seconds, and lines ÷ the seconds of the micro-batches (what a long-running
  query spends per event: without the query's start and stop). Target: ``nats`` ≥ 100,000 events/s.
- **trades through Tandem**: ``run_instance`` of both instances (available-now) on a temp project whose
  stream is ``source: files``, then one whose stream is ``source: nats``; ratio nats ÷ files of the
  medians. Target ≥ 0.8.
- **an events output published to NATS**: ``--relay-events`` overdue orders in ``output_events`` (as
  the sink writes them) published by the relay (``tandem.outputs.relay``: expected sequences,
  positions, a record in PostgreSQL), against the plain acknowledged publishes of the input above;
  ratio relay ÷ plain.
- **hot failover**: bench/failover.py's hot failovers (kill -9 of the ACTIVE of the trades pair under load)
  with the stream over files, then over NATS, in the same run; target: median ≤ 3 s over NATS.

    python bench/nats.py [--events 300000] [--repeats 3] [--failover-runs 5]   # --failover-runs 0 keeps the last
    python bench/nats.py --failover-only      # the failovers alone; the other keys of the results are kept

Results: ``bench/results/nats.json`` (the publish rate too).
"""

from __future__ import annotations

import argparse
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
import plans as P  # noqa: E402
import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

RESULTS = BENCH / "results" / "nats.json"
PREFIX = "bench"
SOURCE_TARGET = 100_000
RATIO_TARGET = 0.8
FAILOVER_TARGET_S = 3.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=300_000, help="trades written (and published)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each side, alternating")
    parser.add_argument("--relay-events", type=int, default=100_000, help="events the relay publishes")
    parser.add_argument("--failover-runs", type=int, default=5, help="hot failovers of each side (0: skip)")
    parser.add_argument("--failover-rate", type=int, default=200, help="trades/s during the failovers")
    parser.add_argument("--failover-only", action="store_true",
                        help="only the hot failovers: their key of bench/results/nats.json is replaced, the rest kept")
    return parser.parse_args(argv)


def landing_lines(input_dir: Path) -> dict[int, list[str]]:
    """The input's lines per partition of ``trades``, in file order (the order Spark reads them in)."""
    out: dict[int, list[str]] = {}
    for directory in sorted((input_dir / "trades").iterdir(), key=lambda p: int(p.name)):
        for path in sorted(p for p in directory.iterdir() if not p.name.startswith(".")):
            out.setdefault(int(directory.name), []).extend(path.read_text().splitlines())
    return out


def publish(url: str, lines: dict[int, list[str]]) -> dict:
    """Every line to its partition's subject with a message id; the publish rate."""
    from tandem.messaging import JetStream, StreamSpec, partition_subject, stream_name

    name = stream_name(PREFIX, "trades")
    started = time.perf_counter()
    with JetStream([url], name="bench-publisher") as js:
        js.ensure_stream(StreamSpec(name, (f"{PREFIX}.trades.*",), max_age_s=86_400.0))
        count = 0
        for partition, partition_lines in lines.items():
            subject = partition_subject(PREFIX, "trades", partition)
            for start in range(0, len(partition_lines), 10_000):
                chunk = partition_lines[start:start + 10_000]
                js.publish([(subject, line.encode(), f"p{partition}-{start + i}") for i, line in enumerate(chunk)])
                count += len(chunk)
        held = js.bounds(name).messages
    seconds = time.perf_counter() - started
    assert held == count, f"JetStream holds {held} of the {count} messages published"
    return {"messages": count, "seconds": round(seconds, 2), "messages_per_s": round(count / seconds, 1)}


def source_alone(spark, kind: str, input_dir: Path, url: str, partitions: int, max_events: int,
                 checkpoint: Path) -> tuple[float, float]:
    """An available-now query over the whole stream whose sink materialises every column: its wall seconds
    (query start and stop included) and the seconds of its micro-batches (the sum of their ``triggerExecution``,
    what a long-running query spends per event)."""
    import json as _json

    from tandem.messaging import partition_subject, stream_name
    from tandem.sources import files_reader, nats_reader as nats

    if kind == "files":
        frame = files_reader.landing_lines(spark, [input_dir / "trades" / str(p) for p in range(partitions)], 100_000)
    else:
        spark.dataSource.register(nats.NatsSource)
        frame = (spark.readStream.format(nats.SOURCE_NAME).option("servers", url)
                 .option("stream", stream_name(PREFIX, "trades"))
                 .option("subjects", _json.dumps([partition_subject(PREFIX, "trades", p) for p in range(partitions)]))
                 .option("max_events_per_trigger", str(max_events)).load())
    seen = [0]

    def materialise(batch, batch_id: int) -> None:
        seen[0] += batch.toArrow().num_rows

    started = time.perf_counter()
    query = (frame.writeStream.foreachBatch(materialise).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    wall = time.perf_counter() - started
    return wall, sum(p["durationMs"]["triggerExecution"] for p in query.recentProgress) / 1000


def relay(url: str, events: int) -> dict:
    """Seconds for the relay to publish ``events`` overdue orders written to ``output_events`` beforehand."""
    from datetime import datetime, timedelta, timezone

    from tandem.config import load_cluster, load_plan
    from tandem.outputs.relay import Relay
    from tandem.store import Database, migrate
    from tandem.store.outputs import insert_events
    from tandem.store.registry import InstanceKey

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with P.private_storage("nats_relay") as (root, database_url):
        os.environ["TANDEM_NATS_URL"] = url
        conf = root / "conf"
        cluster_file = yaml.safe_load((conf / "cluster.yaml").read_text())
        cluster_file["nats"] = {"servers": ["nats://127.0.0.1:4222"], "prefix": "relay"}
        (conf / "cluster.yaml").write_text(yaml.safe_dump(cluster_file))
        plan_file = yaml.safe_load((conf / "plans" / "pizza_shop.yaml").read_text())
        plan_file["streams"]["overdue"] = {"source": "nats", "partitions": 4, "key": "order_no",
                                           "event_time": "expiry_time", "fields": {
                                               "order_no": {"type": "string"}, "customer_name": {"type": "string"},
                                               "expiry_time": {"type": "epoch_millis"}}}
        plan_file["outputs"]["overdue_orders"]["stream"] = "overdue"
        (conf / "plans" / "pizza_shop.yaml").write_text(yaml.safe_dump(plan_file))
        cluster = load_cluster()
        plan = load_plan("pizza_shop", cluster)
        key = InstanceKey("pizza_shop", "shop-1", "node-a")
        with Database(database_url, "bench-relay") as db:
            migrate(db)
            for start in range(0, events, 5_000):
                batch = {f"e-{n:08d}": (t0 + timedelta(milliseconds=n), {
                    "order_no": f"o-{n}", "customer_name": f"c-{n % 97}", "order_time": n, "expiry_time": n + 30_000})
                    for n in range(start, min(start + 5_000, events))}
                db.run(lambda cursor: insert_events(cursor, key, "overdue_orders", batch, 1, start))
            publisher = Relay(plan, "overdue_orders", cluster.nats, db)
            try:
                started = time.perf_counter()
                stored = publisher.publish_pending()
                seconds = time.perf_counter() - started
            finally:
                publisher.close()
        os.environ.pop("TANDEM_NATS_URL", None)
    assert stored == events, f"the relay stored {stored} of {events} events"
    return {"events": events, "seconds": round(seconds, 2), "events_per_s": round(events / seconds, 1)}


def use_nats_stream(conf: Path, url: str, prefix: str = PREFIX) -> None:
    """The temp project's trades stream over NATS (``<prefix>_trades``), the environment's URL for the server."""
    os.environ["TANDEM_NATS_URL"] = url
    cluster = yaml.safe_load((conf / "cluster.yaml").read_text())
    cluster["nats"] = {"servers": ["nats://127.0.0.1:4222"], "prefix": prefix}
    (conf / "cluster.yaml").write_text(yaml.safe_dump(cluster))
    plan = yaml.safe_load((conf / "plans" / "trades.yaml").read_text())
    plan["streams"]["trades"].pop("max_files_per_trigger", None)
    plan["streams"]["trades"]["source"] = "nats"
    (conf / "plans" / "trades.yaml").write_text(yaml.safe_dump(plan))


def hot_failovers(runs: int, rate: int, url: str, console: Console) -> dict:
    """bench/failover.py's hot failovers (kill -9 of the ACTIVE of the trades pair under load) with the stream over
    NATS, and with files as the baseline, in the same run; medians against the 3 s target."""
    import failover as F

    def over_nats(conf: Path) -> None:
        use_nats_stream(conf, url, prefix=f"failover{time.time_ns()}")

    sides = {}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        for side, configure in (("files", None), ("nats", over_nats)):
            try:
                sides[side] = F.hot_failovers(runs, rate, progress, label=side, configure=configure)
            finally:
                os.environ.pop("TANDEM_NATS_URL", None)
    medians = {side: statistics.median(r["first_publish_s"] for r in done["runs"]) for side, done in sides.items()}
    return {
        "runs": runs, "input_events_per_s": rate,
        "definition": "kill -9 of the ACTIVE -> the new ACTIVE's first publish visible to a reader (bench/failover.py)",
        **{side: {"first_publish_s": [r["first_publish_s"] for r in done["runs"]],
                  "median_s": round(medians[side], 3), "detection_s": [r["detection_s"] for r in done["runs"]],
                  "events_written": done["events_written"], "outputs_exact": done["outputs_exact"],
                  "output_problems": done["output_problems"]} for side, done in sides.items()},
        "nats_over_files": round(medians["nats"] / medians["files"], 3),
        "target_median_s": FAILOVER_TARGET_S, "met": medians["nats"] <= FAILOVER_TARGET_S,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if args.failover_only:
        work = Path(tempfile.mkdtemp(prefix="tandem-bench-nats-"))
        from tandem.messaging.server import start_server

        server = start_server(work / "jetstream")
        try:
            failovers = hot_failovers(args.failover_runs, args.failover_rate, server.url, console)
        finally:
            server.stop()
            shutil.rmtree(work, ignore_errors=True)
        result = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {"benchmark": "nats"}
        result["hot_failover"] = {**failovers, "when": C.now_iso(), "commit": C.git_commit(ROOT)}
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
        console.print_json(json.dumps(result["hot_failover"]))
        return 0
    from tandem.config import load_cluster, load_plan
    from tandem.messaging.server import start_server
    from tandem.spark_session import build_session
    from tandem.store import Database, migrate

    work = Path(tempfile.mkdtemp(prefix="tandem-bench-nats-"))
    server = start_server(work / "jetstream")
    spark = build_session("tandem-bench-nats", "local[2]", ROOT / "conf" / "spark-defaults.conf")
    seconds: dict[str, list[float]] = {"files alone": [], "nats alone": [], "files alone, batches": [],
                                       "nats alone, batches": [], "tandem files": [], "tandem nats": []}
    try:
        plan = load_plan("trades", load_cluster(ROOT / "conf" / "cluster.yaml"))
        stream = plan.streams["trades"]
        input_dir = work / "input"
        trades = P.write_input(plan, args.events, 7, input_dir)
        lines = landing_lines(input_dir)
        total = sum(len(v) for v in lines.values())
        published = publish(server.url, lines)
        console.print(f"{total:,} lines ({trades:,} trades) in files and on {server.url}: "
                      f"{published['messages_per_s']:,.0f} acknowledged publishes/s")
        relayed = relay(server.url, args.relay_events)
        console.print(f"the relay published {relayed['events']:,} events of an output: "
                      f"{relayed['events_per_s']:,.0f} events/s")
        runs = [(side, False) for side in ("files", "nats")] + [
            (side, True) for repeat in range(args.repeats)
            for side in (("files", "nats") if repeat % 2 == 0 else ("nats", "files"))]
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            task = progress.add_task("source alone", total=len(runs))
            for index, (side, timed) in enumerate(runs):
                took, in_batches = source_alone(spark, side, input_dir, server.url, stream.partitions,
                                                stream.max_events_per_trigger, work / f"checkpoint-{side}-{index}")
                if timed:
                    seconds[f"{side} alone"].append(round(took, 2))
                    seconds[f"{side} alone, batches"].append(round(in_batches, 2))
                progress.advance(task)
            task = progress.add_task("trades through Tandem", total=len(runs))
            for side, timed in runs:
                with P.private_storage(f"nats_{side}") as (root, url):
                    if side == "nats":
                        use_nats_stream(root / "conf", server.url)
                        with Database(url) as db:  # the stream exists and holds the input already
                            migrate(db)
                    cluster = load_cluster()
                    run_plan = load_plan("trades", cluster)
                    if side == "files":
                        P.land(input_dir, cluster.storage_root)
                        with Database(url) as db:
                            migrate(db)
                    started = time.perf_counter()
                    P.run_tandem(cluster, run_plan, spark)
                    if timed:
                        seconds[f"tandem {side}"].append(round(time.perf_counter() - started, 2))
                    os.environ.pop("TANDEM_NATS_URL", None)
                progress.advance(task)
    finally:
        spark.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)

    def rate(key: str, count: int) -> float:
        return round(count / statistics.median(seconds[key]), 1)

    nats_alone, files_alone = rate("nats alone", total), rate("files alone", total)
    nats_batches, files_batches = rate("nats alone, batches", total), rate("files alone, batches", total)
    tandem_nats, tandem_files = rate("tandem nats", trades), rate("tandem files", trades)
    result = {
        "benchmark": "nats", "when": C.now_iso(), "commit": C.git_commit(ROOT), "machine": C.machine_info(),
        "events": trades, "lines": total, "repeats": args.repeats, "seconds": seconds, "publish": published,
        "source_alone": {"nats_events_per_s": nats_alone, "files_events_per_s": files_alone,
                         "nats_over_files": round(nats_alone / files_alone, 3),
                         "in_batches": {"nats_events_per_s": nats_batches, "files_events_per_s": files_batches,
                                        "definition": "events / the sum of the micro-batches' triggerExecution: "
                                                      "without the query's start and stop (~0.8 s each run)"},
                         "target_events_per_s": SOURCE_TARGET, "met": nats_alone >= SOURCE_TARGET,
                         "met_in_batches": nats_batches >= SOURCE_TARGET},
        "trades_through_tandem": {"nats_events_per_s": tandem_nats, "files_events_per_s": tandem_files,
                                  "ratio": round(tandem_nats / tandem_files, 3), "target_ratio": RATIO_TARGET,
                                  "met": tandem_nats / tandem_files >= RATIO_TARGET},
        "output_relay": {**relayed, "plain_publishes_per_s": published["messages_per_s"],
                         "ratio": round(relayed["events_per_s"] / published["messages_per_s"], 3)},
        "hot_failover": (json.loads(RESULTS.read_text()).get("hot_failover") if RESULTS.is_file() else None),
    }
    if args.failover_runs:
        server = start_server(work / "jetstream-failover")
        try:
            result["hot_failover"] = hot_failovers(args.failover_runs, args.failover_rate, server.url, console)
        finally:
            server.stop()
            shutil.rmtree(work, ignore_errors=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    console.print_json(json.dumps({k: result[k] for k in ("source_alone", "trades_through_tandem", "publish",
                                                                  "output_relay")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
