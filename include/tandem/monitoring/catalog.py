"""Every metric ``tandem exporter`` serves: its name, type, help and labels (the one list the exporter, the docs'
table, the alert rules' test and the Grafana dashboard's test read).

Names follow Prometheus' conventions: the ``tandem_`` prefix, base units in the name (``_seconds``, ``_bytes``),
``_total`` for counters, ``_info`` for a constant 1 whose labels carry the value. Labels are bounded: plans,
instances, nodes, outputs and queries are declared in the plans' files; roles, health states, lease states, causes,
reason classes, jobs and results are the fixed sets below; a version is one of the few a plan runs at once. No
label ever names a key, a batch or a file. A plan's instance is the label ``plan_instance``: ``instance`` (and
``job``) are the labels Prometheus gives every target.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tandem.names import ROLES as NAMED_ROLES

ROLES = (*NAMED_ROLES, "NONE")
"""A node's role (``NONE``: its instance does not run)."""
HEALTH_STATES = ("HEALTHY", "STARTING", "DEAD", "FAILED", "STALLED", "STOPPED", "BLOCKED", "MISSING")
LEASE_STATES = ("held", "stopped", "released", "expired", "free")
UPGRADE_STATES = ("VERIFYING", "HANDED_OVER", "FINISHED", "ROLLED_BACK", "FAILED")
FAILOVER_CAUSES = ("takeover", "handover", "restore")
"""``takeover``: a standby took the lease its holder stopped renewing or gave up (a crash, a freeze, a partition, a
failed instance); ``handover``: an operator moved it (``failover_now``, a drain, an upgrade, a rollback);
``restore``: a restore started the instance on another node."""
SNAPSHOT_RESULTS = ("GOOD", "BAD")
JOB_RESULTS = ("SUCCESS", "FAILURE")


@dataclass(frozen=True)
class Metric:
    name: str
    type: Literal["gauge", "counter"]
    help: str
    labels: tuple[str, ...] = ()


