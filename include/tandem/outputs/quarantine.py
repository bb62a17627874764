"""The ``quarantine`` output kind: bad input lines (and rows another output's store refused), with the reason,
in Delta.

Restore: kept (a source file's bad lines are quarantined once per instance). Validation: none (it holds bad
input by design). Read: from Delta.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from tandem.declarations import OUTPUT_RULES
from tandem.lake.tables import append_once, read_table
from tandem.layout import delta_table_dir
from tandem.outputs.base import BatchInfo, HeldUntilPublished, OutputKind, ReadRequest, fence
from tandem.plan_version import plan_version
from tandem.store.db import Database
from tandem.store.outputs import to_json
from tandem.store.registry import InstanceKey

if TYPE_CHECKING:
    from tandem.config import ClusterConfig, PlanConfig


REFUSED_SOURCE = "output:"
"""The source of a quarantined row that an output's store refused: ``output:<output>/<hash of the row>``."""
QUARANTINE_SCHEMA = pa.schema([
    ("raw", pa.string()), ("source_file", pa.string()), ("reason", pa.string()),
    ("plan", pa.string()), ("instance", pa.string()), ("node", pa.string()),
    ("batch_id", pa.int64()), ("quarantined_at", pa.timestamp("us", tz="UTC")), ("plan_version", pa.string()),
])
"""``plan_version``: the version of the plan that refused the line (:mod:`tandem.plan_version`; null in rows
quarantined before versions were recorded)."""


class QuarantineSink(HeldUntilPublished[str, pa.Table]):
    """Bad input lines, with the raw text, the source file and the reason, appended to Delta.

    A source file's bad lines are quarantined once per instance: a file already in the table for
    this instance is skipped when published (a replay after a restore, an old active's late batch)
    and dropped from what a standby holds. The file source reads a file whole in one batch, so
    the file is the id of its bad lines. A row another output's store refused
    (:meth:`publish_refused`) has the source ``output:<output>/<hash of the row>``.
    """

    unmatched_is_twice = False  # a file only this version quarantines differs; its lines go nowhere twice

    def __init__(self, instance: InstanceKey, database_url: str, delta_path: Path, output: str = "quarantine",
                 plan_version: str | None = None) -> None:
        super().__init__()
        self.output = output
        self.plan_version = plan_version
        self.instance = instance
        self.delta_path = delta_path
        self.db = Database(database_url, "tandem-publisher")

    def quarantined(self, source_files: list[str]) -> set[str]:
        """Of ``source_files``, those whose bad lines are already in the table for this instance."""
        done = read_table(self.delta_path, (ds.field("instance") == self.instance.instance)
                          & ds.field("source_file").isin(source_files), columns=["source_file"])
        return set(done.column("source_file").to_pylist()) if done.num_rows else set()

    def publish(self, rows: pa.Table, batch: BatchInfo) -> int:
        return self._append(rows, batch, batch.app_id(self.output))

    def publish_refused(self, output: str, refused: dict[Any, tuple[dict[str, Any], str]], batch: BatchInfo) -> int:
        """Quarantine rows the store of ``output`` refused: ``{key: (row, the store's error)}``."""
        texts = [json.dumps(to_json(row), default=str, sort_keys=True, ensure_ascii=False)
                 for row, _ in refused.values()]
        rows = pa.table({
            "raw": pa.array(texts, pa.string()),
            "source_file": pa.array([f"{REFUSED_SOURCE}{output}/{hashlib.sha256(text.encode()).hexdigest()[:32]}"
                                     for text in texts], pa.string()),
            "reason": pa.array([f"output {output}: the store refused the row: {error}" for _, error in refused.values()],
                               pa.string()),
        })
        # its own transaction id: several outputs of one query may refuse rows of the same batch
        return self._append(rows, batch, batch.app_id(f"{self.output}/{output}"))

    def _append(self, rows: pa.Table, batch: BatchInfo, app_id: str) -> int:
        if rows.num_rows == 0:
            return 0
        done = self.quarantined(pc.unique(rows["source_file"]).to_pylist())
        if done:
            rows = rows.filter(pc.invert(pc.is_in(rows["source_file"], pa.array(sorted(done), pa.string()))))
            if rows.num_rows == 0:
                return 0
        n = rows.num_rows
        table = pa.table({
            "raw": rows["raw"], "source_file": rows["source_file"], "reason": rows["reason"],
            "plan": pa.repeat(batch.instance.plan, n), "instance": pa.repeat(batch.instance.instance, n),
            "node": pa.repeat(batch.instance.node, n), "batch_id": pa.repeat(pa.scalar(batch.batch_id, pa.int64()), n),
            "quarantined_at": pa.repeat(pa.scalar(batch.published_at, pa.timestamp("us", tz="UTC")), n),
            "plan_version": pa.repeat(pa.scalar(self.plan_version, pa.string()), n),
        }, schema=QUARANTINE_SCHEMA)
        fence(self.db, batch)  # merged: a table written before plan_version had no such column
        append_once(self.delta_path, table, app_id=app_id, version=batch.batch_id, merge_schema=True)
        return n

    def identities(self, rows: pa.Table) -> dict[str, pa.Table]:
        """The rows of each source file (in their order): slices of the batch sorted by file, as a filter of the
        whole batch per file took time in the square of its files (a batch of rows refused one by one)."""
        ordered = rows.take(pc.sort_indices(rows["source_file"]))  # a stable sort
        files = ordered.column("source_file").to_pylist()
        held, start = {}, 0
        for end in range(1, len(files) + 1):
            if end == len(files) or files[end] != files[start]:
                held[files[start]] = ordered.slice(start, end - start)
                start = end
        return held

    def published_of(self, held: dict[str, pa.Table]) -> set[str]:
        return self.quarantined(list(held))

    def publish_held(self, held: dict[str, pa.Table], batch: BatchInfo) -> int:
        return self.publish(pa.concat_tables(held.values()), batch)


