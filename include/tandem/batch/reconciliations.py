"""The reconcile runs' results: the Delta table ``delta/<plan>/reconciliations``, one row per run, instance and output.

Written by :mod:`tandem.batch.reconcile` (Spark), read by the reconcile DAG's verdict, ``tandem status`` and the page
(no Spark needed to read it).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from tandem.config import ClusterConfig, PlanConfig
from tandem.lake.tables import append_once, read_table
from tandem.layout import delta_table_dir
from tandem.names import RECONCILIATIONS
from tandem.outputs.recompute import DIFFERENCES

"""``late``: the stream counted fewer events (the watermark dropped them, by design); ``extra``: published but not
recomputed; ``different``: other values."""
SCHEMA = pa.schema([
    ("run_id", pa.string()), ("reconciled_at", pa.timestamp("us", tz="UTC")),
    ("range_start", pa.timestamp("us", tz="UTC")), ("range_end", pa.timestamp("us", tz="UTC")),
    ("instance", pa.string()), ("output", pa.string()), ("compared", pa.int64()),
    *[(k, pa.int64()) for k in DIFFERENCES], ("examples", pa.string()), ("skipped", pa.string())])


def store_outcomes(cluster: ClusterConfig, plan: PlanConfig, outcomes: list[dict[str, Any]], start: datetime,
                   end: datetime, run_id: str) -> None:
    """Append one run's outcomes (``instance``, ``output``, ``compared``, the counts, ``examples``, ``skipped``), once
    per ``run_id``."""
    now = datetime.now(timezone.utc)
    rows = pa.Table.from_pylist([{"run_id": run_id, "reconciled_at": now, "range_start": start, "range_end": end,
                                  **outcome} for outcome in outcomes], schema=SCHEMA)
    append_once(delta_table_dir(cluster, plan.name, RECONCILIATIONS), rows, app_id=f"reconcile/{run_id}", version=0)


def reconciliation_rows(cluster: ClusterConfig, plan: PlanConfig, run_id: str | None = None) -> list[dict[str, Any]]:
    """The stored rows of one reconcile run (default: the plan's newest; none yet: ``[]``)."""
    rows = read_table(delta_table_dir(cluster, plan.name, RECONCILIATIONS)).to_pylist()
    if run_id is None and rows:
        run_id = max(rows, key=lambda r: r["reconciled_at"])["run_id"]
    return [r for r in rows if r["run_id"] == run_id]


def summary(outcomes: list[Any]) -> dict[str, int]:
    """Counts of every kind over a run's outcomes (:class:`tandem.batch.reconcile.Outcome`) or its stored rows."""
    def count(outcome: Any, kind: str) -> int:
        return outcome[kind] if isinstance(outcome, dict) else outcome.counts[kind]

    return {kind: sum(count(o, kind) for o in outcomes) for kind in DIFFERENCES}
