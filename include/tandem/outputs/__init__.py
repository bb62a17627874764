"""Output kinds: one module per kind, registered in :data:`OUTPUT_KINDS`, named by the declared output.

Each kind module holds its sink (publish; hold, trim and flush through
:class:`tandem.outputs.base.HeldUntilPublished`), its Delta read, and a ``sink(plan, output,
instance, database_url, delta_path, quarantine)`` factory. A new kind is one module plus its entry
here and in :class:`tandem.declarations.OutputConfig`'s ``kind``. The runtime's ``foreachBatch``
driver (:mod:`tandem.runtime.publisher`) only routes batches to them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from tandem.config import PlanConfig
from tandem.outputs import aggregation, events, quarantine, table
from tandem.outputs.base import Sink
from tandem.outputs.quarantine import QuarantineSink
from tandem.store.registry import InstanceKey


class SinkFactory(Protocol):
    def __call__(self, plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
                 quarantine: QuarantineSink | None = None) -> Sink: ...


OUTPUT_KINDS: dict[str, SinkFactory] = {
    "aggregation": aggregation.sink, "table": table.sink, "events": events.sink, "quarantine": quarantine.sink}


def sink_for(plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
             quarantine: QuarantineSink | None = None) -> Sink:
    """The sink of the declared output ``output`` of ``plan``, by its kind; rows its store refuses go to
    ``quarantine`` (the plan's quarantine output)."""
    return OUTPUT_KINDS[plan.outputs[output].kind](plan, output, instance, database_url, delta_path, quarantine)
