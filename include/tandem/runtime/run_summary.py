"""What one run of an instance did, in a few lines: ``tandem run`` prints it when the run ends (an available-now
run reads what waits and stops), from the progress and publish rows the runtime records anyway
(:func:`tandem.store.heartbeats.current_run_totals`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tandem.store.db import Database
from tandem.store.heartbeats import current_run_totals
from tandem.store.registry import InstanceKey


@dataclass(frozen=True)
class RunSummary:
    """A run's totals: per query what it read, per output what it published, and how the run ended."""

    instance_id: str
    status: str
    error: str | None
    queries: Sequence[Mapping[str, Any]]
    """``query_name``, ``batches``, ``input_rows``, ``quarantined_rows`` (``None``: the query counts none)."""
    outputs: Sequence[Mapping[str, Any]]
    """``output``, ``batches``, ``rows``."""

    @property
    def quarantined(self) -> int:
        return sum(q["quarantined_rows"] or 0 for q in self.queries)

    def lines(self) -> list[str]:
        """The summary, its last line the final state as before (``STOPPED``, or ``FAILED <error>``) (pure)."""
        read = "; ".join(f"{q['query_name']} {q['input_rows']:,} rows in {_batches(q['batches'])}"
                         for q in self.queries) or "nothing (no batch ran)"
        published = "; ".join(f"{o['output']} {o['rows']:,} rows in {_batches(o['batches'])}"
                              for o in self.outputs) or "nothing"
        counted = [q for q in self.queries if q["quarantined_rows"] is not None]
        lines = [f"{self.instance_id}: this run",
                 f"  read:        {read}",
                 f"  published:   {published}"]
        if counted:
            lines.append(f"  quarantined: {self.quarantined:,} lines ("
                         + "; ".join(f"by {q['query_name']}" for q in counted) + ")")
        return [*lines, f"{self.status} {self.error or ''}".rstrip()]


def _batches(n: int) -> str:
    return f"{n:,} batch" + ("" if n == 1 else "es")


def summarize_run(database_url: str, key: InstanceKey, status: str, error: str | None) -> RunSummary:
    """The summary of the run of ``key`` that just ended with ``status`` (and ``error``)."""
    with Database(database_url, "tandem-cli") as db:
        queries, outputs = current_run_totals(db, key.id)
    return RunSummary(key.id, status, error, queries, outputs)
