"""What the presenter shows, read from PostgreSQL and the Delta tables (read-only, no Airflow).

Each function answers one endpoint of :mod:`tandem.presenter.api` and one panel of the page; ``tandem
status`` prints :func:`plan_status` too, so the CLI and the page always agree.
"""

from __future__ import annotations

import base64
import dataclasses
import binascii
from collections.abc import Hashable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from tandem.config import ClusterConfig, PlanConfig, quarantine_output
from tandem.errors import ConfigError, DataError, NothingPublished, QueryError, TandemError, cause_of
from tandem.json_values import spelled
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir
from tandem.names import ACTIVE
from tandem.outputs import kind_of
from tandem.outputs.base import ReadRequest, plan_time_fields
from tandem.cutover import pending_cutovers
from tandem.plan_version import plan_version
from tandem.presenter.attention import is_stopped, notices
from tandem.presenter.cache import VersionedCache
from tandem.presenter.models import (
    AggregateRows, BackfillInfo, BatchReport, BrokenPlanSummary, Event, EventPage, GroupSummary, InstanceStatus,
    LeaseState, LeaseStateName, NodeState, OutputSummary, PlanStatus, PlanSummary, QuarantineReport, QuarantineSample,
    OutputCheckState, SnapshotCatalog, SnapshotInfo, ReconcileRow, ReconcileRun, OutputRows, Timeline, TimelineEvent,
    UpgradeState,
)
from tandem.batch.reconciliations import reconciliation_rows
from tandem.store.backfills import list_backfills
from tandem.store import upgrades
from tandem.store.db import Database
from tandem.store.leases import ROLE_CHANGES, newest_of_kinds, recent_events
from tandem.store.outputs import START, EventPosition
from tandem.store.snapshots import SnapshotRecord, database_now, latest_good, list_snapshots
from tandem.store.supervision import latest_progress
from tandem.supervisor.decisions import decide
from tandem.supervisor.launch_decision import ENDED_STATUSES
from tandem.supervisor.observe import observe_instance

RELEASED = "RELEASED"
"""The event of an ACTIVE that gave its lease up (a clean stop, a drain): its reason says why."""

MAX_BUCKETS = 10_000
"""The widest range an aggregates request may span, in buckets of its granularity."""
MAX_AGGREGATE_ROWS = 50_000
MAX_TABLE_ROWS = 10_000
NOMINAL_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86_400, "month": 2_629_746, "year": 31_556_952}
"""A bucket's length (a month and a year of the Gregorian average) for counting the buckets of a range."""
QUARANTINE_TTL_S = 5.0
COUNTED_COLUMNS = ["reason", "instance", "quarantined_at", "source_file"]


class NotFound(TandemError):
    """The plan, output or snapshot asked for does not exist."""


class BadRequest(TandemError):
    """A parameter the presenter cannot serve (a granularity the output does not keep, a malformed cursor)."""


class PlanBroken(TandemError):
    """The plan asked for has a file that does not load (invalid YAML, a refused field): nothing of it is served."""


def plan_summary(plan: PlanConfig) -> PlanSummary:
    """A plan's declaration: nodes, groups and their instances, outputs."""
    groups = [GroupSummary(name=name, parallel=group.parallel, queries=list(group.queries),
                           instances=[s for s in plan.instances if plan.group_of(s)[0] == name])
              for name, group in plan.groups.items()]
    outputs = [OutputSummary(name=name, kind=config.kind, key=list(config.key),
                             **kind_of(plan, name).summary(plan, name)) for name, config in plan.outputs.items()]
    return PlanSummary(name=plan.name, state="ok", description=plan.description, nodes=list(plan.nodes),
                       standby=plan.ha.standby, groups=groups, outputs=outputs,
                       epoch_millis_fields=epoch_millis_fields(plan))


