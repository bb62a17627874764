"""A plan's outputs at a snapshot's cut: which Delta version holds exactly batches ≤ N, and rolling back to it.

Purpose
    A snapshot pairs the checkpoint cut at batch N with the state of the plan's outputs at that
    batch, so a restore can put both back together: reprocessing the input after the cut then
    rebuilds exactly what an uninterrupted run would have written, with nothing twice.

How it works
    Every Delta append of a micro-batch carries an application transaction
    ``(<instance>/<output>/<query id>, batch id)`` (:mod:`tandem.runtime.publisher`). The version
    of a table "at batch N" is the newest version whose transaction for that app id is still ≤ N:
    :func:`version_at_batch` finds it by bisection over the table's versions (the transaction
    version only grows). Batch N+1 may already have been appended while N was being cut (a batch
    publishes before it commits); bisection leaves it out.

    A restore rolls back one shard, not the whole table: the tables are shared by every shard of
    the plan and the other shards keep running from their own checkpoints. Each micro-batch append
    comes from one instance, so the rows of a shard are a clean slice: :func:`restore_shard_slice`
    reads the shard's rows at the snapshot's version (time travel) and replaces the shard's rows
    with them in one Delta commit (an overwrite with a ``shard_id`` predicate). PostgreSQL holds
    the newest value of every key, i.e. what the Delta history says last:
    :func:`rebuild_postgres_shard` replaces the shard's rows with the newest version of each key in
    the restored Delta slice, in one transaction.

What it does not do
    It does not touch checkpoints or processes (:mod:`tandem.snapshots.restore` does) and only
    knows the aggregate tables of :mod:`tandem.aggregation.spec` on the PostgreSQL side.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable, write_deltalake

from tandem.aggregation.spec import AggregationSpec, spec_for
from tandem.lake.tables import read_table, string_literal, table_exists
from tandem.store import aggregates
from tandem.store.db import Database


def version_at_batch(path: Path, app_id: str, batch_id: int) -> int | None:
    """The newest version of the Delta table at ``path`` holding no batch of ``app_id`` after ``batch_id``.

    ``None`` when the table does not exist yet (nothing to roll back to: the restore empties the
    shard's slice).
    """
    if not table_exists(path):
        return None
    latest = DeltaTable(str(path)).version()

    def beyond(version: int) -> bool:
        done = DeltaTable(str(path), version=version).transaction_version(app_id)
        return done is not None and done > batch_id

    if not beyond(latest):
        return latest
    low, high = 0, latest  # beyond(high) holds; find the first version where it does
    while low < high:
        middle = (low + high) // 2
        if beyond(middle):
            high = middle
        else:
            low = middle + 1
    return low - 1 if low > 0 else None


def shard_slice(path: Path, shard_id: str, version: int | None) -> pa.Table | None:
    """The rows of one shard at ``version`` (time travel); ``None`` when the table does not exist."""
    if not table_exists(path):
        return None
    if version is None:
        return read_table(path, ds.field("shard_id") == shard_id).slice(0, 0)
    return read_table(path, ds.field("shard_id") == shard_id, version=version)


def restore_shard_slice(path: Path, shard_id: str, version: int | None) -> tuple[pa.Table | None, int]:
    """Replace the shard's rows of the Delta table at ``path`` with its rows at ``version``, in one commit.

    Returns ``(the rows restored, the table's new version)``; ``(None, -1)`` when the table does not exist.
    """
    rows = shard_slice(path, shard_id, version)
    if rows is None:
        return None, -1
    table = DeltaTable(str(path))
    write_deltalake(str(path), rows, mode="overwrite", predicate=f"shard_id = {string_literal(shard_id)}",
                    partition_by=table.metadata().partition_columns or None)
    return rows, DeltaTable(str(path)).version()


def newest_per_key(rows: pa.Table, spec: AggregationSpec) -> pa.Table:
    """The newest version (highest epoch, then batch) of every (granularity, bucket, keys, shard) in ``rows``."""
    identity = ["granularity", "bucket_start", *spec.keys, "shard_id"]
    if rows.num_rows == 0:
        return rows
    ordered = rows.sort_by([*[(c, "ascending") for c in identity], ("epoch", "descending"),
                            ("batch_id", "descending")])
    changed = None  # row i+1 starts a new key
    for column in identity:
        values = ordered.column(column).combine_chunks()
        differs = pc.not_equal(values.slice(1), values.slice(0, len(values) - 1))
        changed = differs if changed is None else pc.or_(changed, differs)
    return ordered.filter(pa.concat_arrays([pa.array([True]), changed]))


def changed_shard_rows(path: Path, shard_id: str, version: int | None) -> pa.Table | None:
    """The shard's rows in files added to the table after ``version`` or removed from it since.

    These are the only rows a rollback to ``version`` changes. ``None`` when a removed file is gone
    from storage (vacuumed): the caller must then treat every row of the shard as changed.
    """
    now = set(DeltaTable(str(path)).file_uris())
    then = set(DeltaTable(str(path), version=version).file_uris()) if version is not None else set()
    changed = sorted(uri.removeprefix("file://") for uri in now ^ then)
    if not changed:
        return pa.table({})
    if not all(Path(file).exists() for file in changed):
        return None
    dataset = ds.dataset(changed, format="parquet", partitioning="hive", partition_base_dir=str(path))
    return dataset.to_table(filter=ds.field("shard_id") == shard_id)


def rebuild_postgres_shard(db: Database, spec: AggregationSpec, plan: str, shard_id: str, delta_rows: pa.Table,
                           touched: pa.Table | None = None) -> int:
    """Make one plan's shard rows of the spec's PostgreSQL table the newest version of each key in ``delta_rows``.

    With ``touched`` (rows whose keys changed), only those keys are replaced; otherwise every row
    of the shard. One transaction; returns how many rows were written.
    """
    identity = ["granularity", "bucket_start", *spec.keys]
    columns = [*identity, "shard_id", *spec.measure_columns, "epoch", "batch_id"]
    keys = None
    if touched is not None:
        keys = touched.select(identity).group_by(identity).aggregate([])
        delta_rows = delta_rows.join(keys, identity, join_type="inner") if delta_rows.num_rows else delta_rows
    latest = newest_per_key(delta_rows, spec)
    rows = latest.select(columns) if latest.num_rows else latest

    def work(cursor) -> int:
        aggregates.replace_shard_rows(cursor, spec, plan, shard_id, rows, keys)
        return latest.num_rows

    return db.run(work)


def restore_output(db: Database, path: Path, table: str, plan: str, shard_id: str,
                   version: int | None) -> dict[str, int | None]:
    """Roll one plan's output table (Delta, and its PostgreSQL table if it has one) back to ``version`` for one shard.

    Only the keys in files changed since ``version`` are rewritten in PostgreSQL; when nothing of
    the shard changed, nothing is written at all.
    """
    changed = changed_shard_rows(path, shard_id, version)
    outcome: dict[str, int | None] = {"snapshot_version": version, "changed_rows": None if changed is None
                                      else changed.num_rows}
    if changed is not None and changed.num_rows == 0:
        return {**outcome, "delta_rows": 0, "new_version": DeltaTable(str(path)).version(), "postgres_rows": 0}
    at_cut, new_version = restore_shard_slice(path, shard_id, version)
    outcome.update(delta_rows=at_cut.num_rows if at_cut is not None else 0, new_version=new_version)
    spec = postgres_spec(plan, table)
    if spec is not None and at_cut is not None:
        outcome["postgres_rows"] = rebuild_postgres_shard(db, spec, plan, shard_id, at_cut, changed)
    return outcome


def postgres_spec(plan: str, output: str) -> AggregationSpec | None:
    """The aggregation a plan declares as ``output``, served from PostgreSQL (``None``: a Delta-only output)."""
    from tandem.config import load_plan

    declared = load_plan(plan)
    if output not in declared.outputs or declared.outputs[output].kind != "aggregation":
        return None
    return spec_for(declared, output)
