"""What the presenter shows, read from PostgreSQL and the Delta tables (read-only, no Airflow).

Each function answers one endpoint of :mod:`tandem.presenter.api` and one panel of the page; ``tandem
status`` prints :func:`plan_status` too, so the CLI and the page always agree.
"""

from __future__ import annotations

import base64
import binascii
from collections import Counter
from datetime import datetime
from typing import Any

import pyarrow.compute as pc

from tandem import aggregation
from tandem.aggregation.spec import spec_for
from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import NothingPublished, QueryError, TandemError
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir
from tandem.presenter.models import (
    AggregateRows, Event, EventPage, GroupSummary, InstanceStatus, LeaseState, NodeState, OutputSummary, PlanStatus,
    PlanSummary, QuarantineReport, QuarantineSample, SnapshotCatalog, SnapshotInfo, TableRows, Timeline,
    TimelineEvent,
)
from tandem.store.db import Database
from tandem.store.outputs import START, EventPosition, events_after, newest_events, read_table_rows
from tandem.store.snapshots import SnapshotRecord, database_now, latest_good, list_snapshots
from tandem.store.supervision import latest_progress
from tandem.supervisor.decisions import decide
from tandem.supervisor.observe import observe_shard

ROLE_CHANGES = ("PROMOTED", "HANDOVER", "RESTORED")
"""Events after which another node (or the same node at a new epoch) is ACTIVE."""


class NotFound(TandemError):
    """The plan, output or snapshot asked for does not exist."""


class BadRequest(TandemError):
    """A parameter the presenter cannot serve (a granularity the output does not keep, a malformed cursor)."""


def plan_summary(plan: PlanConfig) -> PlanSummary:
    """A plan's declaration: nodes, groups and their instances, outputs."""
    groups = [GroupSummary(name=name, parallel=group.parallel, queries=list(group.queries),
                           instances=[s for s in plan.shards if plan.group_of(s)[0] == name])
              for name, group in plan.groups.items()]
    outputs = []
    for name, config in plan.outputs.items():
        granularities, measures = [], list(config.values)
        if config.kind == "aggregation":
            spec = spec_for(plan, name)
            granularities = list(spec.granularities)
            measures = [*(r.column for r in spec.ratios), *spec.measure_columns]
        outputs.append(OutputSummary(name=name, kind=config.kind, key=list(config.key), granularities=granularities,
                                     measures=measures, time=config.time if config.kind == "events" else None))
    return PlanSummary(name=plan.name, description=plan.description, nodes=list(plan.nodes), standby=plan.ha.standby,
                       groups=groups, outputs=outputs)


def _event(row: dict[str, Any]) -> TimelineEvent:
    return TimelineEvent(id=row["id"], happened_at=row["happened_at"], shard_id=row["shard_id"], kind=row["kind"],
                         node=row["node"], previous_node=row["previous_node"], epoch=row["epoch"], reason=row["reason"])


def _snapshot(record: SnapshotRecord) -> SnapshotInfo:
    return SnapshotInfo(id=record.id, shard_id=record.shard_id, node=record.node, status=record.status,
                        batch_id=record.batch_id, taken_at=record.taken_at, completed_at=record.completed_at,
                        state_rows=record.state_rows, checkpoint_bytes=record.checkpoint_bytes,
                        state_bytes=record.state_bytes, reason=record.reason,
                        validation=dict(record.validation) if record.validation is not None else None)


def _last_role_changes(db: Database, plan: str) -> dict[str, TimelineEvent]:
    def work(cursor):
        cursor.execute("""SELECT DISTINCT ON (shard_id) * FROM failover_events
                          WHERE plan = %s AND kind = ANY(%s) ORDER BY shard_id, happened_at DESC, id DESC""",
                       (plan, list(ROLE_CHANGES)))
        return cursor.fetchall()

    return {row["shard_id"]: _event(row) for row in db.run(work, attempts=3)}


def plan_status(db: Database, cluster: ClusterConfig, plan: PlanConfig) -> PlanStatus:
    """Every group instance of ``plan``: lease, each node's role and health, due actions, last failover and snapshot."""
    progress = latest_progress(db, plan.name)
    changes = _last_role_changes(db, plan.name)
    instances = []
    for shard in plan.shards:
        observed = observe_shard(db, cluster, plan, shard)
        view, rows = observed.view, observed.rows
        lease = None
        if rows.lease is not None:
            lease = LeaseState(holder=rows.lease["holder"], epoch=int(rows.lease["epoch"]),
                               valid=bool(rows.lease["valid"]) and rows.lease["holder"] is not None,
                               expires_in_s=-float(rows.lease["expired_for_s"]), acquired_at=rows.lease["acquired_at"])
        nodes = []
        for node in plan.nodes:
            health, seen = view.health(node), observed.observations[node]
            row = rows.instances.get(node) or {}
            latest = progress.get(f"{plan.name}/{shard}/{node}", {})
            nodes.append(NodeState(
                node=node, role=("ACTIVE" if view.active == node else seen.role) if row else None,
                epoch=seen.epoch if row else None, status=seen.status, health=health.state,
                evidence=health.evidence, drained=node in view.drained, host=row.get("host"), pid=row.get("pid"),
                beat_age_s=seen.beat_age_s, last_batch_id=latest.get("batch_id"),
                last_batch_age_s=latest.get("batch_age_s"), lag_s=latest.get("lag_s"),
                waiting_input_s=seen.waiting_input_age_s))
        good = latest_good(db, plan.name, shard)
        instances.append(InstanceStatus(
            shard_id=shard, group=plan.group_of(shard)[0], standby=plan.ha.standby, lease=lease, nodes=nodes,
            due=[action.describe() for action in decide(view)], last_failover=changes.get(shard),
            last_good_snapshot=_snapshot(good) if good else None))
    return PlanStatus(plan=plan.name, observed_at=database_now(db), instances=instances)