def plan_entry(name: str, found: PlanConfig | ConfigError) -> PlanSummary | BrokenPlanSummary:
    """An entry of the plan list: the plan's summary, or, for a file that does not load, its error."""
    if isinstance(found, ConfigError):
        return BrokenPlanSummary(name=name, state="broken", error=str(found))
    return plan_summary(found)


def epoch_millis_fields(plan: PlanConfig) -> list[str]:
    """Field names that hold times in the plan's events (:func:`~tandem.outputs.base.plan_time_fields`: reads give
    them as ISO 8601 text, :meth:`~tandem.outputs.base.OutputKind.time_fields`; the page shows them as UTC times)."""
    return sorted(plan_time_fields(plan))


def _event(row: dict[str, Any]) -> TimelineEvent:
    took_over = (row.get("detail") or {}).get("took_over_s")
    return TimelineEvent(id=row["id"], happened_at=row["happened_at"], instance=row["instance"], kind=row["kind"],
                         node=row["node"], previous_node=row["previous_node"], epoch=row["epoch"], reason=row["reason"],
                         took_over_s=float(took_over) if isinstance(took_over, (int, float)) else None)


def clock_lag(lag_s: float | None) -> tuple[float | None, float | None]:
    """``(lag, ahead of the clock)`` of a watermark ``lag_s`` seconds behind the clock (pure): a watermark ahead of
    it (event times from a clock that runs fast) lags 0 s and is that far ahead, never a negative lag."""
    if lag_s is None or lag_s >= 0:
        return lag_s, None
    return 0.0, -lag_s


def _snapshot(record: SnapshotRecord) -> SnapshotInfo:
    return SnapshotInfo(id=record.id, instance=record.instance, node=record.node, status=record.status,
                        batch_id=record.batch_id, taken_at=record.taken_at, completed_at=record.completed_at,
                        state_rows=record.state_rows, checkpoint_bytes=record.checkpoint_bytes,
                        state_bytes=record.state_bytes, reason=record.reason,
                        validation=dict(record.validation) if record.validation is not None else None)


def _last_role_events(db: Database, plan: str) -> tuple[dict[str, TimelineEvent], dict[str, TimelineEvent]]:
    """Per group instance: the newest change of the ACTIVE role, and the newest release of the lease."""
    changes, releases = {}, {}
    for row in newest_of_kinds(db, plan, [*ROLE_CHANGES, RELEASED], RELEASED):
        (releases if row["kind"] == RELEASED else changes)[row["instance"]] = _event(row)
    return changes, releases


def vacancy(lease: dict[str, Any], released: TimelineEvent | None,
            holder: NodeState | None) -> tuple[LeaseStateName, datetime | None, str | None]:
    """The lease's state (:class:`~tandem.presenter.models.LeaseState`), and since when and why no node is ACTIVE,
    from the lease row, its last release and its last holder's state (pure); ``("held", None, None)`` while a node
    holds a valid lease. A release by the holder at the lease's epoch is a clean stop when its instance then
    recorded STOPPED (``tandem stop``, SIGTERM, the end of an available-now run)."""
    if lease["holder"] is None:
        return "free", None, "the lease was never taken"
    if lease["valid"]:
        return "held", None, None
    failed = holder is not None and bool(holder.error) and holder.status in ("FAILED", "BLOCKED")
    if released is not None and released.node == lease["holder"] and released.epoch == int(lease["epoch"]):
        if holder is not None and holder.status == "STOPPED":
            return "stopped", released.happened_at, f"stopped: {released.reason}"
        if failed:
            return "released", released.happened_at, f"released: {lease['holder']} is {holder.status}: {holder.error}"
        return "released", released.happened_at, f"released: {released.reason}"
    since = lease["expires_at"]
    if holder is None or holder.status is None:
        return "expired", since, f"expired: {lease['holder']} stopped renewing it"
    if failed:
        return "expired", since, f"expired: {lease['holder']} is {holder.status}: {holder.error}"
    if holder.status == "STOPPED":
        return "expired", since, f"expired: {lease['holder']}'s instance stopped"
    return "expired", since, f"expired: {lease['holder']} stopped renewing it ({holder.health}: {holder.evidence})"


