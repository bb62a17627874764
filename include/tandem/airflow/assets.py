"""A plan's outputs as Airflow Assets: downstream DAGs schedule on what Tandem changed (data-aware scheduling).

Purpose
    A backfill, a reconcile's repair or a maintenance run that changed an output emits an asset event for it, so
    that a DAG scheduled on ``output_asset(plan, output)`` runs after it.

How it works
    Each output is the Asset ``tandem.<plan>.<output>`` with the URI ``x-tandem://<plan>/<output>``
    (:func:`output_asset`; Airflow leaves ``x-`` schemes as they are, no provider needed). The tasks that may change
    outputs declare the plan's :class:`~airflow.sdk.AssetAlias` ``tandem.<plan>.outputs`` (:func:`outputs_alias`)
    as their outlet, not the assets themselves: Airflow emits an event for every declared Asset of a task that
    succeeds, but through an alias only for those the task adds (:func:`emit_output_events`). The pure functions
    :func:`backfill_changes`, :func:`upkeep_changes` and :func:`retention_changes` say which outputs a run changed,
    and the event's ``extra`` says how.

What it does not do
    The streaming instances' own publishes emit no event (they publish every second); an output nobody schedules
    on gets its asset row at its first event (Airflow creates it then).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import PurePath
from typing import Any

from tandem.names import REPAIR_REQUESTED_BY
from tandem.store.outputs import to_json

OUTPUT_SCHEME = "x-tandem"
"""The URI scheme of Tandem's output assets (``x-`` schemes need no provider and are not rewritten by Airflow)."""


def output_asset(plan: str, output: str) -> Any:
    """The Asset of one output of a plan: name ``tandem.<plan>.<output>``, URI ``x-tandem://<plan>/<output>``."""
    from airflow.sdk import Asset

    return Asset(name=f"tandem.{plan}.{output}", uri=f"{OUTPUT_SCHEME}://{plan}/{output}")


def outputs_alias(plan: str) -> Any:
    """The AssetAlias the tasks that may change a plan's outputs declare as their outlet: ``tandem.<plan>.outputs``."""
    from airflow.sdk import AssetAlias

    return AssetAlias(name=f"tandem.{plan}.outputs")


def outcome_changed(outcome: Mapping[str, Any]) -> bool:
    """Whether one instance's backfill outcome of one output changed the output (pure): rows published that the
    stream never published, an aggregation's range rewritten (its rows are replaced even when equal), or counts
    that differ before and after."""
    if not outcome.get("recomputed"):
        return False
    if outcome.get("published", 0) or outcome.get("rows_written", 0):
        return True
    return any(outcome.get(f"{what}_before") != outcome.get(f"{what}_after") for what in ("seconds", "events")
               if f"{what}_before" in outcome)


def backfill_changes(report: Mapping[str, Mapping[str, Mapping[str, Any]]], *, backfill_id: str,
                     start: datetime | str, end: datetime | str, how: str = "backfill") -> dict[str, dict[str, Any]]:
    """The outputs a finished backfill changed, each with its event's ``extra`` (pure).

    Args:
        report: the backfill's report, per instance and output (``tandem.backfills.report``).
        how: ``backfill``, or ``reconcile repair`` for the backfill a reconcile ran.
    """
    changes: dict[str, dict[str, Any]] = {}
    for instance, outputs in report.items():
        for output, outcome in outputs.items():
            if not outcome_changed(outcome):
                continue
            extra = changes.setdefault(output, {"changed_by": how, "backfill_id": backfill_id,
                                                "range_start": to_json(start), "range_end": to_json(end),
                                                "instances": {}})
            extra["instances"][instance] = to_json(dict(outcome))
    return changes


