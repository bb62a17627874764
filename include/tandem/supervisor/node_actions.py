"""What a node's own host does for the supervisor: re-sync and (re)launch its instance, or stop it.

Purpose
    On several hosts, everything a node does happens on that node's host: the supervisor (on the
    control host) decides, and the node's host carries it out. :class:`NodeHost` is that division
    of labour: :class:`ThisHost` when every node runs on this host (the CLI, local runs), the node's
    Airflow queue otherwise (:class:`~tandem.airflow.node_launch.NodeQueue`, whose tasks call
    :func:`resync_then_launch` and :func:`~tandem.supervisor.stopping.stop_instance` on the host).

How it works
    A re-sync copies a consistent cut of ``resync_from``'s checkpoint over the node's own
    (:func:`~tandem.resync.resync_instance`, on the shared storage); a failed cut is
    recorded (``RESYNC_FAILED``) and the node starts from its own checkpoint, which is consistent
    too, only older. Then :func:`~tandem.supervisor.launcher.launch_instance` submits the driver
    (or finds it running). A relaunch (``replace``) first stops the node's instance *on its host*,
    so a driver that ignored its stop request, or hangs (``SIGSTOP``), is signalled there and never
    shares its checkpoint with the new one. A request carries a deadline: a task that a worker
    picks up after it (its host was down while the supervisor waited) refuses, because the
    supervisor has decided again since.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from tandem.config import ClusterConfig, PlanConfig
from tandem.resync import resync_recorded
from tandem.store.db import Database
from tandem.supervisor.launcher import LaunchRejected, LaunchedJob, launch_instance
from tandem.supervisor.stopping import StopResult, stop_instance

log = logging.getLogger(__name__)
REPLACE_STOP_TIMEOUT_S = 10.0  # the relaunched instance is being replaced: no need to wait for a clean stop


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


class NodeHost(Protocol):
    """Carries out the supervisor's launches and stops of a node's instance on the node's own host."""

    def launch(self, instance: str, node: str, role: str, resync_from: str | None) -> NodeLaunch:
        """Stop the node's instance if it runs, re-sync it from ``resync_from`` (when given), launch it in ``role``."""

    def stop(self, instance: str, node: str, timeout_s: float) -> StopResult:
        """Stop the node's instance; SIGKILL what is left after ``timeout_s``."""


@dataclass(frozen=True)
class ThisHost:
    """Every node's host is this one (the CLI, local runs, the tests without Airflow)."""

    cluster: ClusterConfig
    plan: PlanConfig
    launched_by: str
    py_files: Path | None = None
    logger: logging.Logger | logging.LoggerAdapter = log

    def launch(self, instance: str, node: str, role: str, resync_from: str | None) -> NodeLaunch:
        return resync_then_launch(self.cluster, self.plan, instance, node, role=role, resync_from=resync_from,
                                  replace=True, launched_by=self.launched_by, py_files=self.py_files,
                                  logger=self.logger)

    def stop(self, instance: str, node: str, timeout_s: float) -> StopResult:
        return stop_instance(self.cluster, self.plan, instance, node, timeout_s=timeout_s)


def expired(deadline: datetime | None, now: datetime) -> bool:
    """Whether a launch request with this deadline comes too late to be carried out (pure)."""
    return deadline is not None and now > deadline


def check_deadline(deadline: datetime | None, now: datetime, what: str) -> None:
    """Refuse a request picked up after its deadline (its host was down while the supervisor waited)."""
    if expired(deadline, now):
        raise LaunchRejected(f"{what}: the request expired at {deadline.isoformat()} (now {now.isoformat()}); "
                             "the supervisor has decided again since, nothing was done")


def resync_then_launch(cluster: ClusterConfig, plan: PlanConfig, instance: str, node: str, *, role: str,
                       resync_from: str | None = None, replace: bool = False,
                       trigger_interval: str | float | None = None, launched_by: str | None = None,
                       py_files: Path | None = None,
                       logger: logging.Logger | logging.LoggerAdapter | None = None) -> NodeLaunch:
    """Re-sync ``node``'s checkpoint from ``resync_from`` (when given), then launch it in ``role``.

    ``replace``: stop the node's instance here first (a relaunch); otherwise a live instance is
    found again and kept. A re-sync needs ``replace`` (or a stopped instance): nothing may use the
    checkpoint while it is replaced.
    """
    logger = logger or log
    if replace:
        stopped = stop_instance(cluster, plan, instance, node, timeout_s=REPLACE_STOP_TIMEOUT_S,
                                requested_by=launched_by)
        logger.info("before the launch of %s: %s (%s)", node, stopped.detail, stopped.status)
    cut = None
    if resync_from:
        with Database(cluster.database_url, "tandem-resync") as db:
            cut = resync_recorded(db, cluster, plan, instance, resync_from, node, logger)
    job = launch_instance(cluster, plan, instance, node, trigger_interval, role=role, launched_by=launched_by,
                          py_files=py_files)
    return NodeLaunch(job, cut)
