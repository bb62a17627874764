"""The ``latest`` output kind on real PostgreSQL and real Delta: per key, the row of the latest event time.

Logins of a few users, published by two instances in batches out of order, replayed, held by a standby and
flushed after a hand-over, and sent late by a stale ACTIVE: whatever the order, each user's latest login (ties
of event time broken by the login's id) reads the same from PostgreSQL and Delta as a plain-Python reference
computes it over every login, with values of every type (text, boolean, long, double, timestamp). Then the
contract's other duties: a restore keeps it, a backfill publishes a late login that ranks higher and nothing
else, a reconcile sees it late before and nothing after, retention deletes keys not updated for the declared
time, and the validation reads the kept rows. The exactly-once run across kill -9 and SIGSTOP with Spark is
the pizza shop's ``last_orders`` (tests/integration/test_output_failover.py).
"""

from __future__ import annotations

import math
import random
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _references import iso_of_millis
from tandem.batch.backfill import retention_refusal
from tandem.config import load_cluster, load_plan
from tandem.declarations import event_id
from tandem.errors import FencedError
from tandem.json_values import spelled
from tandem.layout import delta_table_dir
from tandem.outputs import kind_of
from tandem.outputs.base import BatchInfo, ReadRequest, RetentionRun, Window
from tandem.outputs.recompute import BATCH_COLUMN, Recomputed
from tandem.store import Database, migrate
from tandem.store.leases import release, try_acquire
from tandem.store.registry import InstanceKey
from tandem.store.trim import horizons

pytestmark = pytest.mark.integration
PLAN, OUTPUT = "logins", "last_login"
USERS = ("ann", "bo", "cy", "dee")
IDPS = ("okta", "google", "github")
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=timezone.utc)
SCHEMA = pa.schema([("user_name", pa.string()), ("login_id", pa.string()), ("at", pa.timestamp("us", tz="UTC")),
                    ("idp", pa.string()), ("success", pa.bool_()), ("attempts", pa.int64()),
                    ("risk", pa.float64()), ("seen_at", pa.timestamp("us", tz="UTC"))])
PLAN_YAML = """name: logins
description: the last successful login per user, with its identity provider
streams:
  logins:
    partitions: 2
    key: user_name
    event_time: at
    fields:
      user_name: {type: string, not_empty: true}
      login_id: {type: string, not_empty: true}
      at: {type: epoch_millis}
groups:
  logins: {parallel: 2, queries: [last_logins]}
outputs:
  last_login:
    kind: latest
    key: [user_name]
    time: at
    values: [login_id, idp, success, attempts, risk, seen_at]
    id: [login_id]
nodes: [node-a, node-b]
maintenance:
  retention:
    table_rows: 1 day
"""


@pytest.fixture
def logins(project: Path, database_url: str):
    (project / "conf" / "plans" / "logins.yaml").write_text(PLAN_YAML)
    with Database(database_url) as db:
        migrate(db)
    cluster = load_cluster()
    return cluster, load_plan(PLAN, cluster)


def login(n: int, user: str, second: int) -> dict:
    """One login, its values derived from its number (so a reference can recompute them)."""
    at = T0 + timedelta(seconds=second)
    return {"user_name": user, "login_id": f"l{n:04d}", "at": at, "idp": IDPS[n % 3], "success": n % 2 == 0,
            "attempts": n, "risk": NON_FINITE.get(n % 11, n / 7), "seen_at": at + timedelta(milliseconds=n)}


NON_FINITE = {3: math.inf, 4: -math.inf, 5: math.nan}
"""Legal doubles no JSON number can hold: kept, and read spelled as strings from both stores."""


def expected(rows: list[dict]) -> list[dict]:
    """Per user, the login of the latest time, a tie broken by the higher id of its ``login_id`` (the declared
    ``id``), as JSON values, in key order."""
    latest: dict[str, dict] = {}
    for row in rows:
        rank = (row["at"], event_id(PLAN, OUTPUT, {"login_id": row["login_id"]}))
        kept = latest.get(row["user_name"])
        if kept is None or rank > kept[0]:
            latest[row["user_name"]] = (rank, row)
    return [{k: v.isoformat() if isinstance(v, datetime) else spelled(v) for k, v in row.items()}
            for _, (_, row) in sorted(latest.items())]


