"""The ``table`` output kind: a keyed table whose instances' partial values are summed on read.

Each contributing row (by its ``id`` fields) is applied once, whoever publishes it
(``output_contributions``); :func:`read_table_lake` merges the Delta copy the same way.

Restore: kept (published once by id). Validation: every instance's row of ``output_table_rows`` (a
table is its current state, whenever it was written), the key's and the value's fields as columns.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa

from tandem.declarations import OUTPUT_RULES, OutputConfig
from tandem.json_values import times_as_iso
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir
from tandem.outputs.base import (
    BatchInfo,
    HeldById,
    ReadRequest,
    RetentionRun,
    Trimmed,
    Validation,
    Window,
    capped,
    reading,
    row_difference,
    plan_time_fields,
)
from tandem.outputs.expectations import expect, instances, not_null
from tandem.outputs.quarantine import QuarantineSink
from tandem.outputs.recompute import PublishedById
from tandem.store import outputs as store
from tandem.store import trim as store_trim
from tandem.store.db import Database
from tandem.store.leases import check_fence
from tandem.store.publish_log import record_published
from tandem.store.registry import InstanceKey

if TYPE_CHECKING:
    from tandem.config import ClusterConfig, PlanConfig


class TableSink(HeldById):
    """A keyed table whose instances' partial values are summed on read; each contributing row applied once."""

    table = "output_contributions"
    id_column = "contribution_id"

    def write(self, rows: dict[str, dict[str, Any]], batch: BatchInfo) -> int:
        key = batch.instance

        def work(cursor, ids: list[str]) -> list[dict]:
            contributions = {cid: ({k: rows[cid][k] for k in self.config.key},
                                   {v: rows[cid][v] for v in self.config.values}) for cid in ids}
            check_fence(cursor, key.plan, key.instance, key.node, batch.epoch)
            current = store.apply_contributions(cursor, key, self.output, self.config.values, contributions,
                                                batch.epoch, batch.batch_id)
            record_published(cursor, key, self.output, batch.batch_id, batch.epoch, len(current), None, None)
            return current

        current, _ = self.refusals.run(work, list(rows), rows.__getitem__, batch)
        if current:
            schema = pa.schema([*(self.schema.field(k) for k in self.config.key),
                                *((v, pa.float64()) for v in self.config.values), ("version", pa.int64())])
            lake = pa.Table.from_pylist([
                {**row["key"], **{v: float(row["value"][v]) for v in self.config.values}, "version": row["version"]}
                for row in current], schema=schema)
            self.to_lake(lake, batch, [cid for row in current for cid in row["ids"]])
        return len(current or ())

    def differences(self, rows: dict[str, dict[str, Any]]) -> list[str]:
        """Each contribution against the one the active applied under its id: the key it added to and its values
        (a contribution applied before values were kept: its key only)."""
        applied = self.db.run(lambda cursor: store.contributions_of(cursor, self.plan, self.output, list(rows)),
                              attempts=1)
        lines = []
        for cid, row in rows.items():
            theirs = applied.get(cid)
            if theirs is None:
                continue
            new = store.to_json({**{k: row[k] for k in self.config.key}, **{v: row[v] for v in self.config.values}})
            old = {**theirs["key"], **(theirs["value"] or {})}
            columns = [*self.config.key, *(self.config.values if theirs["value"] is not None else ())]
            line = row_difference(f"contribution {cid}", old, new, columns)
            if line:
                lines.append(line)
        return lines


def read_table_lake(path: Path, config: OutputConfig) -> list[dict[str, Any]]:
    """The Delta copy of a table, merged: per key, the sum over instances of each instance's newest version."""
    return merge_table_rows(read_table(path), config)


def merge_table_rows(table: pa.Table, config: OutputConfig) -> list[dict[str, Any]]:
    """A table output's Delta rows merged: per key, the sum over instances of each instance's newest version (pure)."""
    newest: dict[tuple, dict[str, Any]] = {}
    for row in table.to_pylist():
        identity = (tuple(row[k] for k in config.key), row["instance"])
        if identity not in newest or row["version"] > newest[identity]["version"]:
            newest[identity] = row
    merged: dict[tuple, dict[str, Any]] = {}
    for (key, _), row in sorted(newest.items(), key=lambda item: str(item[0])):
        out = merged.setdefault(key, {**dict(zip(config.key, key)), **{v: 0.0 for v in config.values},
                                      "instances": 0})
        for v in config.values:
            out[v] += row[v]
        out["instances"] += 1
    return list(merged.values())


