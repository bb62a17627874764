"""What the presenter serves: the JSON shapes of its REST endpoints (and so of its OpenAPI description)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, Field, computed_field

Role = Literal["ACTIVE", "PASSIVE", "BACKUP", "WARM"]
Action = Literal["failover_now", "drain_node", "restart_node", "snapshot_now", "cutover", "upgrade", "finish_upgrade",
                 "rollback", "restore", "backfill"]


class GroupSummary(BaseModel):
    name: str
    parallel: int
    queries: list[str]
    instances: list[str]


class OutputSummary(BaseModel):
    name: str
    kind: str
    key: list[str]
    granularities: list[str] = Field(description="aggregations: the bucket sizes kept (finest first)")
    measures: list[str] = Field(description="aggregations: measure and ratio columns; tables: value columns")
    time: str | None = Field(None, description="events: the event-time field")


class PlanSummary(BaseModel):
    name: str
    state: Literal["ok"] = Field(description="ok: the plan's file loads (BrokenPlanSummary: one that does not)")
    description: str
    nodes: list[str]
    standby: Literal["hot", "warm", "cold"]
    groups: list[GroupSummary]
    outputs: list[OutputSummary]
    epoch_millis_fields: list[str] = Field(
        description="field names holding times in the plan's events (streams' epoch_millis and timestamp fields, "
                    "outputs' time fields): reads give them as ISO 8601 text in UTC, the page shows them as UTC times")


class BrokenPlanSummary(BaseModel):
    """A plan whose file does not load: its DAGs are not defined and its views answer 409 until it is fixed."""

    name: str = Field(description="the file's name without .yaml")
    state: Literal["broken"]
    error: str = Field(description="why, naming the file and the field (as `tandem config check` says it)")


PlanEntry = Annotated[PlanSummary | BrokenPlanSummary, Field(discriminator="state")]
"""An entry of the plan list: a plan that loads, or a broken one with its error."""


class NodeState(BaseModel):
    """One node's instance of a group instance, as the supervisor sees it."""

    node: str
    role: Role | None = Field(description="the role the instance has now: ACTIVE while it holds the lease, else the "
                                          "standby role it recorded; null when it does not run (stopped, failed, "
                                          "blocked, never launched)")
    epoch: int | None
    status: str | None = Field(description="LAUNCHING, STARTING, RUNNING, STOPPED, FAILED or BLOCKED; null: never "
                                           "launched")
    error: str | None = Field(None, description="why it FAILED or is BLOCKED (or how it stopped), in one line: the "
                                                "cause of the error it recorded (its driver's log has the whole text)")
    health: str = Field(description="HEALTHY, STARTING, DEAD, FAILED, STALLED, STOPPED, BLOCKED or MISSING")
    evidence: str = Field(description="why the health is what it is")
    drained: bool
    host: str | None
    pid: int | None
    beat_age_s: float | None = Field(description="seconds since the driver's last liveness beat")
    last_batch_id: int | None
    last_batch_age_s: float | None
    lag_s: float | None = Field(description="seconds the newest event-time watermark is behind the clock (0 when it "
                                            "is ahead: ahead_of_clock_s says by how much)")
    ahead_of_clock_s: float | None = Field(None, description="seconds the newest event-time watermark is ahead of "
                                                             "the clock (event times from a clock that runs fast, or "
                                                             "made up); null when it is not ahead")
    waiting_input_s: float | None = Field(description="age of the oldest input file no batch has read yet")
    relay_error: str | None = Field(None, description="why publishing the plan's events outputs to NATS fails on this "
                                                      "node (its relay tries again with back-off); null: it does not")
    version: str | None = Field(None, description="the plan's version its last run was launched with (YAML, module "
                                                  "and Tandem: tandem.plan_version); null: never started, or before "
                                                  "versions were recorded")


LeaseStateName = Literal["held", "stopped", "released", "expired", "free"]


