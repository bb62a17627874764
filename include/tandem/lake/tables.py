"""Idempotent Delta appends keyed by an application transaction (app id, version)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError


def table_exists(path: Path) -> bool:
    return DeltaTable.is_deltatable(str(path))


def committed_version(path: Path, app_id: str) -> int | None:
    """The last micro-batch version ``app_id`` committed to the table, or ``None``."""
    if not table_exists(path):
        return None
    return DeltaTable(str(path)).transaction_version(app_id)


def append_once(path: Path, data: pa.Table, app_id: str, version: int,
                partition_by: list[str] | None = None) -> bool:
    """Append ``data`` unless ``app_id`` already committed ``version`` (or later).

    The append and the new transaction version are one Delta commit, so a replayed micro-batch
    is skipped and a crash never leaves half a batch. Returns whether anything was written.
    """
    done = committed_version(path, app_id)
    if done is not None and done >= version:
        return False
    path.mkdir(parents=True, exist_ok=True)
    write_deltalake(
        str(path),
        data,
        mode="append",
        partition_by=partition_by,
        commit_properties=CommitProperties(
            app_transactions=[Transaction(app_id=app_id, version=version)], max_commit_retries=50
        ),
    )
    return True


def read_table(path: Path, filter_expression: ds.Expression | None = None, columns: list[str] | None = None) -> pa.Table:
    """Read a Delta table (empty result if it does not exist yet)."""
    try:
        table = DeltaTable(str(path))
    except TableNotFoundError:
        return pa.table({})
    return table.to_pyarrow_dataset().to_table(filter=filter_expression, columns=columns)
