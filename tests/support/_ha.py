"""Helpers of the HA tests (``test_failover.py``, ``test_supervise.py``, the e2e tests) and ``bench/failover.py``.

- :class:`TradeWriter`: a thread writing trade events with current timestamps at a steady rate into
  a landing directory (one atomically renamed file per tick), remembering every event;
  :class:`PlanWriter` the same for any plan, through its partition layout.
- :func:`expected_aggregates` / :func:`mismatches`: the test's own aggregation of every event written
  (independent of ``tandem.aggregation``), compared with the merged numbers served from
  PostgreSQL and read from Delta, for all six granularities.
- :class:`Pair`: plan instances launched detached with ``spark-submit`` (own process group each),
  signalled with real signals, and read back from the coordination tables.
- :class:`PrivatePostgres`: a PostgreSQL cluster of the test's own (``scripts/provision_postgres.sh``),
  so a test can stop and restart it without touching the shared server.
- :func:`split_brain`: publishes that overlap another epoch's (must be none).
- :class:`HotPair` / :func:`under_load`: one running pair shared by the tests of a class, with the
  load, the events written so far and the final comparison.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import socket
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import psycopg2
import psycopg2.extras
import yaml

from tandem.config import ClusterConfig, PlanConfig, load_plan
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir, instance_landing_dir
from tandem.plans.trades import TradeGenerator
from tandem.sources.files import write_atomically
from tandem.supervisor import launch_instance, wait_until_running
from tandem.supervisor.reconcile import Report, Supervisor
from tandem.reading import read_output

UTC = timezone.utc
REPO = Path(__file__).resolve().parents[2]
PLAN = "trades"
INSTANCE = "shard-1"
GRANULARITIES = ("second", "minute", "hour", "day", "month", "year")
MEASURES = ("price_sum", "trade_count", "quantity_sum", "price_min", "price_max")
ALL_TIME = (datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))
SYMBOLS = ("IBM", "WSO2", "ORCL", "MSFT", "GOOG", "AAPL", "AMZN", "NVDA")


# ------------------------------------------------------------------------------------------------
# Configuration


def configure_one_instance(project: Path, standby: str | None = None) -> None:
    """The temp project's trades plan on shard-1 only (see :func:`one_core_nodes` for the masters);
    ``standby`` sets the HA mode with launch and stall timeouts for a loaded machine."""
    plan_path = project / "conf" / "plans" / "trades.yaml"
    plan = yaml.safe_load(plan_path.read_text())
    plan["groups"]["shard"]["parallel"] = 1  # one instance, shard-1
    if standby:
        plan["ha"] = {"standby": standby, "stall_timeout": "60 seconds", "launch_timeout": "4 minutes"}
    plan_path.write_text(yaml.safe_dump(plan))
    one_core_nodes(project)


def one_core_nodes(project: Path) -> None:
    """``spark_master: local[1]`` for both nodes in the temp project's ``cluster.yaml``.

    The launcher takes a node's master from its Airflow connection first: ``.tandem/env.sh``
    defines ``tandem_node_a``/``tandem_node_b`` with ``local[2]``, so under ``make test`` the nodes
    run on ``local[2]`` and this setting is the fallback (no connection defined)."""
    cluster_path = project / "conf" / "cluster.yaml"
    cluster = yaml.safe_load(cluster_path.read_text())
    for node in cluster["nodes"].values():
        node["spark_master"] = "local[1]"
    cluster_path.write_text(yaml.safe_dump(cluster))


# ------------------------------------------------------------------------------------------------
# Input: a steady writer that remembers every event


class TradeFeed:
    """Trade events with current timestamps into one instance's landing directory, one atomically
    renamed file per :meth:`write`, and the totals the instance's outputs must then show."""

    def __init__(self, directory: Path, seed: int = 5) -> None:
        self.directory = directory
        self.generator = TradeGenerator(seed)
        self.count = self.quantity = 0
        self.events: list[tuple[int, str, float, int]] = []  # (timestamp ms, symbol, price, quantity), as TradeWriter

    def write(self, count: int = 60, extra_lines: Sequence[str] = ()) -> None:
        """``count`` trades in one new file, with ``extra_lines`` (bad ones, say) among them: not counted."""
        now_ms = int(time.time() * 1000)
        events = [self.generator.event(now_ms - 500 + i * 5) for i in range(count)]
        lines = [json.dumps(e) for e in events]
        write_atomically(self.directory, lines[:count // 2] + list(extra_lines) + lines[count // 2:])
        self.count += count
        self.quantity += sum(e["quantity"] for e in events)
        self.events += [(e["timestamp"], e["symbol"], e["price"], e["quantity"]) for e in events]

    @staticmethod
    def published(database_url: str, instance: str = INSTANCE) -> tuple[int, int]:
        """(trades counted, quantity) of the instance's per-second partials in PostgreSQL."""
        [row] = fetch(database_url, "SELECT COALESCE(SUM(trade_count), 0) AS n, COALESCE(SUM(quantity_sum), 0) AS q "
                                    "FROM tandem.trade_aggregates WHERE granularity = 'second' AND instance = %s",
                      (instance,))
        return int(row["n"]), int(row["q"])

    def all_published(self, database_url: str, instance: str = INSTANCE) -> bool:
        """Whether every trade written so far is counted exactly once in the instance's outputs."""
        return self.published(database_url, instance) == (self.count, self.quantity)


class TradeWriter(threading.Thread):
    """Writes about ``rate`` trade events per second, one file every ``period_s``, timestamped now.

    Event times increase from file to file (each file's events are spread over the tick just
    ended), so no event is ever behind the plan's 10 s watermark: every event must be counted.
    """

    def __init__(self, directory: Path | None, rate: int = 200, period_s: float = 0.5, seed: int = 1,
                 sink: StreamPartition | None = None) -> None:
        super().__init__(name="trade-writer", daemon=True)
        self.directory, self.sink = directory, sink  # a landing folder, or a stream partition (files or NATS)
        self.per_tick = max(1, round(rate * period_s))
        self.period_s = period_s
        self.rng = random.Random(seed)
        self.events: list[tuple[int, str, float, int]] = []  # (timestamp ms, symbol, price, quantity)
        self.files = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            tick = time.monotonic()
            while not self.stopping.is_set():
                self.write_tick()
                tick += self.period_s
                self.stopping.wait(max(0.0, tick - time.monotonic()))
        except BaseException as exc:  # noqa: BLE001 - surfaced by stop()
            self.error = exc
        finally:
            if self.sink is not None:
                self.sink.close()

    def write_tick(self) -> None:
        end_ms = int(time.time() * 1000)
        span_ms = int(self.period_s * 1000)
        batch = [(end_ms - span_ms + 1 + i * span_ms // self.per_tick, self.rng.choice(SYMBOLS),
                  round(self.rng.uniform(1, 500), 2), self.rng.randint(1, 1000)) for i in range(self.per_tick)]
        lines = [json.dumps({"symbol": s, "price": p, "quantity": q, "timestamp": t}) for t, s, p, q in batch]
        if self.sink is not None:
            self.sink.write(lines)
        else:
            write_atomically(self.directory, lines)
        with self.lock:
            self.events.extend(batch)
            self.files += 1

    @property
    def written(self) -> int:
        with self.lock:
            return len(self.events)

    def snapshot(self) -> list[tuple[int, str, float, int]]:
        with self.lock:
            return list(self.events)

    def stop(self) -> list[tuple[int, str, float, int]]:
        """Stop writing and return every event written; raise what the thread raised, if anything."""
        self.stopping.set()
        if self.is_alive():
            self.join(timeout=30)
        if self.error is not None:
            raise AssertionError(f"the trade writer failed: {self.error!r}") from self.error
        return self.snapshot()


class PlanWriter(threading.Thread):
    """Events of any plan (its generator, at the wall clock) to its streams' partitions (files or NATS), every
    ``period_s``, remembering every event by stream."""

    def __init__(self, cluster: ClusterConfig, plan: PlanConfig, rate: int = 40, period_s: float = 0.5,
                 seed: int = 11, spell: Callable[[str, dict], str] | None = None) -> None:
        from tandem.producer import generator_for

        super().__init__(name=f"{plan.name}-writer", daemon=True)
        self.cluster, self.plan = cluster, plan
        self.spell = spell or (lambda stream, event: json.dumps(event))  # an event of a stream as its line
        self.generator = generator_for(plan, seed)
        self.per_tick = max(1, round(rate * period_s))
        self.period_s = period_s
        self.events: dict[str, list[dict]] = {stream: [] for stream in plan.input_streams}
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from tandem.producer import Destinations, partitioned

        try:
            with Destinations(self.cluster, self.plan) as destinations:
                while not self.stopping.is_set():
                    events = self.generator.events(int(time.time() * 1000), self.per_tick)
                    lines = {stream: [(e, self.spell(stream, e)) for e in items] for stream, items in events.items()}
                    for (stream, partition), chunk in partitioned(self.plan, lines).items():
                        destinations.write(stream, partition, chunk)
                    for stream, items in events.items():
                        self.events[stream].extend(items)
                    self.stopping.wait(self.period_s)
        except BaseException as exc:  # noqa: BLE001 - surfaced by stop()
            self.error = exc

    def stop(self) -> dict[str, list[dict]]:
        """Stop writing and return every event written, by stream; raise what the thread raised, if anything."""
        self.stopping.set()
        if self.is_alive():
            self.join(timeout=30)
        if self.error is not None:
            raise AssertionError(f"the {self.plan.name} writer failed: {self.error!r}") from self.error
        return self.events


class StreamPartition:
    """Lines to one partition of a plan's stream, through the producer's destinations (a landing file, or NATS
    publishes with a message id each); used from one thread."""

    def __init__(self, cluster: ClusterConfig, plan: PlanConfig, stream: str, partition: int) -> None:
        from tandem.producer import Destinations

        self.destinations, self.stream, self.partition = Destinations(cluster, plan), stream, partition

    def write(self, lines: list[str]) -> None:
        self.destinations.write(self.stream, self.partition, lines)

    def close(self) -> None:
        self.destinations.close()


def start_writer(cluster: ClusterConfig, rate: int = 200, seed: int = 1) -> TradeWriter:
    """A :class:`TradeWriter` into the first partition of shard-1's share of the trades stream, files or NATS."""
    plan = load_plan(PLAN, cluster)
    sink = StreamPartition(cluster, plan, "trades", plan.partitions(INSTANCE, "trades")[0])
    writer = TradeWriter(None, rate=rate, seed=seed, sink=sink)
    writer.start()
    return writer


# ------------------------------------------------------------------------------------------------
# Expected values (the test's own bucketing and arithmetic) and the comparison


def truncate(moment: datetime, granularity: str) -> datetime:
    """Bucket start of ``moment`` (independent of tandem.aggregation.granularity)."""
    if granularity == "second":
        return moment.replace(microsecond=0)
    if granularity == "minute":
        return moment.replace(second=0, microsecond=0)
    if granularity == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    if granularity == "day":
        return moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if granularity == "month":
        return moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return moment.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0)


def expected_aggregates(events: list[tuple[int, str, float, int]], granularity: str) -> dict[tuple, dict]:
    groups: dict[tuple, list[tuple]] = defaultdict(list)
    for event in events:
        moment = datetime.fromtimestamp(event[0] / 1000, tz=UTC)
        groups[(truncate(moment, granularity), event[1])].append(event)
    return {
        key: {"price_sum": sum(e[2] for e in group), "trade_count": len(group),
              "quantity_sum": sum(e[3] for e in group), "price_min": min(e[2] for e in group),
              "price_max": max(e[2] for e in group)}
        for key, group in groups.items()
    }


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def compare(actual_rows: list[dict], expected: dict[tuple, dict], label: str, limit: int = 5) -> list[str]:
    """Differences between published rows and the expected ones ([] when equal)."""
    problems: list[str] = []
    actual = {(row["bucket_start"].astimezone(UTC), row["symbol"]): row for row in actual_rows}
    missing = sorted(set(expected) - set(actual))
    extra = sorted(set(actual) - set(expected))
    if missing:
        problems.append(f"{label}: {len(missing)} buckets missing, e.g. {missing[:limit]}")
    if extra:
        problems.append(f"{label}: {len(extra)} unexpected buckets, e.g. {extra[:limit]}")
    wrong = []
    for key in sorted(set(expected) & set(actual)):
        for column in MEASURES:
            want, got = expected[key][column], actual[key][column]
            if not _close(float(got), float(want)):
                wrong.append(f"{key} {column}: published {got}, expected {want}")
    if wrong:
        problems.append(f"{label}: {len(wrong)} wrong values, e.g. {wrong[:limit]}")
    return problems


def mismatches(cluster: ClusterConfig, events: list[tuple[int, str, float, int]],
               sources: tuple[str, ...] = ("postgres", "delta")) -> list[str]:
    """Every difference between the merged outputs (PostgreSQL and Delta, six granularities) and ``events``.

    A value counted twice shows as a wrong value; with ``delta`` among the sources, the raw Delta
    rows are also checked for a batch published twice (:func:`published_twice`).
    """
    problems: list[str] = []
    for granularity in GRANULARITIES:
        expected = expected_aggregates(events, granularity)
        for source in sources:
            rows = read_output(cluster, PLAN, granularity, *ALL_TIME, source=source)
            problems += compare(rows, expected, f"{source} {granularity}")
    if "delta" in sources:
        problems += published_twice(delta_table_dir(cluster, PLAN, "trade_aggregates"))
    return problems


def published_twice(path: Path, limit: int = 5) -> list[str]:
    """Evidence in the raw Delta rows that something was published twice ([] when nothing was).

    Every micro-batch publishes a key at most once, under one epoch, and an epoch belongs to one
    node: the same (key, epoch, batch) twice is a batch appended twice, and an epoch written by two
    nodes is two publishers at once. (Readers keep the newest version of a key, so the merged
    values alone would hide both.)
    """
    rows = read_table(path, columns=["granularity", "bucket_start", "symbol", "instance", "epoch", "batch_id",
                                     "node"]).to_pylist()
    seen: Counter = Counter((r["granularity"], r["bucket_start"], r["symbol"], r["instance"], r["epoch"], r["batch_id"])
                            for r in rows)
    twice = [key for key, n in seen.items() if n > 1]
    nodes_by_epoch: dict[tuple, set[str]] = defaultdict(set)
    for row in rows:
        nodes_by_epoch[(row["instance"], row["epoch"])].add(row["node"])
    problems = [f"delta: {len(twice)} (key, epoch, batch) published twice, e.g. {sorted(twice)[:limit]}"] if twice else []
    problems += [f"delta: {instance} epoch {epoch} written by {sorted(nodes)}"
                 for (instance, epoch), nodes in sorted(nodes_by_epoch.items()) if len(nodes) > 1]
    return problems


# ------------------------------------------------------------------------------------------------
# The coordination tables


def fetch(database_url: str, sql: str, params: Any = None) -> list[dict]:
    conn = psycopg2.connect(database_url, options="-c search_path=tandem -c TimeZone=UTC")
    try:
        with conn, conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cursor:
            cursor.execute(sql, params)
            return [dict(row) for row in cursor.fetchall()]
    finally:
        conn.close()


def published_total(database_url: str) -> int:
    """Trades counted in shard-1's per-second partials."""
    return TradeFeed.published(database_url)[0]


def lease(database_url: str, plan: str = PLAN, instance: str = INSTANCE) -> dict | None:
    rows = fetch(database_url, "SELECT *, now() > expires_at AS expired FROM leases WHERE plan = %s AND instance = %s",
                 (plan, instance))
    return rows[0] if rows else None


ROLE_CHANGES = ("PROMOTED", "DEMOTED", "RELEASED")
"""Event kinds written by the instances themselves (the supervisor's decisions are other kinds)."""


def failover_events(database_url: str, since: datetime | None = None, kinds: tuple[str, ...] | None = None,
                    plan: str = PLAN, instance: str = INSTANCE) -> list[dict]:
    return fetch(database_url, "SELECT * FROM failover_events WHERE plan = %s AND instance = %s "
                               "AND (%s::timestamptz IS NULL OR happened_at >= %s) "
                               "AND (%s::text[] IS NULL OR kind = ANY(%s)) ORDER BY id",
                 (plan, instance, since, since, list(kinds) if kinds else None, list(kinds) if kinds else None))


def publish_log(database_url: str, node: str | None = None, plan: str = PLAN, instance: str = INSTANCE) -> list[dict]:
    return fetch(database_url, "SELECT * FROM publish_log WHERE plan = %s AND instance = %s "
                               "AND (%s::text IS NULL OR node = %s) ORDER BY published_at, batch_id",
                 (plan, instance, node, node))


def instance_row(database_url: str, node: str, plan: str = PLAN, instance: str = INSTANCE) -> dict | None:
    rows = fetch(database_url, "SELECT * FROM plan_instances WHERE instance_id = %s", (f"{plan}/{instance}/{node}",))
    return rows[0] if rows else None


def latest_watermark(database_url: str, node: str, since: datetime | None = None, plan: str = PLAN,
                     instance: str = INSTANCE) -> datetime | None:
    """How far the node's instance has read: the event-time watermark of its slowest query that has one
    (its newest batch since ``since``; trades: ``aggregates``)."""
    rows = fetch(database_url, "SELECT min(w) AS w FROM (SELECT max(watermark) AS w FROM heartbeats "
                               "WHERE instance_id = %s AND watermark IS NOT NULL "
                               "AND (%s::timestamptz IS NULL OR recorded_at >= %s) GROUP BY query_name) AS q",
                 (f"{plan}/{instance}/{node}", since, since))
    return rows[0]["w"]


def level_with(database_url: str, standby: str, active: str, slack_s: float = 5.0,
               since: Mapping[str, datetime] | None = None, plan: str = PLAN, instance: str = INSTANCE) -> bool:
    """Whether ``standby`` is hot: its slowest query's watermark within ``slack_s`` of ``active``'s
    (each node's heartbeats since ``since[node]``, when given)."""
    marks = [latest_watermark(database_url, node, (since or {}).get(node), plan, instance) for node in (standby, active)]
    return None not in marks and marks[0].timestamp() >= marks[1].timestamp() - slack_s


def promotion(database_url: str, node: str, above_epoch: int, plan: str = PLAN, instance: str = INSTANCE) -> dict | None:
    """The first PROMOTED event of ``node`` to an epoch above ``above_epoch``, if any."""
    for event in failover_events(database_url, plan=plan, instance=instance):
        if event["kind"] == "PROMOTED" and event["node"] == node and event["epoch"] > above_epoch:
            return event
    return None


def first_publish(database_url: str, node: str, epoch: int, plan: str = PLAN, instance: str = INSTANCE) -> dict | None:
    """The earliest publish_log row of ``node`` at ``epoch``, if any."""
    rows = [r for r in publish_log(database_url, node, plan, instance) if r["epoch"] == epoch]
    return min(rows, key=lambda r: r["published_at"]) if rows else None


def db_now(database_url: str) -> datetime:
    return fetch(database_url, "SELECT clock_timestamp() AS t")[0]["t"]


# ------------------------------------------------------------------------------------------------
# Processes


def wait_for(predicate: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.5,
             detail: Callable[[], str] | None = None) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{detail()}" if detail else ""
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}{extra}")
        time.sleep(poll_s)