def read(cluster, plan, source: str, **request) -> list[dict]:
    rows = kind_of(plan, OUTPUT).read(cluster, plan, OUTPUT, ReadRequest(source=source, **request))
    return [{k: v for k, v in row.items() if k != "instance"} for row in rows]


def table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def batch(instance: InstanceKey, batch_id: int, epoch: int) -> BatchInfo:
    return BatchInfo(instance, batch_id, epoch, datetime.now(timezone.utc))


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seconds=st.lists(st.tuples(st.sampled_from(USERS), st.integers(0, 5)), min_size=1, max_size=30),
       seed=st.integers(0, 2 ** 16))
def test_the_latest_row_of_each_key_wins_in_any_order_across_instances_and_a_hand_over(logins, seconds, seed):
    cluster, plan = logins
    url = cluster.database_url
    shuffle = random.Random(seed)
    rows = [login(n, user, second) for n, (user, second) in enumerate(seconds)]  # ties of time are likely
    kind = kind_of(plan, OUTPUT)
    with Database(url) as db:
        db.run(lambda cursor: cursor.execute("DELETE FROM output_latest; DELETE FROM leases"))
        shutil.rmtree(delta_table_dir(cluster, PLAN, OUTPUT), ignore_errors=True)
        # instance 1 reads half the users, instance 2 the other half and, as a key may be, some of the first's
        parts = {"logins-1": [r for r in rows if r["user_name"] in USERS[:2]],
                 "logins-2": [r for r in rows if r["user_name"] in USERS[2:] or r["attempts"] % 5 == 0]}
        for instance, part in parts.items():
            shuffle.shuffle(part)
            active, standby = (InstanceKey(PLAN, instance, node) for node in ("node-a", "node-b"))
            sink = kind.sink(plan, OUTPUT, active, url, delta_table_dir(cluster, PLAN, OUTPUT))
            held = kind.sink(plan, OUTPUT, standby, url, delta_table_dir(cluster, PLAN, OUTPUT))
            try:
                publish_and_hand_over(db, instance, part, sink, held)
            finally:  # each sink holds a connection (hypothesis keeps a failing example's frames)
                sink.db.close()
                held.db.close()
    want = expected([r for part in parts.values() for r in part])
    assert read(cluster, plan, "postgres") == want
    assert read(cluster, plan, "delta") == want
    assert read(cluster, plan, "postgres", keys={"user_name": ["ann"]}) == [r for r in want if r["user_name"] == "ann"]


def publish_and_hand_over(db: Database, instance: str, part: list[dict], sink, held) -> None:
    """The ACTIVE publishes the first half of the batches (each twice: a replay), the standby holds them all; the
    ACTIVE is lost, the standby takes over and flushes what it held (the published part trimmed); the stale
    ACTIVE's late batch is fenced, and one under the new epoch that ranks lower changes nothing."""
    active, standby = sink.instance, held.instance
    epoch = try_acquire(db, PLAN, instance, active.node, 30.0)
    batches = [part[i:i + 3] for i in range(0, len(part), 3)]
    for number, rows_of in enumerate(batches):
        held.hold(table(rows_of), number)
        if number < len(batches) // 2:
            sink.publish(table(rows_of), batch(active, number, epoch))
            sink.publish(table(rows_of), batch(active, number, epoch))
    assert release(db, PLAN, instance, active.node, epoch, "test hand-over")
    new_epoch = try_acquire(db, PLAN, instance, standby.node, 30.0)
    held.flush(batch(standby, len(batches), new_epoch))
    if part:
        with pytest.raises(FencedError):
            sink.publish(table(part[:1]), batch(active, 99, epoch))
        older = {**part[0], "at": T0 - timedelta(days=1), "idp": "stale"}
        held.publish(table([older]), batch(standby, 100, new_epoch))


