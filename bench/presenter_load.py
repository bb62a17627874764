#!/usr/bin/env python
"""Presenter load benchmark: open Tandem pages polling the API beside a supervised hot pair of the trades plan.

A private Airflow stack (API server with the ``tandem_ui`` plugin, scheduler, triggerer, DAG processor,
on loopback) supervises the trades plan's shard-1 as a hot pair (node-a ACTIVE, node-b PASSIVE)
while a writer lands ~200 trades/s. After a baseline without pages, ``--pages`` clients (default 20)
poll for ``--duration`` seconds (default 300) exactly what the page polls, at the page's rhythm:
every 2 s the status and the timeline; every third tick the snapshots, the quarantine summary and
each output (the aggregation's last 60 buckets); a tick still running when the next is due makes
that one skip, as the page's ``busy`` flag does.

The clients are HTTP clients, not Chromium pages: twenty headless Chromium renderers on two cores
would take the CPU from the pair and measure the browsers, while the API server sees the same
requests either way (the page's own test drives Chromium).

Recorded, for the baseline and the load:

- lease renewals: the lease row sampled every 100 ms, every distinct ``renewed_at`` kept; the gaps
  between consecutive renewals against the lease ttl (heartbeat interval × max missed), the epoch,
  and the failover events (none may appear);
- the API server's memory: RSS of its process tree every 5 s; the mean of the load's first minute
  against its last minute (flat: a ratio near 1);
- every request's latency and status, by endpoint;
- at the end, that every trade written was published once (the instance's per-second partials).

Loopback only, bounded: the clients stop after ``--duration``, the stack and the pair are stopped and
the private database dropped whatever happens. Results: ``bench/results/presenter_load.json``; see
the "Presenter load" section of bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))  # _ha: pair, writer; _airflow: stack, code home

import psutil  # noqa: E402
import requests  # noqa: E402

import _ha  # noqa: E402
from _airflow import airflow_stack, code_home  # noqa: E402
from _common import create_database, drop_database, git_commit, machine_info, now_iso, percentile  # noqa: E402
from _project import kill_groups  # noqa: E402
from tandem.config import load_cluster, load_plan  # noqa: E402
from tandem.layout import instance_landing_dir  # noqa: E402
from tandem.store import Database, migrate  # noqa: E402

UTC = timezone.utc
SERVER_URL = os.environ.get("TANDEM_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/tandem")
SUPERVISE = "tandem_trades_supervise"
PAGE_REFRESH_S = 2.0
OUTPUTS_EVERY = 3  # ticks: snapshots, quarantine and outputs refresh every third tick (page.html)
LEASE_POLL_S = 0.1
RSS_EVERY_S = 5.0
ROLE_EVENTS = ("PROMOTED", "DEMOTED", "HANDOVER", "RELEASED", "FENCED", "DETECTED", "RESTORED")
"""Failover events that would mean the load disturbed the pair (a supervision STARTED/LAUNCH is not one)."""


@dataclass
class Samples:
    """What the sampler thread saw: renewals, epochs, failover events and the API server's memory."""

    renewals: list[datetime] = field(default_factory=list)
    epochs: set[int] = field(default_factory=set)
    holders: set[str] = field(default_factory=set)
    rss: list[tuple[float, int]] = field(default_factory=list)
    lease_ttl_s: float | None = None


def api_server_pid(home: Path) -> int:
    return int((home / "run" / "api-server.pid").read_text().strip())


def tree_rss(pid: int) -> int:
    """RSS in bytes of ``pid`` and every process below it (the API server's workers)."""
    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def sample(url: str, api_pid: int, samples: Samples, stop: threading.Event) -> None:
    """Every 100 ms the lease row (each new renewal kept), every 5 s the API server's RSS."""
    next_rss = 0.0
    with Database(url, "presenter-load-sampler") as db:
        while not stop.is_set():
            row = db.run(lambda c: (c.execute("SELECT holder, epoch, renewed_at, ttl_s FROM leases "
                                              "WHERE plan = 'trades' AND instance = 'shard-1'"), c.fetchone())[1])
            if row:
                if row["renewed_at"] and (not samples.renewals or row["renewed_at"] != samples.renewals[-1]):
                    samples.renewals.append(row["renewed_at"])
                samples.epochs.add(int(row["epoch"]))
                samples.holders.add(row["holder"])
                samples.lease_ttl_s = float(row["ttl_s"])
            if time.monotonic() >= next_rss:
                samples.rss.append((time.time(), tree_rss(api_pid)))
                next_rss = time.monotonic() + RSS_EVERY_S
            stop.wait(LEASE_POLL_S)


