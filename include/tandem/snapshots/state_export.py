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
    id, plan, instance, instance, query, operator, store, partition, batch id, and the key and value
    as JSON text (``{"window": {"start": ...}, "symbol": "IBM"}``). Spark names the value fields
    after the aggregate functions (``sum``, ``count``, ``sum``...); when the plan names them
    (``QueryDefinition.state_value_names``) those names are used instead. A ``transformWithState``
    operator has one store but several state variables (listed in the metadata's
    ``operatorProperties``): each variable is read on its own (``stateVarName``, lists and maps
    as one value per key) and exported with the variable's name in ``store_name``; its registered
    timers are exported too, as store ``$timers`` with value ``{"expiration_timestamp_ms": …}``
    (Spark's own ``$``-names are reserved, so no variable can be called that). The rows are appended to
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
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable

from tandem.lake.tables import append_once, read_table, table_exists

STATE_SCHEMA = pa.schema([
    ("snapshot_id", pa.string()), ("plan", pa.string()), ("instance", pa.string()), ("instance_id", pa.string()),
    ("query", pa.string()), ("operator_id", pa.int64()), ("operator_name", pa.string()),
    ("store_name", pa.string()), ("partition_id", pa.int32()), ("batch_id", pa.int64()),
    ("key", pa.string()), ("value", pa.string()),
])
STATE_TABLE = "state_snapshots"
TIMERS = "$timers"
"""The ``store_name`` of a ``transformWithState`` operator's registered timers in the export."""


@dataclass(frozen=True)
class StateOperator:
    """One stateful operator (and state store) of a checkpoint, as Spark's state metadata lists it."""

    operator_id: int
    operator_name: str
    store_name: str
    partitions: int
    min_batch_id: int | None
    max_batch_id: int | None
    state_variables: tuple[str, ...] = ()
    """A ``transformWithState`` operator's state variables (Spark's internal ``$…`` ones left out)."""

    @property
    def stores(self) -> tuple[str, ...]:
        """What to read and export: the store of a classic operator; each variable and the timers of a
        ``transformWithState``."""
        return (*self.state_variables, TIMERS) if self.state_variables else (self.store_name,)


def state_operators(spark, query_dir: Path) -> list[StateOperator]:
    """The stateful operators of a checkpoint (empty for a stateless query)."""
    if not (query_dir / "state").is_dir():
        return []
    rows = spark.read.format("state-metadata").load(str(query_dir)).collect()
    return [StateOperator(int(r["operatorId"]), r["operatorName"], r["stateStoreName"], int(r["numPartitions"]),
                          r["minBatchId"], r["maxBatchId"], state_variables(r["operatorProperties"]))
            for r in rows]


def state_variables(operator_properties: str | None) -> tuple[str, ...]:
    """The user state variables in Spark's ``operatorProperties`` JSON of a ``transformWithState`` operator (pure)."""
    try:
        listed = json.loads(operator_properties or "{}").get("stateVariables", [])
    except (json.JSONDecodeError, AttributeError):
        return ()
    return tuple(v["stateName"] for v in listed if not v["stateName"].startswith("$"))


@dataclass(frozen=True)
class StateExport:
    """The state of one query at a cut: ``rows`` in ``STATE_SCHEMA`` (what goes to Delta), ``fields`` (the
    same rows' key and value leaves as columns ``key.<path>`` / ``value.<name>``, for validation) and
    Spark's operator metadata."""

    rows: pa.Table
    fields: pa.Table
    operators: list[StateOperator]

    @property
    def counted_rows(self) -> int:
        """The rows Spark counts as state (``numRowsTotal``): every row but the timers."""
        return self.rows.num_rows - self.timer_rows

    @property
    def timer_rows(self) -> int:
        return int(pc.sum(pc.equal(self.rows["store_name"], TIMERS)).as_py() or 0)


def read_operator_state(spark, query_dir: Path, batch_id: int, op: StateOperator, store: str | None = None):
    """Spark's state data source over one store of an operator (default its first), after batch ``batch_id``.

    The frame has ``key``, ``value`` and ``partition_id``: a ``transformWithState`` variable's list or map
    comes as one value per key, its timers as ``value.expiration_timestamp_ms``.
    """
    from pyspark.sql import functions as F

    store = store or op.stores[0]
    reader = spark.read.format("statestore").option("batchId", batch_id).option("operatorId", op.operator_id)
    if not op.state_variables:
        return reader.option("storeName", store).load(str(query_dir))
    if store == TIMERS:
        frame = reader.option("readRegisteredTimers", "true").load(str(query_dir))
        return frame.select("key", F.struct("expiration_timestamp_ms").alias("value"), "partition_id")
    frame = reader.option("stateVarName", store).option("flattenCollectionTypes", "false").load(str(query_dir))
    value = next(c for c in ("value", "list_value", "map_value") if c in frame.columns)
    return frame.select("key", F.col(value).alias("value"), "partition_id")


def export_state(spark, query_dir: Path, batch_id: int, *, snapshot_id: str, plan: str, instance: str,
                 instance_id: str, query: str, value_names: Sequence[str] = ()) -> StateExport:
    """Every state row of the checkpoint at ``query_dir`` after batch ``batch_id``."""
    from pyspark.sql import functions as F

    # The state store reader asks the driver's StateStoreCoordinator, which Spark only creates with
    # the session's streaming query manager: in a session that never ran a query, reading fails
    # with "Cannot find endpoint: StateStoreCoordinator". Touching the manager creates it.
    spark.streams.active
    operators = state_operators(spark, query_dir)
    parts, fields = [], []
    for op, store in ((op, store) for op in operators for store in op.stores):
        frame = read_operator_state(spark, query_dir, batch_id, op, store)
        if not op.state_variables:
            value_type = frame.schema["value"].dataType
            names = list(value_names) if len(value_names) == len(value_type.fields) else _unique(value_type.fieldNames())
            frame = frame.withColumn("value", F.col("value").cast(_renamed(value_type, names)))
        leaves = [(_column(path), ".".join(path)) for path in _leaves(frame.schema["key"].dataType, "key")]
        leaves += _value_leaves(frame.schema["value"].dataType, store if op.state_variables else None)
        arrow = frame.select(F.col("partition_id").cast("int").alias("partition_id"),
                             F.to_json("key").alias("key"), F.to_json("value").alias("value"),
                             *[column.alias(name) for column, name in leaves]).toArrow()
        fields.append(arrow.select([name for _, name in leaves]))
        n = arrow.num_rows
        parts.append(pa.table({
            "snapshot_id": pa.repeat(snapshot_id, n), "plan": pa.repeat(plan, n), "instance": pa.repeat(instance, n),
            "instance_id": pa.repeat(instance_id, n), "query": pa.repeat(query, n),
            "operator_id": pa.repeat(pa.scalar(op.operator_id, pa.int64()), n),
            "operator_name": pa.repeat(op.operator_name, n), "store_name": pa.repeat(store, n),
            "partition_id": arrow["partition_id"], "batch_id": pa.repeat(pa.scalar(batch_id, pa.int64()), n),
            "key": arrow["key"], "value": arrow["value"],
        }, schema=STATE_SCHEMA))
    table = pa.concat_tables(parts) if parts else STATE_SCHEMA.empty_table()
    flat = pa.concat_tables(fields, promote_options="default") if fields else pa.table({})
    return StateExport(table, flat, operators)


def _column(path: tuple[str, ...]):
    from pyspark.sql import functions as F

    return F.col(".".join(f"`{p}`" for p in path))


def _value_leaves(data_type, variable: str | None) -> list[tuple[Any, str]]:
    """Columns of the value's leaves for validation: ``value.<field>``; for a state variable
    ``value.<variable>.<field>``, or ``value.<variable>.size`` for a list or map."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    if variable is None:
        return [(_column(path), ".".join(path)) for path in _leaves(data_type, "value")]
    if not isinstance(data_type, StructType):
        return [(F.size("value"), f"value.{variable}.size")]
    return [(_column(path), ".".join(("value", variable, *path[1:]))) for path in _leaves(data_type, "value")]


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
