"""Triggers that run in Airflow's triggerer: watch a plan's instances in PostgreSQL.

``StreamHealthTrigger`` polls the plan's heartbeats, liveness beats, leases and landing
directories (psycopg2 and file system reads run in a worker thread, never on the event loop)
and yields one event when an instance needs the supervisor: an instance is DEAD, FAILED or STALLED,
or another decision is due (a node that should run is down, a standby did not take an expired
lease). At its deadline it yields a ``quiet`` event, so every supervision run ends eventually.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from tandem.config import ClusterConfig, PlanConfig, load_cluster, load_plan
from tandem.errors import TandemError
from tandem.layout import InputMtimes
from tandem.store.db import Database


def health_finding(db: Database, cluster: ClusterConfig, plan: PlanConfig,
                   inputs: InputMtimes | None = None) -> dict[str, Any] | None:
    """The first instance of the plan that needs the supervisor, as a JSON-able event payload (or ``None``);
    ``inputs``: the landing folders as the previous polls saw them."""
    from tandem.supervisor.decisions import actionable, decide
    from tandem.supervisor.health import FAILING
    from tandem.supervisor.observe import observe_instance

    for instance in plan.instances:
        view = observe_instance(db, cluster, plan, instance, inputs).view
        actions = decide(view)
        if not actionable(actions):
            continue
        failing = [h for h in view.instances.values() if h.state in FAILING]
        acted_on = {getattr(a, "node", None) for a in actions}
        subject = (failing or [h for h in view.instances.values() if h.node in acted_on]
                   or list(view.instances.values()))[0]
        lease = view.lease
        return {
            "status": "unhealthy",
            "plan": plan.name,
            "instance": instance,
            "node": subject.node,
            "health": subject.state,
            "evidence": subject.evidence,
            "instances": {h.node: {"state": h.state, "role": h.role, "epoch": h.epoch, "evidence": h.evidence}
                          for h in view.instances.values()},
            "lease": None if lease is None else {"holder": lease.holder, "epoch": lease.epoch, "valid": lease.valid,
                                                 "expired_for_s": lease.expired_for_s},
            "decisions": [a.describe() for a in actions],
            "observed_at": datetime.now(timezone.utc).isoformat(),
        }
    return None


class StreamHealthTrigger(BaseTrigger):
    """Fire when an instance of ``plan`` needs the supervisor (DEAD / FAILED / STALLED, ...), or at ``deadline``.

    :param plan: the plan name.
    :param cluster_config: path of ``cluster.yaml`` (default: from the environment).
    :param deadline: epoch seconds at which to give up watching and yield a ``quiet`` event.
    :param poll_interval_s: seconds between two observations.
    """

    def __init__(self, plan: str, deadline: float, cluster_config: str | None = None,
                 poll_interval_s: float = 1.0) -> None:
        super().__init__()
        self.plan = plan
        self.deadline = float(deadline)
        self.cluster_config = cluster_config
        self.poll_interval_s = float(poll_interval_s)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return ("tandem.airflow.triggers.StreamHealthTrigger",
                {"plan": self.plan, "deadline": self.deadline, "cluster_config": self.cluster_config,
                 "poll_interval_s": self.poll_interval_s})

    def _load(self) -> tuple[ClusterConfig, PlanConfig]:
        cluster = load_cluster(Path(self.cluster_config) if self.cluster_config else None)
        return cluster, load_plan(self.plan, cluster)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        cluster, plan = await asyncio.to_thread(self._load)
        db = Database(cluster.database_url, "tandem-trigger")
        inputs = InputMtimes()
        polls = 0
        try:
            while True:
                polls += 1
                try:
                    finding = await asyncio.to_thread(health_finding, db, cluster, plan, inputs)
                except TandemError as exc:  # PostgreSQL restarting: keep watching
                    self.log.warning("observing plan %s failed (poll %d): %s", self.plan, polls, exc)
                    finding = None
                if finding is not None:
                    self.log.info("plan %s instance %s: %s on %s: %s", self.plan, finding["instance"], finding["health"],
                                  finding["node"], finding["evidence"])
                    yield TriggerEvent(finding)
                    return
                if time.time() >= self.deadline:
                    yield TriggerEvent({"status": "quiet", "plan": self.plan, "polls": polls,
                                        "observed_at": datetime.now(timezone.utc).isoformat()})
                    return
                await asyncio.sleep(min(self.poll_interval_s, max(0.0, self.deadline - time.time())))
        finally:
            await asyncio.to_thread(db.close)
