"""Reconcile: compare what the stream published for a closed range with a batch recomputation of it, key by key.

Purpose
    Knowing the stream is right. The daily ``tandem_<plan>_reconcile`` DAG (one run per day, partitioned by day,
    so Airflow's own backfill runs it over a month) recomputes the previous day of each instance exactly as a
    backfill does (:func:`tandem.batch.backfill.recompute`) and compares it with the published outputs.

How it works
    Per instance and output (:func:`compare_partials` for Spark's partial aggregates, :func:`compare_ids` for the
    outputs published once by id), each difference is one of:

    - ``late``: the recomputation counts more than was published (a key missing from the output, or a second
      with fewer events): events that came after the watermark, which the stream drops by design;
    - ``extra``: published, but the recomputation does not produce it;
    - ``different``: both have it, with other values, and the stream did not merely miss events.

    The counts and a few examples are appended to the Delta table ``delta/<plan>/reconciliations``
    (:mod:`tandem.batch.reconciliations`, one row per instance and output), returned for the DAG's asset event,
    and shown by ``tandem status``. A run fails when its extra and different keys exceed
    ``reconcile.tolerance``; ``reconcile.repair: true`` hands the range to a backfill (which adds the late
    events and replaces the aggregations).
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from tandem.aggregation.spec import AggregationSpec, spec_for
from tandem.batch.backfill import BATCH_COLUMN, check_backfill, in_range, newest_seconds, recompute
from tandem.config import ClusterConfig, PlanConfig
from tandem.json_values import json_text
from tandem.layout import backfill_dir, delta_table_dir
from tandem.batch.reconciliations import KINDS, store_outcomes
from tandem.outputs import sink_for
from tandem.store import Database
from tandem.store import aggregates
from tandem.store import outputs as store_outputs
from tandem.store.registry import InstanceKey

EXAMPLES = 5
RELATIVE = 1e-9
"""Sums of doubles recomputed in another order may differ in the last bits."""


@dataclass
class Outcome:
    """The differences of one instance's output."""

    shard_id: str
    output: str
    compared: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    examples: dict[str, list[Any]] = field(default_factory=lambda: {k: [] for k in KINDS})
    skipped: str | None = None

    def add(self, kind: str, example: Any) -> None:
        self.counts[kind] += 1
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(example)

    def row(self) -> dict[str, Any]:
        """What :func:`tandem.batch.reconciliations.store_outcomes` stores of it."""
        return {"shard_id": self.shard_id, "output": self.output, "compared": self.compared, **self.counts,
                "examples": json_text(self.examples), "skipped": self.skipped}

    @property
    def real(self) -> int:
        """Differences the watermark does not explain."""
        return self.counts["extra"] + self.counts["different"]


# --- comparisons (pure) --------------------------------------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True  # a sum that met both infinities, on both sides
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and math.isclose(a, b, rel_tol=RELATIVE, abs_tol=1e-9)
    return a == b


def compare_partials(outcome: Outcome, published: list[Mapping[str, Any]], recomputed: list[Mapping[str, Any]],
                     keys: tuple[str, ...], measures: list[str], count: str) -> Outcome:
    """Per (second, keys): late when the recomputation counts more events than were published (or the second is
    missing), extra when only published, different when the values differ otherwise (pure; sketches compared as
    bytes)."""
    def by_key(rows):
        return {(row["bucket_start"], *(row[k] for k in keys)): row for row in rows}

    ours, theirs = by_key(recomputed), by_key(published)
    outcome.compared += len(set(ours) | set(theirs))
    for key in sorted(set(ours) | set(theirs), key=lambda k: (k[0], *map(str, k[1:]))):
        label = {"bucket_start": str(key[0]), **dict(zip(keys, key[1:]))}
        if key not in theirs:
            outcome.add("late", {**label, "recomputed": ours[key][count], "published": 0})
        elif key not in ours:
            outcome.add("extra", {**label, "published": theirs[key][count]})
        elif ours[key][count] > theirs[key][count]:
            outcome.add("late", {**label, "recomputed": ours[key][count], "published": theirs[key][count]})
        elif not all(_same(ours[key][m], theirs[key][m]) for m in measures):
            outcome.add("different", {**label, **{m: [theirs[key][m], ours[key][m]] for m in measures
                                                  if not _same(ours[key][m], theirs[key][m])}})
    return outcome


