"""Output kinds: one module per kind, registered in :data:`OUTPUT_KINDS`, named by the declared output.

Each kind module is an :class:`OutputKind`: its sink (publish; hold, trim and flush through
:class:`tandem.outputs.base.HeldUntilPublished`), its Delta read, its restore policy and its
validation policy. A new kind is one module plus its entry here and in
:class:`tandem.declarations.OutputConfig`'s ``kind``. The runtime's ``foreachBatch`` driver
(:mod:`tandem.runtime.publisher`) only routes batches to the sinks; a restore
(:mod:`tandem.snapshots.restore`) and the validation (:mod:`tandem.quality.outputs`) ask the kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from tandem.config import PlanConfig
from tandem.outputs import aggregation, events, quarantine, table
from tandem.outputs.base import Sink, Validation
from tandem.outputs.quarantine import QuarantineSink
from tandem.store.db import Database
from tandem.store.registry import InstanceKey


class OutputKind(Protocol):
    """What a kind module provides (module-level functions)."""

    def sink(self, plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
             quarantine: QuarantineSink | None = None) -> Sink:
        """The sink of ``output`` for one instance; rows its store refuses go to ``quarantine``."""

    def restore(self, db: Database, plan: PlanConfig, output: str, path: Path, shard_id: str,
                version: int | None) -> dict[str, int | None] | None:
        """Put one instance's part of ``output`` (its Delta table at ``path``) back to a snapshot's cut
        (``version`` of that table; ``None``: the table was empty then). Returns what changed, or
        ``None`` when the output is kept as it is (the replay after the cut adds only what is missing)."""

    def validation(self, plan: PlanConfig, output: str) -> Validation | None:
        """How ``output`` is validated, or ``None`` when it is not."""


OUTPUT_KINDS: dict[str, OutputKind] = {
    "aggregation": aggregation, "table": table, "events": events, "quarantine": quarantine}


def kind_of(plan: PlanConfig, output: str) -> OutputKind:
    """The kind module of the declared output ``output`` of ``plan``."""
    return OUTPUT_KINDS[plan.outputs[output].kind]


def sink_for(plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
             quarantine: QuarantineSink | None = None) -> Sink:
    """The sink of the declared output ``output`` of ``plan``, by its kind; rows its store refuses go to
    ``quarantine`` (the plan's quarantine output)."""
    return kind_of(plan, output).sink(plan, output, instance, database_url, delta_path, quarantine)