def timeline(db: Database, plan: PlanConfig, *, shard_id: str | None = None, limit: int = 50) -> Timeline:
    """The newest failover and supervision events of a plan (optionally one group instance), newest first."""
    if shard_id:
        plan.check_shard(shard_id)

    def work(cursor):
        cursor.execute("""SELECT * FROM failover_events WHERE plan = %s AND (%s::text IS NULL OR shard_id = %s)
                          ORDER BY happened_at DESC, id DESC LIMIT %s""", (plan.name, shard_id, shard_id, limit))
        return cursor.fetchall()

    return Timeline(plan=plan.name, events=[_event(row) for row in db.run(work, attempts=3)])


def snapshot_catalog(db: Database, plan: PlanConfig, *, shard_id: str | None = None,
                     statuses: tuple[str, ...] | None = None, limit: int = 50) -> SnapshotCatalog:
    """The snapshot catalog of a plan, newest first."""
    if shard_id:
        plan.check_shard(shard_id)
    records = list_snapshots(db, plan.name, shard_id=shard_id, statuses=statuses, limit=limit)
    return SnapshotCatalog(plan=plan.name, snapshots=[_snapshot(r) for r in records])


def quarantine_report(cluster: ClusterConfig, plan: PlanConfig, *, samples: int = 10) -> QuarantineReport:
    """Counts of the plan's quarantined lines (by reason and instance) and the newest ones."""
    table = read_table(delta_table_dir(cluster, plan.name, "quarantine"))
    if table.num_rows == 0:
        return QuarantineReport(plan=plan.name, total=0, by_reason={}, by_instance={}, samples=[])
    newest = table.take(pc.sort_indices(table, [("quarantined_at", "descending"), ("source_file", "ascending")])[:samples])
    return QuarantineReport(
        plan=plan.name, total=table.num_rows,
        by_reason=dict(Counter(table["reason"].to_pylist()).most_common()),
        by_instance=dict(sorted(Counter(table["shard_id"].to_pylist()).items())),
        samples=[QuarantineSample(quarantined_at=r["quarantined_at"], shard_id=r["shard_id"], node=r["node"],
                                  source_file=r["source_file"], reason=r["reason"], raw=r["raw"])
                 for r in newest.to_pylist()])


def output_kind(plan: PlanConfig, output: str, kind: str) -> None:
    """Refuse an output the plan does not have, or one of another kind than the endpoint serves."""
    if output not in plan.outputs:
        raise NotFound(f"plan {plan.name} has no output {output!r} (outputs: {', '.join(plan.outputs)})")
    if plan.outputs[output].kind != kind:
        raise BadRequest(f"{output} of plan {plan.name} is a {plan.outputs[output].kind} output, not {kind}")


def aggregate_rows(cluster: ClusterConfig, plan: PlanConfig, output: str, granularity: str, start: datetime,
                   end: datetime, keys: dict[str, list[str]] | None = None) -> AggregateRows:
    """An aggregation merged over instances, by ``granularity``, for buckets starting in ``[start, end)``."""
    output_kind(plan, output, "aggregation")
    try:
        rows = aggregation.query(cluster, plan.name, granularity, start, end, output=output, keys=keys)
    except NothingPublished:
        rows = []
    except QueryError as exc:
        raise BadRequest(str(exc)) from None
    return AggregateRows(plan=plan.name, output=output, granularity=granularity, start=start, end=end,
                         rows=[dict(r) for r in rows])


def table_rows(db: Database, plan: PlanConfig, output: str, key: dict[str, str] | None = None) -> TableRows:
    """A table output merged over instances (optionally the rows whose key fields have the given values)."""
    output_kind(plan, output, "table")
    config = plan.outputs[output]
    unknown = sorted(set(key or {}) - set(config.key))
    if unknown:
        raise BadRequest(f"{output} of plan {plan.name} has no key {', '.join(unknown)} (key: {', '.join(config.key)})")
    found = db.run(lambda cursor: read_table_rows(cursor, plan.name, output, config.values, key or None), attempts=3)
    return TableRows(plan=plan.name, output=output,
                     rows=[{**r["key"], **{v: float(r[v]) for v in config.values}, "instances": int(r["instances"])}
                           for r in found])


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
    """Events after ``cursor`` (from the first one when there is none), or else the newest ``tail`` ones (a feed's start)."""
    output_kind(plan, output, "events")
    position = decode_cursor(cursor) if cursor else START
    if tail is not None and not cursor:
        rows = db.run(lambda c: newest_events(c, plan.name, output, tail), attempts=3)
    else:
        rows = db.run(lambda c: events_after(c, plan.name, output, position, limit), attempts=3)
    if rows:
        position = (rows[-1]["xid"], rows[-1]["event_id"])
    return EventPage(plan=plan.name, output=output, next_cursor=encode_cursor(position),
                     events=[Event(event_id=r["event_id"], event_time=r["event_time"], shard_id=r["shard_id"],
                                   payload=r["payload"]) for r in rows])