def test_restore_backfill_reconcile_retention_and_validation_keep_the_contract(logins) -> None:
    cluster, plan = logins
    url, instance = cluster.database_url, "logins-1"
    kind = kind_of(plan, OUTPUT)
    active = InstanceKey(PLAN, instance, "node-a")
    first, late = login(1, "ann", 10), login(2, "ann", 20)  # the late one came after the watermark
    with Database(url) as db:
        epoch = try_acquire(db, PLAN, instance, "node-a", 60.0)
        sink = kind.sink(plan, OUTPUT, active, url, delta_table_dir(cluster, PLAN, OUTPUT))
        sink.publish(table([first]), batch(active, 0, epoch))
        sink.db.close()
        assert not kind.rolled_back_on_restore(plan.outputs[OUTPUT])
        assert kind.restore(db, plan, OUTPUT, delta_table_dir(cluster, PLAN, OUTPUT), instance, 0) is None

        recomputed = table([first, late]).append_column(BATCH_COLUMN, pa.array([0, 0], pa.int64()))
        job = Recomputed(cluster, plan, db, instance, OUTPUT, recomputed, T0, T0 + timedelta(minutes=1))
        before = kind.compare(job)
        assert before.counts == {"late": 1, "extra": 0, "different": 0}
        assert kind.replace(job, "bf-1") == {"recomputed": True, "rows": 1, "published": 1, "already_published": 0}
        assert kind.compare(job).counts == {"late": 0, "extra": 0, "different": 0}
        assert kind.replace(job, "bf-2")["published"] == 0, "a second backfill changes nothing"
        assert read(cluster, plan, "postgres") == read(cluster, plan, "delta") == expected([first, late])

        implied = kind.validation(plan, OUTPUT)
        sampled = db.run(lambda cursor: implied.read(cursor, Window(T0), 10))
        assert implied.frame(sampled).to_dict("records") == [{**expected([late])[0], "instance": instance}]

        run = RetentionRun(db, plan, datetime.now(timezone.utc), {})
        assert [t.rows for t in kind.trim(run, OUTPUT)] == [0], "updated just now: kept"
        later = RetentionRun(db, plan, datetime.now(timezone.utc) + timedelta(days=2), {})
        assert [t.rows for t in kind.trim(later, OUTPUT)] == [1], "not updated for two days: the key goes"
        assert read(cluster, plan, "postgres") == []


def test_a_row_whose_lake_copy_was_lost_between_the_two_writes_reaches_the_lake(logins) -> None:
    """Issue 60: PostgreSQL takes a row (``in_lake`` false), then the Delta append fails — the lease moved between
    the two writes, or the append itself failed. Whoever publishes that row next (the new ACTIVE flushing what it
    held, or the same instance replaying the batch) finds it ranked equal in PostgreSQL and must still append it:
    before, nothing ranked higher, nothing was appended, and Delta kept the older row for good."""
    cluster, plan = logins
    url, kind, path = cluster.database_url, kind_of(plan, OUTPUT), delta_table_dir(cluster, PLAN, OUTPUT)
    first, second = login(0, "ann", 0), login(1, "ann", 10)
    with Database(url) as db:
        # the lease moves between the PostgreSQL commit and the Delta append
        instance = "logins-1"
        active, standby = InstanceKey(PLAN, instance, "node-a"), InstanceKey(PLAN, instance, "node-b")
        sink, held = kind.sink(plan, OUTPUT, active, url, path), kind.sink(plan, OUTPUT, standby, url, path)
        epoch = try_acquire(db, PLAN, instance, "node-a", 30.0)
        for number, rows in enumerate(([first], [second])):
            held.hold(table(rows), number)
        sink.publish(table([first]), batch(active, 0, epoch))
        appended = sink.append_to_lake
        moved = {}

        def hand_over_first(rows, info):
            assert release(db, PLAN, instance, "node-a", epoch, "a hand-over between the two writes")
            moved["epoch"] = try_acquire(db, PLAN, instance, "node-b", 30.0)
            appended(rows, info)

        sink.append_to_lake = hand_over_first
        with pytest.raises(FencedError):
            sink.publish(table([second]), batch(active, 1, epoch))
        assert read(cluster, plan, "postgres") == expected([second]), "PostgreSQL took the row"
        assert read(cluster, plan, "delta") == expected([first]), "the lake copy missed it"
        held.trim()
        assert held.held, "a held row whose lake copy is missing is not trimmed"
        held.flush(batch(standby, 2, moved["epoch"]))
        assert read(cluster, plan, "delta") == read(cluster, plan, "postgres") == expected([second])

        # the Delta append itself fails; the same instance replays the batch
        instance, third = "logins-2", login(2, "bo", 20)
        replaying = kind.sink(plan, OUTPUT, InstanceKey(PLAN, instance, "node-a"), url, path)
        epoch = try_acquire(db, PLAN, instance, "node-a", 30.0)

        def fail(rows, info):
            raise OSError("the object store went away")

        replaying.append_to_lake = fail
        with pytest.raises(OSError):
            replaying.publish(table([third]), batch(replaying.instance, 0, epoch))
        del replaying.append_to_lake
        replaying.publish(table([third]), batch(replaying.instance, 0, epoch))
        for sink_ in (sink, held, replaying):
            sink_.db.close()
    assert read(cluster, plan, "delta") == read(cluster, plan, "postgres") == expected([second, third])