def shown_role(recorded: str | None, status: str | None, holds_lease: bool) -> str | None:
    """The role a node's instance has now (pure): none when it does not run (it stopped, failed or is blocked, or
    never ran: the role it last recorded is history); ACTIVE while it holds the lease; else the standby role it
    recorded (one that recorded ACTIVE but no longer holds the lease is being demoted: none until it records its
    standby role)."""
    if status is None or status in ENDED_STATUSES:
        return None
    if holds_lease:
        return ACTIVE
    return None if recorded == ACTIVE else recorded


def plan_status(db: Database, cluster: ClusterConfig, plan: PlanConfig) -> PlanStatus:
    """Every group instance of ``plan``: lease, each node's role and health, due actions, last failover and snapshot."""
    progress = latest_progress(db, plan.name)
    changes, releases = _last_role_events(db, plan.name)
    instances = []
    for instance in plan.instances:
        observed = observe_instance(db, cluster, plan, instance)
        view, rows = observed.view, observed.rows
        nodes = []
        for node in plan.nodes:
            health, seen = view.health(node), observed.observations[node]
            row = rows.instances.get(node) or {}
            latest = progress.get(f"{plan.name}/{instance}/{node}", {})
            lag_s, ahead_s = clock_lag(latest.get("lag_s"))
            holds_lease = view.lease is not None and view.lease.valid and view.lease.holder == node
            nodes.append(NodeState(
                node=node, role=shown_role(seen.role, seen.status, holds_lease) if row else None,
                epoch=seen.epoch if row else None, status=seen.status, error=cause_of(row.get("error")),
                health=health.state,
                evidence=health.evidence, drained=node in view.drained, host=row.get("host"), pid=row.get("pid"),
                beat_age_s=seen.beat_age_s, last_batch_id=latest.get("batch_id"),
                last_batch_age_s=latest.get("batch_age_s"), lag_s=lag_s, ahead_of_clock_s=ahead_s,
                waiting_input_s=seen.waiting_input_age_s, relay_error=row.get("relay_error"),
                version=row.get("plan_version")))
        lease = None
        if rows.lease is not None:
            holder = next((n for n in nodes if n.node == rows.lease["holder"]), None)
            valid = bool(rows.lease["valid"]) and rows.lease["holder"] is not None
            state, since, reason = vacancy({**rows.lease, "valid": valid}, releases.get(instance), holder)
            lease = LeaseState(state=state, holder=rows.lease["holder"], epoch=int(rows.lease["epoch"]), valid=valid,
                               expires_in_s=-float(rows.lease["expired_for_s"]), acquired_at=rows.lease["acquired_at"],
                               expires_at=rows.lease["expires_at"], vacant_since=since, vacancy=reason)
        good = latest_good(db, plan.name, instance)
        due = [action.describe() for action in decide(view)]
        instances.append(InstanceStatus(
            instance=instance, group=plan.group_of(instance)[0], standby=plan.ha.standby, lease=lease, nodes=nodes,
            due=due, stopped=is_stopped(nodes), notices=notices(nodes, lease, due),
            last_failover=changes.get(instance), last_good_snapshot=_snapshot(good) if good else None,
            upgrade=_upgrade(db, plan.name, instance)))
    return PlanStatus(plan=plan.name, observed_at=database_now(db), version=plan_version(plan),
                      refused_changes=pending_cutovers(cluster, plan), instances=instances)


def _upgrade(db: Database, plan: str, instance: str) -> UpgradeState | None:
    """The instance's upgrade under way or its last one, with what its shadow compared."""
    upgrade = upgrades.current(db, plan, instance)
    if upgrade is None:
        return None
    checks = upgrades.checks(db, plan, instance, upgrade.shadow_node, upgrade.to_version)
    return UpgradeState(**{f.name: getattr(upgrade, f.name) for f in dataclasses.fields(upgrade)
                           if f.name not in ("plan", "instance")},
                        checks=[OutputCheckState(**dataclasses.asdict(c)) for c in checks])


