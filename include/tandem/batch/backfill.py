"""Backfill: recompute a closed event-time range of a plan's outputs from its retained input, then replace it.

Purpose
    A stream drops events later than its watermark, and a fixed query bug leaves wrong results behind. A backfill
    recomputes ``[start, end)`` of the plan's outputs from the input still retained (landing files, those landing
    retention moved to ``retained/``, the messages of a ``nats`` stream), late events included, with the plan's own
    query functions, and puts the result in place while the plan keeps running.

How it works
    1. Refusals (:func:`refusal_of_range`, each stream's source kind's
       :meth:`~tandem.sources.base.SourceKind.backfill_refusal`, :func:`tandem.store.backfills.register`): the range
       must be closed (its end at or before the slowest instance's event-time watermark: the stream will not write
       into it again; an instance whose queries keep no state has no watermark and is judged by arrival,
       :func:`read_through`), every landing file the instances read that may hold its events (modified at or after
       ``start``) must still exist (in ``landing/`` or ``retained/``), as must every message of a ``nats`` stream
       published at or after it, and no running backfill of the plan may overlap it. A registered backfill is
       RUNNING in ``tandem.backfills``.
    2. Recompute, per instance (:func:`recompute`): each of the instance's queries runs as a finite streaming
       query (``Trigger.AvailableNow``) over all the retained input of its partitions (landing and retained
       files, linked into one scratch folder first; messages) in one first micro-batch, so nothing is late inside
       it; each batch's rows go to scratch files under ``backfills/<plan>/<id>/``.
    3. Replace, per output, as its kind says (:func:`replace_output`). An aggregation of Spark's partials: the
       instance's seconds in the range are replaced and every coarser bucket overlapping it is rebuilt from its
       children in one PostgreSQL transaction that holds the table's publishers off, then in Delta (one commit
       with a predicate for the seconds, an append of the rebuilt buckets). Outputs published once by id: the
       rows the stream never published are published (:func:`publish_missing`).
    4. The report (per instance and output: seconds and events before and after) is stored with the backfill.

What it does not do
    It never stops, fences or waits for a running instance (only its transaction serialises with their
    publishes), never reads input the retention deleted, and leaves ranges the stream still writes alone.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession

from tandem.batch.trim import contributions_horizon
from tandem.checkpoints import committed_batch, query_dirs
from tandem.cutover import range_refusal_before_cut
from tandem.config import ClusterConfig, PlanConfig
from tandem.errors import BackfillRefused
from tandem.layout import backfill_dir, checkpoint_dir
from tandem.names import QUARANTINE_QUERY
from tandem.outputs import kind_of
from tandem.outputs.recompute import BATCH_COLUMN, Recomputed
from tandem.runtime.node import start_query
from tandem.runtime.plan_api import ALL_ROWS, PlanContext, check_plan_module, define, load_plan_module
from tandem.sources import source_of
from tandem.store import Database
from tandem.store import backfills as catalog
from tandem.store.heartbeats import newest_watermarks
from tandem.store.locks import AdvisoryLock, plan_lock
from tandem.store.leases import read_lease
from tandem.store.registry import InstanceKey
from tandem.store.trim import horizons

log = logging.getLogger(__name__)

CONTRIBUTION_MARGIN = timedelta(minutes=10)
"""A fact is applied (its id recorded) after its event time; a range starts this much after the oldest id kept,
for producers' clocks ahead of PostgreSQL's."""

Step = Callable[[str], None]
"""Called with a line before each step of a backfill (a progress bar, a task log)."""


# --- refusals (pure) ---------------------------------------------------------------------------------------------


def closed_until(positions: Mapping[tuple[str, str], datetime | None], instances: list[str],
                 holders: Mapping[str, str | None] | None = None) -> dict[str, datetime | None]:
    """Per instance, the event time up to which it will not write again: the newest watermark of its slowest query
    with one (``positions``: ``(instance, query)`` -> watermark, the instance as ``<plan>/<instance>/<node>``), on the
    node that holds its lease now (``holders``: instance -> node; ``None`` or no holder: the furthest of its nodes).
    Another node's may be from before a restore took the instance back; ``None`` when no query has one yet."""
    furthest: dict[tuple[str, str], datetime] = {}
    for (key_id, query), watermark in positions.items():
        _, instance, node = key_id.split("/")
        holder = (holders or {}).get(instance)
        if watermark is None or (holder is not None and node != holder):
            continue
        key = (instance, query)
        if key not in furthest or watermark > furthest[key]:
            furthest[key] = watermark
    return {instance: min((w for (s, _), w in furthest.items() if s == instance), default=None) for instance in instances}


