"""The ``latest`` output kind's rows (:mod:`tandem.outputs.latest`): ``output_latest``, each instance's latest row of
each key, replaced only by a row of a higher rank ``(event_time, tiebreak)``."""

from __future__ import annotations

import io
import json
from datetime import datetime
from collections.abc import Mapping
from typing import Any

from psycopg2 import sql

from tandem.json_values import json_text
from tandem.store.outputs import _copy_text, canonical_key, key_filter, to_json
from tandem.store.registry import InstanceKey

TABLE = "output_latest"
Rank = tuple[datetime, str]

def stage(cursor, rows: list[tuple[str, datetime, str, dict[str, Any]]]) -> None:
    """COPY ``(key as canonical JSON text, event time, tiebreak, row)`` into the transaction's temporary table
    ``_latest`` (before :func:`tandem.store.leases.check_fence`: a session frozen in a COPY must not hold the lease's
    lock)."""
    cursor.execute("DROP TABLE IF EXISTS _latest")
    cursor.execute("CREATE TEMP TABLE _latest (key jsonb, event_time timestamptz, tiebreak text, row jsonb) "
                   "ON COMMIT DROP")
    lines = io.StringIO()
    for key, event_time, tiebreak, row in rows:
        lines.write(f"{_copy_text(key)}\t{event_time.isoformat()}\t{_copy_text(tiebreak)}\t"
                    f"{_copy_text(json_text(to_json(row)))}\n")
    lines.seek(0)
    cursor.copy_expert("COPY _latest (key, event_time, tiebreak, row) FROM STDIN", lines)


def keep_higher(cursor, instance: InstanceKey, output: str, epoch: int, batch_id: int, keys: list[str]) -> list[str]:
    """Upsert the staged rows (of ``keys``, canonical texts) where they rank higher than the kept ones; the keys whose
    kept row is now the staged one and not yet in the lake: those that won, and those kept at the same rank by a
    publisher whose Delta append never happened (its lease moved, it died, or the append failed), so that whoever
    publishes the row next copies it to the lake."""
    cursor.execute("""
        INSERT INTO output_latest AS kept
            (plan, output, key, instance, event_time, tiebreak, row, node, epoch, batch_id)
        SELECT %(plan)s, %(output)s, key, %(instance)s, event_time, tiebreak, row, %(node)s, %(epoch)s, %(batch)s
        FROM _latest
        ON CONFLICT (plan, output, key, instance) DO UPDATE
            SET event_time = EXCLUDED.event_time, tiebreak = EXCLUDED.tiebreak, row = EXCLUDED.row,
                node = EXCLUDED.node, epoch = EXCLUDED.epoch, batch_id = EXCLUDED.batch_id, in_lake = false,
                updated_at = now()
            WHERE (EXCLUDED.event_time, EXCLUDED.tiebreak) > (kept.event_time, kept.tiebreak)
        RETURNING key""", {"plan": instance.plan, "output": output, "instance": instance.instance,
                           "node": instance.node, "epoch": epoch, "batch": batch_id})
    staged = {canonical_key(json.loads(key)): key for key in keys}  # the text PostgreSQL gives back may differ
    won = [staged[canonical_key(row["key"])] for row in cursor.fetchall()]
    others = set(keys) - set(won)
    if not others:
        return won
    cursor.execute("""SELECT kept.key FROM output_latest kept JOIN _latest s ON s.key = kept.key
                      WHERE kept.plan = %s AND kept.output = %s AND kept.instance = %s AND kept.key = ANY(%s::jsonb[])
                        AND NOT kept.in_lake AND (kept.event_time, kept.tiebreak) = (s.event_time, s.tiebreak)""",
                   (instance.plan, output, instance.instance, sorted(others)))
    return won + [staged[canonical_key(row["key"])] for row in cursor.fetchall()]


