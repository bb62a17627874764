#!/usr/bin/env python
"""Failover benchmark: how long from ``kill -9`` of the ACTIVE instance to the first output of the new one.

Hot standby (``standby: hot``, and ``warm`` with ``--warm-runs``), the trades plan on shard-1, two real detached ``spark-submit``
instances (node-a / node-b, each its own process group and checkpoint), a writer thread landing
trade events with current timestamps at a steady rate. Each run:

1. waits a random fraction of a heartbeat, so the kill lands anywhere in the renewal cycle;
2. ``kill -9`` the active's whole process group (time ``t0``);
3. polls PostgreSQL every 20 ms for the standby's PROMOTED event (``detection`` = its
   ``happened_at`` − t0, written in the same transaction as the lease take-over) and for the
   first ``publish_log`` row of the new active at the new epoch (``hot`` = the moment that commit
   was first visible − t0, i.e. the first output a reader can see);
4. relaunches the killed node as PASSIVE and waits until it has caught up, then the roles swap.

After the runs the writer stops and the published outputs (six granularities, PostgreSQL and
Delta) are compared with the aggregates of every event written.

Optionally (``--ha-cost-pairs``), the steady-state cost of HA: the same pre-written input run by
the ACTIVE alone and by the ACTIVE while a hot PASSIVE processes the same input at the same time
(``--available-now`` runs, fresh storage and database each), events/s of the ACTIVE from its
progress heartbeats, as a ratio.

With ``--multi-host`` (as root) every node runs on its own host, a network namespace pinned to its
own CPU (``taskset``), with PostgreSQL on a control host (``tests/support/_hosts.py``): hot
failovers after a crash of the active's host (every process killed at once) and after a partition
of it (its link down, its processes running on), warm failovers after a host crash with the
supervisor launching on the other node's host, and the HA cost with each node on its own CPU. They
are written under the ``multi_host`` key, the other keys kept.

Results: ``bench/results/failover.json``; see the "Failover benchmark" section of bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

os.environ.setdefault("AIRFLOW__LOGGING__LOGGING_LEVEL", "WARNING")  # the launcher's hook logs every command
BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))  # _ha: writer, expected values, process control

import psutil  # noqa: E402
import psycopg2  # noqa: E402
import psycopg2.extras  # noqa: E402
import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn  # noqa: E402
from rich.table import Table  # noqa: E402

import _ha  # noqa: E402
from _hosts import HOST_OF, CliOnHosts, HostNetwork, HostPair, hosts_with_postgres  # noqa: E402
from tandem.config import load_cluster, load_plan  # noqa: E402
from tandem.layout import landing_dir  # noqa: E402
from tandem.packaging import build_dist  # noqa: E402
from tandem.store import Database, migrate  # noqa: E402
from tandem.supervisor.submit_command import child_environment  # noqa: E402

UTC = timezone.utc
console = Console()
SERVER_URL = os.environ.get("TANDEM_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/tandem")


# ------------------------------------------------------------------------------------------------
# A private project (conf copy, storage root, database) per scenario


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


def _admin(sql: str, server_url: str = SERVER_URL) -> None:
    conn = psycopg2.connect(_with_database(server_url, "postgres"), connect_timeout=5)
    conn.autocommit = True
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql)
    finally:
        conn.close()


@dataclass
class Project:
    root: Path
    database_url: str
    groups: list[int]  # process groups started in it, killed when it is left


def _merge(into: dict, changes: dict) -> None:
    """Apply ``changes`` to ``into`` key by key, nested mappings merged rather than replaced."""
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


@contextmanager
def private_project(label: str, plan_overrides: dict | None = None, server_url: str = SERVER_URL):
    """A temp project (conf/ copy, storage, dist/tandem.zip) and database on ``server_url``; everything
    started is killed after."""
    root = Path(tempfile.mkdtemp(prefix=f"tandem-failover-{label}-"))
    name = f"tandem_failover_bench_{label}_{uuid.uuid4().hex[:8]}"
    _admin(f'CREATE DATABASE "{name}"', server_url)
    url = _with_database(server_url, name)
    shutil.copytree(ROOT / "conf", root / "conf")
    if plan_overrides:
        path = root / "conf" / "plans" / "trades.yaml"
        plan = yaml.safe_load(path.read_text())
        _merge(plan, plan_overrides)
        path.write_text(yaml.safe_dump(plan, sort_keys=False))
    saved = {k: os.environ.get(k) for k in ("TANDEM_HOME", "TANDEM_CONF_DIR", "TANDEM_STORAGE_ROOT", "TANDEM_SCRATCH_DIR",
                                            "TANDEM_DATABASE_URL")}
    os.environ.update({"TANDEM_HOME": str(ROOT), "TANDEM_CONF_DIR": str(root / "conf"),
                       "TANDEM_STORAGE_ROOT": str(root / "data"), "TANDEM_SCRATCH_DIR": str(root / "scratch"),
                       "TANDEM_DATABASE_URL": url})
    project = Project(root, url, [])
    build_dist(root)
    try:
        yield project
    finally:
        for pgid in project.groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pgid in project.groups:
            _wait_group_gone(pgid)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', server_url)
        shutil.rmtree(root, ignore_errors=True)


def _wait_group_gone(pgid: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while _ha.group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        os.waitpid(pgid, os.WNOHANG)
    except ChildProcessError:
        pass


# ------------------------------------------------------------------------------------------------
# Hot failover runs


def _poll(conn, sql: str, params) -> dict | None:
    with conn.cursor(cursor_factory=psycopg2.extras.RealDictCursor) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()


def watch_takeover(conn, standby: str, epoch: int, timeout_s: float, poll_s: float,
                   check: Callable[[], None] = lambda: None, instance: str | None = None) -> tuple[dict | None, dict | None]:
    """Poll for the standby's PROMOTED event at ``epoch`` and its first ``publish_log`` row at that epoch.

    Returns (promoted, first); ``first["seen_at"]`` is when the row was first visible to this reader.
    Either is None when it did not happen within ``timeout_s``; ``check()`` runs every poll and may raise.
    """
    promoted = first = None
    deadline = time.monotonic() + timeout_s
    while (promoted is None or first is None) and time.monotonic() < deadline:
        now = time.time()
        if promoted is None:
            promoted = _poll(conn, "SELECT happened_at, epoch, previous_node FROM failover_events WHERE kind = "
                                   "'PROMOTED' AND node = %s AND epoch = %s AND plan || '/' || instance || '/' || node = %s",
                             (standby, epoch, instance or f"trades/shard-1/{standby}"))
        if first is None:
            first = _poll(conn, "SELECT min(published_at) AS published_at, min(batch_id) AS batch_id "
                                "FROM publish_log WHERE instance_id = %s AND epoch = %s HAVING count(*) > 0",
                          (instance or f"trades/shard-1/{standby}", epoch))
            if first is not None:
                first["seen_at"] = now
        check()
        time.sleep(poll_s)
    return promoted, first


def other_spark_jvms(pair: _ha.Pair | None = None) -> list[int]:
    """Spark JVMs on this machine that this benchmark did not start (other users' load)."""
    ours = set(pair.pgids.values()) if pair else set()
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if ("org.apache.spark.deploy.SparkSubmit" in " ".join(process.info["cmdline"] or [])
                    and os.getpgid(process.pid) not in ours):
                found.append(process.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return found


def one_failover(pair: _ha.Pair, active: str, standby: str, timeout_s: float = 60,
                 fail: Callable[[str], float] | None = None) -> dict:
    """Fail the active (``fail(active)`` returns when; default: kill -9 of its process group) and time the
    standby's take-over. After a kill the active's processes are gone when this returns."""
    killed = fail is None
    fail = fail or (lambda node: pair.kill(node, signal.SIGKILL))
    url = pair.url
    conn = psycopg2.connect(url, options="-c search_path=tandem -c TimeZone=UTC")
    conn.autocommit = True
    try:
        instance = f"{pair.plan.name}/{pair.instance}/{standby}"
        before = _ha.lease(url, pair.plan.name, pair.instance)
        assert before["holder"] == active, before
        epoch = before["epoch"] + 1
        time.sleep(random.uniform(0, pair.plan.heartbeat.interval_s))
        killed_at = fail(active)
        at_kill = _ha.lease(url, pair.plan.name, pair.instance)  # the failed active cannot renew any more
        load_at_kill = os.getloadavg()[0]
        others_at_kill = len(other_spark_jvms(pair))
        promoted, first = watch_takeover(conn, standby, epoch, timeout_s, poll_s=0.02, instance=instance)
        if promoted is None or first is None:
            raise RuntimeError(f"no take-over by {standby} within {timeout_s}s: {_ha.lease(url, pair.plan.name, pair.instance)}\n"
                               f"{pair.log_tail(standby)}")
        lease_after = _ha.lease(url, pair.plan.name, pair.instance)
        live = None
        deadline = time.monotonic() + 30
        while live is None and time.monotonic() < deadline:  # the first live batch after the held outputs
            live = _poll(conn, "SELECT min(published_at) AS published_at FROM publish_log WHERE instance_id = %s "
                               "AND epoch = %s AND batch_id > %s HAVING count(*) > 0",
                         (instance, epoch, first["batch_id"]))
            time.sleep(0.1)
    finally:
        conn.close()
    if killed:
        pair.wait_group_gone(active)
    return {
        "killed": active, "promoted": standby, "epoch": epoch,
        "detection_s": round(promoted["happened_at"].timestamp() - killed_at, 3),
        "first_publish_s": round(first["seen_at"] - killed_at, 3),
        "first_publish_txn_start_s": round(first["published_at"].timestamp() - killed_at, 3),
        "lease_left_at_kill_s": round(at_kill["expires_at"].timestamp() - killed_at, 3),
        "first_live_batch_s": round(live["published_at"].timestamp() - killed_at, 3)
        if live and live["published_at"] else None,
        "previous_node": promoted["previous_node"], "lease_holder_after": lease_after["holder"],
        "load_average_1m_at_kill": round(load_at_kill, 2), "other_spark_jvms_at_kill": others_at_kill,
    }


def hot_failovers(runs: int, rate: int, progress: Progress, label: str = "hot",
                  configure: Callable[[Path], object] | None = None) -> dict:
    """``runs`` kill -9 failovers of the trades pair under ``rate`` events/s, then every output checked.
    ``configure``: a change of the private project's ``conf/`` first (bench/nats.py: the stream over NATS)."""
    task = progress.add_task(f"{label} failover: starting node-a ACTIVE + node-b PASSIVE", total=runs + 2)
    with private_project(label) as project:
        if configure is not None:
            configure(project.root / "conf")
        cluster = load_cluster()
        plan = load_plan("trades", cluster)
        pair = _ha.Pair(cluster, plan, project.root / "dist" / "tandem.zip", project.groups)
        writer = _ha.start_writer(cluster, rate=rate, seed=11)
        try:
            pair.start_pair("node-a", "node-b")
            pair.wait_caught_up("node-b")
            _ha.wait_for(lambda: pair.first_publish("node-a", 1), 120, "node-a to publish")
            progress.advance(task)
            active, standby = "node-a", "node-b"
            results = []
            for run in range(1, runs + 1):
                progress.update(task, description=f"{label} failover {run}/{runs}: kill -9 {active}")
                results.append(one_failover(pair, active, standby))
                r = results[-1]
                progress.console.log(f"run {run}: kill -9 {active} → PROMOTED {standby} {r['detection_s']:.2f}s, "
                                     f"first output {r['first_publish_s']:.2f}s")
                if run < runs:  # the killed node rejoins as the hot standby of the next run
                    progress.update(task, description=f"{label} failover {run}/{runs}: relaunching {active} as PASSIVE")
                    pair.launch(active, "PASSIVE")
                    pair.wait_running(active)
                    pair.wait_caught_up(active)
                progress.advance(task)
                active, standby = standby, active
            progress.update(task, description=f"{label} failover: checking the outputs against every event written")
            events, problems = _check_outputs(writer, cluster, pair.url)
            progress.advance(task)
            kinds = [(e["kind"], e["node"], e["epoch"]) for e in _ha.failover_events(pair.url)]
        finally:
            writer.stopping.set()
    return {"runs": results, "events_written": len(events), "outputs_exact": not problems,
            "output_problems": problems[:10], "failover_events": kinds}


def _check_outputs(writer: _ha.TradeWriter, cluster, url: str) -> tuple[list, list[str]]:
    """Stop the writer, wait until every event it wrote is published, compare every output with the
    test harness's own aggregation (Delta is appended right after PostgreSQL: a minute of grace)."""
    events = writer.stop()
    _ha.wait_for(lambda: _ha.published_total(url) >= len(events), 180, "every event to be published")
    deadline = time.monotonic() + 60
    while (problems := _ha.mismatches(cluster, events)) and time.monotonic() < deadline:
        time.sleep(2)
    return events, problems


# ------------------------------------------------------------------------------------------------
# Warm failover runs: the standby node runs nothing; the supervisor starts the plan there


WARM_TARGET_MEDIAN_S, WARM_TARGET_MAX_S = 20.0, 30.0
"""Warm failover on separate hosts, failure → first output of the new ACTIVE (issue 28 §2)."""
PLAN_MAX_FILES_PER_TRIGGER = yaml.safe_load((ROOT / "conf" / "plans" / "trades.yaml").read_text())[
    "streams"]["trades"]["max_files_per_trigger"]


def warm_failovers(runs: int, rate: int, progress: Progress, network: HostNetwork | None = None,
                   server_url: str = SERVER_URL, files_per_trigger: int | None = None) -> dict:
    """kill -9 the active; the WARM standby (its Spark session built, no query) takes the expired lease by
    itself, copies a cut of the dead active's checkpoint over its own and starts its queries. A
    supervision loop (what the Airflow sensor + DAG do) polls the instance's health every 0.5 s and, on
    DEAD, reconciles: it waits for the take-over, then launches the dead node again as the next WARM
    standby (the reconcile returns once it runs, so every run starts with a warm standby ready).

    With ``network`` the nodes are hosts: the failure is a crash of the active's host, and the
    supervisor launches each node on its own host. ``files_per_trigger`` caps the landing files of a
    micro-batch (the plan's ``max_files_per_trigger``), so the new instance's first batch does not
    take the whole backlog of the outage at once."""
    from tandem.supervisor.reconcile import Supervisor

    task = progress.add_task("warm failover: starting node-a ACTIVE", total=runs + 2)
    overrides: dict = {"ha": {"standby": "warm"}}
    if files_per_trigger:
        overrides["streams"] = {"trades": {"max_files_per_trigger": files_per_trigger}}
    with private_project("warm", overrides, server_url) as project:
        cluster = load_cluster()
        plan = load_plan("trades", cluster)
        url = project.database_url
        supervisor = Supervisor(cluster, plan, launched_by="bench/failover.py", py_files=project.root / "dist" /
                                "tandem.zip", running_timeout_s=600,
                                node_host=None if network is None else CliOnHosts(network, "trades"))
        writer = _ha.start_writer(cluster, rate=rate, seed=13)
        results = []
        try:
            report = supervisor.reconcile("shard-1", cause="bench bootstrap")
            _remember_groups(url, project)
            assert report.converged, report.lines()
            active = _ha.lease(url)["holder"]
            _ha.wait_for(lambda: _ha.publish_log(url, active), 180, f"{active} to publish")
            progress.advance(task)
            for run in range(1, runs + 1):
                standby = "node-b" if active == "node-a" else "node-a"
                progress.update(task, description=f"warm failover {run}/{runs}: kill -9 {active}")
                crash = None if network is None else (lambda node: crash_host(network, node))
                results.append(one_warm_failover(supervisor, project, active, standby, fail=crash))
                r = results[-1]
                progress.console.log(f"warm run {run}: kill -9 {active} → DEAD {r['detection_s']:.2f}s, "
                                     f"{standby} PROMOTED {r['promoted_s']:.2f}s, first output {r['first_publish_s']:.2f}s")
                progress.advance(task)
                active = standby
                _ha.wait_for(lambda: (_ha.latest_watermark(url, active) or datetime.min.replace(tzinfo=UTC)).timestamp()
                             > time.time() - 25, 300, f"{active} to catch up")
            progress.update(task, description="warm failover: checking the outputs against every event written")
            events = writer.stop()
            _ha.wait_for(lambda: _ha.published_total(url) >= len(events), 180, "every event to be published")
            deadline = time.monotonic() + 60
            while (problems := _ha.mismatches(cluster, events)) and time.monotonic() < deadline:
                time.sleep(2)
            progress.advance(task)
            kinds = [(e["kind"], e["node"], e["epoch"]) for e in _ha.failover_events(url)
                     if e["kind"] in ("PROMOTED", "DEMOTED", "RELEASED")]
        finally:
            writer.stopping.set()
            _remember_groups(url, project)
            supervisor.close()
    return {"runs": results, "events_written": len(events), "outputs_exact": not problems,
            "output_problems": problems[:10], "failover_events": kinds}


def _remember_groups(url: str, project: Project) -> None:
    """Process groups the supervisor launched, so leaving the project kills them."""
    for row in _ha.fetch(url, "SELECT submit_pid FROM plan_instances WHERE submit_pid IS NOT NULL"):
        if row["submit_pid"] not in project.groups:
            project.groups.append(row["submit_pid"])


def one_warm_failover(supervisor, project: Project, active: str, standby: str, timeout_s: float = 600,
                      fail: Callable[[str], float] | None = None) -> dict:
    """Fail the active (``fail(active)`` returns when; default: kill -9 of its process group), then supervise
    as the sensor and the DAG do, and time the warm take-over."""
    import threading

    url = project.database_url
    before = _ha.lease(url)
    assert before["holder"] == active, before
    epoch = before["epoch"] + 1
    pgid = _ha.instance_row(url, active)["submit_pid"]
    time.sleep(random.uniform(0, 1.0))
    if fail is None:
        killed_at = time.time()
        os.killpg(pgid, signal.SIGKILL)
    else:
        killed_at = fail(active)
    load_at_kill = os.getloadavg()[0]
    dead_at = None
    deadline = time.monotonic() + 60
    while dead_at is None and time.monotonic() < deadline:  # the sensor's job: poll health
        if supervisor.observe("shard-1").view.health(active).state == "DEAD":
            dead_at = time.time()
        else:
            time.sleep(0.5)
    if dead_at is None:
        raise RuntimeError(f"{active} was not seen DEAD within 60 s of kill -9")
    outcome: dict = {}

    def reconcile() -> None:
        try:
            outcome["report"] = supervisor.reconcile("shard-1", cause="bench: warm active killed")
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    worker = threading.Thread(target=reconcile, name="reconcile")
    worker.start()
    conn = psycopg2.connect(url, options="-c search_path=tandem -c TimeZone=UTC")
    conn.autocommit = True
    def reconcile_failed() -> None:
        if "error" in outcome:
            raise RuntimeError(f"reconcile failed: {outcome['error']!r}")

    try:
        promoted, first = watch_takeover(conn, standby, epoch, timeout_s, poll_s=0.05, check=reconcile_failed)
    finally:
        conn.close()
        worker.join(timeout=timeout_s)
        _remember_groups(url, project)
    if promoted is None or first is None:
        raise RuntimeError(f"no warm take-over by {standby}: {outcome}")
    resynced = _ha.fetch(url, "SELECT min(happened_at) AS at FROM failover_events WHERE kind = 'RESYNC' AND node = %s "
                              "AND happened_at > to_timestamp(%s)", (standby, killed_at))[0]["at"]
    report = outcome.get("report")
    return {
        "killed": active, "promoted": standby, "epoch": epoch,
        "detection_s": round(dead_at - killed_at, 3),
        "promoted_s": round(promoted["happened_at"].timestamp() - killed_at, 3),
        "resynced_s": round(resynced.timestamp() - killed_at, 3) if resynced else None,
        "first_publish_s": round(first["seen_at"] - killed_at, 3),
        "first_publish_txn_start_s": round(first["published_at"].timestamp() - killed_at, 3),
        "steps": [s.line() for s in report.steps] if report else None,
        "load_average_1m_at_kill": round(load_at_kill, 2),
    }


# ------------------------------------------------------------------------------------------------
# Steady-state cost of a hot standby


def write_input(directory: Path, events: int, files: int, symbols: int, seed: int = 5) -> None:
    """Pre-written input: ``files`` JSON-lines files, event times increasing, a day before now."""
    rng = random.Random(seed)
    names = [f"S{i:03d}" for i in range(symbols)]
    start_ms = int(time.time() * 1000) - 86_400_000
    per_file = events // files
    directory.mkdir(parents=True, exist_ok=True)
    stamp = time.time_ns() - files * 1_000_000_000
    for f in range(files):
        lines = []
        for i in range(per_file):
            n = f * per_file + i
            lines.append(json.dumps({"symbol": rng.choice(names), "price": round(rng.uniform(1, 500), 2),
                                     "quantity": rng.randint(1, 1000), "timestamp": start_ms + n * 3}))
        path = directory / f"events-{f:05d}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, ns=(stamp + f * 1_000_000_000,) * 2)


def _submit(cluster, node: str, role: str, log: Path, network: HostNetwork | None = None) -> subprocess.Popen:
    argv = ["spark-submit", "--master", cluster.node(node).spark_master, "--properties-file",
            str(cluster.spark_defaults), "--py-files", str(Path(os.environ["TANDEM_CONF_DIR"]).parent / "dist" / "tandem.zip"),
            "--driver-memory", cluster.node(node).driver_memory or "1g", "--name", f"tandem-bench:{node}",
            str(ROOT / "jobs" / "run_plan.py"), "--plan", "trades", "--node", node, "--instance", "shard-1",
            "--role", role, "--available-now"]
    if network is not None:  # the exec chain (ip netns exec, unshare, taskset, sh) keeps the PID: it is spark-submit's
        return network.popen(HOST_OF[node], argv, log, env={**child_environment(cluster), "SPARK_LOCAL_IP": "127.0.0.1"},
                             cwd=ROOT)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as output:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                env=child_environment(cluster), cwd=ROOT, start_new_session=True)


def _throughput(url: str, node: str) -> dict:
    rows = _ha.fetch(url, "SELECT input_rows, batch_duration_ms, recorded_at FROM heartbeats "
                          "WHERE instance_id = %s AND query_name = 'aggregates' AND input_rows > 0 ORDER BY batch_id",
                     (f"trades/shard-1/{node}",))
    if not rows:
        return {"events": 0, "seconds": None, "events_per_s": None, "batches": 0}
    first_start = rows[0]["recorded_at"].timestamp() - rows[0]["batch_duration_ms"] / 1000
    seconds = rows[-1]["recorded_at"].timestamp() - first_start
    events = sum(r["input_rows"] for r in rows)
    return {"events": events, "seconds": round(seconds, 2), "events_per_s": round(events / seconds),
            "batches": len(rows)}


def ha_cost_run(template: Path, with_standby: bool, events: int, files_per_trigger: int,
                network: HostNetwork | None = None, server_url: str = SERVER_URL) -> dict:
    label = "pair" if with_standby else "alone"
    with private_project(f"cost_{label}", {"streams": {"trades": {"max_files_per_trigger": files_per_trigger}}},
                         server_url) as project:
        cluster = load_cluster()
        landing = landing_dir(cluster, "trades", 0)
        landing.mkdir(parents=True)
        for path in sorted(template.iterdir()):
            os.link(path, landing / path.name)  # same inode: same content and modification time
        # node-a holds the lease before anything starts, so the standby cannot take it first.
        with Database(project.database_url) as db:
            migrate(db)
            db.run(lambda cur: cur.execute(
                "INSERT INTO leases (plan, instance, holder, epoch, ttl_s, expires_at) "
                "VALUES ('trades', 'shard-1', 'node-a', 0, 3, now() + interval '1 hour')"))
        logs = project.root / "logs"
        processes = {"node-a": _submit(cluster, "node-a", "ACTIVE", logs / "node-a.log", network)}
        if with_standby:
            processes["node-b"] = _submit(cluster, "node-b", "PASSIVE", logs / "node-b.log", network)
        project.groups.extend(p.pid for p in processes.values())
        codes = {node: p.wait(timeout=1800) for node, p in processes.items()}
        if any(codes.values()):
            raise RuntimeError(f"{label}: exit codes {codes}; see {logs}:\n" +
                               (logs / "node-a.log").read_text(errors="replace")[-3000:])
        result = {node: _throughput(project.database_url, node) for node in processes}
        kinds = [e["kind"] for e in _ha.failover_events(project.database_url)]
        total = _ha.published_total(project.database_url)
    return {"active": result["node-a"], "standby": result.get("node-b"), "published_events": total,
            "complete": total == events, "failover_events": kinds}


def ha_cost(pairs: int, events: int, files: int, files_per_trigger: int, progress: Progress,
            network: HostNetwork | None = None, server_url: str = SERVER_URL) -> dict:
    template = Path(tempfile.mkdtemp(prefix="tandem-failover-input-"))
    task = progress.add_task("HA cost: writing the input", total=2 * pairs)
    try:
        write_input(template, events, files, symbols=50)
        alone, paired = [], []
        for run in range(pairs):
            for with_standby in ((False, True) if run % 2 == 0 else (True, False)):
                label = "ACTIVE + hot PASSIVE" if with_standby else "ACTIVE alone"
                progress.update(task, description=f"HA cost {run + 1}/{pairs}: {label}")
                result = ha_cost_run(template, with_standby, events - events % files, files_per_trigger, network,
                                     server_url)
                (paired if with_standby else alone).append(result)
                progress.console.log(f"{label}: {result['active']['events_per_s']} events/s "
                                     f"({result['active']['seconds']} s, complete: {result['complete']})")
                progress.advance(task)
    finally:
        shutil.rmtree(template, ignore_errors=True)
    alone_rate = statistics.median(r["active"]["events_per_s"] for r in alone)
    paired_rate = statistics.median(r["active"]["events_per_s"] for r in paired)
    return {
        "ratio": round(paired_rate / alone_rate, 3),
        "alone_events_per_s": alone_rate, "with_hot_standby_events_per_s": paired_rate,
        "alone": alone, "with_hot_standby": paired,
        "input": {"events": events - events % files, "files": files, "max_files_per_trigger": files_per_trigger,
                  "symbols": 50, "trigger": "availableNow"},
        "method": "the same pre-written files (hard links), fresh checkpoints, Delta tables and database per run; "
                  "node-a ACTIVE with --available-now, alone or with node-b PASSIVE (also --available-now) started "
                  "at the same moment over the same files; events/s of the ACTIVE = input rows / time from the start "
                  "of its first batch to the end of its last (progress heartbeats); median over the runs",
        "caveat": "both nodes are local spark-submit drivers on the same 2-core machine, so the ratio is dominated "
                  "by the standby competing for the same CPUs; on separate machines the active only pays for the "
                  "lease renewals and the publish-log position the standby reads" if network is None else
                  f"each node on its own host (network namespace) pinned to its own CPU ({network.cpus}); "
                  "PostgreSQL on the control host, unpinned (it shares both CPUs)",
    }


# ------------------------------------------------------------------------------------------------
# Multi-host mode: each node on its own host (a network namespace) pinned to its own CPU

MULTI_HOST_CPUS = {"host-a": "0", "host-b": "1"}  # the control host (PostgreSQL) is not pinned


def crash_host(network: HostNetwork, node: str) -> float:
    """Every process of the node's host killed at once; returns when it started."""
    crashed_at = time.time()
    network.crash(HOST_OF[node])
    return crashed_at


def isolate_host(network: HostNetwork, node: str) -> float:
    """The node's host cut off from every other host (its processes run on); returns when."""
    isolated_at = time.time()
    network.isolate(HOST_OF[node])
    return isolated_at


def multi_host_hot(network: HostNetwork, server_url: str, runs: int, rate: int, progress: Progress) -> dict:
    """Hot standby on separate hosts: ``runs`` host crashes and ``runs`` partitions of the active's host,
    alternately. A crashed node is launched again on its host; a cut-off node is reconnected once the
    standby has taken over and publishes, demotes itself, and stays as the standby. Each run starts
    with the standby level with the active."""
    task = progress.add_task("multi-host hot failover: starting node-a ACTIVE + node-b PASSIVE", total=2 * runs + 2)
    results: dict[str, list[dict]] = {"crash": [], "partition": []}
    with private_project("mh_hot", server_url=server_url) as project:
        cluster = load_cluster()
        plan = load_plan("trades", cluster)
        pair = HostPair(cluster, plan, project.root / "dist" / "tandem.zip", project.groups, network=network)
        writer = _ha.start_writer(cluster, rate=rate, seed=17)
        try:
            pair.start_pair("node-a", "node-b")
            pair.wait_level("node-b", "node-a")
            _ha.wait_for(lambda: pair.first_publish("node-a", 1), 120, "node-a to publish")
            progress.advance(task)
            active, standby = "node-a", "node-b"
            for run in range(2 * runs):
                kind = ("crash", "partition")[run % 2]
                progress.update(task, description=f"multi-host hot failover {run + 1}/{2 * runs}: {kind} of "
                                                  f"{HOST_OF[active]}")
                since = _ha.db_now(pair.url)
                fail = (lambda node: crash_host(network, node)) if kind == "crash" else (
                    lambda node: isolate_host(network, node))
                try:
                    result = one_failover(pair, active, standby, fail=fail)
                finally:
                    network.reconnect(HOST_OF[active])
                results[kind].append({"failure": kind, **result})
                progress.console.log(f"{kind} of {HOST_OF[active]} ({active}) → PROMOTED {standby} "
                                     f"{result['detection_s']:.2f}s, first output {result['first_publish_s']:.2f}s")
                if kind == "crash":  # the host is back: its node starts there again, as the standby
                    pair.launch(active, "PASSIVE")
                    pair.wait_running(active)
                else:  # reconnected: it finds its epoch gone and demotes itself
                    _ha.wait_for(lambda: [e for e in _ha.failover_events(pair.url, since=since)
                                          if e["kind"] == "DEMOTED" and e["node"] == active], 120,
                                 f"the reconnected {active} to demote itself", detail=lambda: pair.log_tail(active))
                pair.wait_level(active, standby)
                progress.advance(task)
                active, standby = standby, active
            progress.update(task, description="multi-host hot failover: checking the outputs against every event")
            events, problems = _check_outputs(writer, cluster, pair.url)
            progress.advance(task)
            split = _ha.split_brain(pair.url)
        finally:
            writer.stopping.set()
    return {**results, "events_written": len(events), "outputs_exact": not problems,
            "output_problems": problems[:10], "split_brain": split}


def multi_host(args: argparse.Namespace, progress: Progress) -> dict:
    """Every multi-host measurement, on hosts made of network namespaces (``tests/support/_hosts.py``)."""
    root = Path(tempfile.mkdtemp(prefix="tandem-failover-hosts-"))
    try:
        with hosts_with_postgres(root, list(HOST_OF.values()), MULTI_HOST_CPUS) as (network, _server, url):
            hot = multi_host_hot(network, url, args.runs, args.rate, progress) if args.runs else None
            warm = warm_failovers(args.warm_runs, args.rate, progress, network, url,
                                  args.warm_files_per_trigger) if args.warm_runs else None
            cost = ha_cost(args.ha_cost_pairs, args.ha_cost_events, args.ha_cost_files,
                           args.ha_cost_files_per_trigger, progress, network, url) if args.ha_cost_pairs else None
            cpus = dict(network.cpus)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    first_publish = lambda runs: summary([r["first_publish_s"] for r in runs])  # noqa: E731
    return {
        "settings": {"hosts": {"control": "PostgreSQL (unpinned)", **{h: f"{n}, CPU {cpus[h]}" for n, h in
                                                                        HOST_OF.items()}},
                     "network": "one network namespace per host, veth pairs into a bridge; a partition is the "
                                "host's link to the bridge set down",
                     "input_rate_events_per_s": args.rate},
        "hot": {**first_publish(hot["crash"]), "target_s": 5.0,
                "meets_target": max(r["first_publish_s"] for r in hot["crash"]) <= 5.0,
                "failure": "every process of the active's host killed at once"} if hot else None,
        "partition": {**first_publish(hot["partition"]), "target_s": 5.0,
                      "meets_target": max(r["first_publish_s"] for r in hot["partition"]) <= 5.0,
                      "failure": "the active's host cut off from every other host (its processes run on)"}
        if hot else None,
        "warm": {**first_publish(warm["runs"]), "target_s": WARM_TARGET_MEDIAN_S, "target_max_s": WARM_TARGET_MAX_S,
                 "meets_target": (statistics.median(r["first_publish_s"] for r in warm["runs"]) <= WARM_TARGET_MEDIAN_S
                                  and max(r["first_publish_s"] for r in warm["runs"]) <= WARM_TARGET_MAX_S),
                 "failure": "every process of the active's host killed at once; the WARM standby on the other "
                            "node's host (Spark session built, no query) takes the lease, cuts the checkpoint and "
                            "starts the queries",
                 "promoted": summary([r["promoted_s"] for r in warm["runs"]]),
                 "resynced": summary([r["resynced_s"] for r in warm["runs"] if r.get("resynced_s") is not None]),
                 "max_files_per_trigger": args.warm_files_per_trigger or PLAN_MAX_FILES_PER_TRIGGER,
                 "runs_detail": warm["runs"]} if warm else None,
        "ha_cost_ratio": cost["ratio"] if cost else None,
        "ha_cost": cost,
        "runs": hot["crash"] + hot["partition"] if hot else None,
        "correctness": {"hot": {k: hot[k] for k in ("events_written", "outputs_exact", "output_problems",
                                                     "split_brain")} if hot else None,
                        "warm": {k: warm[k] for k in ("events_written", "outputs_exact", "output_problems")}
                        if warm else None},
    }


# ------------------------------------------------------------------------------------------------
# Machine and report


def machine_info() -> dict:
    def first_line(path: str, prefix: str) -> str | None:
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return None

    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    pg = _ha.fetch(_with_database(SERVER_URL, "postgres"), "SHOW server_version")[0]["server_version"]
    others = other_spark_jvms()
    memory = first_line("/proc/meminfo", "MemTotal")
    return {
        "hostname": platform.node(), "os": platform.platform(), "cpu_model": first_line("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(), "memory_gib": round(int(memory.split()[0]) / 1024 / 1024, 1) if memory else None,
        "python": platform.python_version(), "pyspark": pyspark.__version__, "java": java[0] if java else None,
        "postgresql": pg, "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "other_spark_jvms_at_start": len(others),
    }


def summary(values: list[float]) -> dict:
    return {"median_s": round(statistics.median(values), 3), "max_s": round(max(values), 3),
            "min_s": round(min(values), 3), "runs": values}


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:  # noqa: BLE001 - informational
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="hot failovers (kill -9 of the active), at least 5")
    parser.add_argument("--warm-runs", type=int, default=5, help="warm failovers (0: skip), at least 5 otherwise")
    parser.add_argument("--rate", type=int, default=200, help="input events per second during the failovers")
    parser.add_argument("--warm-files-per-trigger", type=int, default=None,
                        help="warm runs: the plan's max_files_per_trigger (default: the plan's own, 1000)")
    parser.add_argument("--ha-cost-pairs", type=int, default=2, help="alone/with-standby pairs (0: skip)")
    parser.add_argument("--ha-cost-events", type=int, default=300_000)
    parser.add_argument("--ha-cost-files", type=int, default=300)
    parser.add_argument("--ha-cost-files-per-trigger", type=int, default=10)
    parser.add_argument("--output", type=Path, default=BENCH / "results" / "failover.json")
    parser.add_argument("--trial", action="store_true", help="allow fewer runs (to try the harness, not a result)")
    parser.add_argument("--multi-host", action="store_true",
                        help="nodes on hosts made of network namespaces, each pinned to its own CPU (needs root): "
                             "host crash, partition, warm and HA cost, written under the `multi_host` key")
    args = parser.parse_args(argv)
    if not args.trial and (0 < args.runs < 5 or (args.runs == 0 and not args.multi_host) or 0 < args.warm_runs < 5):
        parser.error("--runs and --warm-runs must be at least 5 (--warm-runs 0 skips warm mode; with --multi-host, "
                     "--runs 0 skips the hot runs and keeps the previous run's figures)")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    for name in ("tandem", "airflow", "py4j"):  # the launcher logs every spark-submit it builds
        logging.getLogger(name).setLevel(logging.WARNING)

    started = datetime.now(UTC)
    machine = machine_info()
    if args.multi_host:
        return write_multi_host(args, argv, started, machine)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        hot = hot_failovers(args.runs, args.rate, progress)
        warm = warm_failovers(args.warm_runs, args.rate, progress,
                              files_per_trigger=args.warm_files_per_trigger) if args.warm_runs else None
        cost = ha_cost(args.ha_cost_pairs, args.ha_cost_events, args.ha_cost_files, args.ha_cost_files_per_trigger,
                       progress) if args.ha_cost_pairs else None

    cluster_plan = yaml.safe_load((ROOT / "conf" / "plans" / "trades.yaml").read_text())
    runs = hot["runs"]
    result = {
        "benchmark": "failover",
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "command": " ".join(["python", "bench/failover.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine,
        "settings": {
            "plan": "trades", "instance": "shard-1", "nodes": ["node-a", "node-b"], "standby": "hot",
            "heartbeat_interval_s": cluster_plan["heartbeat"]["interval"],
            "max_missed": cluster_plan["heartbeat"]["max_missed"],
            "lease_ttl": "heartbeat interval × max_missed",
            "trigger_interval": "1 second", "watermark": cluster_plan["watermark"],
            "input_rate_events_per_s": args.rate, "input_files_per_s": 2, "spark_master": "local[2] per node",
            "kill": "SIGKILL to the active's whole process group (spark-submit JVM + Python driver)",
            "kill_phase": "a uniformly random fraction of a heartbeat interval after the previous run settled",
        },
        "definitions": {
            "hot": "kill -9 of the active → first publish_log row of the new active at the new epoch visible to a "
                   "reader polling every 20 ms (its held outputs, published in one fenced transaction)",
            "detection": "hot: kill -9 of the active → the standby's PROMOTED event (lease taken with epoch + 1); "
                         "warm: kill -9 → the supervisor's health evaluation (polled every 0.5 s, as the sensor's "
                         "trigger does) says DEAD",
            "warm": "kill -9 of the active → first publish_log row of the instance the supervisor started on the other "
                    "node from a cut of the dead active's checkpoint (supervision loop in the benchmark process, "
                    "the same Supervisor.reconcile the Airflow DAG runs; no scheduler latency included)",
            "warm.promoted": "kill -9 → PROMOTED event of the started instance (it takes the expired lease at start)",
            "first_publish_txn_start_s": "start of that publishing transaction (publish_log.published_at)",
            "first_live_batch_s": "the first live micro-batch the new active published after its held outputs",
            "lease_left_at_kill_s": "how long the lease the dead active had renewed was still valid at the kill",
        },
        "hot": {**summary([r["first_publish_s"] for r in runs]), "target_s": 5.0,
                "meets_target": max(r["first_publish_s"] for r in runs) <= 5.0},
        "detection": {**summary([r["detection_s"] for r in runs]),
                      "warm": summary([r["detection_s"] for r in warm["runs"]]) if warm else None},
        "warm": {**summary([r["first_publish_s"] for r in warm["runs"]]), "target_s": 30.0,
                 "meets_target": max(r["first_publish_s"] for r in warm["runs"]) <= 30.0,
                 "promoted": summary([r["promoted_s"] for r in warm["runs"]]),
                 "runs_detail": warm["runs"]} if warm else None,
        "runs": runs,
        "correctness": {
            "hot": {"events_written": hot["events_written"], "outputs_exact": hot["outputs_exact"],
                    "problems": hot["output_problems"], "failover_events": hot["failover_events"]},
            "warm": {"events_written": warm["events_written"], "outputs_exact": warm["outputs_exact"],
                     "problems": warm["output_problems"], "failover_events": warm["failover_events"]} if warm else None,
        },
        "ha_cost": cost,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, default=str) + "\n")

    table = Table(title="failover: kill -9 of the active → …")
    for column in ("", "median s", "max s", "min s"):
        table.add_column(column)
    rows = [("hot detection", result["detection"]), ("hot", result["hot"])]
    if warm:
        rows += [("warm detection", result["detection"]["warm"]), ("warm", result["warm"])]
    for label, values in rows:
        table.add_row(label, *(f"{values[k]:.2f}" for k in ("median_s", "max_s", "min_s")))
    console.print(table)
    if cost:
        console.print(f"HA cost: {cost['with_hot_standby_events_per_s']} vs {cost['alone_events_per_s']} events/s "
                      f"alone → ratio {cost['ratio']}")
    exact = hot["outputs_exact"] and (warm is None or warm["outputs_exact"])
    console.print(f"outputs exact after every failover: {exact}; written to {args.output}")
    return 0 if exact else 1


def keep_unmeasured(measured: dict, previous: dict) -> dict:
    """The parts this run skipped (``--runs 0``: hot and partition; ``--warm-runs 0``; ``--ha-cost-pairs 0``) as the
    previous run measured them, each marked with that run's commit (pure)."""
    kept = dict(measured)
    parts = {"hot": ("hot", "partition", "runs"), "warm": ("warm",), "ha_cost": ("ha_cost", "ha_cost_ratio")}
    for part, keys in parts.items():
        if measured.get(keys[0]) is None and previous.get(keys[0]) is not None:
            for key in keys:
                value = previous.get(key)
                kept[key] = ({**value, "kept_from": previous.get("git_commit")} if isinstance(value, dict) else value)
            if part in ("hot", "warm"):
                kept["correctness"] = {**kept["correctness"], part: (previous.get("correctness") or {}).get(part)}
    return kept


def write_multi_host(args: argparse.Namespace, argv: list[str] | None, started: datetime, machine: dict) -> int:
    """Run :func:`multi_host` and store it under ``multi_host`` in the results, keeping the other keys."""
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console) as progress:
        measured = multi_host(args, progress)
    result = json.loads(args.output.read_text()) if args.output.exists() else {"benchmark": "failover"}
    measured = keep_unmeasured(measured, result.get("multi_host") or {})
    result["multi_host"] = {
        "started_at": started.isoformat(timespec="seconds"), "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "command": " ".join(["python", "bench/failover.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine, **measured}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, default=str) + "\n")
    table = Table(title="multi-host failover: failure of the active's host → first output of the new active")
    for column in ("", "median s", "max s", "min s"):
        table.add_column(column)
    for label in ("hot", "partition", "warm"):
        if measured[label]:
            table.add_row(label, *(f"{measured[label][k]:.2f}" for k in ("median_s", "max_s", "min_s")))
    console.print(table)
    if measured["ha_cost"]:
        cost = measured["ha_cost"]
        console.print(f"HA cost on separate CPUs: {cost['with_hot_standby_events_per_s']} vs "
                      f"{cost['alone_events_per_s']} events/s alone → ratio {cost['ratio']}")
    correctness = measured["correctness"]
    exact = (correctness["hot"] is None or (correctness["hot"]["outputs_exact"] and not correctness["hot"]["split_brain"])
             ) and (correctness["warm"] is None or correctness["warm"]["outputs_exact"])
    console.print(f"outputs exact, no split brain: {exact}; written to {args.output} (multi_host)")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
