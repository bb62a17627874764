"""What a node's own host does when the supervisor relaunches it: re-sync its checkpoint, then launch.

Purpose
    On several hosts, everything a node does happens on that node's host: the supervisor (on the
    control host) decides, and the node's host carries it out. :func:`resync_then_launch` is that
    host's part of a launch; the supervisor calls it directly when every node is on its host, and
    the node's Airflow worker calls it (``tandem_<plan>_run``, :mod:`tandem.airflow.node_launch`)
    otherwise.

How it works
    A re-sync copies a consistent cut of ``resync_from``'s checkpoint over the node's own
    (:func:`~tandem.supervisor.resync.resync_instance`, on the shared storage); a failed cut is
    recorded (``RESYNC_FAILED``) and the node starts from its own checkpoint, which is consistent
    too, only older. Then :func:`~tandem.supervisor.launcher.launch_instance` submits the driver
    (or finds it running). A launch request carries a deadline: a task that a worker picks up
    after it (its host was down while the supervisor waited) refuses, because the supervisor has
    decided again since.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tandem.config import ClusterConfig, PlanConfig
from tandem.store.db import Database
from tandem.store.supervision import mark
from tandem.supervisor.launcher import LaunchedJob, LaunchRejected, launch_instance
from tandem.supervisor.resync import CheckpointError, resync_instance

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeLaunch:
    """A launch carried out on the node's host: the job, and the checkpoint cut it was re-synced to."""

    job: LaunchedJob
    cut: dict[str, dict[str, Any]] | None

    def data(self) -> dict[str, Any]:
        data: dict[str, Any] = {"submit_pid": self.job.submit_pid, "log_path": self.job.log_path,
                                "reused": self.job.reused}
        if self.cut is not None:
            data["cut"] = self.cut
        return data


LaunchOnNode = Callable[[str, str, str, "str | None"], NodeLaunch]
"""``(shard, node, role, resync_from) -> NodeLaunch``: re-sync and launch an instance on the node's own host
(:func:`resync_then_launch` here; inside Airflow through the node's queue, :class:`~tandem.airflow.node_launch.LaunchOnNodeQueue`)."""


def expired(deadline: datetime | None, now: datetime) -> bool:
    """Whether a launch request with this deadline comes too late to be carried out (pure)."""
    return deadline is not None and now > deadline


def check_deadline(deadline: datetime | None, now: datetime, what: str) -> None:
    """Refuse a request picked up after its deadline (its host was down while the supervisor waited)."""
    if expired(deadline, now):
        raise LaunchRejected(f"{what}: the request expired at {deadline.isoformat()} (now {now.isoformat()}); "
                             "the supervisor has decided again since, nothing was done")


def resync_then_launch(cluster: ClusterConfig, plan: PlanConfig, shard_id: str, node: str, *, role: str,
                       resync_from: str | None = None, trigger_interval: str | float | None = None,
                       launched_by: str | None = None, py_files: Path | None = None,
                       logger: logging.Logger | logging.LoggerAdapter | None = None) -> NodeLaunch:
    """Re-sync ``node``'s checkpoint from ``resync_from`` (when given), then launch it in ``role``.

    The caller makes sure the node's instance is stopped first: nothing may use the checkpoint
    while it is replaced.
    """
    logger = logger or log
    cut = None
    if resync_from:
        with Database(cluster.database_url, "tandem-resync") as db:
            try:
                cuts = resync_instance(cluster, plan, shard_id, resync_from, node)
            except CheckpointError as exc:
                logger.warning("re-sync of %s from %s failed, launching from its own checkpoint: %s",
                               node, resync_from, exc)
                mark(db, plan.name, shard_id, "RESYNC_FAILED", str(exc)[:2000], node=node, previous_node=resync_from)
            else:
                cut = {q: {"batch_id": c.batch_id, "files": c.files, "bytes": c.bytes} for q, c in cuts.items()}
                summary = ", ".join(f"{q} at batch {c.batch_id} ({c.files} files, {c.bytes} bytes)"
                                    if c.batch_id is not None else f"{q}: nothing committed"
                                    for q, c in cuts.items()) or "no checkpoint"
                mark(db, plan.name, shard_id, "RESYNC",
                     f"checkpoint cut of {resync_from} copied to {node}: {summary}",
                     node=node, previous_node=resync_from, detail=cut)
                logger.info("re-synced %s from %s: %s", node, resync_from, summary)
    job = launch_instance(cluster, plan, shard_id, node, trigger_interval, role=role, launched_by=launched_by,
                          py_files=py_files)
    return NodeLaunch(job, cut)
