"""Sensors for Tandem: wait, in the triggerer, until a plan needs its supervisor."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue

from tandem.airflow.triggers import StreamHealthTrigger, health_finding
from tandem.config import load_cluster, load_plan
from tandem.store.db import Database


class StreamHealthSensor(BaseSensorOperator):
    """Watch a plan's instances; succeed with the evidence when an instance needs the supervisor.

    Pokes once (a failure may already be there); otherwise defers to
    :class:`~tandem.airflow.triggers.StreamHealthTrigger`, which polls PostgreSQL from the
    triggerer and fires on DEAD / FAILED / STALLED (or another due decision), or after
    ``max_watch`` with a ``quiet`` event. Returns the event (XCom ``return_value``).

    :param plan: plan name. Templated.
    :param max_watch: longest time one watch lasts (seconds or timedelta); the run then ends
        quietly and the next supervision run starts.
    :param poll_interval: seconds between two observations in the triggerer.
    :param cluster_config: path of ``cluster.yaml`` (default: from the environment).
    """

    template_fields = ("plan",)
    ui_color = "#fdf0d5"

    def __init__(self, *, plan: str, max_watch: float | timedelta = timedelta(hours=1), poll_interval: float = 1.0,
                 cluster_config: str | None = None, **kwargs: Any) -> None:
        max_watch_s = max_watch.total_seconds() if isinstance(max_watch, timedelta) else float(max_watch)
        kwargs.setdefault("timeout", max_watch_s + 600)
        super().__init__(**kwargs)
        self.plan = plan
        self.max_watch_s = max_watch_s
        self.poll_interval = poll_interval
        self.cluster_config = cluster_config

    def poke(self, context: Any) -> PokeReturnValue:
        cluster = load_cluster(Path(self.cluster_config) if self.cluster_config else None)
        plan = load_plan(self.plan, cluster)
        with Database(cluster.database_url, "tandem-sensor") as db:
            finding = health_finding(db, cluster, plan)
        return PokeReturnValue(is_done=finding is not None, xcom_value=finding)

    def execute(self, context: Any) -> dict[str, Any]:
        first = self.poke(context)
        if first.is_done:
            self.log.info("plan %s needs its supervisor now: %s", self.plan, first.xcom_value)
            return first.xcom_value
        self.log.info("plan %s is healthy; watching it from the triggerer for up to %gs", self.plan, self.max_watch_s)
        self.defer(
            trigger=StreamHealthTrigger(plan=self.plan, deadline=time.time() + self.max_watch_s,
                                        cluster_config=self.cluster_config, poll_interval_s=self.poll_interval),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> dict[str, Any]:
        event = event or {"status": "quiet", "plan": self.plan}
        if event.get("status") == "unhealthy":
            self.log.info("plan %s instance %s: %s on %s: %s", event["plan"], event["instance"], event["health"],
                          event["node"], event["evidence"])
            for decision in event.get("decisions", []):
                self.log.info("  due: %s", decision)
        else:
            self.log.info("plan %s stayed healthy for the whole watch", self.plan)
        return event
