"""``make demo``: the trades plan on two shards, launched by Airflow, fed for a minute, merged on read.

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
from tandem.cli import render_aggregates
from tandem.config import load_cluster, load_plan
from tandem.layout import delta_table_dir, landing_dir
from tandem.lake.tables import read_table
from tandem.producer import produce
from tandem.store import Database, migrate
from tandem.store.heartbeats import input_rows_since, quarantine_totals

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
        client.unpause(RUN_DAG)
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
    total = int(rate * round(duration_s))
    with Progress(TextColumn("[bold]producing trades"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task("produce", total=total)
        for _ in produce(lambda shard: landing_dir(cluster, plan.source.stream, shard), plan.shards[:2], rate=rate,
                         duration_s=duration_s, seed=seed, bad_ratio=0.005, on_tick=lambda n: progress.advance(task, n)):
            pass

    _wait_until_read(console, cluster, plan.name, started, lines=total)
    end = datetime.now(timezone.utc) + timedelta(minutes=1)
    hours = (aggregation.bucket_start(started, "hour"), end)
    hourly = aggregation.query(cluster, "trades", "hour", *hours)
    minutes = aggregation.query(cluster, "trades", "minute", aggregation.bucket_start(started, "minute"), end)
    console.print(render_aggregates(hourly, "merged hourly aggregates (PostgreSQL)"))
    console.print(render_aggregates(minutes, "merged per-minute aggregates (PostgreSQL)"))
    from_delta = aggregation.query(cluster, "trades", "hour", *hours, source="delta")
    same = [(r["symbol"], r["trade_count"]) for r in from_delta] == [(r["symbol"], r["trade_count"]) for r in hourly]
    console.print(f"Delta gives the same hourly counts: {'yes' if same else '[red]NO[/]'}")

    quarantined = read_table(delta_table_dir(cluster, plan.name, "quarantine")).num_rows
    with Database(cluster.database_url, "tandem-demo") as db:
        counted = sum(quarantine_totals(db, plan.name).values())
    console.print(f"quarantined lines: {quarantined} in the Delta table, {counted} counted in heartbeats")

    if not keep_running:
        _stop_instances(console, cluster, plan, placements)
    console.rule()
    console.print(f"Airflow UI: [bold]{cluster.airflow_url}[/]  {escape(login_hint())}  (stop it with [bold]make down[/])")
    return 0


def _bring_up_airflow(console: Console, root, client: AirflowClient) -> None:
    if client.healthy():
        console.print(f"reusing the Airflow stack at {client.base_url}")
        return
    console.print("starting the Airflow stack (API server, scheduler, triggerer, DAG processor)")
    subprocess.run(["bash", str(root / "scripts" / "airflow_stack.sh"), "up"], check=True, env=os.environ.copy())


def _wait_until_read(console: Console, cluster, plan: str, since: datetime, lines: int,
                     timeout_s: float = 180.0) -> None:
    """Wait until the plan's aggregate queries have read and published every produced line."""
    deadline = time.monotonic() + timeout_s
    with Database(cluster.database_url, "tandem-demo") as db, Progress(
            SpinnerColumn(), TextColumn("[bold]waiting for the plan to publish"), BarColumn(), MofNCompleteColumn(),
            console=console) as progress:
        task = progress.add_task("catch up", total=lines)
        while time.monotonic() < deadline:
            read = input_rows_since(db, plan, "aggregates", since)
            progress.update(task, completed=min(read, lines))
            if read >= lines:
                return
            time.sleep(1)
    console.print("[yellow]the plan has not caught up yet; showing what is there[/]")


def _stop_instances(console: Console, cluster, plan, placements) -> None:
    from tandem.supervisor.launcher import stop_instance

    for shard, node in placements:
        stop_instance(cluster, plan, shard, node)
        console.print(f"stopped {plan.name}/{shard}/{node}")
