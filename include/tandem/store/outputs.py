"""PostgreSQL rows of the ``events`` and ``table`` output kinds (see migration 005).

Every function runs inside the caller's publishing transaction, after ``check_fence``: the
PostgreSQL write is the record of truth, and a row's Delta copy is marked ``in_lake`` once it is
committed there.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import pyarrow as pa
from psycopg2 import sql
from psycopg2.extras import Json

from tandem.store.aggregates import copied_out
from tandem.json_values import json_text
from tandem.store.registry import InstanceKey


def to_json(value: Any) -> Any:
    """A JSON-able copy of a row value (timestamps as ISO text)."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def stage_events(cursor, events: dict[str, tuple[datetime, dict]]) -> None:
    """COPY events ``{event_id: (event_time, payload)}`` into the transaction's temporary table ``_events``.

    Stage before :func:`tandem.store.leases.check_fence`: a session frozen inside a ``COPY`` must not
    hold the lease's lock. One ``COPY`` of text lines costs a fraction of a multi-row ``INSERT``
    built row by row in Python.
    """
    cursor.execute("DROP TABLE IF EXISTS _events")
    cursor.execute("CREATE TEMP TABLE _events (event_id text, event_time timestamptz, payload jsonb) ON COMMIT DROP")
    lines = "".join(f"{eid}\t{time.isoformat()}\t{_copy_text(json_text(payload, _json_value))}\n"
                    for eid, (time, payload) in events.items())
    cursor.copy_expert("COPY _events (event_id, event_time, payload) FROM STDIN", io.StringIO(lines))


def _jsonb(value: Any) -> Json:
    """A parameter for a ``jsonb`` column (NaN and infinities spelled: :func:`tandem.json_values.json_text`)."""
    return Json(to_json(value), dumps=json_text)


def _json_value(value: Any) -> Any:
    """What :func:`json.dumps` writes for a value it has no encoding of: the same text as :func:`to_json`."""
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _copy_text(value: str) -> str:
    """A value for COPY's text format (JSON text has no raw tab or newline; its backslashes must be doubled)."""
    return value.replace("\\", "\\\\")


def insert_staged_events(cursor, instance: InstanceKey, output: str, epoch: int, batch_id: int,
                         ids: Sequence[str]) -> list[str]:
    """Insert the staged events (``ids``: theirs) not yet published; return those of ``ids`` not yet in the lake.

    The new events' ids come back from the insert (through ``COPY``); only the others are looked up. A join of the
    staged events with ``output_events`` is the planner's to choose, and on a table without statistics (a new
    deployment's first catch-up) it read every event of the output for each staged one.
    """
    inserted = copied_out(cursor, sql.SQL(
        """INSERT INTO output_events (plan, output, event_id, instance, event_time, payload, node, epoch, batch_id)
           SELECT %s, %s, event_id, %s, event_time, payload, %s, %s, %s FROM _events
           ON CONFLICT (plan, output, event_id) DO NOTHING RETURNING event_id"""),
        (instance.plan, output, instance.instance, instance.node, epoch, batch_id),
        pa.schema([("event_id", pa.string())])).column("event_id").to_pylist()
    new = set(inserted)
    known = [eid for eid in ids if eid not in new]
    return inserted + (not_in_lake(cursor, "output_events", "event_id", instance.plan, output, known) if known else [])


def insert_events(cursor, instance: InstanceKey, output: str, events: dict[str, tuple[datetime, dict]],
                  epoch: int, batch_id: int) -> list[str]:
    """Insert events ``{event_id: (event_time, payload)}`` not yet published; return the ids not yet in the lake."""
    if not events:
        return []
    stage_events(cursor, events)
    return insert_staged_events(cursor, instance, output, epoch, batch_id, list(events))


def as_stored(payload: Mapping[str, Any]) -> dict[str, Any]:
    """An event's payload as ``output_events`` gives it back (the JSON it is stored as, read again)."""
    return json.loads(json_text(payload, _json_value))