def retention_refusal(plan: PlanConfig, start: datetime, end: datetime, trimmed: Mapping[str, datetime],
                      instances: list[str]) -> str | None:
    """Why ``[start, end)`` of ``instances`` needs rows the plan's retention deleted, or ``None`` (pure; ``trimmed``:
    :func:`tandem.store.trim.horizons`, rows older than each instant may be gone):

    - an output published once by id (a table, an aggregation with ``id``) publishes only the rows whose ids it does
      not find; a fact is applied after its event time, so every id of the range is kept when the ids trimmed were
      applied before ``start`` (less :data:`CONTRIBUTION_MARGIN`);
    - and each output's kind says what else of the range its retention deleted
      (:meth:`tandem.outputs.base.OutputKind.backfill_refusal`: an aggregation's coarser buckets are rebuilt from
      finer rows).
    """
    by_id = [name for name in plan.outputs if kind_of(plan, name).applies_contributions(plan.outputs[name])]
    for instance in instances if by_id else ():
        horizon = trimmed.get(contributions_horizon(instance))
        if horizon is not None and start < horizon + CONTRIBUTION_MARGIN:
            return (f"it starts at {start.isoformat()}, and instance {instance}'s ids of {', '.join(by_id)} applied "
                    f"before {horizon.isoformat(timespec='seconds')} were deleted (maintenance.retention."
                    "contributions): rows whose ids are gone would be published again; start it at or after "
                    f"{(horizon + CONTRIBUTION_MARGIN).isoformat(timespec='seconds')}")
    for output in plan.outputs:
        why = kind_of(plan, output).backfill_refusal(plan, output, start, end, trimmed)
        if why:
            return why
    return None


def read_through(pending_ms: Iterable[int], now_ms: int, lateness_s: float) -> datetime:
    """For an instance whose queries keep no state (each event is written when it is read, none is dropped as late):
    the event time up to which it will not write again, judged by arrival (pure). It has read everything that
    arrived before the oldest input it has not read yet (``pending_ms``: when each such landing file was written or
    message published; ``now_ms`` when it read everything); an event arriving later than the plan's watermark delay
    (``lateness_s``) after its event time is late by the plan's own definition, and a recomputation of an earlier
    range would miss it."""
    return datetime.fromtimestamp(min(pending_ms, default=now_ms) / 1000 - lateness_s, tz=timezone.utc)


def _unread_since(cluster: ClusterConfig, plan: PlanConfig, instance: str, query_dir: Path) -> list[int]:
    """When each input the query of ``query_dir`` has not read by its last committed batch arrived (ms), as each
    stream's source kind finds it (:meth:`tandem.sources.base.SourceKind.pending_arrivals`: landing files of the
    instance it did not process; per partition subject of a ``nats`` stream, the first message after its offset)."""
    return [arrived for name in plan.streams
            for arrived in source_of(plan, name).pending_arrivals(cluster, plan, instance, name, query_dir)]


def _stateless_read_through(cluster: ClusterConfig, plan: PlanConfig, instance: str) -> datetime | None:
    """:func:`read_through` of an instance from the node that read furthest, when every query of it committed a
    batch with no state (a Spark checkpoint has a ``state`` folder once a query keeps state); else ``None``."""
    per_node = [query_dirs(checkpoint_dir(cluster, plan.name, instance, node)) for node in plan.nodes]
    stateless = [queries for queries in per_node if queries and all(
        committed_batch(q) is not None and not (q / "state").exists() for q in queries.values())]
    if not stateless:
        return None
    now_ms = int(time.time() * 1000)
    return max(min(read_through(_unread_since(cluster, plan, instance, q), now_ms, plan.watermark_s)
                   for q in queries.values()) for queries in stateless)


