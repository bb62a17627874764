"""One big micro-batch per output kind, its sink, and a plain-Python reference of what it publishes (issue 46 §1).

Shared by ``tests/integration/test_big_batches.py`` (100,000 rows per kind) and ``bench/big_batches.py``
(1,000,000). Every batch has as many distinct keys as rows: an aggregation's ``(tenant, idp)`` (each in one second
of an hour around New Year, so every granularity has two buckets), a table's customer, an event's number, a latest
output's user, a quarantined line's source file. The sinks are built directly (no plan file), on real PostgreSQL and Delta.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tandem.aggregation import sketches
from tandem.aggregation.granularity import GRANULARITIES, bucket_start
from tandem.aggregation.spec import UTC_MICROS, AggregationSpec, Measure
from tandem.declarations import OutputConfig
from tandem.lake.tables import read_table
from tandem.outputs.aggregation import AggregateSink, FactAggregateSink, newest_per_key
from tandem.outputs.base import BatchInfo
from tandem.outputs.events import EventsSink, read_events_lake
from tandem.outputs.latest import LatestSink
from tandem.outputs.quarantine import QuarantineSink
from tandem.outputs.table import TableSink, read_table_lake
from tandem.store import aggregates
from tandem.store.db import Database
from tandem.store.leases import try_acquire
from tandem.store.outputs import read_table_rows
from tandem.store.registry import InstanceKey

PLAN = "big"
INSTANCE = InstanceKey(PLAN, "g-1", "node-a")
KINDS = ("aggregation", "fact_aggregation", "table", "events", "latest", "quarantine")
NEW_YEAR = datetime(2026, 1, 1, tzinfo=timezone.utc)
SPAN_S = 3_600
USERS = 5_000
OUTPUTS = {"aggregation": "partials", "fact_aggregation": "logins", "table": "orders", "events": "alerts",
           "latest": "last_logins", "quarantine": "quarantine"}
FACTS_CONFIG = OutputConfig(kind="aggregation", id=["login_id"], time="time", key=["tenant", "idp"],
                            measures={"logins": {"count": "*"}, "seconds": {"sum": "duration"},
                                      "users": {"distinct": "login_user"}})
TABLE_CONFIG = OutputConfig(kind="table", key=["customer"], values=["amount"], id=["order_no"])
EVENTS_CONFIG = OutputConfig(kind="events", key=["event_no"], time="time")
LATEST_CONFIG = OutputConfig(kind="latest", key=["login_user"], time="time", values=["idp", "ok"], id=["login_id"])
ID_TABLES = {"fact_aggregation": "output_contributions", "table": "output_contributions", "events": "output_events"}
"""Where the kinds published once by id record their ids."""


def _second(i: int) -> datetime:
    return NEW_YEAR + timedelta(seconds=(i * 7_919) % SPAN_S - SPAN_S // 2)


def batch_of(kind: str, n: int) -> pa.Table:
    """One micro-batch of ``n`` rows of ``kind``, each with its own key, as the query hands it over (pure)."""
    times = pa.array([_second(i) for i in range(n)], UTC_MICROS)
    keys = {"tenant": pa.array([f"t{i % 100:02d}" for i in range(n)]),
            "idp": pa.array([f"idp{i // 100:07d}" for i in range(n)])}
    if kind == "aggregation":  # Spark's per-second partials
        counts = [1 + i % 5 for i in range(n)]
        return pa.table({"bucket_start": times, **keys, "n": pa.array(counts, pa.int64()),
                         "total": pa.array([c * 2.5 + i % 7 for i, c in enumerate(counts)], pa.float64()),
                         "low": pa.array([float(i % 7) for i in range(n)]),
                         "high": pa.array([float(i % 7 + 10) for i in range(n)])})
    if kind == "fact_aggregation":
        return pa.table({"login_id": pa.array([f"login-{i}" for i in range(n)]), "time": times, **keys,
                         "duration": pa.array([(i % 1_000) / 4 for i in range(n)]),
                         "login_user": pa.array([f"u{i % USERS}" for i in range(n)])})
    if kind == "table":
        return pa.table({"order_no": pa.array([f"o{i}" for i in range(n)]),
                         "customer": pa.array([f"c{i}" for i in range(n)]),
                         "amount": pa.array([float(i % 100) for i in range(n)])})
    if kind == "events":
        return pa.table({"event_no": pa.array(range(n), pa.int64()), "time": times,
                         "room": pa.array([f"r{i % 1_000}" for i in range(n)])})
    if kind == "latest":
        return pa.table({"login_user": pa.array([f"u{i}" for i in range(n)]),
                         "login_id": pa.array([f"l{i}" for i in range(n)]), "time": times, "idp": keys["idp"], "ok": pa.array([i % 3 > 0 for i in range(n)])})
    if kind == "quarantine":
        return pa.table({"raw": pa.array([f'{{"line": {i}' for i in range(n)]),
                         "source_file": pa.array([f"landing/big/file-{i:07d}.jsonl" for i in range(n)]),
                         "reason": pa.array(["malformed JSON"] * n)})
    raise ValueError(f"unknown kind {kind!r}")


def batch_info(db: Database, batch_id: int = 0) -> BatchInfo:
    """A batch of :data:`INSTANCE` under its lease (taken now, or kept by this node)."""
    epoch = try_acquire(db, PLAN, INSTANCE.instance, INSTANCE.node, 3_600.0, same_node=True)
    assert epoch is not None
    return BatchInfo(INSTANCE, batch_id, epoch, datetime.now(timezone.utc))


@dataclass(frozen=True)
class BigBatches:
    """The outputs of one run: their sinks and what they must publish (the aggregations keep ``granularities``)."""

    granularities: tuple[str, ...] = GRANULARITIES

    @property
    def partials(self) -> AggregationSpec:
        return AggregationSpec(
            name="partials", table="big_partials", keys=("tenant", "idp"), granularities=self.granularities,
            measures=(Measure("n", "count", "bigint"), Measure("total", "sum", "double precision", "amount"),
                      Measure("low", "min", "double precision", "amount"),
                      Measure("high", "max", "double precision", "amount")))

    @property
    def facts(self) -> AggregationSpec:
        return AggregationSpec(
            name="logins", table="big_logins", keys=("tenant", "idp"), granularities=self.granularities,
            measures=(Measure("logins", "count", "bigint"), Measure("seconds", "sum", "double precision", "duration"),
                      Measure("users", "distinct", "bytea", "login_user")))

    def spec(self, kind: str) -> AggregationSpec:
        return self.partials if kind == "aggregation" else self.facts

    def sink(self, kind: str, database_url: str, root: Path) -> Any:
        """The sink of ``kind`` for :data:`INSTANCE`, its Delta table in ``root / kind``."""
        path = root / kind
        if kind == "aggregation":
            return AggregateSink(self.partials, INSTANCE, database_url, path, watermark_s=10.0)
        if kind == "fact_aggregation":
            return FactAggregateSink(self.facts, PLAN, OUTPUTS[kind], FACTS_CONFIG, INSTANCE, database_url, path)
        if kind == "table":
            return TableSink(PLAN, OUTPUTS[kind], TABLE_CONFIG, INSTANCE, database_url, path)
        if kind == "events":
            return EventsSink(PLAN, OUTPUTS[kind], EVENTS_CONFIG, INSTANCE, database_url, path)
        if kind == "latest":
            return LatestSink(PLAN, OUTPUTS[kind], LATEST_CONFIG, INSTANCE, database_url, path)
        if kind == "quarantine":
            return QuarantineSink(INSTANCE, database_url, path)
        raise ValueError(f"unknown kind {kind!r}")

    def reference(self, kind: str, batch: pa.Table) -> Any:
        """What publishing ``batch`` must leave, computed from the input in plain Python (pure).

        An aggregation: ``{(granularity, bucket_start, tenant, idp): (count, sum, distinct users)}``; a table:
        ``{customer: amount}``; events: ``{event_no}``; latest: ``{login_user: (time, idp, ok)}`` (every user
        logs in once); the quarantine: ``{source_file: raw}``.
        """
        rows = batch.to_pylist()
        if kind in ("aggregation", "fact_aggregation"):
            expected: dict[tuple, list] = {}
            for row in rows:
                if kind == "aggregation":
                    second, count, total, users = row["bucket_start"], row["n"], row["total"], set()
                else:
                    second, count, total, users = row["time"], 1, row["duration"], {row["login_user"]}
                for granularity in self.granularities:
                    into = expected.setdefault((granularity, bucket_start(second, granularity), row["tenant"],
                                                row["idp"]), [0, 0.0, set()])
                    into[0] += count
                    into[1] += total
                    into[2] |= users
            return {key: (count, total, len(users)) for key, (count, total, users) in expected.items()}
        if kind == "table":
            sums: dict[str, float] = {}
            for row in rows:
                sums[row["customer"]] = sums.get(row["customer"], 0.0) + row["amount"]
            return sums
        if kind == "events":
            return {row["event_no"] for row in rows}
        if kind == "latest":
            return {row["login_user"]: (row["time"].isoformat(), row["idp"], row["ok"]) for row in rows}
        if kind == "quarantine":
            return {row["source_file"]: row["raw"] for row in rows}
        raise ValueError(f"unknown kind {kind!r}")

    def published(self, kind: str, db: Database, root: Path) -> Any:
        """What ``kind``'s sink published, shaped as :func:`reference`, after checking that the Delta copy holds
        the same (each id once)."""
        path = root / kind
        if kind in ("aggregation", "fact_aggregation"):
            spec = self.spec(kind)
            stored = _sorted(_serving_rows(db, spec), spec)
            lake = _sorted(newest_per_key(read_table(path), spec).select(spec.written_schema.names)
                           .cast(spec.written_schema), spec)
            assert lake.drop_columns(["epoch", "batch_id"]).equals(stored.drop_columns(["epoch", "batch_id"])), \
                "the Delta copy differs from PostgreSQL"
            return _by_bucket(stored, spec)
        if kind == "table":
            stored = db.run(lambda cursor: read_table_rows(cursor, PLAN, OUTPUTS[kind], ["amount"]))
            merged = {row["key"]["customer"]: float(row["amount"]) for row in stored}
            lake = {row["customer"]: row["amount"] for row in read_table_lake(path, TABLE_CONFIG)}
            assert lake == merged, "the Delta copy differs from PostgreSQL"
            return merged
        if kind == "events":
            def read(cursor) -> list[int]:
                cursor.execute("SELECT (payload->>'event_no')::bigint AS n FROM output_events WHERE plan = %s",
                               (PLAN,))
                return [row["n"] for row in cursor.fetchall()]
            stored, lake = db.run(read), read_table(path)
            assert len(stored) == len(set(stored)), "an event twice in PostgreSQL"
            assert lake.num_rows == pc.count_distinct(lake["event_id"]).as_py() == read_events_lake(path).num_rows, \
                "an event twice in Delta"
            assert set(lake.column("event_no").to_pylist()) == set(stored), "the Delta copy differs from PostgreSQL"
            return set(stored)
        if kind == "latest":
            def read_latest(cursor) -> dict[str, tuple]:
                cursor.execute("SELECT row FROM output_latest WHERE plan = %s", (PLAN,))
                return {r["row"]["login_user"]: (r["row"]["time"], r["row"]["idp"], r["row"]["ok"])
                        for r in cursor.fetchall()}
            stored = db.run(read_latest)
            lake = {user: (row["time"].isoformat(), row["idp"], row["ok"])
                    for user, row in ((r["login_user"], r) for r in read_table(path).to_pylist())}
            assert lake == stored, "the Delta copy differs from PostgreSQL"
            return stored
        if kind == "quarantine":
            lake = read_table(path)
            assert lake.num_rows == pc.count_distinct(lake["source_file"]).as_py(), "a line twice in Delta"
            return dict(zip(lake.column("source_file").to_pylist(), lake.column("raw").to_pylist()))
        raise ValueError(f"unknown kind {kind!r}")

    def totals(self, kind: str, db: Database, root: Path) -> dict[str, Any]:
        """A cheap summary of what ``kind``'s sink published, for batches too big for :meth:`published`: rows in
        Delta; an aggregation's rows, sum of counts and of sums per granularity, in PostgreSQL and Delta; ids
        recorded and marked in the lake; a table's amount."""
        path = root / kind
        lake = read_table(path)
        out: dict[str, Any] = {"delta_rows": lake.num_rows}
        if kind in ("aggregation", "fact_aggregation"):
            spec = self.spec(kind)
            count, total = spec.measures[0].column, spec.measures[1].column
            for side, table in (("postgresql", _serving_rows(db, spec)), ("delta", newest_per_key(lake, spec))):
                out[side] = {g: [rows.num_rows, pc.sum(rows[count]).as_py(), pc.sum(rows[total]).as_py()]
                             for g in self.granularities
                             for rows in [table.filter(pc.equal(table["granularity"], g))]}
        if kind in ID_TABLES:
            def count_ids(cursor) -> dict[str, int]:
                cursor.execute(f"SELECT count(*) AS ids, count(*) FILTER (WHERE in_lake) AS in_lake "  # noqa: S608
                               f"FROM {ID_TABLES[kind]} WHERE plan = %s AND output = %s", (PLAN, OUTPUTS[kind]))
                return dict(cursor.fetchone())
            out.update(db.run(count_ids))
        if kind == "table":
            out["amount"] = pc.sum(lake["amount"]).as_py()
        if kind == "latest":
            def count_rows(cursor) -> dict[str, int]:
                cursor.execute("SELECT count(*) AS kept, count(*) FILTER (WHERE in_lake) AS in_lake FROM output_latest "
                               "WHERE plan = %s AND output = %s", (PLAN, OUTPUTS[kind]))
                return dict(cursor.fetchone())
            out.update(db.run(count_rows))
        return out

    def expected_totals(self, kind: str, batch: pa.Table) -> dict[str, Any]:
        """What :meth:`totals` must be for ``batch`` (pure; every key of a batch is its own, so each input row is
        one row of every granularity)."""
        n = batch.num_rows
        out: dict[str, Any] = {"delta_rows": n}
        if kind in ("aggregation", "fact_aggregation"):
            count = pc.sum(batch["n"]).as_py() if kind == "aggregation" else n
            total = pc.sum(batch["total" if kind == "aggregation" else "duration"]).as_py()
            out = {"delta_rows": n * len(self.granularities),
                   **{side: {g: [n, count, total] for g in self.granularities} for side in ("postgresql", "delta")}}
        if kind in ID_TABLES:
            out.update(ids=n, in_lake=n)
        if kind == "table":
            out["amount"] = pc.sum(batch["amount"]).as_py()
        if kind == "latest":
            out.update(kept=n, in_lake=n)
        return out


def _serving_rows(db: Database, spec: AggregationSpec) -> pa.Table:
    statement = f"SELECT * FROM {spec.table} WHERE plan = %s"  # noqa: S608 - the spec's own table name
    return db.run(lambda cursor: aggregates.copied_out(cursor, statement, (PLAN,), spec.written_schema))


def _sorted(rows: pa.Table, spec: AggregationSpec) -> pa.Table:
    return rows.sort_by([(c, "ascending") for c in ("granularity", "bucket_start", *spec.keys)])


def _by_bucket(rows: pa.Table, spec: AggregationSpec) -> dict[tuple, tuple]:
    """Rows as ``{(granularity, bucket_start, tenant, idp): (count, sum, distinct estimate)}``."""
    count, total = spec.measures[0].column, spec.measures[1].column
    sketched = spec.distinct_columns[0] if spec.distinct_columns else None
    out = {}
    for row in rows.to_pylist():
        key = (row["granularity"], row["bucket_start"], row["tenant"], row["idp"])
        assert key not in out, f"{key} twice"
        out[key] = (row[count], row[total], sketches.estimate(row[sketched]) if sketched else 0)
    return out
