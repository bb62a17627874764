"""The operator state of a checkpoint cut, exported to the Delta table ``state_snapshots`` (readable by people).

Purpose
    A checkpoint holds its state in binary state-store files only Spark can read. A snapshot also
    exports that state, so people can ask "what was the running total for symbol X at snapshot S"
    from Spark or from ``tandem snapshots <plan> --state S`` without restoring anything, and so
    the snapshot can be validated (row counts, keys, value ranges) before anyone relies on it.

How it works
    Spark's state data source reads a checkpoint's state at a committed batch:
    ``format("state-metadata")`` lists the stateful operators (id, state store name, partitions,
    batch range) and ``format("statestore").option("batchId", N)`` yields one row per state key
    with its ``key`` and ``value`` structs and ``partition_id``. :func:`export_state` reads every
    operator and store of a cut at its batch N and turns each row into plain columns: snapshot
    id, plan, shard, instance, query, operator, store, partition, batch id, and the key and value
    as JSON text (``{"window": {"start": ...}, "symbol": "IBM"}``). Spark names the value fields
    after the aggregate functions (``sum``, ``count``, ``sum``...); when the plan names them
    (``QueryDefinition.state_value_names``) those names are used instead. The rows are appended to
    ``delta/<plan>/state_snapshots`` in one Delta commit per snapshot (idempotent: the commit
    carries the application transaction ``snapshot/<id>``, so a retried export appends nothing).

What it does not do
    It reads the snapshot's copy, never the live checkpoint, and decides nothing about validity
    (:mod:`tandem.snapshots.validation`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable

from tandem.lake.tables import append_once, read_table, table_exists

STATE_SCHEMA = pa.schema([
    ("snapshot_id", pa.string()), ("plan", pa.string()), ("shard_id", pa.string()), ("instance_id", pa.string()),
    ("query", pa.string()), ("operator_id", pa.int64()), ("operator_name", pa.string()),
    ("store_name", pa.string()), ("partition_id", pa.int32()), ("batch_id", pa.int64()),
    ("key", pa.string()), ("value", pa.string()),
])
STATE_TABLE = "state_snapshots"


@dataclass(frozen=True)
class StateOperator:
    """One stateful operator (and state store) of a checkpoint, as Spark's state metadata lists it."""

    operator_id: int
    operator_name: str
    store_name: str
    partitions: int
    min_batch_id: int | None
    max_batch_id: int | None


def state_operators(spark, query_dir: Path) -> list[StateOperator]:
    """The stateful operators of a checkpoint (empty for a stateless query)."""
    if not (query_dir / "state").is_dir():
        return []
    rows = spark.read.format("state-metadata").load(str(query_dir)).collect()
    return [StateOperator(int(r["operatorId"]), r["operatorName"], r["stateStoreName"], int(r["numPartitions"]),
                          r["minBatchId"], r["maxBatchId"]) for r in rows]


@dataclass(frozen=True)
class StateExport:
    """The state of one query at a cut: ``rows`` in ``STATE_SCHEMA`` (what goes to Delta), ``fields`` (the
    same rows' key and value leaves as columns ``key.<path>`` / ``value.<name>``, for validation) and
    Spark's operator metadata."""

    rows: pa.Table
    fields: pa.Table
    operators: list[StateOperator]


def read_operator_state(spark, query_dir: Path, batch_id: int, op: StateOperator):
    """Spark's state data source over one operator's store of a checkpoint, after batch ``batch_id``."""
    return (spark.read.format("statestore").option("batchId", batch_id).option("operatorId", op.operator_id)
            .option("storeName", op.store_name).load(str(query_dir)))


