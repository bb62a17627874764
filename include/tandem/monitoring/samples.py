"""The values of a scrape, from what the exporter read (pure): each function adds the samples of one reading.

A sample is a metric of :data:`tandem.monitoring.catalog.METRICS`, its label values in the catalog's order and a
number. Nothing here reads a database or a file: the exporter reads, these functions turn the readings into samples,
and the unit tests give them readings they wrote by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tandem.config import PlanConfig
from tandem.monitoring.catalog import (
    BY_NAME, FAILOVER_CAUSES, HEALTH_STATES, JOB_RESULTS, LEASE_STATES, ROLES, SNAPSHOT_RESULTS, UPGRADE_STATES,
)
from tandem.monitoring.reasons import REASON_CLASSES
from tandem.presenter.models import PlanStatus

STANDBY_START_S = {"hot": 0.0, "warm": 60.0}
"""How long a standby needs, once it holds the lease, before it publishes (a hot one runs already; a warm one starts
its queries from a checkpoint cut). A cold plan's is its ``ha.launch_timeout``."""


class Samples:
    """The samples of one scrape, by metric name: ``{labels: value}`` (a label set given twice keeps the last)."""

    def __init__(self) -> None:
        self.values: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in BY_NAME}

    def add(self, name: str, value: float | None, **labels: str) -> None:
        """Add one sample (nothing when ``value`` is None: the figure is not known)."""
        metric = BY_NAME[name]
        if set(labels) != set(metric.labels):
            raise ValueError(f"{name} takes the labels {metric.labels}, not {tuple(labels)}")
        if value is not None:
            self.values[name][tuple(str(labels[label]) for label in metric.labels)] = float(value)

    def one_hot(self, name: str, field: str, states: Iterable[str], current: str | None, **labels: str) -> None:
        """1 for ``current`` and 0 for every other state: an alert can match the state by its label."""
        for state in states:
            self.add(name, 1.0 if state == current else 0.0, **labels, **{field: state})


def failover_budget_s(plan: PlanConfig) -> float:
    """How long an instance of ``plan`` may be without an ACTIVE (pure): the lease's ttl until it expires, as long
    again for a BACKUP (it waits a ttl more), a trigger interval, and the standby's start (:data:`STANDBY_START_S`,
    a cold plan's launch timeout)."""
    start = STANDBY_START_S.get(plan.ha.standby, plan.ha.launch_timeout_s)
    return 2 * plan.heartbeat.timeout_s + plan.trigger_interval_s + start


def add_plan(samples: Samples, plan: PlanConfig, status: PlanStatus) -> None:
    """A plan's declarations and its status (as ``tandem status`` and the page show it)."""
    samples.add("tandem_plan_loaded", 1, plan=plan.name)
    samples.add("tandem_plan_info", 1, plan=plan.name, version=status.version)
    samples.add("tandem_failover_budget_seconds", failover_budget_s(plan), plan=plan.name)
    samples.add("tandem_snapshot_interval_seconds", plan.snapshot.interval_s, plan=plan.name)
    for instance in status.instances:
        at = {"plan": plan.name, "plan_instance": instance.instance}
        lease = instance.lease
        active = lease is not None and lease.state == "held"
        samples.add("tandem_instance_active", 1 if active else 0, **at)
        vacant = 0.0
        if lease is not None and lease.state in ("expired", "released") and lease.vacant_since is not None:
            vacant = max(0.0, (status.observed_at - lease.vacant_since).total_seconds())
        samples.add("tandem_instance_vacant_seconds", vacant, **at)
        samples.one_hot("tandem_lease_state", "state", LEASE_STATES, lease.state if lease else "free", **at)
        if lease is not None:
            samples.add("tandem_lease_epoch", lease.epoch, **at)
            samples.add("tandem_lease_expires_in_seconds", lease.expires_in_s, **at)
        if instance.upgrade is not None:
            samples.one_hot("tandem_upgrade_state", "state", UPGRADE_STATES, instance.upgrade.state, **at)
        for node in instance.nodes:
            on = {**at, "node": node.node}
            samples.one_hot("tandem_node_role", "role", ROLES, node.role or "NONE", **on)
            samples.one_hot("tandem_node_health", "health", HEALTH_STATES, node.health, **on)
            samples.add("tandem_node_drained", 1 if node.drained else 0, **on)
            samples.add("tandem_node_heartbeat_age_seconds", node.beat_age_s, **on)
            samples.add("tandem_node_last_batch_age_seconds", node.last_batch_age_s, **on)
            samples.add("tandem_node_event_time_lag_seconds", node.lag_s, **on)
            samples.add("tandem_node_input_waiting_seconds", node.waiting_input_s, **on)
            if node.status is not None:
                samples.add("tandem_node_relay_failing", 1 if node.relay_error else 0, **on)
            if node.version:
                samples.add("tandem_node_version_info", 1, **on, version=node.version)


