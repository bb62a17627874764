"""Source kinds: where a stream's lines come from, one module per kind, each holding one
:class:`~tandem.sources.base.SourceKind` as ``KIND``.

A stream declares its kind (``source:`` in the plan's YAML, default ``files``; ``nats``: a JetStream stream). A kind
owns every duty of its streams (reading, writing, what a query has not read, a backfill's input, a restore's and a
reset's part: see :class:`~tandem.sources.base.SourceKind`); generic code asks :func:`source_of` and never names a
kind. Its declaration rules sit in :data:`tandem.declarations.SOURCE_RULES` (the configuration is below this
package). A new kind is one module here, its entry in :data:`SOURCE_KINDS` and in ``SOURCE_RULES``, and its tests.
Nothing here imports pyspark: a kind's Spark half is imported by :meth:`~tandem.sources.base.SourceKind.lines`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tandem.layout import landing_dir
from tandem.sources import files, nats
from tandem.sources.base import SourceKind

if TYPE_CHECKING:
    from tandem.config import ClusterConfig, PlanConfig

SOURCE_KINDS: dict[str, SourceKind] = {kind.name: kind for kind in (files.KIND, nats.KIND)}


def source_of(plan: PlanConfig, stream: str) -> SourceKind:
    """The kind of the declared stream ``stream`` of ``plan``."""
    return SOURCE_KINDS[plan.streams[stream].source]


def landing_dirs(cluster: ClusterConfig, plan: PlanConfig, instance: str) -> list[Path]:
    """The landing folders one instance reads: its share of the partitions of every stream whose kind reads files."""
    return [landing_dir(cluster, stream, p) for stream in plan.streams
            for p in source_of(plan, stream).landing_partitions(plan, instance, stream)]