def upkeep_changes(outputs: Iterable[str], upkeeps: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """The outputs whose Delta table an upkeep compacted or expired rows of (pure; ``upkeeps``:
    :class:`tandem.lake.maintenance.Upkeep`, one per table ``delta/<plan>/<output>``). A compaction rewrites files,
    not rows: ``rows_changed`` in the extra says whether rows went."""
    names = set(outputs)
    changes = {}
    for upkeep in upkeeps:
        output = PurePath(upkeep.path).name
        if output in names and (upkeep.files_compacted or upkeep.rows_expired):
            changes[output] = {"changed_by": "delta_upkeep", "rows_changed": bool(upkeep.rows_expired),
                               "rows_expired": upkeep.rows_expired, "files_compacted": upkeep.files_compacted,
                               "files_written": upkeep.files_written, "delta_version": upkeep.version_after}
    return changes


def trimmed_output(outputs: Iterable[str], what: str) -> str | None:
    """The output a retention part (:class:`tandem.outputs.base.Trimmed`) deleted rows of, from its ``what``
    (``"<granularity> partials of <output>"``, ``"<output> of instance <instance>"``, ``"keys of <output>"``);
    ``None`` for bookkeeping rows (pure)."""
    for output in outputs:
        if what.endswith(f" of {output}") or what.startswith(f"{output} of instance "):
            return output
    return None


def retention_changes(outputs: Iterable[str], trimmed: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """The outputs a PostgreSQL retention run deleted rows of, with how many and before when (pure)."""
    names = sorted(set(outputs), key=len, reverse=True)  # the longest name first: "a_b" before "b"
    changes: dict[str, dict[str, Any]] = {}
    for part in trimmed:
        output = trimmed_output(names, part.what) if part.rows else None
        if output is None:
            continue
        extra = changes.setdefault(output, {"changed_by": "postgres_retention", "rows_changed": True,
                                            "rows_deleted": 0, "deleted": []})
        extra["rows_deleted"] += part.rows
        extra["deleted"].append(f"{part.what}: {part.rows} rows before {to_json(part.before)}")
    return changes


def emit_output_events(context: Mapping[str, Any], plan: str, changes: Mapping[str, Mapping[str, Any]],
                       log: Any) -> list[str]:
    """Add an asset event per changed output through the plan's alias (the task must declare
    :func:`outputs_alias` among its outlets); the URIs, for the log and the return value."""
    if not changes:
        log.info("no output of %s changed: no asset event", plan)
        return []
    if "outlet_events" not in context:  # called outside a task run (tests, a script): no event to add
        log.info("not in an Airflow task run: no asset event for %s", ", ".join(sorted(changes)))
        return []
    alias = outputs_alias(plan)
    outlets = getattr(context.get("task"), "outlets", None) or []
    if alias not in outlets:
        log.warning("this task does not declare the outlet %s: Airflow drops its asset events", alias.name)
    uris = []
    for output, extra in sorted(changes.items()):
        asset = output_asset(plan, output)
        context["outlet_events"][alias].add(asset, extra=to_json(dict(extra)))
        log.info("asset event for %s (%s)", asset.uri, extra.get("changed_by", "changed"))
        uris.append(asset.uri)
    return uris


class RepairedOutputs:
    """``post_execute`` hook of a reconcile's Spark task: an asset event per output the repair changed.

    ``jobs/reconcile.py`` repairs with a backfill when the plan says ``reconcile.repair: true``; that backfill is
    found by its ``requested_by`` (:data:`REPAIR_REQUESTED_BY`). Its outcome also goes to the XCom ``repaired``
    (for the reconcile's notification). Without a repair, nothing is emitted.
    """

    def __init__(self, plan: str, cluster_config: str | None = None) -> None:
        self.plan = plan
        self.cluster_config = cluster_config

    def __call__(self, context: Mapping[str, Any], result: Any = None) -> None:
        import logging

        from tandem.airflow.operator_support import task_cluster
        from tandem.store import Database
        from tandem.store import backfills as catalog

        log = logging.getLogger(__name__)
        requested_by = REPAIR_REQUESTED_BY.format(run_id=context["run_id"])
        cluster = task_cluster(self.cluster_config)
        with Database(cluster.database_url, "tandem-reconcile") as db:
            repairs = [r for r in catalog.list_backfills(db, self.plan, limit=50) if r.requested_by == requested_by]
        if not repairs:
            log.info("the reconcile of run %s repaired nothing", context["run_id"])
            return
        record = repairs[0]
        changes = (backfill_changes(record.report, backfill_id=record.id, start=record.range_start,
                                    end=record.range_end, how="reconcile repair")
                   if record.status == catalog.DONE else {})
        emit_output_events(context, self.plan, changes, log)
        context["ti"].xcom_push(key="repaired", value={"backfill_id": record.id, "status": record.status,
                                                       "outputs": sorted(changes)})