class QuarantineKind(OutputKind):
    """``quarantine``: the plan's bad input and refused rows, with the reason, in Delta only. Kept by a restore (a
    source file's bad lines are quarantined once per instance), never recomputed nor validated (it holds bad input
    by design)."""

    name = "quarantine"
    rules = OUTPUT_RULES[name]
    recomputed = False

    def sink(self, plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
             quarantine: QuarantineSink | None = None) -> QuarantineSink:
        """The plan's quarantine (``quarantine`` is itself: it refuses nothing)."""
        return QuarantineSink(instance, database_url, delta_path, output=output, plan_version=plan_version(plan))

    def time_fields(self, plan: PlanConfig, output: str) -> frozenset[str]:
        """None: its columns are its own (``quarantined_at`` is read as ISO text), whatever the streams declare."""
        return frozenset()

    def read(self, cluster: ClusterConfig, plan: PlanConfig, output: str, request: ReadRequest,
             db: Database | None = None) -> list[dict[str, Any]]:
        """The quarantined rows (from Delta whatever the source and ``db``: the quarantine has no PostgreSQL copy) whose
        ``quarantined_at`` lies in ``[start, end)`` (default: all), oldest first: ``raw``, ``source_file``,
        ``reason``, ``instance``, ``node``, ``batch_id``, ``quarantined_at`` (ISO 8601), ``plan_version`` (the
        plan's version that refused it)."""
        table = read_table(delta_table_dir(cluster, plan.name, output))
        rows = [{**{k: row.get(k) for k in QUARANTINE_SCHEMA.names if k != "plan"},
                 "quarantined_at": row["quarantined_at"].isoformat()}
                for row in sorted(table.to_pylist(), key=lambda r: (r["quarantined_at"], r["source_file"], r["raw"]))
                if request.covers(row["quarantined_at"])]
        return request.picked(rows)


KIND = QuarantineKind()
