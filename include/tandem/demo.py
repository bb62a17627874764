"""``make demo``: the three plans launched by Airflow, fed, and their outputs shown.

The trades plan on two shards, fed for a minute and merged on read; then the pizza shop (two
instances) and the temperature plan (three instances in two execution groups), each fed, its
watermark moved past the input, and every output shown.

Expects the environment of ``.tandem/env.sh`` (``make demo`` sources it): Airflow's home, the
Tandem database and the nodes' Airflow connections.
"""

from __future__ import annotations

import os
import subprocess
import time
from datetime import datetime, timedelta, timezone

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from tandem import aggregation
from tandem.airflow_rest import AirflowClient, login_hint
from tandem.aggregation.spec import spec_for
from tandem.cli import render_aggregates
from tandem.config import load_cluster, load_plan
from tandem.errors import TandemError
from tandem.layout import delta_table_dir
from tandem.lake.tables import read_table
from tandem.producer import produce
from tandem.store import Database, migrate
from tandem.store.heartbeats import input_rows_since, quarantine_totals, query_positions

RUN_DAG = "tandem_trades_run"


def run_demo(console: Console, rate: int = 200, duration_s: float = 60.0, seed: int = 42,
             keep_running: bool = False) -> int:
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    placements = list(zip(plan.shards[:2], plan.nodes * 2))  # shard-1 on node-a, shard-2 on node-b
    client = AirflowClient.as_admin(cluster.airflow_url)

    console.rule("[bold]Tandem demo: trades plan on two shards")
    with Database(cluster.database_url, "tandem-demo") as db:
        migrate(db)
    _bring_up_airflow(console, cluster.project_root, client)

    with console.status("waiting for the DAG processor to parse the run DAG"):
        client.wait_for_dag(RUN_DAG)
        client.set_paused(RUN_DAG, False)
    runs = []
    for shard, node in placements:
        run_id = client.trigger(RUN_DAG, {"node": node, "shard_id": shard, "trigger_interval": "1 second"})
        console.print(f"triggered [bold]{RUN_DAG}[/] for {shard} on {node} (run {run_id})")
        runs.append(run_id)
    with console.status("Airflow is launching the Spark jobs (spark-submit, detached)"):
        for run_id in runs:
            client.wait_for_run(RUN_DAG, run_id, timeout_s=300)
    console.print("both plan instances are RUNNING")

    started = datetime.now(timezone.utc)
    written = [0]

    def tick(lines: int) -> None:
        written[0] += lines
        progress.advance(task, lines)

    with Progress(TextColumn("[bold]producing trades"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task("produce", total=int(rate * round(duration_s)))
        for _ in produce(cluster, plan, rate=rate, duration_s=duration_s, seed=seed, bad_ratio=0.005, on_tick=tick):
            pass
    total = written[0]

    _wait_until_read(console, cluster, plan.name, started, lines=total)
    end = datetime.now(timezone.utc) + timedelta(minutes=1)
    hours = (aggregation.bucket_start(started, "hour"), end)
    hourly = aggregation.query(cluster, "trades", "hour", *hours)
    minutes = aggregation.query(cluster, "trades", "minute", aggregation.bucket_start(started, "minute"), end)
    spec = spec_for(plan, "trade_aggregates")
    console.print(render_aggregates(hourly, "merged hourly aggregates (PostgreSQL)", spec))
    console.print(render_aggregates(minutes, "merged per-minute aggregates (PostgreSQL)", spec))
    from_delta = aggregation.query(cluster, "trades", "hour", *hours, source="delta")
    same = [(r["symbol"], r["trade_count"]) for r in from_delta] == [(r["symbol"], r["trade_count"]) for r in hourly]
    console.print(f"Delta gives the same hourly counts: {'yes' if same else '[red]NO[/]'}")

    quarantined = read_table(delta_table_dir(cluster, plan.name, "quarantine")).num_rows
    with Database(cluster.database_url, "tandem-demo") as db:
        counted = sum(quarantine_totals(db, plan.name).values())
    console.print(f"quarantined lines: {quarantined} in the Delta table, {counted} counted in heartbeats")

    if not keep_running:
        _stop_instances(console, cluster, plan, placements)
    for name in ("pizza_shop", "temperatures"):
        _run_event_plan(console, cluster, client, load_plan(name, cluster), rate=max(20, rate // 5),
                        duration_s=min(duration_s, 40.0), seed=seed, keep_running=keep_running)
    console.rule()
    console.print(f"Airflow UI: [bold]{cluster.airflow_url}[/]  {escape(login_hint())}  (stop it with [bold]make down[/])")
    return 0


def _run_event_plan(console: Console, cluster, client: AirflowClient, plan, *, rate: int, duration_s: float,
                    seed: int, keep_running: bool) -> None:
    """Launch every instance of a plan through Airflow, feed it, let the watermark pass, show each output."""
    from tandem.cli import show_output
    from tandem.producer import advance_watermark

    run_dag = f"tandem_{plan.name}_run"
    console.rule(f"[bold]{plan.name}: {plan.description}")
    placements = [(shard, plan.nodes[i % len(plan.nodes)]) for i, shard in enumerate(plan.shards)]
    with console.status(f"waiting for the DAG processor to parse {run_dag}"):
        client.wait_for_dag(run_dag)
        client.set_paused(run_dag, False)
    launched = datetime.now(timezone.utc)
    runs = [client.trigger(run_dag, {"node": node, "shard_id": shard, "trigger_interval": "1 second"})
            for shard, node in placements]
    with console.status(f"Airflow is launching {len(runs)} instances ({', '.join(plan.shards)})"):
        for run_id in runs:
            client.wait_for_run(run_dag, run_id, timeout_s=300)
    groups = ", ".join(f"{name} ×{group.parallel}" for name, group in plan.groups.items())
    console.print(f"groups {groups}: every instance RUNNING")
    # an earlier demo moved this plan's watermark an hour ahead: this run's events come after it, or they are late
    with Database(cluster.database_url, "tandem-demo") as db:
        earlier = [w for w, _ in query_positions(db, plan.name, datetime(1970, 1, 1, tzinfo=timezone.utc)).values()
                   if w is not None]
    offset_s = max(0.0, max(earlier).timestamp() + plan.watermark_s + 1 - time.time()) if earlier else 0.0
    if offset_s:
        console.print(f"an earlier run moved the watermark to {max(earlier):%Y-%m-%d %H:%M:%S}: "
                      f"this run's event times start {offset_s / 60:.0f} minutes ahead of the clock")
    with Progress(TextColumn(f"[bold]producing {plan.name}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task("produce", total=max(1, round(duration_s)))
        for _ in produce(cluster, plan, rate=rate, duration_s=duration_s, seed=seed, bad_ratio=0.01,
                         clock=lambda: time.time() + offset_s, on_tick=lambda lines: progress.advance(task, 1)):
            pass
    ahead_ms = int((time.time() + offset_s) * 1000) + 3_600_000
    sentinel_written = datetime.now(timezone.utc)
    advance_watermark(cluster, plan, ahead_ms)
    console.print("wrote an event an hour ahead into every partition: every result becomes final")
    final_at = datetime.fromtimestamp(ahead_ms / 1000 - plan.watermark_s - 1, timezone.utc)  # 1 s: rounding
    expected = {(f"{plan.name}/{shard}/{node}", query) for shard, node in placements
                for query in plan.groups[plan.group_of(shard)[0]].queries}
    _wait_until_final(console, cluster, plan, expected, launched, sentinel_written, final_at)
    for output, config in plan.outputs.items():
        if config.kind != "quarantine":
            try:
                show_output(cluster, plan, output, limit=8)
            except TandemError as exc:
                console.print(f"[yellow]{plan.name} {output}: {escape(str(exc))}[/]")
    counts = read_table(delta_table_dir(cluster, plan.name, "quarantine")).num_rows if "quarantine" in plan.outputs else 0
    console.print(f"quarantined lines of {plan.name}: {counts} (Delta table delta/{plan.name}/quarantine)")
    if not keep_running:
        _stop_instances(console, cluster, plan, placements)


def _bring_up_airflow(console: Console, root, client: AirflowClient) -> None:
    if client.healthy():
        console.print(f"reusing the Airflow stack at {client.base_url}")
        return
    console.print("starting the Airflow stack (API server, scheduler, triggerer, DAG processor)")
    subprocess.run(["bash", str(root / "scripts" / "airflow_stack.sh"), "up"], check=True, env=os.environ.copy())


def _wait_until_read(console: Console, cluster, plan: str, since: datetime, lines: int) -> None:
    """Wait until the plan's aggregate queries have read and published every produced line."""
    _poll(console, cluster, "waiting for the plan to publish", 180.0,
          lambda db: (min(input_rows_since(db, plan, "aggregates", since), lines), lines))


def _wait_until_final(console: Console, cluster, plan, expected: set[tuple[str, str]], since: datetime,
                      sentinel_written: datetime, final_at: datetime) -> None:
    """Wait until every ``(instance, query)`` has read the events an hour ahead: a query with a watermark
    has run a batch at ``final_at`` (that batch fired every timer before it), one without has run a batch
    since they were written. Then every result of the input is published."""

    def progress(db: Database) -> tuple[int, int]:
        positions = query_positions(db, plan.name, since)
        done = sum(pair in positions and positions[pair][1] > sentinel_written
                   and (positions[pair][0] is None or positions[pair][0] >= final_at) for pair in expected)
        return done, len(expected)

    _poll(console, cluster, "waiting for every query to pass the input", 300.0, progress)


def _poll(console: Console, cluster, label: str, timeout_s: float, progress_of) -> None:
    """Show ``progress_of(db)`` (done, total) every second until done == total or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    with Database(cluster.database_url, "tandem-demo") as db, Progress(
            SpinnerColumn(), TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console) as progress:
        task = progress.add_task(label, total=None)
        while time.monotonic() < deadline:
            done, total = progress_of(db)
            progress.update(task, total=total, completed=done)
            if done >= total:
                return
            time.sleep(1)
    console.print(f"[yellow]{label}: not done within {timeout_s:g}s (a busy machine); showing what is there[/]")


def _stop_instances(console: Console, cluster, plan, placements) -> None:
    from tandem.supervisor.launcher import stop_instance

    for shard, node in placements:
        stop_instance(cluster, plan, shard, node)
        console.print(f"stopped {plan.name}/{shard}/{node}")
