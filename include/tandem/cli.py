"""``tandem``: the command line of the bundle.

    tandem migrate                      apply the coordination schema migrations
    tandem config check | schema [FILE] [PATH]   validate conf/ and the plans' modules | the files' JSON Schema
    tandem plan new NAME                a new plan: conf/plans/NAME.yaml and NAME.py, that run as written
    tandem plan reset NAME [--yes]      remove a stopped plan's checkpoints, outputs, snapshots and rows: start afresh
    tandem produce trades --rate 200 --duration 60   to the streams' landing folders or NATS subjects
    tandem receive [--host H] [--port 8700] [--ssl-certfile F]   HTTP(S) receiver into nats streams (tokens: README)
    tandem query trades --granularity hour [--symbol IBM] [--since 1h] [--source delta]
    tandem status [plan]
    tandem run --plan trades --node node-a --instance shard-1 [--available-now]
    tandem launch trades shard-1 node-a [--role PASSIVE] [--json]   start it detached with spark-submit, on this host
    tandem stop trades shard-1 node-a   stop it wherever it runs (a stop request its driver obeys)
    tandem snapshot trades [--instance shard-1] [--node node-a]  take a snapshot of the ACTIVE instance now
    tandem snapshots trades [--instance shard-1] [--state ID [--key symbol=IBM]] [--prune]
    tandem maintain trades              what the maintenance DAG does, now: landing, Delta and PostgreSQL retention
    tandem backfill trades --start T --end T [--instance shard-1]   recompute a closed range, late events included
    tandem restore trades [--snapshot ID | --latest-good] [--instance shard-1] [--node node-a] [--force]
    tandem airflow-env                  export lines for the nodes' Airflow connections
    tandem airflow-login [--ensure]     where the local Airflow's admin password is (--ensure: generate one)
    tandem demo [--no-failover] [--stop]   the end-to-end demonstration (make demo), with a kill -9 failover;
                                        --stop: stop what it left running (make demo-stop)
"""

from __future__ import annotations

import argparse
import dataclasses
import contextlib
import json
import os
import shlex
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, NoReturn, TextIO

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from tandem.config import load_cluster, load_plan
from tandem.declarations import instant_argument, parse_duration
from tandem.errors import ConfigError, TandemError
from tandem.json_values import json_text
from tandem.names import ACTIVE, ROLES

PIPE_WIDTH = 120
"""The width of the tables printed into a pipe or a log when ``COLUMNS`` does not say (wide enough for the aggregate
tables; Rich's own default is 80)."""


class CommandStdout:
    """The stdout of a command's own output (its tables, lines and ``--json`` answer): ``sys.stdout`` as :func:`main`
    found it. While a command runs, ``sys.stdout`` is stderr, so that what anything else writes or logs there lands
    on stderr: Airflow, once a command imports it (to assemble a ``spark-submit`` command), logs through a handler
    on ``sys.stdout``, and a ``--json`` answer must be alone on stdout for a script's ``json.load``."""

    def __init__(self) -> None:
        self.stream: TextIO | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream or sys.stdout, name)


def output_width(is_terminal: bool, environ: Mapping[str, str]) -> int | None:
    """The width the command's tables are laid out for (pure): ``None`` (Rich's: ``COLUMNS`` when it is set, else the
    terminal's) on a terminal or when ``COLUMNS`` is set, :data:`PIPE_WIDTH` in a pipe or a log otherwise."""
    return None if is_terminal or environ.get("COLUMNS", "").strip().isdigit() else PIPE_WIDTH


STDOUT = CommandStdout()


def command_console() -> Console:
    """The console of a command's own output, sized (:func:`output_width`) from the stdout and environment the
    command runs with, not those of the first import (Rich reads ``COLUMNS`` once, when a console is made)."""
    stream = STDOUT.stream or sys.stdout  # a real terminal: Rich's is_terminal is also true under FORCE_COLOR
    is_tty = callable(getattr(stream, "isatty", None)) and stream.isatty()
    return Console(file=STDOUT, width=output_width(is_tty, os.environ))


console = command_console()
errors = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def jvm_output_to_stderr() -> Iterator[None]:
    """File descriptor 1 pointed at stderr meanwhile: a JVM started in this process (Spark's, in ``tandem run``)
    inherits it and writes its warnings there for as long as it lives, not before the command's own output."""
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def emit(text: str) -> None:
    """Print the command's own output as it is (JSON, exports): on the command's stdout (:class:`CommandStdout`)."""
    print(text, file=STDOUT, flush=True)


def _parse_time(text: str) -> datetime:
    """An ISO time (UTC when no zone is given) or ``now`` (an argparse type: a bad value is a usage error)."""
    return datetime.now(timezone.utc) if text == "now" else instant_argument(text)


def _duration(text: str) -> float:
    """A duration such as ``'60 seconds'`` (an argparse type: a bad value is a usage error)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ratio(text: str) -> float:
    """A share between 0 and 1 (an argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text!r}")
    return value


def print_error(exc: BaseException) -> None:
    """``error: <message>`` on stderr, shown literally (never read as Rich markup); one line first.

    A message with more lines (e.g. the tail of a job's log) keeps them, indented, below.
    """
    first, *rest = (str(exc).strip() or type(exc).__name__).splitlines()
    errors.print(f"error: {first}")
    for line in rest:
        errors.print(f"  {line}")


def cmd_migrate(args: argparse.Namespace) -> int:
    from tandem.store import Database, migrate

    cluster = load_cluster()
    with Database(cluster.database_url, "tandem-cli") as db:
        applied = migrate(db)
    console.print(f"migrations applied: {applied or 'none pending'}")
    return 0


