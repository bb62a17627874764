"""Output kinds: one module per kind, each holding one :class:`~tandem.outputs.base.OutputKind` as ``KIND``.

A kind owns every duty of its outputs (declaration rules, sink, read, restore, backfill, reconcile, retention,
validation: see :class:`~tandem.outputs.base.OutputKind`); generic code asks :func:`kind_of` and never names a
kind. A new kind is one module here, its entry in :data:`OUTPUT_KINDS`, its migration and its tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tandem.outputs import aggregation, events, latest, quarantine, table
from tandem.outputs.base import OutputKind, Sink
from tandem.outputs.quarantine import QuarantineSink
from tandem.store.registry import InstanceKey

if TYPE_CHECKING:
    from tandem.config import PlanConfig

OUTPUT_KINDS: dict[str, OutputKind] = {kind.name: kind for kind in (
    aggregation.KIND, table.KIND, events.KIND, latest.KIND, quarantine.KIND)}


def kind_of(plan: PlanConfig, output: str) -> OutputKind:
    """The kind of the declared output ``output`` of ``plan``."""
    return OUTPUT_KINDS[plan.outputs[output].kind]


def sink_for(plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
             quarantine: QuarantineSink | None = None) -> Sink:
    """The sink of the declared output ``output`` of ``plan``, by its kind; rows its store refuses go to
    ``quarantine`` (the plan's quarantine output)."""
    return kind_of(plan, output).sink(plan, output, instance, database_url, delta_path, quarantine)
