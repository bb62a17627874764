"""``publish_log``: what each instance has published, per output and micro-batch.

The rows carry plan, instance and node as columns, and every lookup matches them exactly: an instance
is never found by a string prefix of the instance id (``LIKE 'plan/instance/%'`` lets ``_`` match
``-``, so ``instance_1`` found ``shard-1``'s rows).
"""

from __future__ import annotations

from datetime import datetime

from tandem.store.db import Database
from tandem.store.registry import InstanceKey


def record_published(cursor, instance: InstanceKey, output: str, batch_id: int, epoch: int, rows: int,
                     max_event_time: datetime | None, watermark: datetime | None) -> None:
    """Inside a publishing transaction: the batch is published (its position is set by :func:`record_position`)."""
    cursor.execute(
        """INSERT INTO publish_log (instance_id, plan, instance, node, output, batch_id, epoch, rows,
                                    max_event_time, watermark)
           VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
           ON CONFLICT (instance_id, output, batch_id) DO UPDATE
           SET epoch = EXCLUDED.epoch, rows = EXCLUDED.rows, max_event_time = EXCLUDED.max_event_time,
               watermark = EXCLUDED.watermark, published_at = now()""",
        (instance.id, instance.plan, instance.instance, instance.node, output, batch_id, epoch, rows,
         max_event_time, watermark),
    )


def record_position(db: Database, instance: InstanceKey, output: str, batch_id: int,
                    watermark: datetime | None) -> None:
    """Set the published position of a batch already logged (once every store has its rows)."""
    db.run(lambda cursor: cursor.execute(
        "UPDATE publish_log SET watermark = %s WHERE instance_id = %s AND output = %s AND batch_id = %s",
        (watermark, instance.id, output, batch_id)))


def published_watermark(db: Database, plan: str, instance: str, output: str) -> datetime | None:
    """The furthest position any instance of this (plan, instance) has published for ``output``."""

    def work(cursor) -> datetime | None:
        cursor.execute("SELECT max(watermark) AS w FROM publish_log WHERE plan = %s AND instance = %s AND output = %s",
                       (plan, instance, output))
        return cursor.fetchone()["w"]

    return db.run(work, attempts=1)


def forget_instance(db: Database, plan: str, instance: str) -> int:
    """Delete every published position of one (plan, instance) (a restore rolls them back); how many rows."""

    def work(cursor) -> int:
        cursor.execute("DELETE FROM publish_log WHERE plan = %s AND instance = %s", (plan, instance))
        return cursor.rowcount

    return db.run(work)


def first_publish_after(db: Database, plan: str, instance: str, epoch: int) -> dict | None:
    """The first batch published in ``(plan, instance)`` at an epoch above ``epoch``: node, epoch, published_at."""

    def work(cursor):
        cursor.execute("""SELECT node, epoch, published_at FROM publish_log
                          WHERE plan = %s AND instance = %s AND epoch > %s
                          ORDER BY published_at, batch_id LIMIT 1""", (plan, instance, epoch))
        row = cursor.fetchone()
        return dict(row) if row else None

    return db.run(work, attempts=3)


def last_publish_until(db: Database, plan: str, instance: str, epoch: int) -> datetime | None:
    """When ``(plan, instance)`` last published a batch at ``epoch`` or before (a hand-over's publishing pause
    runs from here to :func:`first_publish_after`)."""

    def work(cursor):
        cursor.execute("""SELECT max(published_at) AS at FROM publish_log
                          WHERE plan = %s AND instance = %s AND epoch <= %s""", (plan, instance, epoch))
        return cursor.fetchone()["at"]

    return db.run(work, attempts=3)


def last_publisher(db: Database, plan: str, instance: str) -> str | None:
    """The node that published the newest batch (highest epoch, then batch) of any output of ``(plan, instance)``, or
    ``None`` before any."""
    def work(cursor) -> str | None:
        cursor.execute("""SELECT node FROM publish_log WHERE plan = %s AND instance = %s
                          ORDER BY epoch DESC, batch_id DESC, published_at DESC LIMIT 1""", (plan, instance))
        row = cursor.fetchone()
        return row["node"] if row else None

    return db.run(work)


def published_batch(db: Database, instance: InstanceKey, outputs: list[str], batch_id: int) -> bool:
    """Whether the node published batch ``batch_id`` of any of ``outputs`` (the outputs of one query)."""
    return db.run(lambda cursor: (cursor.execute(
        "SELECT EXISTS (SELECT 1 FROM publish_log WHERE plan = %s AND instance = %s AND node = %s AND batch_id = %s "
        "AND output = ANY(%s)) AS published", (instance.plan, instance.instance, instance.node, batch_id, outputs)),
        cursor.fetchone()["published"])[1])


def last_published(cursor, plan: str, instance: str, output: str) -> tuple[int, int]:
    """The (epoch, batch) of the newest batch of ``output`` any instance of ``(plan, instance)`` published ((0, 0)
    before any)."""
    cursor.execute("""SELECT epoch, batch_id FROM publish_log WHERE plan = %s AND instance = %s AND output = %s
                      ORDER BY epoch DESC, batch_id DESC LIMIT 1""", (plan, instance, output))
    row = cursor.fetchone()
    return (int(row["epoch"]), int(row["batch_id"])) if row else (0, 0)


def newest_publish(db: Database, plan: str, instance: str, other_than: str) -> datetime | None:
    """When a node of ``(plan, instance)`` other than ``other_than`` last published a batch (PostgreSQL's clock)."""

    def work(cursor) -> datetime | None:
        cursor.execute("SELECT max(published_at) AS newest FROM publish_log WHERE plan = %s AND instance = %s "
                       "AND node <> %s", (plan, instance, other_than))
        return cursor.fetchone()["newest"]

    return db.run(work, attempts=1)
