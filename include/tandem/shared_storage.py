"""Check that every node of a plan sees the same storage root (checkpoints, Delta tables, snapshots).

Nodes on separate hosts share one POSIX storage root (NFS or similar): a standby resumes from the
failed active's checkpoint, a re-sync copies one node's checkpoint over another's, a snapshot cut
on one host is restored on another. A host that mounted the wrong thing, or nothing, would start
from empty state and publish wrong outputs, so Tandem refuses to start there.

How it works
    The first node to start writes a random token into ``<storage_root>/.tandem-storage`` and
    records the same token in PostgreSQL (``storage_marker``), one check at a time (a transaction
    advisory lock). Every node, on its own host, reads
    the file and compares (:func:`storage_verdict`, pure), and records the result per node
    (``storage_checks``). A launch refuses a node whose own check fails, and a plan any of whose
    other nodes last failed its check (:func:`plan_storage_problems`, pure).
    On a Spark cluster the executors read checkpoints, landing files and Delta tables too: a small Spark job
    reads the marker on the executors registered when an instance starts (:func:`require_executor_storage`).
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import TandemError
from tandem.layout import make_private_dirs, prepare_storage_root
from tandem.store import storage_checks
from tandem.store.db import Database

MARKER_NAME = ".tandem-storage"
GUIDE = "every node must mount the same storage root (NFS or similar): README, 'Deploying on several hosts'"


class StorageNotShared(TandemError):
    """A node cannot see the plan's shared storage root."""


@dataclass(frozen=True)
class StorageVerdict:
    """What :func:`storage_verdict` decided: ``ok``, ``initialise`` (first node) or ``refuse``, and why."""

    action: str
    detail: str

    @property
    def ok(self) -> bool:
        return self.action != "refuse"


def storage_verdict(recorded: str | None, on_disk: str | None, marker: Path, recorded_root: str | None) -> StorageVerdict:
    """Compare the token PostgreSQL recorded with the one this host reads from the marker file (pure)."""
    if recorded is None and on_disk is None:
        return StorageVerdict("initialise", f"no marker yet: writing {marker}")
    if recorded is None:
        return StorageVerdict("initialise", f"{marker} exists but this database has no marker: recording it")
    if on_disk is None:
        return StorageVerdict("refuse", f"{marker} is missing on this host, but the storage root "
                                        f"{recorded_root} was already set up by another node: {GUIDE}")
    if on_disk != recorded:
        return StorageVerdict("refuse", f"{marker} on this host belongs to another storage (its token differs "
                                        f"from the one recorded for {recorded_root}): {GUIDE}")
    return StorageVerdict("ok", f"{marker} matches")


def plan_storage_problems(plan_nodes: Iterable[str], checks: Mapping[str, Mapping]) -> list[str]:
    """The plan's nodes whose latest check failed, each with its host and reason (pure)."""
    return [f"{node} (host {checks[node]['host']}): {checks[node]['detail']}"
            for node in plan_nodes if node in checks and not checks[node]["ok"]]


def _read_token(marker: Path) -> str | None:
    try:
        return marker.read_text().strip() or None
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageNotShared(f"cannot read {marker}: {exc}") from None


def _write_token(marker: Path, token: str) -> None:
    make_private_dirs(marker.parent)
    partial = marker.with_name(f"{marker.name}.{os.getpid()}.partial")
    partial.write_text(token + "\n")
    os.replace(partial, marker)


def check_storage(db: Database, cluster: ClusterConfig, node: str, host: str | None = None) -> StorageVerdict:
    """Check (on this host) that ``node`` sees the shared storage root; record the result.

    Raises:
        StorageNotShared: this host cannot see the storage root the other nodes use.
    """
    host = host or socket.gethostname()
    marker = cluster.storage_root / MARKER_NAME

    def work(cursor) -> StorageVerdict:
        # Two first launches at once both found no marker, both wrote a token file and one INSERT lost:
        # the file then held the loser's token and every later check refused. Checks take turns.
        storage_checks.lock_marker(cursor)
        row = storage_checks.read_marker(cursor)
        on_disk = _read_token(marker)
        verdict = storage_verdict(row["token"] if row else None, on_disk, marker, row and row["storage_root"])
        if verdict.action == "initialise":
            token = on_disk or secrets.token_hex(16)
            if on_disk is None:
                _write_token(marker, token)
            storage_checks.insert_marker(cursor, token, str(cluster.storage_root), f"{node}@{host}")
        storage_checks.record_check(cursor, node, host, verdict.ok, verdict.detail)
        return verdict

    verdict = db.run(work)
    if not verdict.ok:
        raise StorageNotShared(f"node {node} on host {host} cannot see the shared storage root "
                               f"{cluster.storage_root}: {verdict.detail}")
    return verdict


def require_shared_storage(db: Database, cluster: ClusterConfig, plan: PlanConfig, node: str) -> None:
    """Check ``node`` here, then refuse if any other node of the plan last failed its own check.

    Raises:
        StorageNotShared: naming every node that cannot see the storage root, with its host.
    """
    check_storage(db, cluster, node)

    problems = plan_storage_problems(plan.nodes, storage_checks.last_checks(db, plan.nodes))
    if problems:
        raise StorageNotShared(f"plan {plan.name} is not started: not every node sees the shared storage root "
                               f"{cluster.storage_root}: " + "; ".join(problems))
    prepare_storage_root(cluster)


def executor_problems(recorded: str, seen: Mapping[str, str | None], marker: Path, recorded_root: str) -> list[str]:
    """The executor hosts whose marker token is missing or another storage's, each with the reason (pure)."""
    return [f"executor host {host}: {verdict.detail}" for host, token in sorted(seen.items())
            if not (verdict := storage_verdict(recorded, token, marker, recorded_root)).ok]


def executor_tokens(spark, marker: Path) -> dict[str, str | None]:
    """What the marker file holds as each executor host reads it (a job of a few tasks per executor core)."""
    path = str(marker)

    def read(_: int) -> tuple[str, str | None]:
        import socket as host_socket

        try:
            with open(path) as handle:
                return host_socket.gethostname(), handle.read().strip() or None
        except OSError:
            return host_socket.gethostname(), None

    tasks = 4 * max(spark.sparkContext.defaultParallelism, 1)
    return dict(spark.sparkContext.parallelize(range(tasks), tasks).map(read).distinct().collect())


def require_executor_storage(db: Database, cluster: ClusterConfig, node: str, spark) -> None:
    """On a Spark cluster (not ``local``), refuse when an executor cannot see the storage root the marker names.

    Raises:
        StorageNotShared: naming each executor host that reads no marker, or another storage's.
    """
    if spark.sparkContext.master.startswith("local"):
        return
    row = db.run(storage_checks.read_marker)
    marker = cluster.storage_root / MARKER_NAME
    problems = executor_problems(row["token"], executor_tokens(spark, marker), marker, row["storage_root"])
    if problems:
        raise StorageNotShared(f"node {node}'s Spark cluster ({spark.sparkContext.master}) cannot see the shared "
                               f"storage root {cluster.storage_root} on every executor: " + "; ".join(problems))