def signal_group(pgid: int, sig: int) -> None:
    os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    for process in psutil.process_iter(["status"]):
        try:
            if os.getpgid(process.pid) == pgid and process.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return False


@dataclass
class Pair:
    """Instances of (trades, shard-1) on node-a / node-b, launched detached; groups are registered
    in ``groups`` (the ``process_groups`` fixture) so they are killed after the test, whatever happens."""

    cluster: ClusterConfig
    plan: PlanConfig
    dist: Path
    groups: list[int]
    trigger: str = "1 second"
    instance: str = INSTANCE
    pgids: dict[str, int] = field(default_factory=dict)
    launched_at: dict[str, datetime] = field(default_factory=dict)

    started: float = field(default_factory=time.monotonic)

    @property
    def url(self) -> str:
        return self.cluster.database_url

    def note(self, message: str) -> None:
        """Print a progress line with the seconds since the pair was set up (shown with ``pytest -s``)."""
        print(f"[{time.monotonic() - self.started:6.1f}s] {message}", flush=True)

    def launch(self, node: str, role: str) -> int:
        job = launch_instance(self.cluster, self.plan, self.instance, node, self.trigger, role=role,
                              launched_by="test_failover", py_files=self.dist)
        assert not job.reused, f"{node}: the launcher reused a job instead of launching: {job.reason}"
        self.groups.append(job.submit_pid)
        self.pgids[node] = job.submit_pid
        self.launched_at[node] = datetime.now(UTC)
        return job.submit_pid

    def wait_running(self, node: str, timeout_s: float = 240) -> dict:
        return wait_until_running(self.cluster, self.plan.name, self.instance, node, timeout_s=timeout_s)

    def start_pair(self, active: str = "node-a", passive: str = "node-b", timeout_s: float = 240) -> None:
        """ACTIVE first (it takes the free lease at start), then the PASSIVE once the lease is taken."""
        self.launch(active, "ACTIVE")
        wait_for(lambda: (lease(self.url, self.plan.name, self.instance) or {}).get("holder") == active, timeout_s, f"{active} to take the lease",
                 detail=lambda: self.log_tail(active))
        self.launch(passive, "PASSIVE")
        self.wait_running(active, timeout_s)
        self.wait_running(passive, timeout_s)
        self.note(f"{active} ACTIVE and {passive} PASSIVE are running")

    def kill(self, node: str, sig: int = signal.SIGKILL) -> float:
        """Send ``sig`` to the node's whole process group; return the wall-clock time it was sent."""
        sent = time.time()
        signal_group(self.pgids[node], sig)
        return sent

    def wait_group_gone(self, node: str, timeout_s: float = 30) -> None:
        wait_for(lambda: not group_alive(self.pgids[node]), timeout_s, f"the processes of {node} to exit", poll_s=0.2)

    def caught_up(self, node: str, slack_s: float = 10.0) -> bool:
        """The node's watermark is within ``slack_s`` of now − 10 s watermark delay: it has read what was written."""
        watermark = latest_watermark(self.url, node, self.launched_at.get(node), self.plan.name, self.instance)
        if watermark is None:
            return False
        behind = time.time() - watermark.timestamp() - self.plan.watermark_s
        return behind <= slack_s

    def wait_caught_up(self, node: str, timeout_s: float = 300) -> None:
        wait_for(lambda: self.caught_up(node), timeout_s, f"{node} to catch up with the input",
                 detail=lambda: f"watermark {latest_watermark(self.url, node, None, self.plan.name, self.instance)}, "
                                f"now {datetime.now(UTC)}\n"
                                f"{self.log_tail(node)}")

    def wait_level(self, standby: str, active: str, slack_s: float = 5.0, timeout_s: float = 600) -> None:
        """Wait until the standby is hot (:func:`level_with`, each node's watermarks since its launch)."""
        wait_for(lambda: level_with(self.url, standby, active, slack_s, self.launched_at, self.plan.name, self.instance),
                 timeout_s, f"{standby} to process what {active} has", detail=lambda: self.log_tail(standby))

    @staticmethod
    def other(node: str) -> str:
        """The pair's other node."""
        return ({"node-a", "node-b"} - {node}).pop()

    def roles(self) -> tuple[str, str]:
        """(the node holding the lease, the other node of the pair)."""
        holder = lease(self.url, self.plan.name, self.instance)["holder"]
        return holder, self.other(holder)

    def promoted(self, node: str, above_epoch: int) -> dict | None:
        return promotion(self.url, node, above_epoch, self.plan.name, self.instance)

    def first_publish(self, node: str, epoch: int) -> dict | None:
        return first_publish(self.url, node, epoch, self.plan.name, self.instance)

    def log_tail(self, node: str, lines: int = 30) -> str:
        """For a failed wait: the node's instance row, its log's Tandem and ERROR lines (a query's error is
        followed by its plan, which fills any tail), then the log's last ``lines`` lines."""
        row = instance_row(self.url, node, self.plan.name, self.instance)
        path = row and row["log_path"]
        if not path or not Path(path).is_file():
            return f"(no log for {node})"
        text = Path(path).read_text(errors="replace").splitlines()
        notable = [line for line in text if " tandem." in line or " ERROR " in line][-15:]
        error = f", error {row['error'][:500]!r}" if row.get("error") else ""
        return (f"--- {path}: {row['status']} {row['role']} at epoch {row['epoch']}{error} ---\n"
                + "\n".join(notable) + "\n[…]\n" + "\n".join(text[-lines:]))