def cmd_produce(args: argparse.Namespace) -> int:
    from tandem.producer import produce

    cluster = load_cluster()
    plan = load_plan(args.plan, cluster)
    ticks = max(1, round(args.duration))
    written = [0, 0]  # lines, files

    def tick(batch: dict[str, list[tuple[dict, str]]]) -> None:
        written[0] += sum(len(lines) for lines in batch.values())
        progress.update(task, advance=1, lines=written[0])

    with Progress(TextColumn("[bold]producing {task.fields[plan]}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("seconds, {task.fields[lines]} lines"), TimeRemainingColumn(), console=console) as progress:
        task = progress.add_task("produce", total=ticks, plan=plan.name, lines=0)
        for _ in produce(cluster, plan, rate=args.rate, duration_s=args.duration, seed=args.seed,
                         bad_ratio=args.bad_ratio, on_tick=tick):
            written[1] += 1
    streams = ", ".join(f"{name} ({stream.source}, {stream.partitions} partitions)"
                        for name, stream in plan.streams.items())
    console.print(f"wrote {written[0]} lines in {written[1]} writes (files, or acknowledged NATS batches) to {streams}")
    return 0


def cmd_receive(args: argparse.Namespace) -> int:
    """Serve the receiver (HTTP(S) → the plans' nats streams) until interrupted; the tokens are TANDEM_RECEIVER_TOKEN
    and the file TANDEM_RECEIVER_TOKENS names."""
    from tandem.receiver import HEADER_TIMEOUT_S, MAX_BODY_BYTES, MAX_CONNECTIONS, serve, tokens_from_environment

    tokens_from_environment()  # refused before anything is loaded
    if args.max_body_bytes is not None and args.max_body_bytes <= 0:
        raise TandemError(f"--max-body-bytes must be a positive number of bytes, got {args.max_body_bytes}")
    if args.header_timeout is not None and not 0 < args.header_timeout < float("inf"):
        raise TandemError(f"--header-timeout must be a positive number of seconds, got {args.header_timeout:g}")
    if args.max_connections is not None and args.max_connections <= 0:
        raise TandemError(f"--max-connections must be a positive number, got {args.max_connections}")
    if args.ssl_keyfile and not args.ssl_certfile:
        raise TandemError("--ssl-keyfile goes with --ssl-certfile (the certificate it is the key of)")
    serve(load_cluster(), args.host, args.port, max_body_bytes=args.max_body_bytes or MAX_BODY_BYTES,
          header_timeout_s=args.header_timeout or HEADER_TIMEOUT_S,
          max_connections=args.max_connections or MAX_CONNECTIONS,
          ssl_certfile=args.ssl_certfile, ssl_keyfile=args.ssl_keyfile)
    return 0


def cmd_exporter(args: argparse.Namespace) -> int:
    """Serve the plane's metrics for Prometheus until interrupted (:mod:`tandem.monitoring.exporter`)."""
    from tandem.monitoring.exporter import TOKEN_VARIABLE, serve, token_from

    token = token_from(args.token_file)
    load_cluster()  # a configuration error is refused before anything listens
    server = serve(args.host, args.port, token, read_timeout_s=args.read_timeout, max_connections=args.max_connections,
                   fresh_s=args.fresh_for)
    console.print(f"tandem exporter: http://{args.host}:{server.server_port}/metrics "
                  f"({'a bearer token is required' if token else f'no token: set {TOKEN_VARIABLE} or --token-file'})",
                  highlight=False)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    """One output of a plan, merged over its instances, as its kind reads it (:mod:`tandem.reading`)."""
    from tandem.outputs import kind_of  # pandas and pyarrow: only the commands that read load them
    from tandem.outputs.base import ReadRequest
    from tandem.reading import only_output, read_output
    from tandem.show import render_line, render_rows

    cluster = load_cluster()
    plan = load_plan(args.plan, cluster)
    output = only_output(plan, args.output)
    keys: dict[str, list[Any]] = {}
    for name, value in [_key_text(item) for item in args.key or []] + [("symbol", s) for s in args.symbol or []]:
        keys.setdefault(name, []).append(value)
    if args.symbol:
        errors.print("--symbol is deprecated: use --key symbol=VALUE")
    start, end = args.start, args.end
    if start is None and args.since is not None:
        end = end or datetime.now(timezone.utc) + timedelta(seconds=1)
        start = end - timedelta(seconds=args.since)
    if args.follow:
        request = ReadRequest(start=start, keys=keys, source=args.source)
        kind_of(plan, output).follow(cluster, plan, output, request,
                                     lambda row: emit(json_text(row)) if args.json
                                     else console.print(render_line(row), highlight=False))
        return 0
    rows = read_output(cluster, plan, args.granularity, start, end, output=output, keys=keys, source=args.source,
                       limit=args.limit)
    if args.json:
        emit(json_text(rows, indent=2))
    else:
        where = f"{start.isoformat() if start else 'all'} .. {end.isoformat() if end else 'now'}"
        console.print(render_rows(rows, f"{plan.name} {output} ({plan.outputs[output].kind}, {args.source}, "
                                        f"merged over instances; {where})"))
    return 0


STATUS_EVENTS = 10
"""How many of a plan's newest failover events ``tandem status`` shows."""
HEALTH_STYLES = {"HEALTHY": "green", "STARTING": "cyan", "DEAD": "bold red", "FAILED": "bold red",
                 "BLOCKED": "bold magenta", "STALLED": "yellow", "STOPPED": "dim", "MISSING": "dim"}


def cmd_status(args: argparse.Namespace) -> int:
    """Per plan and group instance: each node's role, epoch, status, health, beat age and lag; the lease; recent
    events. The same view as the Tandem page in the Airflow UI (:mod:`tandem.presenter.views`); ``--json``: the
    same as one JSON document (:func:`status_document`).

    Without a plan, a plan file that does not load is one ``error:`` line with its error after the others'
    status, and the exit code is 2 (as ``tandem config check`` for a broken file): a script sees it.
    """
    import psycopg2.errors

    from tandem.config import load_plans_and_errors
    from tandem.presenter.views import plan_status, timeline
    from tandem.store import Database

    cluster = load_cluster()
    plans, broken = ({args.plan: load_plan(args.plan, cluster)}, {}) if args.plan else load_plans_and_errors(cluster)
    shown = []
    try:
        with Database(cluster.database_url, "tandem-cli") as db:
            for plan in plans.values():
                status = plan_status(db, cluster, plan)
                events = timeline(db, plan, limit=STATUS_EVENTS).events
                if args.json:
                    shown.append((status, events))
                else:
                    _print_plan_status(cluster, plan, db, status, events)
    except psycopg2.errors.UndefinedTable:
        raise TandemError("the coordination schema is missing: run `tandem migrate`") from None
    finally:
        if not args.json:
            for name, error in broken.items():
                print_error(TandemError(f"plan {name} is broken, not shown: {error}"))
    if args.json:
        emit(json.dumps(status_document(shown, {name: str(error) for name, error in broken.items()}), indent=2))
    return 2 if broken else 0


def status_document(shown: list[tuple[Any, list[Any]]], broken: Mapping[str, str]) -> dict[str, Any]:
    """``tandem status --json`` (pure): per plan its status (:class:`tandem.presenter.models.PlanStatus`: instances,
    leases, each node's role, status, health and lag) and its newest failover ``events`` (timestamps in full, the
    take-over time in seconds), and the plan files that do not load (``broken``: file name -> error)."""
    return {"plans": [{**status.model_dump(mode="json"), "events": [e.model_dump(mode="json") for e in events]}
                      for status, events in shown],
            "broken": dict(broken)}


def _print_plan_status(cluster, plan, db, status, events) -> None:
    """``tandem status`` of one plan, as tables and lines."""
    from tandem.store.output_streams import stream_progress
    from tandem.supervisor.launch_decision import ACTIVE_STATUSES

    age = short_age
    for group, refused in status.refused_changes.items():
        console.print(f"{plan.name} / group {group}: its checkpoints refuse {'; '.join(refused)}: stop "
                      f"the plan and run `tandem plan cutover {plan.name} --group {group}`",
                      style="bold red", markup=False, highlight=False)
    for instance in status.instances:
        lease_text = lease_line(instance.lease, status.observed_at)
        table = Table(title=escape(f"{plan.name} / {instance.instance} ({instance.standby} standby) - "
                                   f"{lease_text}"),
                      box=box.SIMPLE_HEAD, title_justify="left")
        for column in ("node", "role", "epoch", "status", "health", "last beat", "last batch",
                       "lag", "input waiting", "pid", "version"):
            table.add_column(column, no_wrap=True)
        notes = []
        for node in instance.nodes:
            table.add_row(node.node + (" (drained)" if node.drained else ""), node.role or "-",
                          str(node.epoch if node.epoch is not None else "-"), node.status or "-",
                          f"[{HEALTH_STYLES.get(node.health, '')}]{node.health}[/]", age(node.beat_age_s),
                          "-" if node.last_batch_id is None
                          else f"#{node.last_batch_id} {age(node.last_batch_age_s)} ago",
                          lag_text(node.lag_s, node.ahead_of_clock_s), age(node.waiting_input_s),
                          str(node.pid or "-"), node.version or "-")
            if node.health != "HEALTHY":
                notes.append(f"  {node.node} {node.health}: {node.evidence}")
            if node.ahead_of_clock_s is not None:
                notes.append(f"  {node.node}: its event-time watermark is {node.ahead_of_clock_s:.1f}s ahead of "
                             "the clock (event times from a clock that runs fast?): lag shown as 0")
            if node.relay_error:
                notes.append(f"  {node.node} relay to NATS failing: {node.relay_error}")
            if node.status in ACTIVE_STATUSES and node.version not in (None, status.version):
                notes.append(f"  {node.node} runs version {node.version}; the files now define "
                             f"{status.version}: `tandem plan diff {plan.name}` says what changed")
        if instance.upgrade is not None:
            notes.append(upgrade_line(instance.upgrade))
        console.print(table)
        notes += next_action_lines(plan.name, instance)
        for note in notes:  # an error's text is shown as it is, never read as Rich markup
            console.print(note, highlight=False, markup=False)
    for output, config in plan.outputs.items():
        if config.stream is not None:
            held, sequence = db.run(lambda c, o=output: stream_progress(c, plan.name, o))
            at = "-" if sequence is None else f"{sequence:,}"
            console.print(f"{plan.name} / {output} -> NATS stream {config.stream}: {held:,} events in "
                          f"PostgreSQL, the stream at sequence {at} (as last recorded)", highlight=False)
    for line in batch_lines(cluster, plan, db):
        console.print(line, highlight=False, markup=False)
    if events:
        table = Table(title=f"{plan.name}: last failover events", box=box.SIMPLE_HEAD, title_justify="left")
        for column in ("time (UTC)", "instance", "kind", "node", "from", "epoch"):
            table.add_column(column, no_wrap=True)
        table.add_column("reason", overflow="fold", ratio=1, min_width=30)
        for event in events:
            table.add_row(event_time(event.happened_at), event.instance, event.kind, event.node or "",
                          event.previous_node or "", str(event.epoch or ""), escape(event_reason(event)))
        console.print(table)


def event_time(at: datetime) -> str:
    """A failover event's time in UTC to the millisecond (pure): ``2026-12-07 13:58:52.757``; a take-over lasts
    seconds, so the second alone hid its pace."""
    return at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def event_reason(event) -> str:
    """A failover event's reason as ``tandem status`` shows it (pure; ``event`` a
    :class:`tandem.presenter.models.TimelineEvent`): a take-over says how long it took, to the hundredth of a
    second: ``node-b (PASSIVE standby) took the lease: lease expired or handed over; took over in 2.41 s after
    node-a's last renewal``."""
    if event.took_over_s is None:
        return event.reason
    return (f"{event.reason}; took over in {event.took_over_s:.2f} s after {event.previous_node or 'the holder'}'s "
            "last renewal")


def lag_text(lag_s: float | None, ahead_of_clock_s: float | None) -> str:
    """The lag column (pure): the watermark's age, or ``ahead of clock`` when it is ahead (never a negative lag)."""
    return "ahead of clock" if ahead_of_clock_s is not None else short_age(lag_s)


def next_action_lines(plan: str, instance) -> list[str]:
    """What the supervisor would do next for an instance (pure; ``instance`` a
    :class:`tandem.presenter.models.InstanceStatus`): ``due: ...`` a line each; an instance no node ever ran is
    ``not launched`` (nothing is overdue about it), with the command that starts it; one stopped cleanly is
    ``stopped`` (no alarm either), with what the supervisor would do if its DAG were unpaused."""
    launched = any(node.status is not None for node in instance.nodes)
    if launched and instance.stopped and instance.due:
        return [f"  stopped cleanly: no node runs it (the supervise DAG would: {'; '.join(instance.due)})"]
    if launched:
        return [f"  due: {action}" for action in instance.due]
    first = instance.nodes[0].node if instance.nodes else "NODE"
    would = f" (the supervise DAG would: {'; '.join(instance.due)})" if instance.due else ""
    return [f"  not launched: `tandem launch {plan} {instance.instance} {first}` starts it{would}"]


def upgrade_line(upgrade) -> str:
    """An instance's upgrade as ``tandem status`` shows it (pure; ``upgrade`` a
    :class:`tandem.presenter.models.UpgradeState`): its state, its versions, what was compared, and its detail."""
    compared = ", ".join(f"{c.output} {c.checked} compared, {c.differing} differ" for c in upgrade.checks)
    return (f"  upgrade {upgrade.from_version or '?'} -> {upgrade.to_version}: {upgrade.state}"
            f"{' (' + compared + ')' if compared else ''}: {upgrade.detail}")


def short_age(seconds: float | None) -> str:
    """``12.5s``, ``40m``, ``3h``, ``2d`` (``-`` for none)."""
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    return f"{seconds / 60:.0f}m" if seconds < 7200 else f"{seconds / 3600:.0f}h" if seconds < 172800 \
        else f"{seconds / 86400:.0f}d"


def lease_line(lease, now: datetime) -> str:
    """A group instance's lease as ``tandem status`` titles it (pure; ``lease`` a
    :class:`tandem.presenter.models.LeaseState` or ``None``): who holds it and until when, or since when and why
    nobody does: ``lease: node-a at epoch 3, stopped 12.0s ago (instance stopped)``."""
    if lease is None or lease.state == "free":
        return "lease: never taken"
    holder = f"{lease.holder} at epoch {lease.epoch}"
    if lease.state == "held":
        return f"lease: {holder}, expires in {lease.expires_in_s:.1f}s"
    since = "" if lease.vacant_since is None \
        else f" {short_age(max(0.0, (now - lease.vacant_since).total_seconds()))} ago"
    why = (lease.vacancy or "").removeprefix(f"{lease.state}: ")
    return f"lease: {holder}, {lease.state}{since}" + (f" ({why})" if why else "")


def batch_lines(cluster, plan, db) -> list[str]:
    """The plan's newest backfill and reconcile run, a line each (none: no line)."""
    from tandem.batch.reconciliations import DIFFERENCES, reconciliation_rows, summary
    from tandem.store.backfills import list_backfills

    lines = []
    for record in list_backfills(db, plan.name, limit=1):
        lines.append(f"{plan.name}: last backfill {record.id} {record.status} "
                     f"({record.range_start:%Y-%m-%d %H:%M:%S} .. {record.range_end:%Y-%m-%d %H:%M:%S}): "
                     + record.outcome())
    rows = reconciliation_rows(cluster, plan)
    if rows:
        counts = summary(rows)
        lines.append(f"{plan.name}: last reconcile {rows[0]['run_id']} of {rows[0]['range_start']:%Y-%m-%d %H:%M} .. "
                     f"{rows[0]['range_end']:%Y-%m-%d %H:%M}: " + ", ".join(f"{counts[k]} {k}" for k in DIFFERENCES))
    return lines


def cmd_run(args: argparse.Namespace) -> int:
    import threading

    from tandem.errors import StoreError
    from tandem.runtime.node import install_stop_signals, run_instance
    from tandem.runtime.run_summary import summarize_run
    from tandem.store.registry import InstanceKey

    cluster = load_cluster()
    plan = load_plan(args.plan, cluster)
    stop = threading.Event()
    install_stop_signals(stop)
    key = InstanceKey(plan.name, args.instance or plan.instances[0], args.node)
    with jvm_output_to_stderr():
        result = run_instance(cluster, plan, key.node, key.instance, available_now=args.available_now,
                              trigger_interval_s=args.trigger_interval, stop=stop)
    try:
        lines = summarize_run(cluster.database_url, key, result.status, result.error).lines()
    except StoreError as exc:  # the run's own outcome is shown whatever the figures' fate
        lines = [f"{key.id}: no summary of the run: {exc}", f"{result.status} {result.error or ''}".rstrip()]
    for line in lines:
        console.print(line, markup=False, highlight=False)
    return 0 if result.status == "STOPPED" else 1


def cmd_launch(args: argparse.Namespace) -> int:
    from tandem.supervisor.node_actions import resync_then_launch

    cluster = load_cluster()
    launched = resync_then_launch(cluster, load_plan(args.plan, cluster), args.instance, args.node, role=args.role,
                                  resync_from=args.resync_from, replace=args.replace,
                                  trigger_interval=args.trigger_interval)
    job = launched.job
    if args.json:
        emit(json.dumps({"instance_id": job.instance_id, "reused": job.reused, "reason": job.reason,
                          "status": job.status, "submit_pid": job.submit_pid, "log_path": job.log_path,
                          "cut": launched.cut}))
    else:
        console.print(f"{job.instance_id}: {'reused' if job.reused else 'launched'} ({job.reason}); "
                      f"spark-submit pid {job.submit_pid}, log {job.log_path}", markup=False, highlight=False)
        if args.resync_from:
            console.print(resync_line(args.resync_from, launched.cut), markup=False, highlight=False)
    return 0


def resync_line(source: str, cut: Mapping[str, Mapping[str, Any]] | None) -> str:
    """What a launch's re-sync did (pure): the batch each query's checkpoint was cut at, or that it failed."""
    if cut is None:
        return (f"re-sync from {source} failed: the node starts from its own checkpoint (the RESYNC_FAILED event "
                "says why: tandem status)")
    queries = ", ".join(f"{query} at batch {c['batch_id']}" if c.get("batch_id") is not None
                        else f"{query}: nothing committed" for query, c in cut.items()) or "no checkpoint yet"
    return f"re-synced from {source}: {queries}"


def cmd_stop(args: argparse.Namespace) -> int:
    from tandem.supervisor import stop_instance

    result = stop_instance(load_cluster(), args.plan, args.instance, args.node, timeout_s=args.timeout)
    if args.json:
        emit(json.dumps(dataclasses.asdict(result)))
        return 0
    console.print(f"{result.instance_id}: {result.status or 'not recorded'} ({result.detail})",
                  markup=False, highlight=False)
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    """Take a snapshot of each instance's ACTIVE node now (or ``--node``'s), validate it, show the result."""
    from tandem.snapshots.take import snapshot_session, take_snapshot

    cluster = load_cluster()
    plan = load_plan(args.plan, cluster)
    instances = [plan.check_instance(args.instance)] if args.instance else list(plan.instances)
    if args.node:
        plan.check_node(args.node)  # before a Spark session starts
    bad = 0
    with Progress(TextColumn("[bold]snapshot {task.fields[what]}"), BarColumn(), MofNCompleteColumn(),
                  console=console) as progress:
        task = progress.add_task("snapshot", total=len(instances), what=plan.name)
        spark = snapshot_session(cluster, plan)  # at nice 10: the running queries keep the CPU first
        for instance in instances:
            progress.update(task, what=f"{plan.name}/{instance}")
            taken = take_snapshot(cluster, plan, instance, spark, node=args.node)
            progress.advance(task)
            style = "green" if taken.good else "bold red"
            console.print(f"[{style}]{taken.record.status}[/] {taken.summary()}", highlight=False)
            bad += not taken.good
    return 1 if bad else 0


def cmd_maintain(args: argparse.Namespace) -> int:
    """The maintenance DAG's tasks, now: landing retention, Delta upkeep, PostgreSQL retention."""
    from tandem.batch.trim import trim_plan_rows
    from tandem.batch.upkeep import maintain_plan_tables
    from tandem.snapshots.landing import clean_plan_landing
    from tandem.store import Database, migrate
    from tandem.store.job_runs import recorded_run

    cluster = load_cluster()
    plan = load_plan(args.plan, cluster)
    with Database(cluster.database_url, "tandem-maintenance") as db:
        migrate(db)  # a database no plan has run on yet has nothing to trim, but its tables are read
        with recorded_run(db, plan.name, "landing_retention"):
            decisions = clean_plan_landing(cluster, plan, db=db)
        for partition, decision in decisions.items():
            for line in decision.describe():
                console.print(f"landing {partition}: {line}", highlight=False)
        with console.status(f"compacting and vacuuming the Delta tables of {plan.name}"), \
                recorded_run(db, plan.name, "delta_upkeep"):
            upkeeps = maintain_plan_tables(cluster, plan, db)
        for upkeep in upkeeps:
            console.print(upkeep.describe(), highlight=False)
        with console.status(f"deleting old PostgreSQL rows of {plan.name}"), \
                recorded_run(db, plan.name, "postgres_retention"):
            retention = trim_plan_rows(plan, db)
        for line in retention.describe():
            console.print(line, highlight=False)
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    """Recompute a closed range of a plan's outputs from its retained input and replace it; or list backfills."""
    from tandem.batch.backfill import check_backfill, run_backfill
    from tandem.spark_session import build_session
    from tandem.store import Database, migrate
    from tandem.store.backfills import list_backfills

    cluster = load_cluster()
    plan = load_plan(args.plan, cluster)
    with Database(cluster.database_url, "tandem-backfill") as db:
        migrate(db)
        if args.list:
            table = Table("id", "status", "range", "instances", "started", "outcome", box=box.SIMPLE_HEAD)
            for record in list_backfills(db, plan.name):
                table.add_row(record.id, record.status, f"{record.range_start:%Y-%m-%d %H:%M:%S} .. "
                              f"{record.range_end:%H:%M:%S}", ", ".join(record.instances),
                              f"{record.started_at:%Y-%m-%d %H:%M:%S}", escape(record.outcome()))
            console.print(table)
            return 0
        if args.start is None or args.end is None:
            raise TandemError("tandem backfill: give --start and --end (or --list)")
        instances = [plan.check_instance(s) for s in args.instance] if args.instance else list(plan.instances)
        node = cluster.node(plan.check_node(args.node or plan.nodes[0]))
        check_backfill(cluster, plan, db, args.start, args.end, instances)  # refused before Spark starts
        with Progress(TextColumn("[bold]backfill {task.fields[what]}"), BarColumn(), MofNCompleteColumn(),
                      console=console) as progress:
            task = progress.add_task("backfill", total=len(instances) * (1 + len(plan.outputs)), what=plan.name)

            def step(line: str) -> None:
                progress.update(task, what=f"{plan.name}: {line}")
                progress.advance(task)

            spark = build_session(f"tandem-backfill:{plan.name}", node.spark_master, cluster.spark_defaults)
            try:
                done = run_backfill(cluster, plan, db, spark, args.start, args.end, instances=instances,
                                    requested_by="tandem backfill", step=step)
            finally:
                spark.stop()
            progress.update(task, completed=progress.tasks[0].total)
    console.print(f"backfill {done.id}: {done.status}, {done.outcome()}", highlight=False)
    for instance, outputs in done.report.items():
        for output, outcome in outputs.items():
            console.print(f"  {instance} {output}: {json.dumps(outcome, default=str)}", markup=False, highlight=False)
    return 0


def cmd_snapshots(args: argparse.Namespace) -> int:
    """List a plan's snapshots; or show one snapshot's exported state; or prune now."""
    from tandem.layout import delta_table_dir
    from tandem.snapshots.state_export import STATE_TABLE, read_state
    from tandem.snapshots.take import prune_snapshots
    from tandem.store import Database
    from tandem.store import snapshots as catalog

    cluster = load_cluster()
    plan = load_plan(args.plan, cluster)
    if args.instance:
        plan.check_instance(args.instance)
    if args.prune:
        from tandem.snapshots.landing import clean_plan_landing

        for line in prune_snapshots(cluster, plan, instance=args.instance).describe():
            console.print(line, highlight=False)
        for partition, decision in clean_plan_landing(cluster, plan, instance=args.instance).items():
            for line in decision.describe():
                console.print(f"landing {partition}: {line}", highlight=False)
        return 0
    if args.state:
        key = dict(_key_filter(item) for item in args.key or [])
        rows = read_state(delta_table_dir(cluster, plan.name, STATE_TABLE), args.state, key_contains=key,
                          query=args.query)
        if args.json:
            emit(json.dumps(rows, default=str, indent=2))
            return 0
        table = Table(title=f"state of snapshot {args.state}: {len(rows)} rows", box=box.SIMPLE_HEAD,
                      title_justify="left")
        for column in ("query", "operator", "partition", "batch", "key", "value"):
            table.add_column(column, overflow="fold")
        for row in rows[: args.limit]:
            table.add_row(row["query"], f"{row['operator_id']} {row['store_name']}", str(row["partition_id"]),
                          str(row["batch_id"]), json.dumps(row["key"]), json.dumps(row["value"]))
        console.print(table)
        if len(rows) > args.limit:
            console.print(f"({len(rows) - args.limit} more rows: --limit, or --json for all)")
        return 0
    with Database(cluster.database_url, "tandem-cli") as db:
        records = catalog.list_snapshots(db, plan.name, instance=args.instance, limit=args.limit)
    if args.json:
        emit(json.dumps([r.__dict__ for r in records], default=str, indent=2))
        return 0
    table = Table(title=f"snapshots of {plan.name} (newest first)", box=box.SIMPLE_HEAD, title_justify="left")
    for column in ("id", "instance", "batch", "taken (UTC)", "status", "state rows", "checkpoint", "outputs",
                   "reason"):
        table.add_column(column, overflow="fold")
    styles = {"GOOD": "green", "BAD": "bold red", "TAKING": "cyan", "PRUNED": "dim"}
    for r in records:
        table.add_row(r.id, r.instance_id, str(r.batch_id if r.batch_id is not None else "-"),
                      r.taken_at.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
                      f"[{styles.get(r.status, '')}]{r.status}[/]", str(r.state_rows or "-"),
                      _size(r.checkpoint_bytes), ", ".join(f"{t} v{v}" for t, v in sorted(r.output_versions.items())),
                      r.reason or "")
    console.print(table)
    return 0


def _key_text(text: str) -> tuple[str, str]:
    """``--key field=value`` as ``(field, value)``; the value stays text, as the REST API's (``5`` finds the number
    5 and the string "5")."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise TandemError(f"--key {text!r}: expected field=value, e.g. symbol=IBM")
    return name, value


def _key_filter(text: str) -> tuple[str, object]:
    """``--key field=value`` of a snapshot's state: the value as JSON when it is (a number, a boolean), else text."""
    name, value = _key_text(text)
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def cmd_restore(args: argparse.Namespace) -> int:
    """Restore instances of a plan from a snapshot (by id, or each instance's newest good one) and start them."""
    from tandem.snapshots.restore import restore_instance, instances_to_restore

    cluster = load_cluster()
    plan = load_plan(args.plan, cluster)
    if args.node:
        plan.check_node(args.node)
    instances = instances_to_restore(cluster, plan, args.snapshot, args.instance)
    with Progress(TextColumn("[bold]restore {task.fields[what]}"), BarColumn(), MofNCompleteColumn(),
                  console=console) as progress:
        task = progress.add_task("restore", total=len(instances), what=plan.name)
        for instance in instances:
            progress.update(task, what=f"{plan.name}/{instance}")
            report = restore_instance(cluster, plan, instance, snapshot_id=args.snapshot, force=args.force,
                                      undo_backfills=args.undo_backfills, node=args.node, start=not args.no_start)
            progress.advance(task)
            for line in report.lines():
                console.print(line, highlight=False)
    return 0


def airflow_connection_exports() -> list[str]:
    """``export AIRFLOW_CONN_<ID>='{json}'`` for every node's Spark connection (sourced by ``.tandem/env.sh``).

    The variable name comes from a connection id ``load_cluster`` validated (``CONN_ID_PATTERN``)
    and the value is shell-quoted: sourcing the lines runs nothing but the exports.
    """
    cluster = load_cluster()
    lines = []
    for node in cluster.nodes.values():
        value = json.dumps({"conn_type": "spark", "host": node.spark_master,
                            "description": f"Tandem node {node.name}"})
        lines.append(f"export AIRFLOW_CONN_{node.airflow_conn_id.upper()}={shlex.quote(value)}")
    return lines


SCHEMA_USAGE = ("tandem config schema [cluster.yaml | plans/<name>.yaml] [OUTPUT.json]: one file's JSON Schema (a plan "
                "file's, named by any plan file), or both's; printed, or written to OUTPUT.json")


def schema_file(name: str, names: tuple[str, ...], plans_folder: Path | None = None) -> str | None:
    """The configuration file whose schema ``tandem config schema NAME`` asks for (pure): one of ``names`` as
    written; ``cluster.yaml`` for any path of that name; the plan files' for a YAML file in a folder named
    ``plans`` (``plans/x.yaml``, ``conf/plans/trades.yaml``) or in ``plans_folder`` (``TANDEM_PLANS_DIR``). ``None``
    for any other name."""
    if name in names:
        return name
    path = Path(name)
    cluster, plan = names
    if path.name == cluster:
        return cluster
    in_plans = path.parent.name == "plans" or (plans_folder is not None and path.parent.resolve() == plans_folder)
    return plan if path.suffix.lower() in (".yaml", ".yml") and in_plans else None


def schema_arguments(file: str | None, path: str | None, names: tuple[str, ...],
                     plans_folder: Path | None = None) -> tuple[str | None, Path | None]:
    """``tandem config schema [FILE] [PATH]``: which file's schema (``None``: every file's) and where to write it
    (``None``: stdout). ``names``: ``cluster.yaml`` and the plan files' name, in this order. A first argument that
    names a YAML file (``plans/x.yaml``) asks for its kind's schema (:func:`schema_file`); one that names no YAML file
    is the path (pure)."""
    if file is not None:
        which = schema_file(file, names, plans_folder)
        if which is None and (path is not None or Path(file).suffix.lower() in (".yaml", ".yml")):
            raise TandemError(f"tandem config schema: {file!r} is not a configuration file ({', '.join(names)}, "
                              f"or a plan file in a plans/ folder); usage: {SCHEMA_USAGE}")
        file, path = (which, path) if which is not None else (None, file)
    if path is not None and Path(path).suffix.lower() in (".yaml", ".yml"):
        raise TandemError(f"tandem config schema: {path} would be a JSON file named like a YAML one (the schema is "
                          f"JSON: name it .json); usage: {SCHEMA_USAGE}")
    return file, None if path is None else Path(path)


def cmd_config(args: argparse.Namespace) -> int:
    """``schema``: the JSON Schema of the configuration files; ``check``: validate every file and each plan's
    module (its queries against the YAML's groups and outputs, without starting Spark), and say what they hold."""
    from tandem.config import configured_plans_dir, json_schemas, load_plans_and_errors
    from tandem.errors import PlanChanged, PlanError
    from tandem.plan_shape import refused_launches
    from tandem.runtime.plan_api import check_plan_module, load_plan_module

    if args.action == "schema":
        schemas = json_schemas()
        which, path = schema_arguments(args.file, args.path, tuple(schemas), configured_plans_dir())
        text = json.dumps(schemas[which] if which else schemas, indent=2)
        if path is None:
            emit(text)
            return 0
        path.write_text(text + "\n", encoding="utf-8")
        emit(f"wrote the JSON Schema of {which or ', '.join(schemas)} to {path}")
        return 0
    if args.file or args.path:
        raise TandemError("tandem config check takes no file: it checks conf/cluster.yaml and every plan file "
                          "(conf/plans/*.yaml, or $TANDEM_PLANS_DIR/*.yaml)")
    try:
        cluster = load_cluster()
    except ConfigError as exc:
        for problem in exc.problems:
            print_error(problem)
        return 2
    emit(f"{cluster.path}: ok: {len(cluster.nodes)} node(s) ({', '.join(cluster.nodes)}), storage root "
          f"{cluster.storage_root}")
    refused = 0
    plan_files = sorted(cluster.plans_dir.glob("*.yaml"))
    plans, broken = load_plans_and_errors(cluster)  # every plan at once: two plans' NATS streams must not collide
    for path in plan_files:
        if path.stem in broken:
            for problem in broken[path.stem].problems:  # every problem of the file, a line each
                print_error(problem)
            refused += 1
            continue
        plan = plans[path.stem]
        try:
            queries = check_plan_module(plan, load_plan_module(plan))
        except PlanError as exc:
            for problem in str(exc).splitlines():
                print_error(PlanError(problem))
            refused += 1
            continue
        launches_refused = refused_launches(cluster, plan)
        if launches_refused:  # the file is valid, but its instances' checkpoints were built from another shape
            for line in launches_refused:
                print_error(PlanChanged(line))
            refused += 1
            continue
        streams = ", ".join(f"{name} ({stream.partitions} partitions)" for name, stream in plan.streams.items())
        outputs = ", ".join(f"{name} ({output.kind})" for name, output in plan.outputs.items())
        emit(f"{plan.path}: ok: plan {plan.name}, instances {', '.join(plan.instances)}, streams {streams}, "
              f"outputs {outputs}, queries {', '.join(queries)}, nodes {', '.join(plan.nodes)}, {plan.ha.standby} standby, "
              f"suites {plan.validation.suite or 'implied (declarations)'} and "
              f"{plan.snapshot.suite or 'implied (declarations)'}")
    emit(f"{len(plan_files) - refused} of {len(plan_files)} plan file(s) valid")
    return 2 if refused else 0


def cmd_plan_new(args: argparse.Namespace) -> int:
    """Write a new plan's YAML and module (one stream, one query, one output) that runs as written."""
    from tandem.scaffold import new_plan

    yaml_path, module_path = new_plan(load_cluster(), args.name)
    console.print(f"wrote {yaml_path}\nwrote {module_path}\nnext: tandem config check; "
                  f"tandem produce {args.name} --duration 10s; tandem run --plan {args.name} --node <node> "
                  "--available-now; tandem query " + args.name, markup=False, highlight=False)
    return 0


def confirmed_by_name(plan: str, action: str, what: str) -> bool:
    """Whether the operator, told ``what`` ``tandem plan <action>`` does, typed the plan's name to confirm it (a
    :class:`TandemError` without a terminal: ``--yes`` confirms without asking)."""
    console.print(what, markup=False, highlight=False)
    if not sys.stdin.isatty():
        raise TandemError(f"tandem plan {action} {plan}: no terminal to confirm on: pass --yes to {action} without "
                          "asking")
    try:
        typed = input(f"Type the plan's name ({plan}) to confirm: ").strip()
    except EOFError:
        typed = ""
    if typed != plan:
        errors.print(f"not {action}: {typed!r} is not {plan!r}")
    return typed == plan


def cmd_plan_reset(args: argparse.Namespace) -> int:
    """Remove everything a plan keeps, so that its next run starts from nothing (:mod:`tandem.plan_reset`): after
    showing what that is and a confirmation (the plan's name typed, or ``--yes``); refused while it runs."""
    from tandem.plan_reset import inventory, plan_running, refusal, reset_plan
    from tandem.store import Database, migrate

    cluster = load_cluster()
    plan = load_plan(args.name, cluster)
    with Database(cluster.database_url, "tandem-cli") as db:
        migrate(db)
        reasons = plan_running(db, plan)
        if reasons:  # before asking: the reset checks again under the plan's locks
            raise refusal(plan, reasons)
        planned = inventory(cluster, plan, db)
    if not args.yes and not confirmed_by_name(plan.name, "reset", "\n".join(["A reset removes:",
                                                                            *planned.lines()[1:]])):
        return 1
    report = reset_plan(cluster, plan)
    console.print("\n".join(["removed:", *report.lines()[1:]] if report.removed else report.lines()), markup=False,
                  highlight=False)
    console.print(f"plan {plan.name} is reset: its next run starts from nothing (its input is kept: the next run "
                  "reads it again)", markup=False, highlight=False)
    return 0


def cmd_plan_diff(args: argparse.Namespace) -> int:
    """How the plan's files now differ from what each of its checkpoints was built from, each change classified
    (:mod:`tandem.plan_shape`): exit 0 when every launch takes them, 2 when a launch refuses one."""
    from tandem.plan_shape import pending_changes
    from tandem.plan_version import plan_version

    cluster = load_cluster()
    plan = load_plan(args.name, cluster)
    version = plan_version(plan)
    diffs = pending_changes(cluster, plan)
    if args.json:
        emit(json.dumps({"plan": plan.name, "version": version, "checkpoints": [
            {"instance": d.instance, "node": d.node, "version": d.version,
             "changes": [{"class": c.kind, "change": c.text, "refused": c.refused} for c in d.changes]}
            for d in diffs]}, indent=2))
    else:
        console.print(f"plan {plan.name}: version {version} in {plan.path}", markup=False, highlight=False)
        if not diffs:
            console.print("no checkpoint has recorded what it was built from yet: the next launch records it",
                          markup=False, highlight=False)
        for diff in diffs:
            built = f"{diff.instance} on {diff.node} (built with {diff.version or 'an unrecorded version'})"
            if not diff.changes:
                console.print(f"{built}: no change", markup=False, highlight=False)
            for change in diff.changes:
                verdict = "refused at launch" if change.refused else "taken at the next launch"
                console.print(f"{built}: {change.kind}: {change.text} ({verdict})", markup=False, highlight=False)
    return 2 if any(c.refused for d in diffs for c in d.changes) else 0


def cmd_plan_cutover(args: argparse.Namespace) -> int:
    """Carry out a change the plan's checkpoints refuse (a group's parallel, an aggregation's keys or measures) by a
    cut-over of the stopped group (:mod:`tandem.cutover`), after a confirmation (the plan's name, or ``--yes``)."""
    from tandem.cutover import CutoverRefused, cut_over, pending_cutovers
    from tandem.declarations import instance_ids
    from tandem.runtime.plan_api import partial_outputs_by_query
    from tandem.store import Database, migrate

    cluster = load_cluster()
    plan = load_plan(args.name, cluster)
    pending = pending_cutovers(cluster, plan)
    for group, found in pending.items():
        console.print(f"group {group}: {'; '.join(found)}", markup=False, highlight=False)
    if not args.yes and not confirmed_by_name(plan.name, "cutover", (
            "A cut-over retires the group's checkpoints; its instances start afresh past the cut, and its partials "
            "stay merged under retired labels.")):
        return 1
    with Database(cluster.database_url, "tandem-cli") as db:
        migrate(db)
        try:
            cut = cut_over(cluster, plan, db, args.group, partial_outputs=partial_outputs_by_query(plan),
                           force=args.force)
        except CutoverRefused as exc:
            print_error(exc)
            return 2
    read = sum(len(files) for files in cut.consumed.values())
    console.print(f"plan {plan.name}, group {cut.group}: cut over (generation {cut.generation}): instances "
                  f"{', '.join(cut.retired)} retired (their partials kept as {cut.label(cut.retired[0])} ...), "
                  f"{read} file read(s) before the cut; the next launch starts "
                  f"{', '.join(instance_ids(cut.group, plan.groups[cut.group].parallel))} afresh",
                  markup=False, highlight=False)
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    """Upgrade a running plan to its files' version without stopping it (:mod:`tandem.supervisor.upgrade`): per
    instance a shadow standby of the new version, verified against the ACTIVE's output, then handed the ACTIVE
    role; ``--finish`` ends the rollback window. Exit 2 when an instance is refused or its upgrade failed."""

    def confirm(checks) -> bool:
        for check in checks:
            console.print(check.line(), markup=False, highlight=False)
            for sample in check.samples:
                console.print(f"  {sample}", markup=False, highlight=False)
        return args.yes or (sys.stdin.isatty() and confirmed_by_name(
            args.plan, "upgrade", "The new version's outputs differ from the old one's (above)."))

    status = console.status("upgrade")
    with status:
        return _upgrade_steps(args, "tandem upgrade", lambda upgrader: upgrader.finish if args.finish
                              else upgrader.upgrade, verify_s=args.verify_seconds, min_rows=args.min_rows,
                              timeout_s=args.timeout, confirm=confirm if args.expect_changes else None,
                              progress=lambda line: status.update(escape(line)))


def cmd_rollback(args: argparse.Namespace) -> int:
    """Hand the ACTIVE role back to the version an upgrade replaced, while it still runs as a standby."""
    return _upgrade_steps(args, "tandem rollback", lambda upgrader: upgrader.rollback)


def _upgrade_steps(args: argparse.Namespace, launched_by: str, step_of, **options: Any) -> int:
    """One step of :class:`tandem.supervisor.upgrade.Upgrader` (``step_of`` picks it) on ``--instance`` or every
    instance of the plan, a line each; exit 2 when one was refused or failed."""
    from tandem.supervisor.reconcile import Supervisor
    from tandem.supervisor.upgrade import Upgrader, each_instance

    cluster = load_cluster()
    plan = load_plan(args.plan, cluster)
    instances = [plan.check_instance(args.instance)] if args.instance else list(plan.instances)
    failed = 0
    with Supervisor(cluster, plan, launched_by=launched_by) as supervisor:
        for _, result, refused in each_instance(step_of(Upgrader(supervisor, **options)), instances):
            if refused is not None:
                print_error(refused)
            else:
                console.print(result.summary(plan.name), markup=False, highlight=False)
            failed += refused is not None or not result.ok
    return 2 if failed else 0


def cmd_airflow_login(args: argparse.Namespace) -> int:
    """Where the local Airflow's login is; ``--ensure`` first gives ``admin`` a random password if it has none."""
    from tandem.airflow_rest import ensure_admin_password, login_hint, passwords_file

    path = passwords_file()
    if args.ensure and ensure_admin_password(path):
        emit(f"generated a random password for the Airflow user admin in {path} (mode 0600)")
    emit(f"Airflow {login_hint(path)}")
    return 0


def cmd_airflow_env(args: argparse.Namespace) -> int:
    emit("\n".join(airflow_connection_exports()))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from tandem.demo import run_demo, stop_demo

    if args.stop:
        return stop_demo(console)
    return run_demo(console, rate=args.rate, duration_s=args.duration, seed=args.seed, failover=not args.no_failover,
                    only=args.only, keep_running=not args.stop_at_end)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (``error: tandem query: argument --since: …``), exit 2."""

    def error(self, message: str) -> NoReturn:
        errors.print(f"error: {self.prog}: {message} (see {self.prog} --help)")
        sys.exit(2)



class _FormerInstanceOption(argparse.Action):
    """``--shard``, the former name of ``--instance``: accepted until the next release, with a warning."""

    def __init__(self, option_strings, dest, appends: bool = False, **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.appends = appends

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"{parser.prog}: {option_string} is deprecated: use --instance", file=sys.stderr)
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), values] if self.appends else values)


def add_instance_option(parser: argparse.ArgumentParser, help: str, *, repeatable: bool = False) -> None:
    """``--instance`` (one of the plan's instances, e.g. shop-1), and ``--shard``, its deprecated former name."""
    parser.add_argument("--instance", action="append" if repeatable else "store", help=help)
    parser.add_argument("--shard", dest="instance", action=_FormerInstanceOption, appends=repeatable,
                        help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tandem", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("migrate", help="apply coordination schema migrations").set_defaults(func=cmd_migrate)

    produce = commands.add_parser("produce", help="write events to a plan's streams (landing files or NATS subjects)")
    produce.add_argument("plan")
    produce.add_argument("--rate", type=int, default=100, help="events per second (trades, orders or temperatures)")
    produce.add_argument("--duration", type=_duration, default=10.0, help="how long, e.g. '60 seconds'")
    produce.add_argument("--seed", type=int, default=42)
    produce.add_argument("--bad-ratio", type=_ratio, default=0.0, help="share of deliberately bad lines")
    produce.set_defaults(func=cmd_produce)

    receive = commands.add_parser("receive", help="serve the receiver: events over HTTP into the plans' nats streams")
    receive.add_argument("--host", default="127.0.0.1")
    receive.add_argument("--port", type=int, default=8700)
    receive.add_argument("--max-body-bytes", type=int,
                         help="a request's body at most; a larger one gets 413 (default 16 MiB)")
    receive.add_argument("--header-timeout", type=float, metavar="SECONDS",
                         help="seconds a connection has to send a request's head (line and headers) after it opens or "
                              "its last answer; then it is closed, with 408 when part of one came (default 10)")
    receive.add_argument("--max-connections", type=int,
                         help="connections served at once; a request on one more gets 503 (default 100)")
    receive.add_argument("--ssl-certfile", help="serve HTTPS with this PEM certificate (chain)")
    receive.add_argument("--ssl-keyfile", help="its PEM private key (unless the certificate file holds it)")
    receive.set_defaults(func=cmd_receive)

    exporter = commands.add_parser("exporter", help="serve the plane's metrics for Prometheus (/metrics)")
    exporter.add_argument("--host", default="127.0.0.1")
    exporter.add_argument("--port", type=int, default=9464)
    exporter.add_argument("--token-file", help="a file holding the bearer token a scrape must send (default: "
                                               "TANDEM_EXPORTER_TOKEN; neither: no token, and loopback only)")
    exporter.add_argument("--read-timeout", type=float, default=5.0, metavar="SECONDS",
                          help="drop a connection that has not sent its request within this long (default 5)")
    exporter.add_argument("--max-connections", type=int, default=32,
                          help="connections open at once; a newer one takes the place of the oldest that has not "
                               "sent its request (default 32)")
    exporter.add_argument("--fresh-for", type=float, default=0.5, metavar="SECONDS",
                          help="answer a scrape from the last reading when it began at most this long before "
                               "(default 0.5; a scrape during a reading always shares it)")
    exporter.set_defaults(func=cmd_exporter)

    query = commands.add_parser("query", help="read any output of a plan (the quarantine too), merged over its "
                                              "instances, from PostgreSQL or Delta")
    query.add_argument("plan")
    query.add_argument("output", nargs="?", help="the output to read (default: the plan's only one besides its "
                                                 "quarantine)")
    query.add_argument("--granularity", choices=("second", "minute", "hour", "day", "month", "year"),
                       help="aggregations: the bucket size (default: the finest the output keeps)")
    query.add_argument("--key", action="append", metavar="FIELD=VALUE",
                       help="only rows whose FIELD is VALUE (repeatable; several values of one field: any of them)")
    query.add_argument("--symbol", action="append", help=argparse.SUPPRESS)  # deprecated: --key symbol=VALUE
    query.add_argument("--since", type=_duration, help="a range of this length before --end (default: all the data)")
    query.add_argument("--start", type=_parse_time, help="ISO start time (UTC if no zone; default: all the data)")
    query.add_argument("--end", type=_parse_time, help="ISO end time (default: all the data)")
    query.add_argument("--limit", type=int, help="at most this many rows")
    query.add_argument("--follow", action="store_true", help="events: keep printing new events as they come")
    query.add_argument("--source", default="postgres", choices=("postgres", "delta"))
    query.add_argument("--json", action="store_true")
    query.set_defaults(func=cmd_query)

    status = commands.add_parser("status", help="plan instances, roles and heartbeats")
    status.add_argument("plan", nargs="?")
    status.add_argument("--json", action="store_true",
                        help="as one JSON document: per plan its instances, nodes (role, status, health, lag) and "
                             "newest failover events (full timestamps, took_over_s)")
    status.set_defaults(func=cmd_status)

    run = commands.add_parser("run", help="run a plan instance in this process (no spark-submit); at its end, what "
                                          "it read, published and quarantined")
    run.add_argument("--plan", required=True)
    run.add_argument("--node", required=True)
    add_instance_option(run, "an instance of the plan, e.g. shop-1 (default: its first)")
    run.add_argument("--trigger-interval", type=_duration)
    run.add_argument("--available-now", action="store_true")
    run.set_defaults(func=cmd_run)

    launch = commands.add_parser("launch", help="start a plan instance detached with spark-submit on this host")
    launch.add_argument("plan")
    launch.add_argument("instance", metavar="instance", help="an instance of the plan, e.g. shop-1")
    launch.add_argument("node")
    launch.add_argument("--role", choices=ROLES, default=ACTIVE)
    launch.add_argument("--trigger-interval", help="e.g. '1 second' (default: the plan's)")
    launch.add_argument("--resync-from", metavar="NODE",
                        help="first copy a cut of NODE's checkpoint over this node's (its instance must be stopped: "
                             "see --replace)")
    launch.add_argument("--replace", action="store_true",
                        help="a relaunch: stop the node's instance on this host first (signals, as `tandem stop`)")
    launch.add_argument("--json", action="store_true", help="print the launched job as one JSON line")
    launch.set_defaults(func=cmd_launch)

    stop = commands.add_parser("stop", help="stop a plan instance wherever it runs")
    stop.add_argument("plan")
    stop.add_argument("instance", metavar="instance", help="an instance of the plan, e.g. shop-1")
    stop.add_argument("node")
    stop.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for it to end")
    stop.add_argument("--json", action="store_true", help="print the outcome as one JSON line")
    stop.set_defaults(func=cmd_stop)

    snapshot = commands.add_parser("snapshot", help="take a snapshot of each instance's ACTIVE node now")
    snapshot.add_argument("plan")
    add_instance_option(snapshot, "one instance (default: every instance of the plan)")
    snapshot.add_argument("--node", help="snapshot this node's instance instead of the ACTIVE one")
    snapshot.set_defaults(func=cmd_snapshot)

    snapshots = commands.add_parser("snapshots", help="list a plan's snapshots, show one's state, or prune")
    snapshots.add_argument("plan")
    add_instance_option(snapshots, "one instance of the plan")
    snapshots.add_argument("--state", metavar="SNAPSHOT_ID", help="show the state this snapshot exported")
    snapshots.add_argument("--key", action="append", metavar="FIELD=VALUE",
                           help="with --state: keys whose field has this value, e.g. symbol=IBM (repeatable)")
    snapshots.add_argument("--query", help="with --state: one query's state (e.g. aggregates)")
    snapshots.add_argument("--prune", action="store_true", help="apply retention now (snapshot.keep), then delete landing files nothing needs")
    snapshots.add_argument("--limit", type=int, default=50)
    snapshots.add_argument("--json", action="store_true")
    snapshots.set_defaults(func=cmd_snapshots)

    backfill = commands.add_parser("backfill", help="recompute a closed event-time range of a plan's outputs from its "
                                                     "retained input (late events included) and replace it")
    backfill.add_argument("plan")
    backfill.add_argument("--start", type=_parse_time, help="first instant of the range (ISO; UTC when no zone)")
    backfill.add_argument("--end", type=_parse_time, help="end of the range (excluded); at or before the slowest "
                                                          "instance's watermark")
    add_instance_option(backfill, "an instance to backfill (repeatable; default: every instance)", repeatable=True)
    backfill.add_argument("--node", help="whose Spark master runs the recomputation (default: the plan's first node)")
    backfill.add_argument("--list", action="store_true", help="list the plan's backfills instead")
    backfill.set_defaults(func=cmd_backfill)

    maintain = commands.add_parser("maintain", help="run a plan's maintenance now (landing, Delta and PostgreSQL "
                                                     "retention, as its maintenance DAG does)")
    maintain.add_argument("plan")
    maintain.set_defaults(func=cmd_maintain)

    restore = commands.add_parser("restore", help="restore a plan's instances from a snapshot and start them")
    restore.add_argument("plan")
    which = restore.add_mutually_exclusive_group()
    which.add_argument("--snapshot", help="a snapshot id (its instance is restored)")
    which.add_argument("--latest-good", action="store_true", help="each instance's newest GOOD snapshot (default)")
    add_instance_option(restore, "with --latest-good: one instance (default: every instance)")
    restore.add_argument("--node", help="the node to start ACTIVE (default: the node the snapshot was cut from)")
    restore.add_argument("--force", action="store_true", help="restore a snapshot marked BAD")
    restore.add_argument("--undo-backfills", action="store_true",
                         help="restore a snapshot taken before backfills of the instance (they are undone)")
    restore.add_argument("--no-start", action="store_true", help="restore but start nothing")
    restore.set_defaults(func=cmd_restore)

    commands.add_parser("airflow-env", help="shell exports of the nodes' Airflow connections").set_defaults(
        func=cmd_airflow_env)
    plan = commands.add_parser("plan", help="write a new plan (its YAML and its module, beside each other in "
                                            "conf/plans/), reset one's state, or show its pending changes")
    plan_actions = plan.add_subparsers(dest="plan_action", required=True)
    plan_new = plan_actions.add_parser("new", help="a plan with one stream, one query and one output, that runs "
                                                   "as written")
    plan_new.add_argument("name")
    plan_new.set_defaults(func=cmd_plan_new)
    plan_reset = plan_actions.add_parser(
        "reset", help="remove everything a plan keeps (checkpoints, outputs in PostgreSQL and Delta, snapshots, its "
                      "coordination rows) so that its next run starts from nothing; refused while it runs")
    plan_reset.add_argument("name")
    plan_reset.add_argument("--yes", action="store_true", help="reset without asking (default: type the plan's name)")
    plan_reset.set_defaults(func=cmd_plan_reset)
    plan_diff = plan_actions.add_parser(
        "diff", help="how the plan's files differ from what its checkpoints were built from, each change classified "
                     "(code only, state compatible, stream schema, state to rebuild, topology); exit 2 when a launch "
                     "would refuse one")
    plan_diff.add_argument("name")
    plan_diff.add_argument("--json", action="store_true", help="as JSON")
    plan_diff.set_defaults(func=cmd_plan_diff)
    plan_cutover = plan_actions.add_parser(
        "cutover", help="carry out a change the checkpoints refuse (a group's parallel, an aggregation's "
                        "measures) by a cut-over of the stopped group: its instances start afresh past the cut, "
                        "every output kept")
    plan_cutover.add_argument("name")
    plan_cutover.add_argument("--group", help="the group to cut over (default: the one whose checkpoints refuse)")
    plan_cutover.add_argument("--force", action="store_true",
                              help="cut over a group whose checkpoints refuse nothing (its instances restart afresh)")
    plan_cutover.add_argument("--yes", action="store_true", help="cut over without asking")
    plan_cutover.set_defaults(func=cmd_plan_cutover)

    upgrade = commands.add_parser("upgrade", help="take the plan's changed files without stopping: a standby of the "
                                  "new version is verified against the ACTIVE, then takes over (docs: Changing a plan)")
    upgrade.add_argument("plan")
    upgrade.add_argument("--instance", help="one instance (default: every one, in turn)")
    upgrade.add_argument("--verify-seconds", type=float, default=30.0,
                         help="how long the new version's output is compared before it takes over (default 30s; 0: "
                              "no verification)")
    upgrade.add_argument("--min-rows", type=int, default=1, help="rows compared, at least, before it takes over")
    upgrade.add_argument("--timeout", type=_duration, default=300.0,
                         help="how long the verification may wait for rows to compare (default 300s)")
    upgrade.add_argument("--expect-changes", action="store_true",
                         help="a change of semantics: show the differences and ask before the hand-over")
    upgrade.add_argument("--yes", action="store_true", help="with --expect-changes: hand over without asking")
    upgrade.add_argument("--finish", action="store_true",
                         help="end the rollback window: restart the old version's nodes on the new one")
    upgrade.set_defaults(func=cmd_upgrade)
    rollback = commands.add_parser("rollback", help="hand the ACTIVE role back to the version an upgrade replaced")
    rollback.add_argument("plan")
    rollback.add_argument("--instance", help="one instance (default: every one)")
    rollback.set_defaults(func=cmd_rollback)

    config = commands.add_parser("config", help="check the configuration files, or print their JSON Schema")
    config.add_argument("action", choices=("check", "schema"))
    config.add_argument("file", nargs="?", metavar="FILE",
                        help="with schema: cluster.yaml or plans/<name>.yaml (any plan file: plans/trades.yaml), one "
                             "file's schema (default: both, by file)")
    config.add_argument("path", nargs="?", metavar="PATH",
                        help="with schema: write it to this file (default: print it); `tandem config schema PATH` "
                             "writes both")
    config.set_defaults(func=cmd_config)
    login = commands.add_parser("airflow-login", help="where the local Airflow's admin password is")
    login.add_argument("--ensure", action="store_true", help="generate a random password first if there is none")
    login.set_defaults(func=cmd_airflow_login)

    demo = commands.add_parser("demo", help="bring the stack up, run the bundled plans through Airflow, show their outputs")
    demo.add_argument("--rate", type=int, default=200)
    demo.add_argument("--duration", type=_duration, default=40.0,
                      help="how long trades is fed (the kill -9 is halfway); the other plans at most 30 s")
    demo.add_argument("--seed", type=int, default=42)
    demo.add_argument("--no-failover", action="store_true",
                      help="the short path: each trades instance once, no standby and no kill -9")
    demo.add_argument("--only", action="append", metavar="PLAN",
                      help="run only this plan's part (repeatable; trades, pizza_shop, temperatures, hot_rooms; "
                           "default: all, side by side)")
    demo.add_argument("--stop-at-end", action="store_true",
                      help="stop trades too at the end (by default it is left running under supervision, fed slowly)")
    demo.add_argument("--stop", action="store_true",
                      help="stop what an earlier demo left running: its producer, the trades supervision, the trades "
                           "instances (make demo-stop)")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; a Tandem error (bad configuration, refused request) is one line on stderr, exit 2."""
    global console
    import psycopg2.errors

    args = build_parser().parse_args(argv)
    STDOUT.stream = sys.stdout
    console = command_console()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # logs and stray prints: see CommandStdout
            return args.func(args)
    except (TandemError, OSError) as exc:  # OSError: a path the user named (too long, not permitted, ...)
        print_error(exc)
        return 2
    except (psycopg2.errors.UndefinedColumn, psycopg2.errors.UndefinedTable) as exc:
        print_error(TandemError(f"{str(exc).splitlines()[0]}: the database's schema is older than this Tandem; "
                                "run `tandem migrate` (a node's start migrates it too)"))
        return 2
    finally:
        STDOUT.stream = None


if __name__ == "__main__":
    sys.exit(main())