def test_after_retention_a_backfill_that_could_bring_an_older_row_back_is_refused_and_reconcile_sees_every_key(
        logins) -> None:
    """Issue 60: once ``retention.table_rows`` deleted a key, a backfill of an older range made an older row the
    key's latest in PostgreSQL while Delta kept the newer one; now it is refused from the trim horizon (the newest
    event time trimmed). And a reconcile compares each recomputed key with its kept row whatever the kept row's time:
    a key whose newest row lies after the range is not ``late``."""
    cluster, plan = logins
    url, instance = cluster.database_url, "logins-1"
    kind = kind_of(plan, OUTPUT)
    active = InstanceKey(PLAN, instance, "node-a")
    early, late, other = login(1, "ann", 10), login(2, "ann", 20), login(3, "bo", 5)
    with Database(url) as db:
        epoch = try_acquire(db, PLAN, instance, "node-a", 60.0)
        sink = kind.sink(plan, OUTPUT, active, url, delta_table_dir(cluster, PLAN, OUTPUT))
        sink.publish(table([early, late, other]), batch(active, 0, epoch))
        sink.db.close()

        # the range [T0, T0+15s) recomputes ann's earlier login: her kept row (T0+20s) ranks higher, after the range
        recomputed = table([early, other]).append_column(BATCH_COLUMN, pa.array([0, 0], pa.int64()))
        job = Recomputed(cluster, plan, db, instance, OUTPUT, recomputed, T0, T0 + timedelta(seconds=15))
        assert kind.compare(job).counts == {"late": 0, "extra": 0, "different": 0}
        assert kind.compare(job).compared == 2

        assert retention_refusal(plan, T0, T0 + timedelta(seconds=15), horizons(db, PLAN), [instance]) is None
        later = RetentionRun(db, plan, datetime.now(timezone.utc) + timedelta(days=2), {})
        assert [t.rows for t in kind.trim(later, OUTPUT)] == [2], "both keys deleted"
        trimmed = horizons(db, PLAN)
        why = retention_refusal(plan, T0, T0 + timedelta(seconds=15), trimmed, [instance])
        assert why is not None and "last_login" in why and "retention.table_rows" in why, why
        assert (T0 + timedelta(seconds=20)).isoformat() in why, "the horizon is the newest event time trimmed"
        assert retention_refusal(plan, T0 + timedelta(seconds=20), T0 + timedelta(seconds=30), trimmed, [instance])
        assert retention_refusal(plan, T0 + timedelta(seconds=21), T0 + timedelta(seconds=30), trimmed,
                                 [instance]) is None, "a range after every trimmed row is fine"
        # a reconcile of the old range does not call the deleted keys late (a repair would be refused)
        assert kind.compare(job).counts == {"late": 0, "extra": 0, "different": 0}