def timeline(db: Database, plan: PlanConfig, *, instance: str | None = None, limit: int = 50) -> Timeline:
    """The newest failover and supervision events of a plan (optionally one group instance), newest first."""
    if instance:
        plan.check_instance(instance)

    return Timeline(plan=plan.name, events=[_event(row) for row in recent_events(db, plan.name, instance, limit)])


def snapshot_catalog(db: Database, plan: PlanConfig, *, instance: str | None = None,
                     statuses: tuple[str, ...] | None = None, limit: int = 50) -> SnapshotCatalog:
    """The snapshot catalog of a plan, newest first."""
    if instance:
        plan.check_instance(instance)
    records = list_snapshots(db, plan.name, instance=instance, statuses=statuses, limit=limit)
    return SnapshotCatalog(plan=plan.name, snapshots=[_snapshot(r) for r in records])


def batch_report(db: Database, cluster: ClusterConfig, plan: PlanConfig, *, limit: int = 10) -> BatchReport:
    """A plan's newest backfills and its newest reconcile run."""
    backfills = [BackfillInfo(id=r.id, status=r.status, range_start=r.range_start, range_end=r.range_end,
                              instances=list(r.instances), requested_by=r.requested_by, started_at=r.started_at,
                              finished_at=r.finished_at, outcome=r.outcome())
                 for r in list_backfills(db, plan.name, limit=limit)]
    rows = reconciliation_rows(cluster, plan)
    run = None if not rows else ReconcileRun(
        run_id=rows[0]["run_id"], reconciled_at=rows[0]["reconciled_at"], range_start=rows[0]["range_start"],
        range_end=rows[0]["range_end"],
        rows=[ReconcileRow(instance=r["instance"], **{k: r[k] for k in ("output", "compared", "late", "extra",
                                                                          "different", "examples", "skipped")})
              for r in rows])
    return BatchReport(plan=plan.name, backfills=backfills, reconcile=run)


QUARANTINE_SUMMARIES: VersionedCache[QuarantineReport] = VersionedCache(ttl_s=QUARANTINE_TTL_S)
"""Quarantine summaries by (table, samples), reused while the table's Delta version stays the same."""


def delta_version(path: Path) -> int | None:
    """The newest version of the Delta table at ``path`` (``None``: no table yet): one read of its log."""
    try:
        return DeltaTable(str(path)).version()
    except TableNotFoundError:
        return None


def quarantine_report(cluster: ClusterConfig, plan: PlanConfig, *, samples: int = 10,
                      cache: VersionedCache[QuarantineReport] = QUARANTINE_SUMMARIES) -> QuarantineReport:
    """Counts of the plan's quarantined lines (by reason and instance) and the newest ones.

    Served from ``cache`` while the quarantine table's Delta version is unchanged (looked at every few
    seconds), so open pages do not each read the table on every refresh.
    """
    path = delta_table_dir(cluster, plan.name, quarantine_output(plan))
    return cache.get((str(path), samples), lambda: delta_version(path),
                     lambda version: _quarantine_summary(path, plan.name, version, samples))


