"""Reset a plan: remove everything it keeps, so that its next run starts from nothing (``tandem plan reset``).

Purpose
    For experiments: run a plan, change it (a measure, a stream's partitions, a group's parallelism: a launch
    refuses a plan whose checkpoints were built from another shape), and run it again from scratch. Nothing of
    the former runs may meet the next one: no checkpoint, no published position, no output row, no snapshot.

How it works
    Under the plan's lock (:func:`tandem.store.locks.plan_lock`: never beside a restore, a backfill, retention,
    snapshot pruning or Delta upkeep of the plan), each instance's supervision lock (no supervisor acts on it
    meanwhile) and each of its nodes' launch locks (no launch starts meanwhile):

    1. refuse (:class:`~tandem.errors.PlanRunning`) while any instance of the plan runs (:func:`running_reasons`):
       a node holds its lease, or its driver is alive (its process on this host, a fresh liveness beat, a launch
       still starting);
    2. delete the JetStream streams the plan's outputs publish to (their relays start again from nothing);
    3. delete each declared output's rows in PostgreSQL, as its kind says
       (:meth:`tandem.outputs.base.OutputKind.reset`), and the plan's rows of the coordination tables
       (:data:`tandem.store.plan_rows.PLAN_TABLES`: instances, progress, published positions, leases, events,
       the snapshot catalog, backfills, retention horizons); then record one ``RESET`` event per instance;
    4. remove the plan's folders under the storage root (:func:`tandem.layout.plan_dirs`): every node's
       checkpoints with the plan's shape records beside them, the Delta tables (outputs, partials, quarantine,
       state export), the snapshot cuts and the backfills' scratch space.

    Each step finds what is there: a reset interrupted half-way is finished by running it again.

What it does not do
    It keeps the plan's input (``landing/`` and ``retained/`` files, the JetStream streams it reads: they are a
    stream's, and other plans may read them): the next run reads what is still there again. It keeps the drivers'
    logs, and the PostgreSQL rows of outputs the plan no longer declares. It does not stop anything: stop the
    instances first (``tandem stop``), and pause the plan's supervision DAG, or its supervisor starts the plan
    again at once.
"""

from __future__ import annotations

import getpass
import logging
import os
import shutil
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import PlanRunning
from tandem.layout import plan_dirs, under_root
from tandem.outputs import kind_of
from tandem.sources import source_of
from tandem.store.db import Database
from tandem.store.leases import record_event
from tandem.store.locks import advisory_locks, plan_lock
from tandem.store.migrations import migrate
from tandem.store.plan_rows import count_plan_rows, delete_plan_rows, instances_and_leases
from tandem.store.registry import InstanceKey
from tandem.supervisor.launch_decision import ACTIVE_STATUSES
from tandem.supervisor.processes import instance_process_alive, recorded_on_this_host
from tandem.supervisor.reconcile import instance_lock

log = logging.getLogger(__name__)
RESET_EVENT = "RESET"
"""The event each instance of a reset plan gets (the only row of the plan left in PostgreSQL)."""


def running_reasons(instances: Iterable[Mapping[str, Any]], leases: Iterable[Mapping[str, Any]], *,
                    heartbeat_timeout_s: float, launch_timeout_s: float) -> list[str]:
    """Why the plan counts as running, a line each; ``[]``: nothing of it runs (pure).

    ``leases``: the plan's lease rows (``instance``, ``holder``, ``epoch``, ``valid``, ``left_s``). ``instances``:
    its instance rows (``instance_id``, ``status``, ``host``, ``beat_age_s``, ``launched_age_s``), each with
    ``recorded_here`` (its PIDs are this host's) and ``process_alive`` (its verified ``spark-submit`` or driver
    runs here). An instance runs while its status says so and: its process is alive here, or its driver beat
    within the heartbeat timeout (a driver started by hand, or on another host: a killed one counts until its beat
    is that old), or, launched on another host, it is still within the launch timeout.
    """
    reasons = [f"{lease['holder']} holds the lease of instance {lease['instance']} (epoch {lease['epoch']}, "
               f"{max(0.0, float(lease['left_s'])):.1f}s left)" for lease in leases if lease["valid"]]
    for row in instances:
        if row["status"] not in ACTIVE_STATUSES:
            continue
        beat, launched = row.get("beat_age_s"), row.get("launched_age_s")
        what = f"{row['instance_id']} is {row['status']}"
        if row.get("process_alive"):
            reasons.append(f"{what}: its process runs on this host")
        elif beat is not None and beat < heartbeat_timeout_s:
            reasons.append(f"{what}: its driver beat {beat:.1f}s ago on host {row.get('host') or '?'}")
        elif (row["status"] == "LAUNCHING" and not row.get("recorded_here") and launched is not None
              and launched < launch_timeout_s):
            reasons.append(f"{what}: launched {launched:.1f}s ago on host {row.get('host') or '?'}")
    return reasons


def plan_running(db: Database, plan: PlanConfig) -> list[str]:
    """:func:`running_reasons` for ``plan`` as PostgreSQL and this host's processes say now."""
    instances, leases = instances_and_leases(db, plan.name)
    for row in instances:
        key = InstanceKey(row["plan"], row["instance"], row["node"])
        row["recorded_here"] = recorded_on_this_host(row)
        row["process_alive"] = row["status"] in ACTIVE_STATUSES and instance_process_alive(row, key)
    return running_reasons(instances, leases, heartbeat_timeout_s=plan.heartbeat.timeout_s,
                           launch_timeout_s=plan.ha.launch_timeout_s)


def refusal(plan: PlanConfig, reasons: list[str]) -> PlanRunning:
    """The error a reset of a running plan raises, naming what runs and what to do (pure)."""
    return PlanRunning(running_message(plan, reasons, "reset"))


