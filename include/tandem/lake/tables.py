"""Idempotent Delta appends keyed by an application transaction (app id, version)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as ds
from pyarrow.fs import LocalFileSystem
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError


RENAMED_COLUMNS = {"shard_id": "instance"}
"""Columns of tables written before a rename, by their name today: a version written before issue 47 holds
``shard_id``; :func:`read_table` names it ``instance`` and :func:`rename_legacy_columns` upgrades a table."""


T = TypeVar("T")
ATTEMPTS = 8
"""How many times a commit that met a concurrent writer's (a backfill's overwrite, a compaction) is tried."""


def table_exists(path: Path) -> bool:
    return DeltaTable.is_deltatable(str(path))


def string_literal(value: str) -> str:
    """``value`` as a string literal of a delta-rs SQL predicate (DataFusion's: quotes doubled, backslashes literal).

    E.g. ``predicate=f"instance = {string_literal(instance)}"``: the predicate then matches exactly that value.
    """
    return "'" + value.replace("'", "''") + "'"


def committed_version(path: Path, app_id: str) -> int | None:
    """The last micro-batch version ``app_id`` committed to the table, or ``None``."""
    if not table_exists(path):
        return None
    return DeltaTable(str(path)).transaction_version(app_id)


def append_once(path: Path, data: pa.Table, app_id: str, version: int,
                partition_by: list[str] | None = None, *, merge_schema: bool = False) -> bool:
    """Append ``data`` unless ``app_id`` already committed ``version`` (or later); ``merge_schema``: columns the
    table lacks are added (those it has and ``data`` lacks are null in the new rows).

    The append and the new transaction version are one Delta commit, so a replayed micro-batch
    is skipped and a crash never leaves half a batch. Returns whether anything was written.
    """
    def append() -> bool:
        done = committed_version(path, app_id)
        if done is not None and done >= version:
            return False
        path.mkdir(parents=True, exist_ok=True)
        write_deltalake(
            str(path),
            data,
            mode="append",
            partition_by=partition_by,
            schema_mode="merge" if merge_schema else None,
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id=app_id, version=version)], max_commit_retries=50
            ),
        )
        return True

    # delta-rs retries an append itself, except after a concurrent commit removed files (a backfill's overwrite of a
    # range, a compaction): then the append is tried again on the new version, never lost, never failing the batch
    return retry_on_conflict(append)[0]


def retry_on_conflict(action: Callable[[], T], sleep: Callable[[float], None] = time.sleep) -> tuple[T, int]:
    """``action()``, tried again after a commit conflict with a concurrent writer; its result and the retries."""
    for attempt in range(ATTEMPTS):
        try:
            return action(), attempt
        except CommitFailedError:
            if attempt == ATTEMPTS - 1:
                raise
            sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def read_table(path: Path, filter_expression: ds.Expression | None = None, columns: list[str] | None = None, *,
               version: int | None = None) -> pa.Table:
    """Read a Delta table at ``version`` (default: the newest); an empty table if it does not exist yet.

    The Delta log names the table's Parquet files and each file's partition values; pyarrow reads
    the files from the local filesystem. (``DeltaTable.to_pyarrow_dataset()`` and
    ``to_pyarrow_table()`` scan through deltalake's filesystem handler, whose threads race the
    interpreter's exit: one process in two aborted with "terminate called without an active
    exception", exit 134, which a caller or the supervisor reads as a crash.)
    """
    try:
        table = DeltaTable(str(path), version=version)
    except TableNotFoundError:
        return pa.table({})
    schema = pa.schema(table.schema().to_arrow())
    partition_columns = table.metadata().partition_columns
    actions = pa.table(table.get_add_actions(flatten=True)).select(
        ["path", *(f"partition.{column}" for column in partition_columns)]).to_pylist()
    root = Path(path).resolve()
    files = [str(root / unquote(action["path"])) for action in actions]
    partitions = [_partition_expression(action, partition_columns, schema) for action in actions]
    dataset = ds.FileSystemDataset.from_paths(files, schema=schema, format=ds.ParquetFileFormat(),
                                              filesystem=LocalFileSystem(), partitions=partitions)
    legacy = _legacy_names(schema)
    if not legacy:
        return dataset.to_table(filter=filter_expression, columns=columns)
    # a version written before a rename (a snapshot's, or a table not upgraded yet): named as today, then filtered
    found = dataset.to_table().rename_columns([legacy.get(name, name) for name in schema.names])
    if filter_expression is not None:
        found = found.filter(filter_expression)
    return found.select(columns) if columns is not None else found


def _legacy_names(schema: pa.Schema) -> dict[str, str]:
    return {old: new for old, new in RENAMED_COLUMNS.items() if old in schema.names and new not in schema.names}


def has_legacy_columns(path: Path) -> bool:
    """Whether the newest version of the table still has a column of a former name (:data:`RENAMED_COLUMNS`)."""
    return table_exists(path) and bool(_legacy_names(pa.schema(DeltaTable(str(path)).schema().to_arrow())))


def rename_legacy_columns(path: Path) -> bool:
    """Rewrite the newest version of a table written before a rename with today's column names, in one overwrite
    commit (older versions keep theirs: :func:`read_table` renames them on read); whether it had to."""
    if not has_legacy_columns(path):
        return False
    table = DeltaTable(str(path))
    write_deltalake(str(path), read_table(path), mode="overwrite", schema_mode="overwrite",
                    partition_by=table.metadata().partition_columns or None)
    return True


def _partition_expression(action: dict, partition_columns: list[str], schema: pa.Schema) -> ds.Expression:
    """What every row of one file holds in the partition columns (the values the Delta log records)."""
    expression = ds.scalar(True)
    for column in partition_columns:
        value = action[f"partition.{column}"]
        expression &= ds.field(column).is_null() if value is None else (
            ds.field(column) == pa.scalar(value).cast(schema.field(column).type))
    return expression