def _quarantine_summary(path: Path, plan: str, version: Hashable, samples: int) -> QuarantineReport:
    """The summary at ``version``: the counts from four columns, the raw lines of the newest ``samples`` only."""
    if version is None:
        return QuarantineReport(plan=plan, total=0, by_reason={}, by_instance={}, samples=[])
    counted = read_table(path, columns=COUNTED_COLUMNS, version=version)
    if counted.num_rows == 0:
        return QuarantineReport(plan=plan, total=0, by_reason={}, by_instance={}, samples=[])
    order = [("quarantined_at", "descending"), ("source_file", "ascending")]
    newest: list[dict[str, Any]] = []
    if samples:
        oldest_shown = counted.take(pc.sort_indices(counted, order)[:samples])["quarantined_at"][-1]
        candidates = read_table(path, ds.field("quarantined_at") >= oldest_shown, version=version)
        newest = candidates.take(pc.sort_indices(candidates, order)[:samples]).to_pylist()
    return QuarantineReport(
        plan=plan, total=counted.num_rows,
        by_reason=dict(sorted(_counts(counted["reason"]).items(), key=lambda item: (-item[1], item[0]))),
        by_instance=dict(sorted(_counts(counted["instance"]).items())),
        samples=[QuarantineSample(quarantined_at=r["quarantined_at"], instance=r["instance"], node=r["node"],
                                  source_file=r["source_file"], reason=r["reason"], raw=r["raw"],
                                  plan_version=r.get("plan_version")) for r in newest])


def _counts(column: pa.ChunkedArray) -> dict[str, int]:
    """How many times each value occurs, counted by Arrow (a quarantine may hold millions of lines)."""
    return {entry["values"]: entry["counts"] for entry in pc.value_counts(column).to_pylist()}


def declared(plan: PlanConfig, output: str) -> None:
    """Refuse an output the plan does not have."""
    if output not in plan.outputs:
        raise NotFound(f"plan {plan.name} has no output {output!r} (outputs: {', '.join(plan.outputs)})")


def check_range(granularity: str, start: datetime, end: datetime, max_buckets: int = MAX_BUCKETS) -> None:
    """Refuse a range that is empty, outside 1970–9999, or wider than ``max_buckets`` buckets of ``granularity``."""
    if not datetime(1970, 1, 1, tzinfo=timezone.utc) <= start < end <= datetime(9999, 1, 1, tzinfo=timezone.utc):
        raise BadRequest(f"empty or unreadable range: start {start.isoformat()}, end {end.isoformat()} "
                         "(start before end, both within 1970-9999)")
    width = NOMINAL_SECONDS.get(granularity)
    if width is None:
        return  # an unknown granularity: the query names the ones the output keeps
    buckets = (end - start).total_seconds() / width
    if buckets > max_buckets:
        widest = timedelta(seconds=max_buckets * width)
        raise BadRequest(f"range too wide: {start.isoformat()} to {end.isoformat()} is {buckets:,.0f} {granularity} "
                         f"buckets, at most {max_buckets:,} are served: narrow start/end to at most {widest} "
                         f"or ask a coarser granularity")


def too_many_rows(what: str, limit: int, maximum: int, narrow: str) -> BadRequest:
    """The 400 of a read with more rows than ``limit``, saying how to narrow it."""
    more = f", or raise limit (at most {maximum:,})" if limit < maximum else ""
    return BadRequest(f"{what} has more than {limit:,} rows (limit={limit:,}): {narrow}{more}")


def aggregate_rows(cluster: ClusterConfig, db: Database, plan: PlanConfig, output: str, granularity: str,
                   start: datetime, end: datetime, keys: dict[str, list[str]] | None = None,
                   limit: int = MAX_AGGREGATE_ROWS) -> AggregateRows:
    """An output kept in time buckets (its kind's summary names granularities), merged over instances, by
    ``granularity``, for buckets starting in ``[start, end)``.

    At most ``limit`` rows (bucket × key): a :class:`BadRequest` saying how to narrow the request otherwise.
    """
    declared(plan, output)
    kind, config = kind_of(plan, output), plan.outputs[output]
    granularities = kind.summary(plan, output)["granularities"]
    if not granularities:
        raise BadRequest(f"{output} of plan {plan.name} is an output of kind {kind.name}, kept in no time buckets: "
                         f"read it at /plans/{plan.name}/outputs/{output}/rows")
    if granularity not in granularities:
        raise BadRequest(f"unknown granularity {granularity!r}: plan {plan.name} keeps {output} by "
                         f"{', '.join(granularities)}")
    check_range(granularity, start, end)
    request = ReadRequest(start=start, end=end, granularity=granularity, keys=keys or {}, limit=limit + 1)
    try:
        rows = kind.read(cluster, plan, output, request, db)
    except QueryError as exc:
        raise BadRequest(str(exc)) from None
    except NothingPublished:
        rows = []
    if len(rows) > limit:
        raise too_many_rows(f"{output} by {granularity} from {start.isoformat()} to {end.isoformat()}", limit,
                            MAX_AGGREGATE_ROWS, "narrow start/end, ask a coarser granularity"
                            + (f" or filter with key={config.key[0]}:<value>" if config.key else ""))
    return AggregateRows(plan=plan.name, output=output, granularity=granularity, start=start, end=end,
                         rows=[spelled(r) for r in rows])