class LeaseState(BaseModel):
    state: LeaseStateName = Field(
        description="held: a node holds it; stopped: its holder's instance stopped cleanly and gave it up; released: "
                    "its holder gave it up otherwise (a failed instance, a promotion that could not publish); "
                    "expired: its holder stopped renewing it (killed, frozen, cut off); free: never taken")
    holder: str | None
    epoch: int
    valid: bool
    expires_in_s: float = Field(description="negative: expired that many seconds ago")
    acquired_at: datetime | None = Field(description="when the holder took the lease (the active's 'since')")
    expires_at: datetime | None = Field(None, description="when the lease expires (or expired)")
    vacant_since: datetime | None = Field(None, description="when no node is ACTIVE: since when (the release, or "
                                                            "the expiry)")
    vacancy: str | None = Field(None, description="when no node is ACTIVE: the state and why ('stopped: instance "
                                                  "stopped', 'expired: node-a is FAILED: …')")


class OfInstance(BaseModel):
    """A record of one group instance: ``instance`` names it, ``shard_id`` is its deprecated former name."""

    instance: str = Field(description="the group instance, e.g. shop-1")

    @computed_field(description="deprecated: the former name of `instance`, served until the next release",
                    json_schema_extra={"deprecated": True})
    @property
    def shard_id(self) -> str:
        return self.instance


class TimelineEvent(OfInstance):
    """A failover or supervision event (``tandem.failover_events``)."""

    id: int
    happened_at: datetime
    kind: str
    node: str | None
    previous_node: str | None
    epoch: int | None
    reason: str
    took_over_s: float | None = Field(None, description="a PROMOTED event: seconds from the previous holder's last "
                                                        "renewal (its last sign of life as the ACTIVE) to this "
                                                        "take-over; null for other events, a lease never held before "
                                                        "and events recorded before this was")


class SnapshotInfo(OfInstance):
    id: str
    node: str
    status: Literal["TAKING", "GOOD", "BAD", "PRUNED"]
    batch_id: int | None
    taken_at: datetime
    completed_at: datetime | None
    state_rows: int | None
    checkpoint_bytes: int | None
    state_bytes: int | None
    reason: str | None
    validation: dict[str, Any] | None


class OutputCheckState(BaseModel):
    output: str
    checked: int = Field(description="rows the new version compared with what the old one published")
    differing: int
    samples: list[str] = Field(description="up to five differing rows, each with its columns old and new")
    unmatched: int = Field(0, description="rows only the new version held: the old one published rows of later "
                                          "batches, never one under their identity (an upgrade refuses them)")


class UpgradeState(BaseModel):
    """An instance's upgrade under way, or its last one (`tandem upgrade`, docs: Changing a plan)."""

    state: Literal["VERIFYING", "HANDED_OVER", "FINISHED", "ROLLED_BACK", "FAILED"]
    from_version: str | None
    to_version: str
    from_node: str = Field(description="the node of the ACTIVE when the upgrade started (the old version)")
    shadow_node: str = Field(description="the standby that runs the new version first")
    detail: str
    started_at: datetime
    updated_at: datetime
    checks: list[OutputCheckState] = Field(description="what the new version compared, per output")


class Notice(BaseModel):
    """One thing the page points out about an instance (tandem.presenter.attention decides which, and how loudly)."""

    severity: Literal["alarm", "pending", "note"] = Field(
        description="alarm: wrong, may need a person (DEAD, FAILED, BLOCKED, STALLED, the lease lost, a failing "
                    "relay); pending: the supervisor has something to do; note: how it is, nothing wrong (stopped "
                    "cleanly)")
    kind: Literal["error", "health", "relay", "lease", "stopped", "due"]
    node: str | None = Field(description="the node it is about (null: the instance)")
    text: str


class InstanceStatus(OfInstance):
    """One group instance (one HA unit): its lease, its nodes, and what the supervisor would do now."""

    group: str
    standby: Literal["hot", "warm", "cold"]
    lease: LeaseState | None
    nodes: list[NodeState]
    due: list[str] = Field(description="what the supervisor's next decision would do (empty: nothing)")
    stopped: bool = Field(False, description="no node runs it and every node that ran it stopped cleanly (none "
                                             "FAILED or BLOCKED): nothing about it is an alarm")
    notices: list[Notice] = Field(default_factory=list, description="what to point out, in the order to show it: "
                                                                    "errors, health, relays, the lease, due actions")
    last_failover: TimelineEvent | None = Field(description="the newest change of the ACTIVE role, with its reason")
    last_good_snapshot: SnapshotInfo | None
    upgrade: UpgradeState | None = None