# ------------------------------------------------------------------------------------------------
# Catching an instance inside a publishing transaction (it holds the lease row FOR KEY SHARE)


def postgres_ports(pid: int, server_port: int = 5432) -> list[int]:
    """Local TCP ports of the process's connections to the PostgreSQL server on ``server_port``."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
    return [c.laddr.port for c in connections if c.raddr and c.raddr.port == server_port]


def open_publish_transaction(cursor, ports: list[int]) -> dict | None:
    """The open transaction of a ``tandem-publisher`` connection on one of ``ports``, if there is one."""
    cursor.execute(
        """SELECT pid, state, xact_start, left(query, 120) AS query FROM pg_stat_activity
           WHERE datname = current_database() AND application_name = 'tandem-publisher'
             AND client_port = ANY(%s) AND xact_start IS NOT NULL AND state <> 'idle'""",
        (ports,),
    )
    return cursor.fetchone()


def pause_inside_publish(pair: Pair, node: str, timeout_s: float = 30.0) -> tuple[float, dict | None]:
    """SIGSTOP the node's process group, preferably while its publisher has a fenced transaction open.

    Returns the time the signal was sent and the transaction still open after the pause (``None``
    when the pause missed every transaction within ``timeout_s``, or the transaction ended first).
    """
    driver = instance_row(pair.url, node)["pid"]
    server_port = urlsplit(pair.url).port or 5432
    conn = psycopg2.connect(pair.url)
    conn.autocommit = True
    try:
        with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cursor:
            deadline = time.monotonic() + timeout_s
            ports, ports_at = postgres_ports(driver, server_port), time.monotonic()
            while time.monotonic() < deadline:
                if time.monotonic() - ports_at > 1.0:
                    ports, ports_at = postgres_ports(driver, server_port), time.monotonic()
                if open_publish_transaction(cursor, ports):
                    break
                time.sleep(0.002)
            paused = pair.kill(node, signal.SIGSTOP)
            time.sleep(0.3)  # let the server finish the statement it was running
            return paused, open_publish_transaction(cursor, postgres_ports(driver, server_port))
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------------
# A PostgreSQL server the test may restart


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrivatePostgres:
    """A private cluster made and run by ``scripts/provision_postgres.sh`` (as the unprivileged
    ``tandem`` user when the tests run as root), on its own port, removed by :meth:`destroy`."""

    def __init__(self, directory: Path, port: int, listen: str = "127.0.0.1",
                 on_host: Callable[[list[str]], list[str]] = lambda argv: argv) -> None:
        """``listen``: the address to listen on; ``on_host``: turns a command into the same command run
        on the server's host (a network namespace of ``_hosts.HostNetwork``; here by default)."""
        self.env = {**os.environ, "TANDEM_PG_DIR": str(directory), "TANDEM_PG_PORT": str(port),
                    "TANDEM_PG_SKIP_LOCAL": "1", "TANDEM_PG_LISTEN": listen}
        self.env.pop("TANDEM_DATABASE_URL", None)
        self.on_host = on_host

    def _script(self, command: str) -> str:
        argv = self.on_host(["bash", str(REPO / "scripts" / "provision_postgres.sh"), command])
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise AssertionError(f"provision_postgres.sh {command} failed:\n{done.stderr}")
        return done.stdout.strip()

    def start(self) -> str:
        """Start it (initdb the first time); return the URL of its ``tandem`` database."""
        return self._script("ensure")

    def stop(self) -> None:
        """Fast shutdown: every client connection is cut."""
        self._script("stop")

    def destroy(self) -> None:
        self._script("destroy")