def add_broken_plan(samples: Samples, name: str) -> None:
    samples.add("tandem_plan_loaded", 0, plan=name)


def failover_cause(kind: str) -> str:
    """The ``cause`` label of a role change event's kind (pure)."""
    return {"PROMOTED": "takeover", "HANDOVER": "handover", "RESTORED": "restore"}[kind]


def add_failovers(samples: Samples, totals: Mapping[tuple[str, ...], float],
                  instances: Iterable[tuple[str, str]]) -> None:
    """The failover counters (every cause of every declared instance, 0 when none happened, so that ``increase``
    sees the first one)."""
    for plan, instance in instances:
        for cause in FAILOVER_CAUSES:
            samples.add("tandem_failovers_total", totals.get((plan, instance, cause), 0.0), plan=plan,
                        plan_instance=instance, cause=cause)
    for (plan, instance, cause), value in totals.items():
        samples.add("tandem_failovers_total", value, plan=plan, plan_instance=instance, cause=cause)


def add_published(samples: Samples, totals: Mapping[tuple[str, ...], float]) -> None:
    for (plan, instance, output), value in totals.items():
        samples.add("tandem_published_rows_total", value, plan=plan, plan_instance=instance, output=output)


def add_quarantine(samples: Samples, plan: str, output: str, instances: Iterable[str],
                   counts: Mapping[tuple[str, str], int]) -> None:
    """Rows of the plan's quarantine table (its quarantine ``output``) by (instance, reason class); every class of
    every instance (0 when none) so that a rate starts from the first quarantined line."""
    for instance in instances:
        for reason in REASON_CLASSES:
            samples.add("tandem_quarantine_rows", counts.get((instance, reason), 0), plan=plan,
                        plan_instance=instance, output=output, reason=reason)


def add_engine(samples: Samples, rows: Iterable[Mapping[str, Any]]) -> None:
    """The engine's own figures: each query's newest batch as Spark's progress reported it."""
    for row in rows:
        on = {"plan": row["plan"], "plan_instance": row["instance"], "node": row["node"], "query": row["query_name"]}
        samples.add("tandem_query_input_rows_per_second", row["input_rows_per_s"], **on)
        samples.add("tandem_query_processed_rows_per_second", row["processed_rows_per_s"], **on)
        duration = row["batch_duration_ms"]
        samples.add("tandem_query_batch_duration_seconds", None if duration is None else duration / 1000, **on)
        samples.add("tandem_query_state_rows", row["state_rows"], **on)
        samples.add("tandem_query_state_memory_bytes", row["state_memory_bytes"], **on)


def add_snapshots(samples: Samples, rows: Iterable[Mapping[str, Any]]) -> None:
    for row in rows:
        at = {"plan": row["plan"], "plan_instance": row["instance"]}
        samples.add("tandem_snapshot_last_good_age_seconds", row["good_age_s"], **at)
        if row["last_status"]:
            samples.one_hot("tandem_snapshot_last_result", "status", SNAPSHOT_RESULTS, row["last_status"], **at)


def add_relays(samples: Samples, rows: Iterable[Mapping[str, Any]]) -> None:
    for row in rows:
        at = {"plan": row["plan"], "output": row["output"]}
        samples.add("tandem_relay_pending_events", row["pending"], **at)
        samples.add("tandem_relay_stream_sequence", row["stream_seq"], **at)
        samples.add("tandem_relay_idle_seconds", row["age_s"], **at)


def add_jobs(samples: Samples, counts: Iterable[Mapping[str, Any]], last: Iterable[Mapping[str, Any]]) -> None:
    counted = {(row["plan"], row["job"], row["result"]): row["runs"] for row in counts}
    for plan, job in {(plan, job) for plan, job, _ in counted}:
        for result in JOB_RESULTS:
            samples.add("tandem_job_runs_total", counted.get((plan, job, result), 0), plan=plan, job=job,
                        result=result)
    for row in last:
        at = {"plan": row["plan"], "job": row["job"]}
        samples.add("tandem_job_last_success", 1 if row["result"] == "SUCCESS" else 0, **at)
        samples.add("tandem_job_last_duration_seconds", row["duration_s"], **at)
        samples.add("tandem_job_last_finished_age_seconds", row["age_s"], **at)