def expectations(config: OutputConfig) -> list[dict[str, Any]]:
    """What a table output's declaration implies of its per-instance rows (the key's and the value's fields)."""
    return [
        *[not_null(field, "the table's key") for field in config.key],
        expect("expect_compound_columns_to_be_unique", "one partial row per key and instance",
               column_list=[*config.key, "instance"]),
        *[not_null(value, "a value of the table") for value in config.values],
        expect("expect_column_values_to_be_between", "a row exists once a contribution was applied",
               column="version", min_value=1),
        instances(),
    ]


def table_frame(rows: list[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows of ``output_table_rows`` with the key's and the value's fields as columns (pure)."""
    return pd.DataFrame([{**row["key"], **row["value"], "instance": row["instance"], "version": row["version"]}
                         for row in rows], columns=None if rows else ["instance", "version"])


def validation(plan: PlanConfig, output: str) -> Validation:
    """Every instance's rows (the window does not apply: a table is its current state)."""
    config = plan.outputs[output]
    implied = expectations(config)

    def read(cursor, window: Window, limit: int) -> list[dict[str, Any]]:
        return store.sample_table_rows(cursor, plan.name, output, limit)

    return Validation(table="tandem.output_table_rows", key_columns=[*config.key, "instance"], implied=implied,
                      required=implied, takes_unnamed=False, read=read, frame=table_frame)


class TableKind(PublishedById):
    """``table``: a keyed table of numbers, each instance's partial values summed on read."""

    name = "table"
    rules = OUTPUT_RULES[name]

    def sink(self, plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
             quarantine: QuarantineSink | None = None) -> TableSink:
        return TableSink(plan.name, output, plan.outputs[output], instance, database_url, delta_path, quarantine)

    def read(self, cluster: ClusterConfig, plan: PlanConfig, output: str, request: ReadRequest,
             db: Database | None = None) -> list[dict[str, Any]]:
        """Per key, the sum over instances of each value, and how many instances hold the key (a key that is a time
        as ISO 8601 text, :meth:`time_fields`)."""
        config = plan.outputs[output]
        if request.source == "delta":
            rows = read_table_lake(delta_table_dir(cluster, plan.name, output), config)
        else:
            single, limit = request.in_store()  # the rest is filtered below

            def work(cursor) -> list[dict[str, Any]]:
                with capped(cursor, limit) as rows:
                    return store.read_table_rows(rows, plan.name, output, config.values, single or None)

            with reading(cluster, db) as connection:
                found = connection.run(work, attempts=3)
            rows = [{**r["key"], **{v: float(r[v]) for v in config.values}, "instances": int(r["instances"])}
                    for r in found]
        times = self.time_fields(plan, output)
        return [times_as_iso(row, times) for row in request.picked(rows)]

    def time_fields(self, plan: PlanConfig, output: str) -> frozenset[str]:
        """Its key fields that hold times (its values are sums, never times)."""
        return plan_time_fields(plan) & set(plan.outputs[output].key)

    def trim(self, run: RetentionRun, output: str) -> list[Trimmed]:
        seconds = run.plan.maintenance.retention.table_rows_s
        if seconds is None:
            return []
        before = run.cutoff(seconds)
        return [Trimmed("output_table_rows", store_trim.trim_table_rows(run.db, run.plan.name, output, before),
                        before, f"keys of {output}")]

    def validation(self, plan: PlanConfig, output: str) -> Validation:
        return validation(plan, output)

    def reset(self, db: Database, plan: PlanConfig, output: str) -> list[str]:
        """Its keys' partial values and the ids of the rows applied to them."""

        def work(cursor) -> list[str]:
            rows = store.delete_output_rows(cursor, "output_table_rows", plan.name, output)
            applied = store.delete_output_rows(cursor, "output_contributions", plan.name, output)
            return [f"{rows} partial values (output_table_rows)", f"{applied} applied row ids (output_contributions)"]

        return db.run(work, attempts=3)


KIND = TableKind()