def split_brain(database_url: str, plan: str = PLAN, instance: str = INSTANCE) -> list[str]:
    """Evidence of two publishers at once: an epoch published by two nodes, or a publish at an
    epoch after the next epoch was granted. [] when every epoch's publishes precede the next one's."""
    problems = []
    nodes_by_epoch: dict[int, set[str]] = defaultdict(set)
    rows = publish_log(database_url, plan=plan, instance=instance)
    for row in rows:
        nodes_by_epoch[row["epoch"]].add(row["instance_id"])
    problems += [f"epoch {epoch} published by {sorted(nodes)}" for epoch, nodes in nodes_by_epoch.items()
                 if len(nodes) > 1]
    for promotion in failover_events(database_url, plan=plan, instance=instance):
        if promotion["kind"] != "PROMOTED":
            continue
        stale = [r for r in rows if r["epoch"] < promotion["epoch"] and r["published_at"] > promotion["happened_at"]]
        problems += [f"{r['instance_id']} published batch {r['batch_id']} at epoch {r['epoch']} "
                     f"after epoch {promotion['epoch']} was granted" for r in stale]
    return problems


# ------------------------------------------------------------------------------------------------
# One hot pair shared by several tests, under load


@dataclass
class HotPair:
    """The pair shared by the tests of ``TestOneHotPairUnderLoad``, its PostgreSQL server and its load."""

    pair: Pair
    server: PrivatePostgres
    events: list[tuple[int, str, float, int]] = field(default_factory=list)  # every event landed so far
    writer: TradeWriter | None = None
    load_started_at: datetime | None = None  # database time
    seeds: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @property
    def url(self) -> str:
        return self.pair.url

    def start_load(self) -> None:
        """~200 events/s into shard-1's landing directory (a new writer, a new seed, for each test)."""
        self.load_started_at = db_now(self.url)
        self.writer = TradeWriter(instance_landing_dir(self.pair.cluster, load_plan("trades", self.pair.cluster), INSTANCE), rate=200, seed=next(self.seeds))
        self.writer.start()

    def stop_load(self) -> list[tuple[int, str, float, int]]:
        """Stop the writer (if one runs) and return every event written so far, by every test."""
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.stopping.set()
            writer.join(timeout=30)
            self.events += writer.snapshot()  # kept even if the writer failed, since they may have landed
            writer.stop()  # raises what the thread raised
        return self.events

    def roles(self) -> tuple[str, str]:
        """(the lease holder, the other node)."""
        return self.pair.roles()

    def relaunch(self, node: str) -> None:
        """Launch ``node`` again as PASSIVE, once its last liveness beat is older than the heartbeat
        timeout (before that the launcher would take it for a live job and reuse it)."""
        timeout_s = self.pair.plan.heartbeat.timeout_s
        wait_for(lambda: not fetch(self.url, "SELECT 1 FROM liveness WHERE instance_id = %s AND "
                                             "beat_at > now() - make_interval(secs => %s)",
                                   (f"trades/{INSTANCE}/{node}", timeout_s)),
                 30, f"{node}'s last liveness beat to age past {timeout_s:g}s")
        self.pair.launch(node, "PASSIVE")
        self.pair.wait_running(node)
        self.pair.note(f"{node} relaunched as PASSIVE")

    def running(self, node: str) -> bool:
        row = instance_row(self.url, node)
        return (node in self.pair.pgids and group_alive(self.pair.pgids[node])
                and row is not None and row["status"] == "RUNNING")

    def publishes(self, node: str, epoch: int | None = None, since: datetime | None = None) -> list[dict]:
        return [r for r in publish_log(self.url, node)
                if (epoch is None or r["epoch"] == epoch) and (since is None or r["published_at"] >= since)]

    def finish_and_compare(self) -> int:
        """Stop the writer, wait until every event written so far is published, compare every output."""
        pair, events = self.pair, self.stop_load()
        pair.note(f"writer stopped after {len(events)} events (all tests so far)")
        wait_for(lambda: published_total(pair.url) >= len(events), 120,
                 f"all {len(events)} events to be published",
                 detail=lambda: f"published {published_total(pair.url)}; lease {lease(pair.url)}")
        pair.note("every event is published")
        deadline = time.monotonic() + 30  # Delta is appended right after the PostgreSQL commit
        while (problems := mismatches(pair.cluster, events)) and time.monotonic() < deadline:
            time.sleep(2)
        assert not problems, "\n".join(problems)
        pair.note("outputs compared")
        return len(events)


