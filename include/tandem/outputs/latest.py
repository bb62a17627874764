"""The ``latest`` output kind: per key, the row of the latest event time, values of any declared type.

Declared with ``key`` (the fields a row is the latest of), ``time`` (the event time that orders rows) and
``values`` (the fields kept with it, of any type: strings, booleans, numbers, timestamps); ``id`` optionally
names the fields that break a tie of event times (default: the row's own content). A row's *rank* is
``(event time, tiebreak)``; the latest row of a key is the one of the highest rank.

Exactly once, whoever publishes: each instance keeps its latest row of each key in ``tandem.output_latest``
(migration ``018_latest.sql``), and a row replaces the kept one only when it ranks higher, in the publishing
transaction that checks the fence. So a replay, a standby flushing what it held, a backfill or a stale ACTIVE's
late batch never moves a key backwards, and a row published twice changes nothing. The Delta copy appends each
batch's winning rows once (application transactions), and the rows kept at the same rank whose copy is not in the
lake yet (``in_lake``): a publisher whose lease moved, or that died, between its PostgreSQL commit and its Delta
append left them for whoever publishes the same row next, as events and tables do. Its read takes the highest rank
per key, so a row an old ACTIVE appended after the new one moved on does not count. Reads merge the instances the
same way: per key, the highest rank of any instance.

Restore: kept (a replay after the cut brings rows that rank no higher than those kept). Backfill: the range's
recomputed latest row of each key is published under the ACTIVE's lease (a late event that ranks higher wins).
Reconcile: per key recomputed in the range, the published row of the key (whatever its time) against the recomputed
one. Retention: ``maintenance.retention.table_rows`` deletes keys not updated for that long (as for tables), and a
backfill from at or before the newest event time deleted is refused (a deleted key keeps no rank). Validation: every
instance's kept rows of the window, the row's fields as columns.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tandem.declarations import OUTPUT_RULES, OutputConfig, event_id
from tandem.json_values import spelled, times_as_iso
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir
from tandem.outputs.base import (
    ALL_TIME,
    LAKE_COLUMNS,
    BatchInfo,
    HeldById,
    OutputKind,
    ReadRequest,
    RetentionRun,
    Trimmed,
    Validation,
    Window,
    as_utc,
    capped,
    reading,
    row_difference,
)
from tandem.outputs.expectations import expect, instances, not_null
from tandem.outputs.quarantine import QuarantineSink
from tandem.outputs.recompute import Outcome, Recomputed, instance_sink, publish_under_lease, same, unbounded
from tandem.store import latest as store
from tandem.store.db import Database
from tandem.store.leases import check_fence
from tandem.store.outputs import canonical_key, to_json
from tandem.store.publish_log import record_published
from tandem.store.registry import InstanceKey
from tandem.store.trim import horizons, record_horizon

if TYPE_CHECKING:
    import pandas as pd

    from tandem.config import ClusterConfig, PlanConfig

TIEBREAK = "tiebreak"
"""The Delta column (and PostgreSQL's) that breaks a tie of event times."""
Rank = tuple[datetime, str]


def tiebreak_of(plan: str, output: str, config: OutputConfig, row: Mapping[str, Any]) -> str:
    """What orders two rows of one key and event time: the id of the declared ``id`` fields, else a hash of the
    row's content (the same on every replica and in every batching) (pure)."""
    if config.id:
        return event_id(plan, output, {f: row[f] for f in config.id})
    return hashlib.sha256(canonical_key({k: v for k, v in row.items() if k != TIEBREAK}).encode()).hexdigest()[:32]


def latest_horizon(output: str) -> str:
    """The name :func:`tandem.store.trim.record_horizon` records the newest event time of an output's trimmed keys
    under."""
    return f"latest/{output}"


def declared_fields(config: OutputConfig) -> list[str]:
    """The fields a latest row keeps: the key's, the time, the values and the id's, each once."""
    return list(dict.fromkeys([*config.key, config.time, *config.values, *config.id]))


def rank_of(config: OutputConfig, row: Mapping[str, Any]) -> Rank:
    return as_utc(row[config.time]), row[TIEBREAK]


def key_of(config: OutputConfig, row: Mapping[str, Any]) -> str:
    """The key's canonical JSON text (the identity of a row in a batch and among held rows)."""
    return canonical_key({k: row[k] for k in config.key})


def latest_per_key(rows: list[dict[str, Any]], config: OutputConfig) -> dict[str, dict[str, Any]]:
    """Of rows that carry their tiebreak, the highest-ranked of each key (pure)."""
    latest: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = key_of(config, row)
        if key not in latest or rank_of(config, row) > rank_of(config, latest[key]):
            latest[key] = row
    return latest


def ranked_latest(plan: str, output: str, config: OutputConfig, rows: pa.Table) -> dict[str, dict[str, Any]]:
    """Of a batch of query rows, the declared fields (key, time, values, id) and tiebreak of each key's
    highest-ranked row (pure)."""
    return latest_per_key([{**row, TIEBREAK: tiebreak_of(plan, output, config, row)}
                           for row in rows.select(declared_fields(config)).to_pylist()], config)


class LatestSink(HeldById):
    """Each instance's latest row per key → ``output_latest`` (only when it ranks higher) → the winners to Delta.

    A row's identity is its key. A standby holds the highest-ranked row of each key; a held row is published for
    good once the kept row of its key ranks at least as high and is in the lake.
    """

    def identities(self, rows: pa.Table) -> dict[str, dict[str, Any]]:
        """The declared fields (key, time, values, id) of each key's highest-ranked row."""
        self.schema = rows.select(declared_fields(self.config)).schema
        return ranked_latest(self.plan, self.output, self.config, rows)

    def hold(self, rows: pa.Table, batch_id: int) -> None:
        """Keep the highest-ranked row of each key (a later batch may bring an earlier event)."""
        identities = self.identities(rows)
        for key, row in identities.items():
            if key not in self.held or rank_of(self.config, row) > rank_of(self.config, self.held[key]):
                self.held[key] = row
        self.note_held(identities, batch_id)

    def published_of(self, held: dict[str, dict[str, Any]]) -> list[str]:
        kept = self.db.run(lambda cursor: store.kept(cursor, self.plan, self.output, self.instance.instance, list(held),
                                                in_lake=True), attempts=1)
        return [key for key, row in held.items()
                if key in kept and kept[key] >= rank_of(self.config, row)]

    def describe(self, identity: str) -> str:
        return f"key {identity}"

    def differences(self, rows: dict[str, dict[str, Any]]) -> list[str]:
        """Each key's held row against the active's kept row of the same event time: its values, and its tiebreak
        (another tiebreak: the rows' ``id`` is computed otherwise). A kept row of a later time superseded both."""
        kept = {canonical_key(row["key"]): row for row in self.db.run(lambda cursor: store.instance_rows_of_keys(
            cursor, self.plan, self.output, self.instance.instance, list(rows)), attempts=1)}
        lines = []
        for key, row in rows.items():
            theirs = kept.get(key)
            if theirs is None or theirs["event_time"] != as_utc(row[self.config.time]):
                continue
            new = {**to_json({k: v for k, v in row.items() if k != TIEBREAK}), TIEBREAK: row[TIEBREAK]}
            old = {**theirs["row"], TIEBREAK: theirs["tiebreak"]}
            line = row_difference(f"key {key}", old, new, [*self.config.values, TIEBREAK])
            if line:
                lines.append(line)
        return lines

    def write(self, rows: dict[str, dict[str, Any]], batch: BatchInfo) -> int:
        """Keep each key's row where it ranks higher than the kept one; copy to Delta those kept rows that are not in
        the lake yet; how many were copied."""
        instance = batch.instance

        def work(cursor, keys: list[str]) -> list[str]:
            store.stage(cursor, [(key, as_utc(rows[key][self.config.time]), rows[key][TIEBREAK],
                                  {k: v for k, v in rows[key].items() if k != TIEBREAK}) for key in keys])
            check_fence(cursor, instance.plan, instance.instance, instance.node, batch.epoch)
            pending = store.keep_higher(cursor, instance, self.output, batch.epoch, batch.batch_id, keys)
            newest = max((as_utc(rows[key][self.config.time]) for key in keys), default=None)
            record_published(cursor, instance, self.output, batch.batch_id, batch.epoch, len(pending), newest, None)
            return pending

        pending, _ = self.refusals.run(work, list(rows), rows.__getitem__, batch)
        if pending:
            lake = pa.Table.from_pylist([rows[key] for key in pending],
                                        schema=self.schema.append(pa.field(TIEBREAK, pa.string())))
            self.append_to_lake(lake, batch)
            self.db.run(lambda cursor: store.mark_in_lake(cursor, instance, self.output,
                                                     {key: rank_of(self.config, rows[key]) for key in pending}))
        return len(pending or ())


# --- the kind ------------------------------------------------------------------------------------------------------

LAKE_ONLY = (*LAKE_COLUMNS, TIEBREAK)


class LatestKind(OutputKind):
    """``latest``: per key, the row of the latest event time (ties broken by ``id``), merged on read."""

    name = "latest"
    rules = OUTPUT_RULES[name]

    def sink(self, plan: PlanConfig, output: str, instance: InstanceKey, database_url: str, delta_path: Path,
             quarantine: QuarantineSink | None = None) -> LatestSink:
        return LatestSink(plan.name, output, plan.outputs[output], instance, database_url, delta_path, quarantine)

    def read(self, cluster: ClusterConfig, plan: PlanConfig, output: str, request: ReadRequest,
             db: Database | None = None) -> list[dict[str, Any]]:
        """Per key, the latest row over the instances (whose event time lies in ``[start, end)`` when given), in key
        order: the row's fields as JSON values (times as ISO 8601 text, :meth:`time_fields`), and ``instance``, the
        instance that published it."""
        config = plan.outputs[output]
        if request.source == "delta":
            table = read_table(delta_table_dir(cluster, plan.name, output))
            latest = latest_per_key(table.to_pylist(), config)
            found = [({k: v for k, v in row.items() if k not in LAKE_ONLY}, row["instance"], rank_of(config, row))
                     for _, row in sorted(latest.items())]
        else:
            single, limit = request.in_store(ranged=True)  # the rest is filtered below

            def work(cursor) -> list[dict[str, Any]]:
                with capped(cursor, limit) as rows:
                    return store.read_merged(rows, plan.name, output, single or None)

            with reading(cluster, db) as connection:
                kept = connection.run(work, attempts=3)
            found = [(row["row"], row["instance"], (row["event_time"], row["tiebreak"]))
                     for row in sorted(kept, key=lambda r: canonical_key(r["key"]))]
        rows = request.picked([{**spelled(to_json(values)), "instance": instance} for values, instance, rank in found
                               if request.covers(rank[0])])
        times = self.time_fields(plan, output)
        return [times_as_iso(row, times) for row in rows]

    def replace(self, job: Recomputed, backfill_id: str) -> dict[str, Any]:
        """The range's latest row of each key, published under the ACTIVE's lease: it wins where it ranks higher
        than the kept row (a late event), and changes nothing elsewhere."""
        why = unbounded(job)
        if why:
            return {"recomputed": False, "why": why}
        sink = instance_sink(self, job, "backfill")
        rows = job.in_range()
        latest = {} if rows is None else sink.identities(rows)
        won = publish_under_lease(job, sink, latest, backfill_id) if latest else 0
        return {"recomputed": True, "rows": len(latest), "published": won, "already_published": len(latest) - won}

    def compare(self, job: Recomputed) -> Outcome:
        """Per key recomputed in the range, against the instance's kept row of the key whatever its event time: late
        when the recomputed row ranks higher, or none is kept (but for a row at or before the trim horizon, whose key
        the retention may have deleted: not compared); different when both are the same rank with other values; extra
        when a kept row of the range ranks higher than anything recomputed for its key."""
        outcome = Outcome(job.instance, job.output)
        why = unbounded(job)
        if why:
            outcome.skipped = why
            return outcome
        config = job.declared
        rows = job.in_range()
        recomputed = {} if rows is None else ranked_latest(job.plan.name, job.output, config, rows)
        horizon = horizons(job.db, job.plan.name).get(latest_horizon(job.output))

        def read(cursor) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
            of_range = store.instance_rows(cursor, job.plan.name, job.output, job.instance, job.start, job.end)
            of_keys = store.instance_rows_of_keys(cursor, job.plan.name, job.output, job.instance, list(recomputed))
            return of_range, of_keys

        of_range, of_keys = job.db.run(read, attempts=3)
        in_range = {canonical_key(row["key"]) for row in of_range}
        kept = {canonical_key(row["key"]): row for row in [*of_range, *of_keys]}
        compared = set(in_range)
        for key, row in sorted(recomputed.items()):
            ours, theirs = rank_of(config, row), kept.get(key)
            if theirs is None and horizon is not None and ours[0] <= horizon:
                continue
            compared.add(key)
            rank = None if theirs is None else (theirs["event_time"], theirs["tiebreak"])
            if rank is None or rank < ours:
                outcome.add("late", {"key": key, "recomputed": ours[0].isoformat()})
            elif rank == ours:
                values = to_json({k: v for k, v in row.items() if k != TIEBREAK})
                differing = {k: [theirs["row"].get(k), v] for k, v in values.items()
                             if not same(theirs["row"].get(k), v)}
                if differing:
                    outcome.add("different", {"key": key, **differing})
            elif key in in_range:
                outcome.add("extra", {"key": key, "published": rank[0].isoformat()})
        for key in sorted(in_range - set(recomputed)):
            outcome.add("extra", {"key": key, "published": kept[key]["event_time"].isoformat()})
        outcome.compared += len(compared)
        return outcome

    def backfill_refusal(self, plan: PlanConfig, output: str, start: datetime, end: datetime,
                         trimmed: Mapping[str, datetime]) -> str | None:
        """A key the retention deleted keeps no rank: a range from at or before the newest event time trimmed could
        make an older row its latest in PostgreSQL while Delta keeps the newer one."""
        horizon = trimmed.get(latest_horizon(output))
        if horizon is None or start > horizon:
            return None
        return (f"it starts at {start.isoformat()}, and {output} deleted keys whose latest rows were at or before "
                f"{horizon.isoformat()} (maintenance.retention.table_rows): an older row of such a key would become "
                f"its latest again; start it after {horizon.isoformat()}")

    def trim(self, run: RetentionRun, output: str) -> list[Trimmed]:
        """Keys not updated for ``retention.table_rows`` (and in the lake) go; the newest event time of those is
        recorded as the output's trim horizon (:meth:`backfill_refusal`)."""
        seconds = run.plan.maintenance.retention.table_rows_s
        if seconds is None:
            return []
        before = run.cutoff(seconds)
        rows, newest = run.db.run(lambda cursor: store.trim(cursor, run.plan.name, output, before), attempts=3)
        if newest is not None:
            record_horizon(run.db, run.plan.name, latest_horizon(output), newest)
        return [Trimmed(store.TABLE, rows, before, f"keys of {output}")]

    def reset(self, db: Database, plan: PlanConfig, output: str) -> list[str]:
        """Every instance's latest rows of the output."""
        deleted = db.run(lambda cursor: store.delete_all(cursor, plan.name, output), attempts=3)
        return [f"{deleted} latest rows ({store.TABLE})"]

    def summary(self, plan: PlanConfig, output: str) -> dict[str, Any]:
        return {**super().summary(plan, output), "time": plan.outputs[output].time}

    def validation(self, plan: PlanConfig, output: str) -> Validation:
        """Every instance's kept rows whose event time lies in the window, the row's fields as columns."""
        config = plan.outputs[output]
        implied = [
            *[not_null(field, "the output's key") for field in config.key],
            expect("expect_compound_columns_to_be_unique", "one latest row per key and instance",
                   column_list=[*config.key, "instance"]),
            not_null(config.time, "the event time that orders the rows"),
            instances(),
        ]

        def read(cursor, window: Window, limit: int) -> list[dict[str, Any]]:
            return store.instance_rows(cursor, plan.name, output, None, window.since, window.until or ALL_TIME[1],
                                       limit)

        return Validation(table=f"tandem.{store.TABLE}", key_columns=[*config.key, "instance"], implied=implied,
                          required=implied, takes_unnamed=False, read=read, frame=latest_frame)


def latest_frame(rows: list[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows of ``output_latest`` with the row's fields as columns (pure)."""
    import pandas as pd  # only validations build frames

    return pd.DataFrame([{**row["row"], "instance": row["instance"]} for row in rows],
                        columns=None if rows else ["instance"])


KIND = LatestKind()