def mark_in_lake(cursor, instance: InstanceKey, output: str, ranks: dict[str, Rank]) -> None:
    """The rows of these keys at these ranks are in the Delta copy."""
    cursor.execute("""UPDATE output_latest t SET in_lake = true
                      FROM unnest(%s::jsonb[], %s::timestamptz[], %s::text[]) AS w(key, event_time, tiebreak)
                      WHERE t.plan = %s AND t.output = %s AND t.instance = %s AND t.key = w.key
                        AND t.event_time = w.event_time AND t.tiebreak = w.tiebreak""",
                   (list(ranks), [r[0] for r in ranks.values()], [r[1] for r in ranks.values()],
                    instance.plan, output, instance.instance))


def kept(cursor, plan: str, output: str, instance: str, keys: list[str], *, in_lake: bool = False) -> dict[str, Rank]:
    """The kept rank of each of ``keys`` (canonical text) of one instance (only rows in the lake with ``in_lake``)."""
    cursor.execute(sql.SQL("""SELECT key, event_time, tiebreak FROM output_latest
                              WHERE plan = %s AND output = %s AND instance = %s AND key = ANY(%s::jsonb[]) {}""")
                   .format(sql.SQL("AND in_lake" if in_lake else "")), (plan, output, instance, keys))
    return {canonical_key(row["key"]): (row["event_time"], row["tiebreak"]) for row in cursor.fetchall()}


def read_merged(cursor, plan: str, output: str, key: Mapping[str, list[Any]] | None) -> list[dict[str, Any]]:
    """Per key (those whose fields each hold one of ``key``'s values, when given), the highest-ranked row of any
    instance."""
    where, params = key_filter(key)
    cursor.execute(sql.SQL("""SELECT DISTINCT ON (key) key, row, instance, event_time, tiebreak FROM output_latest
                              WHERE plan = %s AND output = %s {} ORDER BY key, event_time DESC, tiebreak DESC""")
                   .format(where), (plan, output, *params))
    return [dict(row) for row in cursor.fetchall()]


def instance_rows(cursor, plan: str, output: str, instance: str | None, start: datetime, end: datetime,
                  limit: int | None = None) -> list[dict[str, Any]]:
    """The kept rows (of one instance, or all) whose event time lies in ``[start, end)``."""
    cursor.execute("""SELECT key, instance, event_time, tiebreak, row FROM output_latest
                      WHERE plan = %s AND output = %s AND (%s::text IS NULL OR instance = %s)
                        AND event_time >= %s AND event_time < %s LIMIT %s""",
                   (plan, output, instance, instance, start, end, limit))
    return [dict(row) for row in cursor.fetchall()]


def instance_rows_of_keys(cursor, plan: str, output: str, instance: str, keys: list[str]) -> list[dict[str, Any]]:
    """One instance's kept rows of ``keys`` (canonical texts), whatever their event time."""
    cursor.execute("""SELECT key, instance, event_time, tiebreak, row FROM output_latest
                      WHERE plan = %s AND output = %s AND instance = %s AND key = ANY(%s::jsonb[])""",
                   (plan, output, instance, keys))
    return [dict(row) for row in cursor.fetchall()]


def trim(cursor, plan: str, output: str, before: datetime) -> tuple[int, datetime | None]:
    """Delete the keys not updated since ``before`` whose row is in the lake; how many went, and the newest event
    time of those."""
    cursor.execute("""WITH gone AS (DELETE FROM output_latest WHERE plan = %s AND output = %s AND updated_at < %s
                                    AND in_lake RETURNING event_time)
                      SELECT count(*) AS rows, max(event_time) AS newest FROM gone""", (plan, output, before))
    row = cursor.fetchone()
    return row["rows"], row["newest"]


def delete_all(cursor, plan: str, output: str) -> int:
    """Delete every instance's rows of the output (a plan reset); how many went."""
    cursor.execute("DELETE FROM output_latest WHERE plan = %s AND output = %s", (plan, output))
    return cursor.rowcount
