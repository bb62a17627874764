"""Delete landing files nothing can need any more (processed by every instance and inside every kept snapshot), or
move them out of the streams' folders while a backfill may still want them.

Purpose
    Input files must not pile up either. Once the snapshot DAG has pruned old snapshots, a landing
    file that every instance's checkpoint has processed for good, and that every kept GOOD
    snapshot's cut had processed too, is needed by no restart and no restore: it is deleted.

How it works
    :func:`clean_landing` gathers the facts, for every plan that reads the stream, and acts on the
    pure decision
    :func:`tandem.snapshots.retention.decide_landing_retention`: the files of the partition's landing
    directory; per query checkpoint of every node of the instance, the files its committed batches
    read of this stream (:func:`tandem.snapshots.retention.files_of_stream` over every source of
    the query: a pizza-shop query reads orders and deliveries); per query cut of every kept GOOD
    snapshot, the same. The checkpoints of :func:`tandem.snapshots.retention.guarding_nodes` count (the
    lease holder's, those of nodes that beat or whose checkpoint changed lately): a node left behind
    launches after a re-sync that replaces its checkpoint. A query (or cut) that does not read the stream,
    or reads no files (not a file source), is left out of both.

    A file nothing but a backfill or reconcile needs any more (younger than a reader plan's
    ``maintenance.keep_input``) moves to ``retained/<stream>/<partition>/`` instead of being deleted, and is
    deleted there once older than ``keep_input``: a file source lists its whole folder every trigger, so a
    landing folder that kept a day of processed input would make every micro-batch pay for the day.

    The maintenance DAG (``tandem_<plan>_maintenance``) runs it hourly; ``tandem snapshots <plan>
    --prune`` runs it after pruning.

What it does not do
    It does not prune snapshots (the snapshot DAG does; the cuts that guard files are the GOOD
    snapshots in the catalog) and never deletes hidden or temporary files.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from tandem.checkpoints import CheckpointError, last_changed, processed_files_by_source, query_dirs
from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import ConfigError
from tandem.layout import checkpoint_dir, input_mtimes, landing_dir, retained_dir, retained_twin, under_root
from tandem.names import WARM
from tandem.snapshots.retention import LandingDecision, decide_landing_retention, files_of_stream, guarding_nodes
from tandem.sources import source_of
from tandem.store import snapshots as catalog
from tandem.store.db import Database
from tandem.store.leases import read_lease
from tandem.store.locks import plan_lock
from tandem.store.registry import get_instance, instance_id

log = logging.getLogger(__name__)


SourceLogs = dict[Path, list[frozenset[str] | None] | None]
"""Per query checkpoint (or cut) read in one retention run: what each of its sources processed."""

Guards = dict[tuple[str, str], list[str]]
"""Per (plan, instance) read in one retention run: the nodes whose checkpoints guard landing files."""


def _read(query_dir: Path, stream_dir: Path, logs: SourceLogs) -> frozenset[str] | None:
    """What the query (or cut) at ``query_dir`` processed of the stream; ``None``: it does not read it.

    ``logs`` keeps each checkpoint's source logs once per run: a query is a possible reader of every
    partition of every stream its instance reads.
    """
    if query_dir not in logs:
        try:
            logs[query_dir] = processed_files_by_source(query_dir)
        except CheckpointError as exc:  # not a readable file-source log: it guards nothing here
            log.info("landing retention: %s: %s", query_dir, exc)
            logs[query_dir] = None
    by_source = logs[query_dir]
    return None if by_source is None else files_of_stream(by_source, str(stream_dir))


def clean_landing(cluster: ClusterConfig, plans: list[PlanConfig], stream: str, partition: int,
                  db: Database, logs: SourceLogs | None = None, guards: Guards | None = None) -> LandingDecision:
    """Delete the files of ``landing/<stream>/<partition>`` that every reader has processed for good.

    ``plans``: every plan (the readers are the instances of every plan whose share of ``stream``
    includes the partition: several groups, and several plans, may read it).

    Raises:
        PathOutsideRoot: a kept snapshot's recorded cut lies outside the storage root; nothing is deleted.
    """
    logs = {} if logs is None else logs
    guards = {} if guards is None else guards
    directory = landing_dir(cluster, stream, partition)
    landed = input_mtimes(directory)  # one listing for the decision and the ages (hidden and _ files: not input)
    files = [str(path) for path in landed]
    processed_by: dict[str, frozenset[str]] = {}
    kept_cuts: dict[str, frozenset[str]] = {}
    readers = [(plan, instance) for plan in plans if stream in plan.streams  # of a kind that reads landing files
               for instance in plan.instances
               if partition in source_of(plan, stream).landing_partitions(plan, instance, stream)]
    for plan, instance in readers:
        if (plan.name, instance) not in guards:  # once per run: an instance reads several partitions
            guards[plan.name, instance] = _guarding(cluster, plan, instance, db)
        for node in guards[plan.name, instance]:
            for query, query_dir in query_dirs(checkpoint_dir(cluster, plan.name, instance, node, "")).items():
                seen = _read(query_dir, directory.parent, logs)
                if seen is not None:
                    processed_by[f"{plan.name}/{instance}/{node}/{query}"] = seen
        for snapshot in catalog.list_snapshots(db, plan.name, instance=instance, statuses=(catalog.GOOD,)):
            for query in snapshot.query_batches:
                # a catalog row is data: a cut outside the root is refused (nothing of the instance is deleted)
                seen = _read(under_root(cluster, snapshot.checkpoint_path) / query, directory.parent, logs)
                if seen is not None:
                    kept_cuts[f"{snapshot.id}/{query}"] = seen
    keep_input = max((plan.maintenance.keep_input_s or 0.0 for plan, _ in readers), default=0.0)
    now = time.time()
    recent = [str(path) for path, mtime in landed.items() if now - mtime < keep_input] if keep_input else []
    decision = decide_landing_retention(files, processed_by, kept_cuts, recent)
    for path in decision.delete:
        Path(path).unlink(missing_ok=True)
    retained = retained_dir(cluster, stream, partition)
    if decision.retire:
        retained.mkdir(parents=True, exist_ok=True)
    for path in decision.retire:  # a rename keeps the file's modification time: its age stays its age
        try:
            os.replace(path, retained_twin(cluster, Path(path)))
        except FileNotFoundError:  # another retention run (the scheduled one beside a triggered one) moved it
            continue
    # each retained file was processed by every instance and every kept cut when it moved: only backfills want it
    expired = [path for path, mtime in input_mtimes(retained).items() if now - mtime >= keep_input]
    for path in expired:
        path.unlink(missing_ok=True)
    for line in decision.describe() + ([f"delete {len(expired)} retained file(s): older than "
                                        "maintenance.keep_input"] if expired else []):
        log.info("landing %s: %s", directory, line)
    return decision


def _guarding(cluster: ClusterConfig, plan: PlanConfig, instance: str, db: Database) -> list[str]:
    """The nodes of the instance whose checkpoints guard landing files (:func:`guarding_nodes` on what is read now)."""
    lease = read_lease(db, plan.name, instance)
    now = time.time()
    beats, changes = {}, {}
    for node in plan.nodes:
        row = get_instance(db, instance_id(plan.name, instance, node))
        if row and row["beat_age_s"] is not None and row["role"] != WARM:  # a WARM standby runs no query
            beats[node] = float(row["beat_age_s"])
        changed = last_changed(checkpoint_dir(cluster, plan.name, instance, node, ""))
        if changed is not None:
            changes[node] = now - changed
    guarding = guarding_nodes(plan.nodes, lease.holder if lease else None, beats, changes)
    for node in sorted(set(plan.nodes) - guarding):
        if node in changes:
            log.info("landing retention: %s/%s/%s left behind: not the lease holder, no beat for %s, checkpoint "
                     "unchanged for %.0f s (it launches again after a re-sync)", plan.name, instance, node,
                     f"{beats[node]:.0f} s" if node in beats else "ever", changes[node])
    return [node for node in plan.nodes if node in guarding]


def _every_plan(cluster: ClusterConfig, plan: PlanConfig) -> dict[str, PlanConfig]:
    """Every configured plan, or a :class:`ConfigError` naming the first other plan whose file does not load."""
    from tandem.config import load_plans_and_errors

    plans, broken = load_plans_and_errors(cluster)
    others = {name: error for name, error in broken.items() if name != plan.name}
    if others:
        name, error = next(iter(others.items()))
        more = f"; {len(others) - 1} more plan(s) broken: {', '.join(list(others)[1:])}" if len(others) > 1 else ""
        raise ConfigError(error.path, error.field, f"{error.problem} (plan {name} is broken: landing retention of "
                                                   f"{plan.name} deletes nothing while a plan that may read the same "
                                                   f"files cannot be read{more})")
    return plans


def clean_plan_landing(cluster: ClusterConfig, plan: PlanConfig, *, instance: str | None = None,
                       db: Database | None = None) -> dict[str, LandingDecision]:
    """:func:`clean_landing` for each partition ``plan`` reads (or one instance reads), by ``<stream>/<partition>``.

    Every configured plan is a possible reader: while another plan's file does not load, nothing is deleted
    (a :class:`~tandem.errors.ConfigError` naming that plan, its file and field).
    """
    with plan_lock(cluster.database_url, plan.name, "landing retention"):
        plans = list({**_every_plan(cluster, plan), plan.name: plan}.values())
        owned = db is None
        db = db or Database(cluster.database_url, "tandem-maintenance")
        try:
            instances = [plan.check_instance(instance)] if instance else list(plan.instances)
            partitions = sorted({(stream, p) for instance in instances for stream in plan.streams
                                 for p in source_of(plan, stream).landing_partitions(plan, instance, stream)})
            logs: SourceLogs = {}  # each checkpoint's source logs read once, whatever partitions it guards
            guards: Guards = {}
            return {f"{stream}/{p}": clean_landing(cluster, plans, stream, p, db, logs, guards)
                    for stream, p in partitions}
        finally:
            if owned:
                db.close()