CLOCKS_YAML = """name: clocks
description: times as a query emits them, epoch milliseconds or a timestamp column
streams:
  readings:
    partitions: 1
    key: room
    event_time: at
    fields:
      room: {type: string}
      at: {type: epoch_millis}
      seen: {type: timestamp}
      attempts: {type: long}
groups:
  clocks: {queries: [clock]}
outputs:
  last_reading:
    kind: latest
    key: [room]
    time: at
    values: [seen, attempts, noted_ms, column_at]
  alarms:
    kind: events
    key: [room, at]
    time: at
nodes: [node-a]
"""
CLOCK_SCHEMA = pa.schema([("room", pa.string()), ("at", pa.int64()), ("seen", pa.int64()), ("attempts", pa.int64()),
                          ("noted_ms", pa.int64()), ("column_at", pa.timestamp("us", tz="UTC"))])


def test_fields_holding_epoch_millis_read_as_iso_text_like_a_timestamp_column(project: Path, database_url: str):
    """A query that keeps a time as epoch milliseconds (the pizza shop's ``order_time``) reads it as ISO 8601 text in
    UTC, the same text a timestamp column of the same instant reads as, from both stores, in a latest row and an
    event's payload alike: the output's ``time``, and a field named as a stream's ``epoch_millis`` or ``timestamp``
    field. A ``long`` field, and an integer the plan does not declare a time, stay numbers; a key filter still takes
    the number as the event was published with it."""
    (project / "conf" / "plans" / "clocks.yaml").write_text(CLOCKS_YAML)
    with Database(database_url) as db:
        migrate(db)
    cluster = load_cluster()
    plan = load_plan("clocks", cluster)
    at, seen = 1795687200000, 1795687200250  # 2026-11-26 10:00:00 and .250 UTC
    rows = [{"room": "r1", "at": at, "seen": seen, "attempts": 3, "noted_ms": at,
             "column_at": datetime.fromtimestamp(at // 1000, timezone.utc)}]
    instance = InstanceKey("clocks", "clocks-1", "node-a")
    with Database(database_url) as db:
        epoch = try_acquire(db, "clocks", instance.instance, instance.node, 30.0)
        for output in ("last_reading", "alarms"):
            sink = kind_of(plan, output).sink(plan, output, instance, database_url,
                                              delta_table_dir(cluster, "clocks", output))
            sink.publish(pa.Table.from_pylist(rows, schema=CLOCK_SCHEMA), batch(instance, 0, epoch))
            sink.db.close()
        want = {"room": "r1", "at": iso_of_millis(at), "seen": iso_of_millis(seen), "attempts": 3, "noted_ms": at,
                "column_at": iso_of_millis(at)}
        assert want["at"] == "2026-11-26T10:00:00+00:00" and want["seen"] == "2026-11-26T10:00:00.250000+00:00"
        for source in ("postgres", "delta"):
            latest = kind_of(plan, "last_reading").read(cluster, plan, "last_reading", ReadRequest(source=source))
            assert latest == [{**want, "instance": "clocks-1"}], source
            assert latest[0]["at"] == latest[0]["column_at"], "the same text as a timestamp column's"
            events = kind_of(plan, "alarms").read(cluster, plan, "alarms", ReadRequest(source=source))
            assert [{k: v for k, v in e.items() if k not in ("event_id", "event_time")} for e in events] == [
                {**want, "instance": "clocks-1"}], source
            filtered = kind_of(plan, "alarms").read(cluster, plan, "alarms",
                                                    ReadRequest(source=source, keys={"at": [str(at)]}))
            assert [e["at"] for e in filtered] == [want["at"]], "the key filter names the number published"
        polled = kind_of(plan, "alarms").page(db, plan, "alarms", None, 10, 10)
        assert [{k: v for k, v in e["payload"].items()} for e in polled] == [want], "the REST API's event feed"