@dataclass(eq=False)  # a thread must stay hashable
class PageClient(threading.Thread):
    """One open page: the page's requests at the page's rhythm, every response's latency and status kept."""

    base: str
    token: str
    until: float
    results: list[tuple[str, int, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread.__init__(self, daemon=True)
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {self.token}"

    def get(self, endpoint: str, path: str, **params) -> dict:
        started = time.monotonic()
        try:
            response = self.session.get(f"{self.base}/tandem/api/v1/{path}", params=params, timeout=30)
            status = response.status_code
        except requests.RequestException:
            response, status = None, 0
        self.results.append((endpoint, status, time.monotonic() - started))
        return response.json() if response is not None and response.ok else {}

    def tick(self, number: int, plan: dict) -> None:
        self.get("status", "plans/trades/status")
        self.get("timeline", "plans/trades/timeline", limit=25)
        if number % OUTPUTS_EVERY:
            return
        self.get("snapshots", "plans/trades/snapshots", limit=15)
        self.get("quarantine", "plans/trades/quarantine", samples=5)
        for output in plan.get("outputs", []):
            if output["kind"] == "aggregation":
                now = datetime.now(UTC)
                self.get("aggregates", f"plans/trades/outputs/{output['name']}/aggregates", granularity="minute",
                         start=(now - timedelta(minutes=60)).isoformat(), end=(now + timedelta(minutes=10)).isoformat())

    def run(self) -> None:
        self.get("plans", "plans")
        plan = self.get("plan", "plans/trades")
        number, next_tick = 0, time.monotonic()
        while time.monotonic() < self.until:
            self.tick(number, plan)
            number += 1
            next_tick += PAGE_REFRESH_S
            while next_tick < time.monotonic():  # the page skips a tick while the last one still runs
                next_tick += PAGE_REFRESH_S
            time.sleep(max(0.0, min(next_tick, self.until) - time.monotonic()))


def renewal_gaps(renewals: list[datetime], start: datetime, end: datetime) -> list[float]:
    inside = [r for r in renewals if start <= r <= end]
    return [(b - a).total_seconds() for a, b in zip(inside, inside[1:])]


def gap_summary(gaps: list[float], ttl_s: float | None) -> dict:
    return {"renewals": len(gaps) + 1 if gaps else 0, "gap_p50_s": percentile(gaps, 50),
            "gap_p99_s": percentile(gaps, 99), "gap_max_s": max(gaps) if gaps else None, "ttl_s": ttl_s,
            "gaps_over_ttl": sum(1 for g in gaps if ttl_s and g >= ttl_s)}


def failover_events(url: str, since: datetime) -> list[dict]:
    return _ha.fetch(url, "SELECT happened_at, kind, node, epoch, reason FROM tandem.failover_events "
                          "WHERE happened_at >= %s ORDER BY id", (since,))


def request_summary(results: list[tuple[str, int, float]]) -> dict:
    by_endpoint: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for endpoint, status, seconds in results:
        by_endpoint[endpoint].append((status, seconds))
    return {endpoint: {"requests": len(rows), "errors": sum(1 for s, _ in rows if s != 200),
                       "statuses": dict(sorted(_count(s for s, _ in rows).items())),
                       "p50_ms": round(percentile([t for _, t in rows], 50) * 1000, 1),
                       "p95_ms": round(percentile([t for _, t in rows], 95) * 1000, 1),
                       "max_ms": round(max(t for _, t in rows) * 1000, 1)}
            for endpoint, rows in sorted(by_endpoint.items())}


def _count(values) -> dict:
    counts: dict = defaultdict(int)
    for value in values:
        counts[str(value)] += 1
    return counts


def memory_summary(rss: list[tuple[float, int]], start: float, end: float) -> dict:
    during = [(t, r) for t, r in rss if start <= t <= end]
    first = [r for t, r in during if t < start + 60]
    last = [r for t, r in during if t > end - 60]
    mib = 1024 * 1024
    return {"samples": len(during), "first_minute_mib": round(statistics.mean(first) / mib, 1) if first else None,
            "last_minute_mib": round(statistics.mean(last) / mib, 1) if last else None,
            "last_over_first": round(statistics.mean(last) / statistics.mean(first), 3) if first and last else None,
            "max_mib": round(max(r for _, r in during) / mib, 1) if during else None,
            "series_mib": [[round(t - start, 1), round(r / mib, 1)] for t, r in during]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--duration", type=float, default=300.0, help="seconds the pages poll")
    parser.add_argument("--baseline", type=float, default=60.0, help="seconds of the pair without pages first")
    parser.add_argument("--rate", type=int, default=200, help="trades per second into shard-1")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "presenter_load.json")
    args = parser.parse_args()
    if not 1 <= args.pages <= 50 or not 10 <= args.duration <= 1800:
        parser.error("--pages 1..50 and --duration 10..1800 s: the load stays bounded")

    root = Path(tempfile.mkdtemp(prefix="tandem-presenter-load-"))
    url = create_database(SERVER_URL, "presenter_load")
    shutil.copytree(ROOT / "conf", root / "conf")
    os.environ.update({"TANDEM_HOME": str(ROOT), "TANDEM_CONF_DIR": str(root / "conf"),
                       "TANDEM_STORAGE_ROOT": str(root / "data"), "TANDEM_SCRATCH_DIR": str(root / "scratch"),
                       "TANDEM_DATABASE_URL": url})
    _ha.configure_one_instance(root, "hot")
    groups: list[int] = []
    writer = None
    try:
        with Database(url) as db:
            migrate(db)
        env_file = code_home(root)
        home = root / "airflow"
        with airflow_stack(home, {"TANDEM_ENV_FILE": str(env_file)}) as airflow:
            try:
                airflow.wait_for_dag(SUPERVISE)
                airflow.set_paused(SUPERVISE, False)
                print("supervision DAG unpaused: waiting for the pair", flush=True)
                _ha.wait_for(lambda: all((row := _ha.instance_row(url, n)) and row["status"] == "RUNNING"
                                         for n in ("node-a", "node-b")), 480, "node-a and node-b to run")
                groups += [_ha.instance_row(url, n)["submit_pid"] for n in ("node-a", "node-b")]
                _ha.wait_for(lambda: {_ha.instance_row(url, n)["role"] for n in ("node-a", "node-b")}
                             == {"ACTIVE", "PASSIVE"}, 120, "one ACTIVE and one PASSIVE")
                cluster = load_cluster()
                writer = _ha.TradeWriter(instance_landing_dir(cluster, load_plan("trades", cluster), _ha.INSTANCE),
                                         rate=args.rate)
                writer.start()
                samples, stop = Samples(), threading.Event()
                sampler = threading.Thread(target=sample, args=(url, api_server_pid(home), samples, stop), daemon=True)
                sampler.start()
                _ha.wait_for(lambda: _ha.published_total(url) > 0, 180, "the first trades to be published")
                started_at = _ha.db_now(url)
                print(f"baseline: {args.baseline:g} s without pages", flush=True)
                time.sleep(args.baseline)
                load_at, load_wall = _ha.db_now(url), time.time()
                token = airflow._headers()["Authorization"].removeprefix("Bearer ")
                clients = [PageClient(airflow.base_url, token, time.monotonic() + args.duration)
                           for _ in range(args.pages)]
                print(f"{args.pages} pages polling for {args.duration:g} s", flush=True)
                for number, client in enumerate(clients):
                    client.start()
                    time.sleep(PAGE_REFRESH_S / args.pages)  # pages opened over one refresh interval
                for client in clients:
                    client.join(timeout=args.duration + 120)
                end_at, end_wall = _ha.db_now(url), time.time()
                stop.set()
                sampler.join(timeout=10)
                events = writer.stop()
                writer = None
                _ha.wait_for(lambda: _ha.published_total(url) >= len(events), 180,
                             f"all {len(events)} trades to be published")
                published = _ha.published_total(url)
                results = [r for client in clients for r in client.results]
                report = {
                    "benchmark": "presenter_load", "at": now_iso(), "commit": git_commit(ROOT),
                    "machine": machine_info(server_url=SERVER_URL),
                    "setup": {"pages": args.pages, "duration_s": args.duration, "baseline_s": args.baseline,
                              "page_refresh_s": PAGE_REFRESH_S, "trades_per_s": args.rate,
                              "clients": "HTTP clients polling as page.html does (not Chromium renderers)",
                              "pair": "trades shard-1, hot, node-a/node-b local[1], supervised by tandem_trades_supervise"},
                    "lease": {
                        "baseline": gap_summary(renewal_gaps(samples.renewals, started_at, load_at), samples.lease_ttl_s),
                        "under_load": gap_summary(renewal_gaps(samples.renewals, load_at, end_at), samples.lease_ttl_s),
                        "epochs_seen": sorted(samples.epochs), "holders_seen": sorted(h or "-" for h in samples.holders),
                        "failover_events_during_load": [{**e, "happened_at": e["happened_at"].isoformat()}
                                                        for e in failover_events(url, load_at)],
                    },
                    "api_server_memory": memory_summary(samples.rss, load_wall, end_wall),
                    "api_server_memory_baseline_mib": [round(r / 2**20, 1) for t, r in samples.rss if t < load_wall],
                    "requests": {"total": len(results), "per_s": round(len(results) / args.duration, 1),
                                 "by_endpoint": request_summary(results)},
                    "trades": {"written": len(events), "published": published, "exact": published == len(events)},
                }
            finally:
                airflow.set_paused(SUPERVISE, True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        lease, memory = report["lease"], report["api_server_memory"]
        print(json.dumps({"lease": {k: v for k, v in lease.items()}, "memory": {k: v for k, v in memory.items()
                                                                                if k != "series_mib"},
                          "requests": report["requests"]["total"]}, indent=2, default=str))
        role_changes = [e for e in lease["failover_events_during_load"] if e["kind"] in ROLE_EVENTS]
        ok = (not role_changes and len(lease["epochs_seen"]) == 1
              and lease["under_load"]["gaps_over_ttl"] == 0)
        return 0 if ok else 1
    finally:
        if writer is not None:
            writer.stopping.set()
        groups += [row["submit_pid"] for n in ("node-a", "node-b")
                   if (row := _safe_row(url, n)) and row["submit_pid"]]
        kill_groups(groups)
        drop_database(url)
        shutil.rmtree(root, ignore_errors=True)


def _safe_row(url: str, node: str) -> dict | None:
    try:
        return _ha.instance_row(url, node)
    except Exception:  # noqa: BLE001 - best effort at cleanup
        return None


if __name__ == "__main__":
    sys.exit(main())
