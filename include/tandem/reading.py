"""Read any output of a plan, merged over its instances, by asking its kind (:meth:`OutputKind.read`).

The command line (``tandem query``), the demo and the tests read through :func:`read_output`; rows come in one
shape per kind, the same from PostgreSQL and from Delta.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tandem.config import ClusterConfig, PlanConfig, load_plan
from tandem.errors import QueryError
from tandem.outputs import kind_of
from tandem.outputs.base import ReadRequest

SOURCES = ("postgres", "delta")


def only_output(plan: PlanConfig, wanted: str | None = None) -> str:
    """``wanted`` when the plan declares it, else the plan's only output besides its quarantine."""
    if wanted is not None:
        if wanted not in plan.outputs:
            raise QueryError(f"plan {plan.name} has no output {wanted!r} (outputs: {', '.join(plan.outputs)})")
        return wanted
    readable = [name for name in plan.outputs if kind_of(plan, name).recomputed]
    if len(readable) != 1:
        raise QueryError(f"plan {plan.name} has several outputs: name one ({', '.join(plan.outputs)})")
    return readable[0]


def read_output(cluster: ClusterConfig, plan: PlanConfig | str, granularity: str | None = None,
                start: datetime | None = None, end: datetime | None = None, *, output: str | None = None,
                keys: dict[str, list[Any]] | None = None, source: str = "postgres",
                limit: int | None = None) -> list[dict[str, Any]]:
    """The rows of ``output`` (default: the plan's only one) merged over the plan's instances.

    ``granularity``: an aggregation's buckets (default: its finest); ``[start, end)``: the event-time range
    (default: all of it); ``keys``: per key field, the values wanted; ``source``: ``postgres`` or ``delta``.
    """
    plan = plan if isinstance(plan, PlanConfig) else load_plan(plan, cluster)
    if source not in SOURCES:
        raise QueryError(f"unknown source {source!r} (expected one of {', '.join(SOURCES)})")
    output = only_output(plan, output)
    request = ReadRequest(start=start, end=end, granularity=granularity,
                          keys={name: list(values) for name, values in (keys or {}).items()}, source=source,
                          limit=limit)
    return kind_of(plan, output).read(cluster, plan, output, request)