def event_payloads(cursor, plan: str, output: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The payloads of the published events among ``ids``."""
    cursor.execute("SELECT event_id, payload FROM output_events WHERE plan = %s AND output = %s "
                   "AND event_id = ANY(%s)", (plan, output, list(ids)))
    return {row["event_id"]: row["payload"] for row in cursor.fetchall()}


def _ids(cursor, table: str, id_column: str, condition: str, plan: str, output: str, ids: Sequence[str]) -> list[str]:
    """Of ``ids``, those of ``table`` whose row meets ``condition`` (SQL text of Tandem's own)."""
    cursor.execute(sql.SQL("SELECT {id} AS id FROM {table} WHERE plan = %s AND output = %s AND {id} = ANY(%s) "
                           "AND {condition}").format(id=sql.Identifier(id_column), table=sql.Identifier(table),
                                                     condition=sql.SQL(condition)),
                   (plan, output, list(ids)))
    return [row["id"] for row in cursor.fetchall()]


def known_ids(cursor, table: str, id_column: str, plan: str, output: str, ids: Sequence[str]) -> set[str]:
    """Of ``ids``, those already published (in PostgreSQL, in the lake or not)."""
    return set(_ids(cursor, table, id_column, "TRUE", plan, output, ids))


def not_in_lake(cursor, table: str, id_column: str, plan: str, output: str, ids: Sequence[str]) -> list[str]:
    """Of ``ids``, those whose rows are in PostgreSQL but not yet in the Delta copy."""
    return _ids(cursor, table, id_column, "NOT in_lake", plan, output, ids)


def in_lake(cursor, table: str, id_column: str, plan: str, output: str, ids: Sequence[str]) -> set[str]:
    """Of ``ids``, those published for good: in PostgreSQL and in the Delta copy."""
    return set(_ids(cursor, table, id_column, "in_lake", plan, output, ids))


def mark_in_lake(cursor, table: str, id_column: str, plan: str, output: str, ids: Sequence[str]) -> None:
    cursor.execute(sql.SQL("UPDATE {table} SET in_lake = true WHERE plan = %s AND output = %s AND {id} = ANY(%s)")
                   .format(table=sql.Identifier(table), id=sql.Identifier(id_column)), (plan, output, list(ids)))


def canonical_key(values: dict[str, Any]) -> str:
    return json_text(to_json(values), sort_keys=True, separators=(",", ":"))


def insert_contributions(cursor, instance: InstanceKey, output: str, keys: dict[str, dict],
                         values: Mapping[str, Mapping[str, Any]] | None = None) -> set[str]:
    """Record contributions ``{id: the key they add to}`` (and ``{id: the values they add}``, kept so that an upgrade's
    shadow can compare them); return the ids that were new (not applied before, by anyone).

    The contributions are COPied into the transaction's temporary table ``_contributions``, then inserted in one
    statement whose new ids come back through ``COPY``: a multi-row ``INSERT`` per thousand rows, built in Python,
    took most of a big batch's time.
    """
    if not keys:
        return set()

    def value(cid: str) -> str:
        return "\\N" if values is None else _copy_text(json_text(to_json(dict(values[cid]))))

    _stage(cursor, "_contributions", "contribution_id text, key jsonb, value jsonb",
           (f"{_copy_value(cid)}\t{_copy_text(json_text(to_json(key)))}\t{value(cid)}\n" for cid, key in keys.items()))
    inserted = copied_out(cursor, sql.SQL(
        """INSERT INTO output_contributions (plan, output, contribution_id, instance, key, value)
           SELECT %s, %s, contribution_id, %s, key, value FROM _contributions
           ON CONFLICT (plan, output, contribution_id) DO NOTHING RETURNING contribution_id"""),
        (instance.plan, output, instance.instance), pa.schema([("contribution_id", pa.string())]))
    return set(inserted.column("contribution_id").to_pylist())


def apply_contributions(cursor, instance: InstanceKey, output: str, values: Sequence[str],
                        contributions: dict[str, tuple[dict, dict]], epoch: int, batch_id: int) -> list[dict]:
    """Add each contribution ``{id: (key, values)}`` not applied yet to its key's partial value.

    Returns the instance's current rows of every key with a contribution not yet in the lake
    (``key``, ``value``, ``version`` and the contribution ids to mark), for the Delta copy. The keys' new values
    go in through a temporary table (``COPY``); the contributions are found by one array of ids (hashed), and each
    finds its key's row by primary key (``LATERAL … OFFSET 0``, which the planner cannot turn into a join): a join
    left to the planner, on tables just filled (no statistics), compared every contribution with every row (77 s
    for 10,000 keys).
    """
    if not contributions:
        return []
    new = insert_contributions(cursor, instance, output, {cid: key for cid, (key, _) in contributions.items()},
                               {cid: contributed for cid, (_, contributed) in contributions.items()})
    totals: dict[str, tuple[dict, dict[str, float], int]] = {}
    for cid in new:
        key, contributed = contributions[cid]
        text = canonical_key(key)
        _, sums, count = totals.get(text, (key, {v: 0 for v in values}, 0))
        totals[text] = (key, {v: sums[v] + (contributed.get(v) or 0) for v in values}, count + 1)
    if totals:
        _stage(cursor, "_table_rows", "key jsonb, value jsonb, version bigint",
               (f"{_copy_text(json_text(to_json(key)))}\t{_copy_text(json_text(to_json(sums)))}\t{count}\n"
                for key, sums, count in totals.values()))
        added = sql.SQL(", ").join(
            sql.SQL("{0}, (t.value->>{0})::numeric + (EXCLUDED.value->>{0})::numeric").format(sql.Literal(v))
            for v in values)
        cursor.execute(
            sql.SQL("""INSERT INTO output_table_rows AS t (plan, output, key, instance, value, version, node, epoch, batch_id)
                SELECT %s, %s, key, %s, value, version, %s, %s, %s FROM _table_rows
                ON CONFLICT (plan, output, key, instance) DO UPDATE
                SET value = jsonb_build_object({added}), version = t.version + EXCLUDED.version,
                    node = EXCLUDED.node, epoch = EXCLUDED.epoch, batch_id = EXCLUDED.batch_id, updated_at = now()"""
                    ).format(added=added),
            (instance.plan, output, instance.instance, instance.node, epoch, batch_id))
    known = [cid for cid in contributions if cid not in new]
    pending = [*new, *(not_in_lake(cursor, "output_contributions", "contribution_id", instance.plan, output, known)
                       if known else [])]
    if not pending:
        return []
    cursor.execute(
        """SELECT r.key, r.value, r.version, array_agg(c.contribution_id) AS ids
           FROM (SELECT contribution_id, key, instance FROM output_contributions
                 WHERE plan = %(plan)s AND output = %(output)s AND contribution_id = ANY(%(pending)s) OFFSET 0) c
           CROSS JOIN LATERAL (
               SELECT r.key, r.value, r.version FROM output_table_rows r
               WHERE r.plan = %(plan)s AND r.output = %(output)s AND r.key = c.key AND r.instance = c.instance
               OFFSET 0) r
           GROUP BY r.key, r.value, r.version""",
        {"plan": instance.plan, "output": output, "pending": pending})
    return [dict(row) for row in cursor.fetchall()]


def contributions_of(cursor, plan: str, output: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The applied contributions among ``ids``: ``{id: {"key": …, "value": … (None: applied before values were
    kept)}}``."""
    cursor.execute("SELECT contribution_id, key, value FROM output_contributions WHERE plan = %s AND output = %s "
                   "AND contribution_id = ANY(%s)", (plan, output, list(ids)))
    return {row["contribution_id"]: {"key": row["key"], "value": row["value"]} for row in cursor.fetchall()}


def _stage(cursor, table: str, columns: str, lines: Iterable[str]) -> None:
    """(Re)create the transaction's temporary ``table`` (``columns``: Tandem's own SQL) and COPY ``lines`` (COPY's
    text format) into it."""
    cursor.execute(f"DROP TABLE IF EXISTS {table}")
    cursor.execute(f"CREATE TEMP TABLE {table} ({columns}) ON COMMIT DROP")
    cursor.copy_expert(f"COPY {table} FROM STDIN", io.StringIO("".join(lines)))


def _copy_value(value: str) -> str:
    """Any text as a value of COPY's text format (backslash, tab, newline and carriage return escaped)."""
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def read_events(cursor, plan: str, output: str, start: datetime, end: datetime, *, limit: int | None = None,
                after: tuple[datetime, str] | None = None) -> list[dict]:
    """Events with ``start <= event_time < end`` in time order (then id), optionally after a (time, id) position."""
    filters = ["plan = %(plan)s", "output = %(output)s", "event_time >= %(start)s", "event_time < %(end)s"]
    params: dict[str, Any] = {"plan": plan, "output": output, "start": start, "end": end, "limit": limit}
    if after is not None:
        filters.append("(event_time, event_id) > (%(after_time)s, %(after_id)s)")
        params.update(after_time=after[0], after_id=after[1])
    cursor.execute(f"""SELECT event_id, event_time, instance, payload FROM output_events WHERE {' AND '.join(filters)}
                       ORDER BY event_time, event_id LIMIT %(limit)s""", params)
    return [dict(row) for row in cursor.fetchall()]


def read_table_rows(cursor, plan: str, output: str, values: Sequence[str],
                    key: Mapping[str, list[Any]] | None = None) -> list[dict]:
    """A table merged across instances: per key, the sum of the instances' partial values (of the keys whose fields
    each hold one of ``key``'s values for that field, when given)."""
    sums = sql.SQL(", ").join(sql.SQL("sum((value->>{})::numeric) AS {}").format(sql.Literal(v), sql.Identifier(v))
                              for v in values)
    where, params = key_filter(key)
    cursor.execute(sql.SQL("""SELECT key, {sums}, count(*) AS instances, sum(version) AS version FROM output_table_rows
                              WHERE plan = %s AND output = %s {where} GROUP BY key ORDER BY key::text""").format(
        sums=sums, where=where), (plan, output, *params))
    return [dict(row) for row in cursor.fetchall()]


def key_filter(key: Mapping[str, list[Any]] | None) -> tuple[sql.Composable, list[Any]]:
    """``AND`` conditions on a ``jsonb`` column ``key``: each field holds one of its values (jsonb compares numbers
    by value), and their parameters."""
    conditions = [sql.SQL(" AND key -> %s = ANY(%s::jsonb[])") for _ in (key or {})]
    params: list[Any] = []
    for name, wanted in (key or {}).items():
        params += [name, [json_text(to_json(value)) for value in wanted]]
    return sql.Composed(conditions), params


EventPosition = tuple[int, str]
"""Where a poller of an events output is: (inserting transaction id, event id) of the last event it got."""
START: EventPosition = (0, "")
"""The position before every event."""


def events_after(cursor, plan: str, output: str, after: EventPosition, limit: int) -> list[dict]:
    """Up to ``limit`` events after ``after`` (:data:`START`: from the first one) in (xid, event_id) order.

    Only events of transactions below this statement's snapshot xmin are returned: those
    transactions have all ended, so a later poll from the last position sees no event it missed
    (migration 006). Rows carry their position as ``xid`` (int) and ``event_id``.
    """
    cursor.execute(
        """SELECT xid::text::bigint AS xid, event_id, event_time, instance, payload FROM output_events
           WHERE plan = %s AND output = %s AND xid < pg_snapshot_xmin(pg_current_snapshot())
             AND (xid, event_id) > (%s::text::xid8, %s)
           ORDER BY xid, event_id LIMIT %s""",
        (plan, output, str(after[0]), after[1], limit))
    return [dict(row) for row in cursor.fetchall()]


def newest_events(cursor, plan: str, output: str, count: int) -> list[dict]:
    """The last ``count`` events in (xid, event_id) order (a feed's start), with their positions as in :func:`events_after`."""
    cursor.execute(
        """SELECT * FROM (
               SELECT xid::text::bigint AS xid, event_id, event_time, instance, payload FROM output_events
               WHERE plan = %s AND output = %s AND xid < pg_snapshot_xmin(pg_current_snapshot())
               ORDER BY xid DESC, event_id DESC LIMIT %s) newest
           ORDER BY xid, event_id""",
        (plan, output, count))
    return [dict(row) for row in cursor.fetchall()]


def count_events(cursor, plan: str, output: str) -> int:
    cursor.execute("SELECT count(*) AS n FROM output_events WHERE plan = %s AND output = %s", (plan, output))
    return int(cursor.fetchone()["n"])


def sample_events(cursor, plan: str, output: str, since: datetime, until: datetime, limit: int) -> list[dict]:
    """Up to ``limit`` events with ``since <= event_time < until``, in no particular order (a sample to validate)."""
    cursor.execute("SELECT event_id, instance, event_time, payload FROM output_events WHERE plan = %s AND output = %s "
                   "AND event_time >= %s AND event_time < %s LIMIT %s", (plan, output, since, until, limit))
    return [dict(row) for row in cursor.fetchall()]


def sample_table_rows(cursor, plan: str, output: str, limit: int) -> list[dict]:
    """Up to ``limit`` rows of a table output, every instance's, as stored (not merged), in no particular order."""
    cursor.execute("SELECT key, instance, value, version FROM output_table_rows WHERE plan = %s AND output = %s "
                   "LIMIT %s", (plan, output, limit))
    return [dict(row) for row in cursor.fetchall()]


OUTPUT_ROW_TABLES = ("output_events", "output_table_rows", "output_contributions")
"""The tables that hold rows of outputs of several kinds, by plan and output (migration 005)."""


def delete_output_rows(cursor, table: str, plan: str, output: str) -> int:
    """Delete every row of ``plan``'s output ``output`` from ``table`` (one of :data:`OUTPUT_ROW_TABLES`); how many
    went."""
    if table not in OUTPUT_ROW_TABLES:
        raise ValueError(f"{table!r} is not one of {', '.join(OUTPUT_ROW_TABLES)}")
    cursor.execute(sql.SQL("DELETE FROM {} WHERE plan = %s AND output = %s").format(sql.Identifier(table)),
                   (plan, output))
    return cursor.rowcount