def instances_closed_until(cluster: ClusterConfig, db: Database, plan: PlanConfig,
                           instances: list[str]) -> dict[str, datetime | None]:
    """:func:`closed_until` of ``instances`` from the newest progress rows of ``plan`` in PostgreSQL, on the nodes that
    hold their leases; for an instance whose queries keep no state (no watermark either), :func:`read_through` of
    its checkpoints and landing files."""
    holders = {instance: lease.holder if (lease := read_lease(db, plan.name, instance)) else None for instance in instances}
    closed = closed_until(newest_watermarks(db, plan.name), instances, holders)
    return {instance: until if until is not None else _stateless_read_through(cluster, plan, instance)
            for instance, until in closed.items()}


def refusal_of_range(start: datetime, end: datetime, closed: Mapping[str, datetime | None]) -> str | None:
    """Why ``[start, end)`` cannot be backfilled for these instances (``closed``: :func:`closed_until`), or ``None``."""
    if start.tzinfo is None or end.tzinfo is None:
        return "start and end must carry a time zone (e.g. 2026-11-26T10:00:00Z)"
    if start >= end:
        return f"the range is empty: start {start.isoformat()} is not before end {end.isoformat()}"
    for instance, until in closed.items():
        if until is None:
            return (f"instance {instance} has no event-time watermark yet (nor, keeping no state, has it read any "
                    "input): no range of it is closed")
        if end > until:
            return (f"the range is not closed: it ends at {end.isoformat()}, after instance {instance}'s watermark "
                    f"{until.isoformat()} (the stream may still write into it); end it at or before that")
    return None


def check_backfill(cluster: ClusterConfig, plan: PlanConfig, db: Database, start: datetime, end: datetime,
                   instances: list[str]) -> None:
    """Raise :class:`BackfillRefused` with the reason if ``[start, end)`` of ``instances`` cannot be backfilled now."""
    reason = refusal_of_range(start, end, instances_closed_until(cluster, db, plan, instances)) \
        or retention_refusal(plan, start, end, horizons(db, plan.name), instances) \
        or range_refusal_before_cut(cluster, plan, start)
    if reason:
        raise BackfillRefused(f"backfill of plan {plan.name}: {reason}")
    refused = [why for name in plan.streams
               if (why := source_of(plan, name).backfill_refusal(cluster, plan, instances, name, start))]
    if refused:
        raise BackfillRefused(f"backfill of plan {plan.name}: {'; '.join(refused)}")


# --- recompute ---------------------------------------------------------------------------------------------------


def gather_input(cluster: ClusterConfig, plan: PlanConfig, instance: str, folder: Path) -> dict[str, list[Path]]:
    """The instance's input of each stream whose kind fixes it for a recomputation, in ``folder``
    (:meth:`tandem.sources.base.SourceKind.gather`: every retained file of a ``files`` stream, linked); the
    folders by stream."""
    return {stream: folders for stream in plan.streams
            if (folders := source_of(plan, stream).gather(cluster, plan, instance, stream, folder))}


def in_one_batch(plan: PlanConfig) -> PlanConfig:
    """``plan`` with no admission limit on its streams: a finite run reads all its input in one micro-batch, so
    nothing is late inside it (pure)."""
    return dataclasses.replace(plan, streams={name: source_of(plan, name).unbounded(stream)
                                              for name, stream in plan.streams.items()})


def recompute(spark: SparkSession, cluster: ClusterConfig, plan: PlanConfig, instance: str,
              scratch: Path) -> dict[str, pa.Table]:
    """Run the instance's queries (not the quarantine) over all its retained input (:func:`gather_input`) as finite
    queries; per output, every row they emitted, with the micro-batch it came in as :data:`BATCH_COLUMN`."""
    ctx = PlanContext(cluster, in_one_batch(plan), InstanceKey(plan.name, instance, "backfill"), spark,
                      input_folders=gather_input(cluster, plan, instance, scratch / "input"))
    specs = check_plan_module(plan, load_plan_module(plan))
    rows: dict[str, list[pa.Table]] = {}
    for name in ctx.queries:
        if name == QUARANTINE_QUERY:
            continue
        definition = define(ctx, specs[name])
        folder = scratch / "rows" / name
        folder.mkdir(parents=True, exist_ok=True)

        def keep(frame: DataFrame, batch_id: int, folder: Path = folder) -> None:
            table = frame.toArrow()
            table = table.append_column(BATCH_COLUMN, pa.repeat(pa.scalar(batch_id, pa.int64()), table.num_rows))
            pq.write_table(table, folder / f"{batch_id}.parquet")

        query = start_query(spark, definition, definition.frame.writeStream
                            .queryName(f"backfill:{plan.name}/{instance}:{name}").outputMode(definition.output_mode)
                            .option("checkpointLocation", str(scratch / "checkpoints" / name))
                            .foreachBatch(keep).trigger(availableNow=True))
        query.awaitTermination()
        emitted = [pq.read_table(f) for f in sorted(folder.glob("*.parquet"))]
        if not emitted:
            continue
        table = pa.concat_tables(emitted, promote_options="default")
        spec = specs[name]
        for value, outputs in spec.routes.items():
            part = table if value == ALL_ROWS else table.filter(pc.equal(table[spec.route_by], value))
            for output in outputs:
                rows.setdefault(output, []).append(part)
    return {output: pa.concat_tables(parts, promote_options="default") for output, parts in rows.items()}