@contextmanager
def under_load(hot: "HotPair") -> Iterator["HotPair"]:
    """The shared pair ready for a test: both nodes RUNNING as ACTIVE / PASSIVE (a node an earlier
    test left down relaunched as PASSIVE), the load on, the standby caught up with it and the active
    publishing it. Afterwards the load is stopped and its events kept."""
    pair, url = hot.pair, hot.url
    nodes = ("node-a", "node-b")
    for node in nodes:
        if not hot.running(node):
            hot.relaunch(node)
    wait_for(lambda: (holder := (lease(url) or {}).get("holder")) in nodes and not lease(url)["expired"]
             and {n: instance_row(url, n)["role"] for n in nodes} == {
                 holder: "ACTIVE", ({"node-a", "node-b"} - {holder}).pop(): "PASSIVE"},
             60, "one ACTIVE lease holder and one PASSIVE",
             detail=lambda: f"lease {lease(url)}; {[instance_row(url, n) for n in nodes]}")
    hot.start_load()
    try:
        active, standby = hot.roles()
        pair.wait_caught_up(standby)
        wait_for(lambda: hot.publishes(active, lease(url)["epoch"], hot.load_started_at), 90,
                 f"{active} to publish", detail=lambda: pair.log_tail(active))
        pair.note(f"{standby} has caught up, {active} publishes")
        yield hot
    finally:
        hot.stop_load()


