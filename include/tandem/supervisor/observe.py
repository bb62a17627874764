"""Observe one (plan, instance): read PostgreSQL, the landing directory and, for an instance quiet long enough to be
stalled, the input its sources hold that it has not read (the messages of its ``nats`` streams); evaluate health
(read-only).

The result feeds :func:`tandem.supervisor.decisions.decide` (the supervisor), the supervision
trigger (which fires when the decision has something to do) and ``tandem status``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tandem.checkpoints import committed_batch, query_dirs, source_offsets
from tandem.config import ClusterConfig, PlanConfig
from tandem.layout import InputMtimes, checkpoint_dir
from tandem.sources import landing_dirs, source_of
from tandem.store.db import Database
from tandem.store.supervision import InstanceRows, read_instance
from tandem.supervisor.decisions import LeaseView, InstanceView
from tandem.supervisor.health import NodeObservation, Thresholds, evaluate


@dataclass(frozen=True)
class InstanceObservation:
    """One observation of a (plan, instance): the view the decisions take, and what it was made from."""

    view: InstanceView
    observations: dict[str, NodeObservation]
    rows: InstanceRows


def thresholds(plan: PlanConfig) -> Thresholds:
    return Thresholds(heartbeat_timeout_s=plan.heartbeat.timeout_s, stall_timeout_s=plan.ha.stall_timeout_s,
                      launch_timeout_s=plan.ha.launch_timeout_s)


def progress_window_s(plan: PlanConfig) -> float:
    """How far back progress rows (and waiting input) are read: long enough to tell a stall, including one before a
    run's first micro-batch (judged by the launch timeout), short enough to stay cheap."""
    return 2 * max(plan.ha.stall_timeout_s, plan.ha.launch_timeout_s) + 60.0


def oldest_after(mtimes: list[float], after_epoch: float, now_epoch: float) -> float | None:
    """Age of the oldest file modified after ``after_epoch`` (``None`` when there is none)."""
    newer = [m for m in mtimes if m > after_epoch]
    return max(0.0, now_epoch - min(newer)) if newer else None


def unread_messages_since(cluster: ClusterConfig, plan: PlanConfig, instance: str, node: str) -> float | None:
    """When the oldest input of the instance's streams that ``node``'s queries have not read (by their last committed
    batch) was published, as its source kind finds it (:meth:`tandem.sources.base.SourceKind.unread_published`: the
    messages of ``nats`` streams), as a POSIX time; ``None`` when there is none (or the source does not answer)."""
    committed = [source_offsets(query_dir / "offsets" / str(batch))
                 for query_dir in query_dirs(checkpoint_dir(cluster, plan.name, instance, node)).values()
                 if (batch := committed_batch(query_dir)) is not None]  # a query without one: judged by its start
    return min((published for name in plan.streams
                for published in source_of(plan, name).unread_published(cluster, plan, instance, name, committed)),
               default=None)


UNREAD_RECHECK_S = 30.0
"""How long an answer of :func:`unread_messages_since` is reused while the node's last batch is the same: the oldest
unread message only changes when a batch reads it, and a poller observes each second."""
_unread: dict[tuple[str, str, str], tuple[float | None, float, float | None]] = {}


def _remembered_unread(cluster: ClusterConfig, plan: PlanConfig, instance: str, node: str,
                       batch_start: float | None) -> float | None:
    key = (plan.name, instance, node)
    known = _unread.get(key)
    if known is not None and known[0] == batch_start and time.monotonic() - known[1] < UNREAD_RECHECK_S:
        return known[2]
    unread = unread_messages_since(cluster, plan, instance, node)
    _unread[key] = (batch_start, time.monotonic(), unread)
    return unread


def observe_instance(db: Database, cluster: ClusterConfig, plan: PlanConfig, instance: str,
                  inputs: InputMtimes | None = None) -> InstanceObservation:
    """Read one (plan, instance) and evaluate every configured node's instance (``inputs``: what a poller remembers of
    the landing folders between observations)."""
    inputs = inputs or InputMtimes()
    window = progress_window_s(plan)
    rows = read_instance(db, plan.name, instance, progress_window_s=window, launch_window_s=plan.ha.launch_window_s)
    limits = thresholds(plan)
    mtimes: list[float] | None = None
    observations: dict[str, NodeObservation] = {}
    for node in plan.nodes:
        row = rows.instances.get(node)
        if row is None:
            observations[node] = NodeObservation(node, None)
            continue
        batch_start = rows.last_batch_start_epoch.get(node)
        waiting = None
        if row["status"] == "RUNNING":
            if mtimes is None:
                mtimes = [m for directory in landing_dirs(cluster, plan, instance)
                          for m in inputs.of(directory).values()]
            since = batch_start if batch_start is not None else max(row["started_epoch"] or 0.0, rows.now_epoch - window)
            waiting = oldest_after(mtimes, since, time.time())
            quiet_s = rows.now_epoch - (batch_start if batch_start is not None else (row["started_epoch"] or 0.0))
            if quiet_s >= limits.stall_timeout_s:  # only then can it be stalled: the messaging layer is asked then
                unread = _remembered_unread(cluster, plan, instance, node, batch_start)
                if unread is not None:
                    age = max(0.0, time.time() - unread)
                    waiting = age if waiting is None else max(waiting, age)
        observations[node] = NodeObservation(
            node=node, status=row["status"], role=row["role"], epoch=int(row["epoch"] or 0), error=row["error"],
            failure=row.get("failure"), failure_repeats=int(row.get("failure_repeats") or 0),
            beat_age_s=row["beat_age_s"], launched_age_s=row["launched_age_s"], started_age_s=row["started_age_s"],
            last_batch_age_s=None if batch_start is None else max(0.0, rows.now_epoch - batch_start),
            waiting_input_age_s=waiting, work_age_s=row.get("work_age_s"),
        )
    lease = None
    if rows.lease is not None:
        valid = bool(rows.lease["valid"]) and rows.lease["holder"] is not None
        lease = LeaseView(rows.lease["holder"], int(rows.lease["epoch"]), valid,
                          None if valid else max(0.0, float(rows.lease["expired_for_s"])))
    view = InstanceView(
        plan=plan.name, instance=instance, nodes=plan.nodes, standby=plan.ha.standby,
        lease_ttl_s=plan.heartbeat.timeout_s,
        instances={node: evaluate(obs, limits) for node, obs in observations.items()},
        lease=lease, drained=rows.drained, recent_launches=rows.recent_launches, max_launches=plan.ha.max_launches,
    )
    return InstanceObservation(view, observations, rows)