# --- replace -----------------------------------------------------------------------------------------------------


def replace_output(cluster: ClusterConfig, plan: PlanConfig, db: Database, instance: str, output: str,
                   rows: pa.Table | None, start: datetime, end: datetime, backfill_id: str) -> dict[str, Any]:
    """Put the recomputed ``rows`` of one instance's ``output`` in place for ``[start, end)`` (``None``: it emitted
    none), as its kind does (:meth:`tandem.outputs.base.OutputKind.replace`); what changed."""
    job = Recomputed(cluster, plan, db, instance, output, rows, start, end)
    return kind_of(plan, output).replace(job, backfill_id)


# --- the whole backfill ------------------------------------------------------------------------------------------


def run_backfill(cluster: ClusterConfig, plan: PlanConfig, db: Database, spark: SparkSession, start: datetime,
                 end: datetime, *, instances: list[str] | None = None, requested_by: str = "tandem backfill",
                 backfill_id: str | None = None, step: Step = log.info) -> catalog.BackfillRecord:
    """Check, register (or take over the registered ``backfill_id``), recompute and replace ``[start, end)`` of
    ``instances`` (default: every instance of the plan); the finished record (DONE, or FAILED with the error, which
    is raised again).

    The refusals are checked again under the plan's lock before anything is recomputed: maintenance may have run
    between the registration and the run (a queued task, a retry after a lost worker), and a backfill it makes
    unsafe fails with the reason (:class:`BackfillRefused`)."""
    if backfill_id is None:
        instances = [plan.check_instance(s) for s in instances] if instances else list(plan.instances)
        check_backfill(cluster, plan, db, start, end, instances)
        backfill_id = catalog.register(db, plan.name, start, end, instances, requested_by).id
    with AdvisoryLock(cluster.database_url, "backfill", catalog.run_lock_name(backfill_id)), \
            plan_lock(cluster.database_url, plan.name, f"backfill {backfill_id}"):  # both held while it runs
        record = catalog.get_backfill(db, backfill_id)
        if record is None or record.status != catalog.RUNNING:
            raise BackfillRefused(f"no RUNNING backfill {backfill_id!r} of plan {plan.name}"
                                  + (f" (it is {record.status}: {record.error})" if record and record.error else ""))
        try:
            check_backfill(cluster, plan, db, record.range_start, record.range_end, record.instances)
        except BackfillRefused as exc:
            catalog.finish(db, record.id, catalog.FAILED, {}, str(exc))
            raise
        return _run_registered(cluster, plan, db, spark, record, step)


def _run_registered(cluster: ClusterConfig, plan: PlanConfig, db: Database, spark: SparkSession,
                    record: catalog.BackfillRecord, step: Step) -> catalog.BackfillRecord:
    report: dict[str, Any] = {}
    scratch = backfill_dir(cluster, plan.name, record.id)
    try:
        for instance in record.instances:
            step(f"{instance}: recomputing {record.range_start.isoformat()} .. {record.range_end.isoformat()}")
            recomputed = recompute(spark, cluster, plan, instance, scratch / instance)
            report[instance] = {}
            for output in plan.outputs:
                if not kind_of(plan, output).recomputed:
                    continue
                step(f"{instance}: replacing {output}")
                report[instance][output] = replace_output(cluster, plan, db, instance, output, recomputed.get(output),
                                                       record.range_start, record.range_end, record.id)
    except Exception as exc:
        catalog.finish(db, record.id, catalog.FAILED, report, f"{type(exc).__name__}: {exc}")
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    catalog.finish(db, record.id, catalog.DONE, report)
    return catalog.get_backfill(db, record.id)