def compare_ids(outcome: Outcome, published: Mapping[str, Any] | None, recomputed: Mapping[str, Any]) -> Outcome:
    """Outputs published once by id: late when recomputed but never published; with ``published`` (events: id ->
    payload), extra when only published and different when the payloads differ (pure; doubles within
    :data:`RELATIVE`, as a reading's average summed in another order may differ in the last bits)."""
    outcome.compared += len(set(recomputed) | set(published or {}))
    for event_id, row in sorted(recomputed.items()):
        if published is not None and event_id in published:
            theirs = published[event_id]
            differing = {k: [theirs.get(k), v] for k, v in row.items() if not _same(theirs.get(k), v)}
            if differing:
                outcome.add("different", {"id": event_id, **differing})
        elif published is None or event_id not in published:
            outcome.add("late", {"id": event_id})
    for event_id in sorted(set(published or {}) - set(recomputed)):
        outcome.add("extra", {"id": event_id})
    return outcome


# --- the run -------------------------------------------------------------------------------------------------------


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(row, default=str))


def _compare(cluster: ClusterConfig, plan: PlanConfig, db: Database, shard_id: str, output: str,
             rows: pa.Table | None, start: datetime, end: datetime) -> Outcome:
    outcome = Outcome(shard_id, output)
    declared = plan.outputs[output]
    if declared.kind == "aggregation" and not declared.id:
        spec: AggregationSpec = spec_for(plan, output)
        recomputed = [] if rows is None else newest_seconds(rows, spec.keys, start, end).to_pylist()

        def published(cursor) -> list[dict[str, Any]]:
            aggregates.ensure_table(cursor, spec)
            return aggregates.seconds_between(cursor, spec, plan.name, shard_id, start, end)

        return compare_partials(outcome, db.run(published, attempts=3), recomputed, spec.keys,
                                spec.measure_columns, spec.version_column)
    if declared.time is None:
        outcome.skipped = f"{output} declares no time field: its range cannot be bounded"
        return outcome
    sink = sink_for(plan, output, InstanceKey(plan.name, shard_id, "reconcile"), cluster.database_url,
                    delta_table_dir(cluster, plan.name, output))
    recomputed = {} if rows is None else {
        i: _plain(row) for i, row in sink.identities(in_range(rows.drop_columns([BATCH_COLUMN]), declared.time,
                                                               start, end)).items()}
    if declared.kind == "events":
        events = db.run(lambda cursor: store_outputs.read_events(cursor, plan.name, output, start, end), attempts=3)
        return compare_ids(outcome, {e["event_id"]: e["payload"] for e in events if e["shard_id"] == shard_id},
                           recomputed)
    known = db.run(lambda cursor: store_outputs.known_ids(cursor, sink.table, sink.id_column, plan.name, output,
                                                          list(recomputed)), attempts=3) if recomputed else set()
    outcome.compared += len(known)
    return compare_ids(outcome, None, {i: row for i, row in recomputed.items() if i not in known})


def reconcile(cluster: ClusterConfig, plan: PlanConfig, db: Database, spark: SparkSession, start: datetime,
              end: datetime, *, run_id: str, shards: list[str] | None = None) -> list[Outcome]:
    """Recompute ``[start, end)`` of every instance (or ``shards``), compare it with the published outputs, append
    the outcomes to ``delta/<plan>/reconciliations`` (once per ``run_id``) and return them. Refused as a backfill
    would be (range not closed, input gone)."""
    shards = [plan.check_shard(s) for s in shards] if shards else list(plan.shards)
    check_backfill(cluster, plan, db, start, end, shards)
    scratch = backfill_dir(cluster, plan.name, f"reconcile-{run_id}".replace("/", "_").replace(":", "_"))
    outcomes = []
    try:
        for shard in shards:
            recomputed = recompute(spark, cluster, plan, shard, scratch / shard)
            outcomes += [_compare(cluster, plan, db, shard, output, recomputed.get(output), start, end)
                         for output in plan.outputs if plan.outputs[output].kind != "quarantine"]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    store_outcomes(cluster, plan, [o.row() for o in outcomes], start, end, run_id)
    return outcomes
