"""A Delta table's history per instance: which version holds exactly batches ≤ N, and rolling one instance back to it.

Purpose
    A snapshot pairs a checkpoint cut at batch N with the version of each output table at that
    batch, so a restore can put both back together: reprocessing the input after the cut then
    rebuilds exactly what an uninterrupted run would have written, with nothing twice.

How it works
    Every Delta append of a micro-batch carries an application transaction
    ``(<instance>/<output>/<query id>, batch id)`` (:mod:`tandem.outputs.base`). The version of a
    table "at batch N" is the newest version whose transaction for that app id is still ≤ N:
    :func:`version_at_batch` finds it by bisection over the table's versions (the transaction
    version only grows). Batch N+1 may already have been appended while N was being cut (a batch
    publishes before it commits); bisection leaves it out.

    A rollback touches one instance, not the whole table: the tables are shared by every instance
    of the plan and the others keep running from their own checkpoints. Each micro-batch append
    comes from one instance, so an instance's rows are a clean slice (``instance``):
    :func:`roll_back_slice` replaces them with the slice at the snapshot's version (time travel),
    in one Delta commit (an overwrite with a ``instance`` predicate).

What it does not do
    It knows nothing of output kinds: what a rollback means for an output's PostgreSQL copy is the
    kind's restore policy (:mod:`tandem.outputs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable, write_deltalake

from tandem.lake.maintenance import oldest_readable_version
from tandem.lake.tables import read_table, string_literal, table_exists


def version_at_batch(path: Path, app_id: str, batch_id: int) -> int | None:
    """The newest version of the Delta table at ``path`` holding no batch of ``app_id`` after ``batch_id``.

    ``None`` when the table does not exist yet (nothing to roll back to: a rollback empties the
    instance's slice). The search starts at the oldest version the log still holds (maintenance cleans the
    log before a checkpoint); a ``ValueError`` says so when even that one holds a later batch.
    """
    if not table_exists(path):
        return None
    latest = DeltaTable(str(path)).version()

    def beyond(version: int) -> bool:
        done = DeltaTable(str(path), version=version).transaction_version(app_id)
        return done is not None and done > batch_id

    if not beyond(latest):
        return latest
    oldest = oldest_readable_version(path)
    if oldest > 0 and beyond(oldest):
        raise ValueError(f"{path}: the Delta log before version {oldest} was cleaned up by maintenance, and "
                         f"{app_id} had committed batches after {batch_id} by then")
    low, high = oldest, latest  # beyond(high) holds; find the first version where it does
    while low < high:
        middle = (low + high) // 2
        if beyond(middle):
            high = middle
        else:
            low = middle + 1
    return low - 1 if low > 0 else None


def instance_slice(path: Path, instance: str, version: int | None) -> pa.Table | None:
    """The rows of one instance at ``version`` (time travel); ``None`` when the table does not exist."""
    if not table_exists(path):
        return None
    if version is None:
        return read_table(path, ds.field("instance") == instance).slice(0, 0)
    return read_table(path, ds.field("instance") == instance, version=version)


def vacuumed_files(path: Path, version: int) -> list[str]:
    """The files the Delta table at ``path`` names at ``version`` that are gone from storage (vacuumed), or the
    reason the version cannot be read at all; empty when time travel to it works (or there is no table)."""
    if not table_exists(path):
        return []
    try:
        uris = DeltaTable(str(path), version=version).file_uris()
    except Exception as exc:  # noqa: BLE001 - delta-rs raises several kinds for a version whose log is gone
        return [f"version {version} cannot be read: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"]
    return sorted(f for f in (uri.removeprefix("file://") for uri in uris) if not Path(f).exists())


def changed_instance_rows(path: Path, instance: str, version: int | None) -> pa.Table | None:
    """The instance's rows in files added to the table after ``version`` or removed from it since.

    These are the only rows a rollback to ``version`` changes. ``None`` when a removed file is gone
    from storage (vacuumed): the caller must then treat every row of the instance as changed.
    """
    now = set(DeltaTable(str(path)).file_uris())
    then = set(DeltaTable(str(path), version=version).file_uris()) if version is not None else set()
    changed = sorted(uri.removeprefix("file://") for uri in now ^ then)
    if not changed:
        return pa.table({})
    if not all(Path(file).exists() for file in changed):
        return None
    dataset = ds.dataset(changed, format="parquet", partitioning="hive", partition_base_dir=str(path))
    return dataset.to_table(filter=ds.field("instance") == instance)


@dataclass(frozen=True)
class RolledBack:
    """What rolling one instance's slice of a table back did.

    ``changed`` holds the instance's rows in the files changed since ``version`` (``None``: unknown,
    files were vacuumed); ``restored`` its rows at ``version`` (``None``: the table does not exist,
    nothing was written; also ``None`` when nothing changed and nothing was written).
    """

    version: int | None
    changed: pa.Table | None
    restored: pa.Table | None
    new_version: int

    @property
    def changed_rows(self) -> int | None:
        return None if self.changed is None else self.changed.num_rows

    def outcome(self) -> dict[str, int | None]:
        """JSON-able, for the restore's report and its event."""
        return {"snapshot_version": self.version, "changed_rows": self.changed_rows,
                "delta_rows": self.restored.num_rows if self.restored is not None else 0,
                "new_version": self.new_version}


def roll_back_slice(path: Path, instance: str, version: int | None) -> RolledBack:
    """Make the instance's rows of the Delta table at ``path`` its rows at ``version``, in one commit.

    Nothing is written when no file holding the instance's rows changed since ``version``.
    """
    changed = changed_instance_rows(path, instance, version)
    if changed is not None and changed.num_rows == 0:
        return RolledBack(version, changed, None, DeltaTable(str(path)).version())
    rows = instance_slice(path, instance, version)
    if rows is None:
        return RolledBack(version, changed, None, -1)
    table = DeltaTable(str(path))
    write_deltalake(str(path), rows, mode="overwrite", predicate=f"instance = {string_literal(instance)}",
                    partition_by=table.metadata().partition_columns or None)
    return RolledBack(version, changed, rows, DeltaTable(str(path)).version())