def running_message(plan: PlanConfig, reasons: list[str], not_done: str) -> str:
    """Why ``plan`` was not ``not_done`` (reset, cut over): what of it runs, and what to do (pure)."""
    return (f"plan {plan.name} is running, not {not_done}: {'; '.join(reasons)}. Stop its instances first "
            f"(tandem stop {plan.name} <instance> <node>; pause its supervision DAG, or it starts them again), and "
            "wait for their leases to expire")


def folder_size(path: Path) -> tuple[int, int]:
    """``(files, bytes)`` under ``path`` (``(0, 0)`` when it does not exist)."""
    files = size = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                size += os.lstat(os.path.join(root, name)).st_size
            except FileNotFoundError:
                continue
            files += 1
    return files, size


def _bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def output_streams(plan: PlanConfig) -> dict[str, str]:
    """The streams the plan's outputs publish to: stream -> output (pure)."""
    return {name: output for name in plan.streams if (output := plan.publisher_of(name)) is not None
            and plan.streams[name].rules.published_to}


@dataclass
class ResetReport:
    """What a reset removed (or, before it, would remove), a line each."""

    plan: str
    removed: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        if not self.removed:
            return [f"plan {self.plan}: nothing kept: nothing to remove"]
        return [f"plan {self.plan}:", *(f"  {line}" for line in self.removed)]


def inventory(cluster: ClusterConfig, plan: PlanConfig, db: Database) -> ResetReport:
    """What a reset of ``plan`` would remove now (read-only; its outputs' rows are counted by the reset itself)."""
    report = ResetReport(plan.name)
    for name, path in plan_dirs(cluster, plan.name).items():
        files, size = folder_size(path)
        if files or path.exists():
            report.removed.append(f"{path}: {files} files, {_bytes(size)}")
    for stream, output in output_streams(plan).items():
        report.removed.append(f"NATS stream {stream} (output {output} publishes to it)")
    report.removed += [f"PostgreSQL {table}: {n} rows" for table, n in count_plan_rows(db, plan.name).items()]
    report.removed.append(f"PostgreSQL rows of outputs {', '.join(plan.outputs)}")
    return report


@contextmanager
def while_stopped(cluster: ClusterConfig, plan: PlanConfig, db: Database, what: str,
                  refused: Callable[[list[str]], Exception]) -> Iterator[None]:
    """Hold what keeps ``plan`` still while ``what`` changes what it keeps (a reset, a cut-over): the plan's lock
    (:func:`tandem.store.locks.plan_lock`: no restore, backfill, retention, snapshot pruning or Delta upkeep of it
    meanwhile), each instance's supervision lock (no supervisor acts on it) and each of its nodes' launch locks (no
    launch starts); then check, under them, that nothing of the plan runs (:func:`plan_running`).

    Raises:
        whatever ``refused(reasons)`` gives, when something of the plan runs (nothing was changed).
    """
    with plan_lock(cluster.database_url, plan.name, what):
        recorded, _ = instances_and_leases(db, plan.name)
        instances = sorted(set(plan.instances) | {row["instance"] for row in recorded})
        key_ids = sorted({InstanceKey(plan.name, s, n).id for s in instances for n in plan.nodes}
                         | {row["instance_id"] for row in recorded})
        # a supervisor holds its instance's supervision lock, then takes a launch lock: the same order here
        supervision = [instance_lock(cluster.database_url, plan.name, s) for s in instances]  # not taken: named
        with advisory_locks(cluster.database_url, [*((lock.scope, lock.name) for lock in supervision),
                                                   *(("launch", key) for key in key_ids)]):
            reasons = plan_running(db, plan)
            if reasons:
                raise refused(reasons)
            yield


def reset_plan(cluster: ClusterConfig, plan: PlanConfig, *, requested_by: str | None = None) -> ResetReport:
    """Remove everything ``plan`` keeps (see the module's docstring); what was removed.

    Raises:
        PlanRunning: an instance of the plan runs (nothing is removed).
    """
    requested_by = requested_by or f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"
    report = ResetReport(plan.name)
    with Database(cluster.database_url, "tandem-reset") as db:
        migrate(db)
        with while_stopped(cluster, plan, db, "a reset", lambda reasons: refusal(plan, reasons)):
            _delete_output_streams(cluster, plan, report)
            for output in plan.outputs:
                for line in kind_of(plan, output).reset(db, plan, output):
                    report.removed.append(f"output {output}: {line}")
            report.removed += [f"PostgreSQL {table}: {n} rows" for table, n in delete_plan_rows(db, plan.name).items()]
            _mark_reset(db, plan, requested_by)
            for path in plan_dirs(cluster, plan.name).values():
                if path.exists():
                    files, size = folder_size(path)
                    shutil.rmtree(under_root(cluster, path))
                    report.removed.append(f"{path}: {files} files, {_bytes(size)}")
    log.info("plan %s reset by %s: %s", plan.name, requested_by, "; ".join(report.removed))
    return report


def _mark_reset(db: Database, plan: PlanConfig, requested_by: str) -> None:
    def work(cursor) -> None:
        for instance in plan.instances:
            record_event(cursor, plan.name, instance, RESET_EVENT,
                         f"plan reset by {requested_by}: its next run starts from nothing")

    db.run(work)


def _delete_output_streams(cluster: ClusterConfig, plan: PlanConfig, report: ResetReport) -> None:
    """Delete what the plan's outputs published to its streams, as each stream's source kind does."""
    for stream in output_streams(plan):
        report.removed += source_of(plan, stream).drop_published(cluster, plan, stream)