def output_rows(cluster: ClusterConfig, db: Database, plan: PlanConfig, output: str,
                keys: dict[str, list[str]] | None = None, *, start: datetime | None = None,
                end: datetime | None = None, granularity: str | None = None,
                limit: int = MAX_TABLE_ROWS) -> OutputRows:
    """Any output merged over instances, as its kind reads it (:meth:`tandem.outputs.base.OutputKind.read`): the rows
    whose key fields hold one of ``keys``' values, of ``[start, end)`` and ``granularity`` where the kind has them.

    At most ``limit`` rows: a :class:`BadRequest` saying how to narrow the request otherwise.
    """
    declared(plan, output)
    config = plan.outputs[output]
    unknown = sorted(set(keys or {}) - set(config.key))
    if unknown:
        raise BadRequest(f"{output} of plan {plan.name} has no key {', '.join(unknown)} (key: "
                         f"{', '.join(config.key) or 'none'})")
    request = ReadRequest(start=start, end=end, granularity=granularity, keys=keys or {}, limit=limit + 1)
    try:
        rows = kind_of(plan, output).read(cluster, plan, output, request, db)
    except QueryError as exc:
        raise BadRequest(str(exc)) from None
    except NothingPublished:
        rows = []
    if len(rows) > limit:
        raise too_many_rows(f"{config.kind} {output}", limit, MAX_TABLE_ROWS,
                            f"filter with key={config.key[0]}:<value>" if config.key else "narrow start/end")
    return OutputRows(plan=plan.name, output=output, kind=config.kind, rows=[spelled(r) for r in rows])


def encode_cursor(position: EventPosition) -> str:
    """An opaque cursor for a poll position."""
    return base64.urlsafe_b64encode(f"{position[0]}:{position[1]}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> EventPosition:
    """The position a cursor of :func:`encode_cursor` stands for (:class:`BadRequest` when it is not one)."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        xid, separator, event_id = text.partition(":")
        position = (int(xid), event_id)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise BadRequest(f"not a cursor of this API: {cursor[:40]!r}") from None
    if not separator or not 0 <= position[0] < 2 ** 63:
        raise BadRequest(f"not a cursor of this API: {cursor[:40]!r}")
    return position


def event_page(db: Database, plan: PlanConfig, output: str, *, cursor: str | None = None, tail: int | None = None,
               limit: int = 100) -> EventPage:
    """Rows of an appended output after ``cursor`` (from the first one when there is none), or else the newest
    ``tail`` ones (a feed's start), as its kind pages them (:meth:`tandem.outputs.base.OutputKind.page`)."""
    declared(plan, output)
    position = decode_cursor(cursor) if cursor else START
    try:
        rows = kind_of(plan, output).page(db, plan, output, position if cursor else None, tail, limit)
    except DataError as exc:
        raise BadRequest(str(exc)) from None
    if rows:
        position = (rows[-1]["xid"], rows[-1]["event_id"])
    return EventPage(plan=plan.name, output=output, next_cursor=encode_cursor(position),
                     events=[Event(event_id=r["event_id"], event_time=r["event_time"], instance=r["instance"],
                                   payload=r["payload"]) for r in rows])
