"""``output_streams``: the last position an events output's relay saw stored in its NATS stream (migration 009)."""

from __future__ import annotations

from tandem.store.locks import lock_key
from tandem.store.outputs import EventPosition


def record_relayed(cursor, plan: str, output: str, stream: str, stream_seq: int, position: EventPosition) -> None:
    """The stream holds the event at ``position`` as message ``stream_seq`` (a later sequence only moves it on)."""
    cursor.execute(
        """INSERT INTO output_streams (plan, output, stream, stream_seq, xid, event_id) VALUES (%s, %s, %s, %s, %s, %s)
           ON CONFLICT (plan, output) DO UPDATE SET stream = EXCLUDED.stream, stream_seq = EXCLUDED.stream_seq,
               xid = EXCLUDED.xid, event_id = EXCLUDED.event_id, updated_at = now()
           WHERE output_streams.stream <> EXCLUDED.stream OR output_streams.stream_seq < EXCLUDED.stream_seq""",
        (plan, output, stream, stream_seq, position[0], position[1]))


def relayed(cursor, plan: str, output: str, stream: str) -> tuple[int, EventPosition] | None:
    """``(stream sequence, position)`` last recorded for the output in ``stream`` (``None``: nothing yet)."""
    cursor.execute("SELECT stream_seq, xid, event_id FROM output_streams WHERE plan = %s AND output = %s "
                   "AND stream = %s", (plan, output, stream))
    row = cursor.fetchone()
    return (int(row["stream_seq"]), (int(row["xid"]), row["event_id"])) if row else None


def stream_progress(cursor, plan: str, output: str) -> tuple[int, int | None]:
    """``(events the output holds in PostgreSQL, the stream sequence last recorded for it)`` (``None``: none yet)."""
    cursor.execute("""SELECT (SELECT count(*) FROM output_events WHERE plan = %s AND output = %s) AS events,
                             (SELECT stream_seq FROM output_streams WHERE plan = %s AND output = %s) AS stream_seq""",
                   (plan, output, plan, output))
    row = cursor.fetchone()
    return int(row["events"]), row["stream_seq"]


def lock_relay_quarantine(cursor, plan: str, output: str) -> None:
    """Hold, until this transaction ends, the lock under which the relays of every instance quarantine the
    output's events that no NATS message can carry (each checks and writes under it: one row per event)."""
    cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", lock_key("plan", f"{plan}/{output}/relay-quarantine"))


def forget_relayed(cursor, plan: str, output: str) -> int:
    """Forget the position recorded for the output's relay (its stream starts again from nothing); rows deleted."""
    cursor.execute("DELETE FROM output_streams WHERE plan = %s AND output = %s", (plan, output))
    return cursor.rowcount