class PlanStatus(BaseModel):
    plan: str
    observed_at: datetime
    version: str = Field(description="the plan's version its files define now: a node running another one runs the "
                                     "plan as it was (`tandem plan diff` says what changed)")
    refused_changes: dict[str, list[str]] = Field(default_factory=dict, description=(
        "per group, the changes of the files its checkpoints refuse (a launch fails with them): the `cutover` "
        "action carries them out on the stopped plan"))
    instances: list[InstanceStatus]


class Timeline(BaseModel):
    plan: str
    events: list[TimelineEvent]


class SnapshotCatalog(BaseModel):
    plan: str
    snapshots: list[SnapshotInfo]


class BackfillInfo(BaseModel):
    id: str
    status: str
    range_start: datetime
    range_end: datetime
    instances: list[str]
    requested_by: str
    started_at: datetime
    finished_at: datetime | None = None
    outcome: str = Field(description="what the backfill changed, in words (or its error)")


class ReconcileRow(OfInstance):
    output: str
    compared: int
    late: int
    extra: int
    different: int
    examples: str
    skipped: str | None = None


class ReconcileRun(BaseModel):
    run_id: str
    reconciled_at: datetime
    range_start: datetime
    range_end: datetime
    rows: list[ReconcileRow]


class BatchReport(BaseModel):
    plan: str
    backfills: list[BackfillInfo] = Field(description="the newest first")
    reconcile: ReconcileRun | None = Field(None, description="the newest reconcile run, if any")


class QuarantineSample(OfInstance):
    quarantined_at: datetime
    node: str
    source_file: str
    reason: str
    raw: str
    plan_version: str | None = Field(None, description="the plan's version that refused the line (null: quarantined "
                                                       "before versions were recorded)")


class QuarantineReport(BaseModel):
    plan: str
    total: int = Field(description="quarantined lines in the Delta table")
    by_reason: dict[str, int]
    by_instance: dict[str, int] = Field(description="per group instance")
    samples: list[QuarantineSample] = Field(description="the newest quarantined lines")


class AggregateRows(BaseModel):
    plan: str
    output: str
    granularity: str
    start: datetime
    end: datetime
    rows: list[dict[str, Any]] = Field(
        description="per bucket and key: bucket_start, the keys, measures and ratios merged over every instance "
                    "(a distinct_exact measure with `<measure>_exact`: whether its count is exact), and `instances`: "
                    "how many group instances contributed")


class OutputRows(BaseModel):
    plan: str
    output: str
    kind: str
    rows: list[dict[str, Any]] = Field(description="the output merged over instances, as its kind reads it: a table's "
                                                   "keys with their values summed and instances (how many hold a "
                                                   "part), a latest output's latest row per key, events, aggregates, "
                                                   "quarantined lines")


class Event(OfInstance):
    event_id: str
    event_time: datetime
    payload: dict[str, Any]


class EventPage(BaseModel):
    plan: str
    output: str
    events: list[Event]
    next_cursor: str = Field(description="pass it as `cursor` to get the events after these (none are skipped "
                                         "or repeated, across failovers too)")


class ActionRequest(BaseModel):
    action: Action
    instance: str = Field("", validation_alias=AliasChoices("instance", "shard_id"),
                          description="one group instance, or empty for every one of the plan (`shard_id`, its "
                                      "former name, is accepted until the next release)")
    node: str = Field("", description="drain_node / restart_node: the node; failover_now: the preferred standby; "
                                      "restore: the node to start ACTIVE")
    snapshot_id: str = Field("", description="restore: the snapshot (empty: each instance's newest GOOD one)")
    force: bool = Field(False, description="restore: accept a snapshot marked BAD")
    undo_backfills: bool = Field(False, description="restore: accept a snapshot taken before backfills of the "
                                                    "instance (they are undone)")
    expect_changes: bool = Field(False, description="upgrade: hand over although the new version's outputs differ "
                                                    "(a change of semantics)")
    confirm: bool = Field(False, description="restore rewinds the plan's outputs: it must be confirmed")
    start: str = Field("", description="backfill: the first instant of the range (ISO, UTC when no zone)")
    end: str = Field("", description="backfill: the end of the range, excluded")


class ActionRun(BaseModel):
    action: Action
    dag_id: str
    dag_run_id: str
    state: str
    url: str = Field(description="the run in the Airflow UI")


class Problem(BaseModel):
    detail: str