def export_state(spark, query_dir: Path, batch_id: int, *, snapshot_id: str, plan: str, shard_id: str,
                 instance_id: str, query: str, value_names: Sequence[str] = ()) -> StateExport:
    """Every state row of the checkpoint at ``query_dir`` after batch ``batch_id``."""
    from pyspark.sql import functions as F

    # The state store reader asks the driver's StateStoreCoordinator, which Spark only creates with
    # the session's streaming query manager: in a session that never ran a query, reading fails
    # with "Cannot find endpoint: StateStoreCoordinator". Touching the manager creates it.
    spark.streams.active
    operators = state_operators(spark, query_dir)
    parts, fields = [], []
    for op in operators:
        frame = read_operator_state(spark, query_dir, batch_id, op)
        value_type = frame.schema["value"].dataType
        names = list(value_names) if len(value_names) == len(value_type.fields) else _unique(value_type.fieldNames())
        frame = frame.withColumn("value", F.col("value").cast(_renamed(value_type, names)))
        leaves = _leaves(frame.schema["key"].dataType, "key") + _leaves(frame.schema["value"].dataType, "value")
        arrow = frame.select(F.col("partition_id").cast("int").alias("partition_id"),
                             F.to_json("key").alias("key"), F.to_json("value").alias("value"),
                             *[F.col(".".join(f"`{p}`" for p in path)).alias(".".join(path)) for path in leaves]
                             ).toArrow()
        fields.append(arrow.select([".".join(path) for path in leaves]))
        n = arrow.num_rows
        parts.append(pa.table({
            "snapshot_id": pa.repeat(snapshot_id, n), "plan": pa.repeat(plan, n), "shard_id": pa.repeat(shard_id, n),
            "instance_id": pa.repeat(instance_id, n), "query": pa.repeat(query, n),
            "operator_id": pa.repeat(pa.scalar(op.operator_id, pa.int64()), n),
            "operator_name": pa.repeat(op.operator_name, n), "store_name": pa.repeat(op.store_name, n),
            "partition_id": arrow["partition_id"], "batch_id": pa.repeat(pa.scalar(batch_id, pa.int64()), n),
            "key": arrow["key"], "value": arrow["value"],
        }, schema=STATE_SCHEMA))
    table = pa.concat_tables(parts) if parts else STATE_SCHEMA.empty_table()
    flat = pa.concat_tables(fields, promote_options="default") if fields else pa.table({})
    return StateExport(table, flat, operators)


def _leaves(data_type, name: str, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths to the non-struct fields of a (nested) struct column, e.g. ``("key", "window", "start")``."""
    from pyspark.sql.types import StructType

    path = (*prefix, name)
    if not isinstance(data_type, StructType):
        return [path]
    return [leaf for f in data_type.fields for leaf in _leaves(f.dataType, f.name, path)]


def _unique(names: Sequence[str]) -> list[str]:
    """Spark's value field names, made unique (``sum``, ``count``, ``sum_2``)."""
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return unique


def _renamed(struct_type, names: Sequence[str]):
    from pyspark.sql.types import StructField, StructType

    return StructType([StructField(name, field.dataType, field.nullable)
                       for name, field in zip(names, struct_type.fields)])


def append_state(path: Path, rows: pa.Table, snapshot_id: str) -> bool:
    """Append one snapshot's state rows to ``state_snapshots`` in one commit (once per snapshot)."""
    return append_once(path, rows.cast(STATE_SCHEMA), app_id=f"snapshot/{snapshot_id}", version=0)


def read_state(path: Path, snapshot_id: str, *, key_contains: dict[str, Any] | None = None,
               query: str | None = None) -> list[dict[str, Any]]:
    """The exported state rows of one snapshot, keys and values parsed from JSON.

    ``key_contains`` keeps rows whose key has these top-level fields with these values (e.g.
    ``{"symbol": "IBM"}``).
    """
    condition = ds.field("snapshot_id") == snapshot_id
    if query is not None:
        condition &= ds.field("query") == query
    table = read_table(path, condition)
    rows = []
    for row in table.to_pylist() if table.num_rows else []:
        row["key"] = json.loads(row["key"]) if row["key"] is not None else None
        row["value"] = json.loads(row["value"]) if row["value"] is not None else None
        if key_contains and not all(isinstance(row["key"], dict) and row["key"].get(k) == v
                                    for k, v in key_contains.items()):
            continue
        rows.append(row)
    return rows


def spark_state(spark, path: Path, snapshot_id: str | None = None):
    """The state export as a Spark DataFrame (every snapshot, or one), without Spark's Delta connector.

    Reads the Parquet files of the table's current version (listed by ``deltalake``), e.g.
    ``spark_state(spark, path, sid).where(F.get_json_object("key", "$.symbol") == "IBM")``.
    """
    from pyspark.sql import functions as F

    if not table_exists(path):
        return spark.createDataFrame([], "snapshot_id string").limit(0)
    frame = spark.read.schema(_spark_schema()).parquet(*DeltaTable(str(path)).file_uris())
    return frame if snapshot_id is None else frame.where(F.col("snapshot_id") == snapshot_id)


def _spark_schema():
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    types = {pa.string(): StringType(), pa.int64(): LongType(), pa.int32(): IntegerType()}
    return StructType([StructField(f.name, types[f.type]) for f in STATE_SCHEMA])


def delete_state(path: Path, snapshot_ids: Sequence[str]) -> int:
    """Delete the exported rows of pruned snapshots (one commit); returns how many rows went."""
    if not snapshot_ids or not table_exists(path):
        return 0
    listed = ", ".join("'" + i.replace("'", "''") + "'" for i in snapshot_ids)
    metrics = DeltaTable(str(path)).delete(f"snapshot_id IN ({listed})")
    return int(metrics.get("num_deleted_rows", 0) or 0)