PLAN, INSTANCE, NODE = ("plan",), ("plan", "plan_instance"), ("plan", "plan_instance", "node")
METRICS: tuple[Metric, ...] = (
    Metric("tandem_up", "gauge", "1 when the exporter read the coordination database in this scrape, else 0"),
    Metric("tandem_scrape_duration_seconds", "gauge", "how long the exporter took to read this scrape's figures"),
    Metric("tandem_plan_loaded", "gauge", "1 when the plan's files load, 0 when they do not (its DAGs are not "
                                          "defined: `tandem config check` says why)", PLAN),
    Metric("tandem_plan_info", "gauge", "the version the plan's files define now (1)", ("plan", "version")),
    Metric("tandem_failover_budget_seconds", "gauge", "how long an instance may be without an ACTIVE before it is "
                                                      "an incident: twice the lease ttl, plus the standby's start", PLAN),
    Metric("tandem_snapshot_interval_seconds", "gauge", "the plan's snapshot.interval", PLAN),
    Metric("tandem_instance_active", "gauge", "1 while a node holds the instance's lease (it is ACTIVE), else 0",
           INSTANCE),
    Metric("tandem_instance_vacant_seconds", "gauge", "seconds the instance has been without an ACTIVE although "
                                                      "nobody stopped it (its lease expired or was released); 0 "
                                                      "while one is ACTIVE, or after a clean stop", INSTANCE),
    Metric("tandem_lease_state", "gauge", "1 for the lease's state: held, stopped, released, expired, free",
           INSTANCE + ("state",)),
    Metric("tandem_lease_epoch", "gauge", "the lease's epoch (+1 on every change of its holder)", INSTANCE),
    Metric("tandem_lease_expires_in_seconds", "gauge", "seconds until the lease expires (negative: expired)",
           INSTANCE),
    Metric("tandem_node_role", "gauge", "1 for the role the node's instance has now (NONE: it does not run)",
           NODE + ("role",)),
    Metric("tandem_node_health", "gauge", "1 for the health the supervisor sees (HEALTHY, STARTING, DEAD, FAILED, "
                                          "STALLED, STOPPED, BLOCKED, MISSING)", NODE + ("health",)),
    Metric("tandem_node_drained", "gauge", "1 while an operator has drained the node of the instance", NODE),
    Metric("tandem_node_heartbeat_age_seconds", "gauge", "seconds since the driver's last liveness beat", NODE),
    Metric("tandem_node_last_batch_age_seconds", "gauge", "seconds since the node's last micro-batch", NODE),
    Metric("tandem_node_event_time_lag_seconds", "gauge", "seconds the newest event-time watermark is behind the "
                                                          "clock", NODE),
    Metric("tandem_node_input_waiting_seconds", "gauge", "age of the oldest input file no batch has read yet",
           NODE),
    Metric("tandem_node_relay_failing", "gauge", "1 while publishing the plan's events to NATS fails on the node",
           NODE),
    Metric("tandem_node_version_info", "gauge", "the plan's version the node's instance was launched with (1)",
           NODE + ("version",)),
    Metric("tandem_upgrade_state", "gauge", "1 for the state of the instance's upgrade under way or its last one",
           INSTANCE + ("state",)),
    Metric("tandem_failovers_total", "counter", "changes of the ACTIVE node, by cause: takeover, handover, restore",
           INSTANCE + ("cause",)),
    Metric("tandem_published_rows_total", "counter", "rows the instance's ACTIVE published to the output",
           INSTANCE + ("output",)),
    Metric("tandem_quarantine_rows", "gauge", "input lines (and refused rows) the plan's quarantine output (whatever "
                                              "its name) holds, by the class of their first reason",
           INSTANCE + ("output", "reason")),
    Metric("tandem_query_input_rows_per_second", "gauge", "the query's input rate in its newest batch (Spark's "
                                                          "progress)", NODE + ("query",)),
    Metric("tandem_query_processed_rows_per_second", "gauge", "the query's processing rate in its newest batch",
           NODE + ("query",)),
    Metric("tandem_query_batch_duration_seconds", "gauge", "how long the query's newest batch took",
           NODE + ("query",)),
    Metric("tandem_query_state_rows", "gauge", "rows in the query's state stores after its newest batch",
           NODE + ("query",)),
    Metric("tandem_query_state_memory_bytes", "gauge", "memory the query's state stores used after its newest "
                                                       "batch", NODE + ("query",)),
    Metric("tandem_snapshot_last_good_age_seconds", "gauge", "seconds since the instance's newest GOOD snapshot "
                                                             "completed", INSTANCE),
    Metric("tandem_snapshot_last_result", "gauge", "1 for the result of the instance's newest completed snapshot "
                                                   "(GOOD, BAD)", INSTANCE + ("status",)),
    Metric("tandem_relay_pending_events", "gauge", "events of the output PostgreSQL holds after the last one its "
                                                   "relay stored in the NATS stream", ("plan", "output")),
    Metric("tandem_relay_stream_sequence", "gauge", "the stream sequence of the output's last relayed event",
           ("plan", "output")),
    Metric("tandem_relay_idle_seconds", "gauge", "seconds since the output's relay last stored an event",
           ("plan", "output")),
    Metric("tandem_job_runs_total", "counter", "finished runs of the plan's batch jobs (reconcile, backfill, "
                                               "landing_retention, delta_upkeep, postgres_retention), by result",
           ("plan", "job", "result")),
    Metric("tandem_job_last_success", "gauge", "1 when the job's newest finished run succeeded, 0 when it failed",
           ("plan", "job")),
    Metric("tandem_job_last_duration_seconds", "gauge", "how long the job's newest finished run took",
           ("plan", "job")),
    Metric("tandem_job_last_finished_age_seconds", "gauge", "seconds since the job's newest run finished",
           ("plan", "job")),
)
BY_NAME = {metric.name: metric for metric in METRICS}