# ------------------------------------------------------------------------------------------------
# Instances launched by Tandem's supervisor


def launched(report: Report, pair: Pair) -> list[tuple[str, str]]:
    """(node, role) of each launch the report made; each launch's process group is known to ``pair``
    (to kill it) and registered in its groups (the ``process_groups`` fixture kills them after the test)."""
    done = []
    for step in report.steps:
        if step.action.kind == "LAUNCH" and step.data.get("submit_pid"):
            assert not step.data["reused"], f"{step.action.node}: the launcher reused a job: {step.line()}"
            pair.groups.append(step.data["submit_pid"])
            pair.pgids[step.action.node] = step.data["submit_pid"]
            done.append((step.action.node, step.action.role))
    return done


def register_last_launches(pair: Pair) -> None:
    """Register the process group of each node's last launch, as its instance row records it: a launch
    whose report never came back (it failed, or the test did) is killed too. The database may be gone."""
    for node in pair.plan.nodes:
        try:
            row = instance_row(pair.url, node, pair.plan.name, pair.instance)
        except Exception:  # noqa: BLE001 - kill what is known
            row = None
        if row and row["submit_pid"] and row["submit_pid"] not in pair.groups:
            pair.groups.append(row["submit_pid"])


class Reconciling(threading.Thread):
    """``supervisor.reconcile(instance)`` in a thread (a launch waits for RUNNING: a JVM start), so the
    test goes on meanwhile; :meth:`report` joins it and returns its report, or raises what it raised."""

    def __init__(self, supervisor: Supervisor, instance: str, cause: str) -> None:
        super().__init__(name=f"supervisor-reconcile-{instance}", daemon=True)
        self.supervisor, self.instance, self.cause = supervisor, instance, cause
        self.result: Report | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.supervisor.reconcile(self.instance, cause=self.cause)
        except BaseException as exc:  # noqa: BLE001 - surfaced by report()
            self.error = exc

    def report(self, timeout_s: float) -> Report:
        self.join(timeout_s)
        assert not self.is_alive(), f"the supervisor's round ({self.cause}) took more than {timeout_s:g}s"
        if self.error is not None:
            raise AssertionError(f"the supervisor's round ({self.cause}) raised {self.error!r}") from self.error
        return self.result
