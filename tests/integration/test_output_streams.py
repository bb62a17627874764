"""An events output published to a NATS stream, exactly once: the relay against a real nats-server and PostgreSQL.

Events are written to ``output_events`` as the sinks write them (fenced transactions of an instance,
two writers at once so that their transaction ids interleave); two relays publish at the same time, as
the ACTIVEs of two instances do; an old relay publishes what it read before the others went on, as an
ACTIVE frozen by SIGSTOP and resumed after a failover does. The stream must hold every event once, in
the outbox's (xid, event_id) order. (The same through real kill -9 and SIGSTOP failovers of spark-submit
drivers: ``test_output_failover.py``.)
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from _ha import wait_for
from _nats import edit_plan, publish_output, stream_lines, use_nats
from tandem import cli
from tandem.config import load_cluster, load_plan
from tandem.messaging import JetStream, stream_name
from tandem.messaging.server import EmbeddedServer
from tandem.outputs.relay import WRONG_LAST_SEQUENCE, Relay, RelayError, messages_after
from tandem.store import Database, migrate
from tandem.store.outputs import START, EventPosition, events_after, insert_events
from tandem.store.registry import InstanceKey

pytestmark = pytest.mark.integration
PLAN, OUTPUT, STREAM = "pizza_shop", "overdue_orders", "overdue"
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)



def write_events(url: str, instance: str, numbers: range, per_transaction: int = 25) -> None:
    """Overdue orders ``o-<n>`` as the events sink writes them: ``per_transaction`` a transaction."""
    key = InstanceKey(PLAN, instance, "node-a")
    with Database(url, "test-writer") as db:
        for start in range(numbers.start, numbers.stop, per_transaction):
            batch = {f"e-{n:06d}": (T0 + timedelta(seconds=n), {"order_no": f"o-{n}", "expiry_time": (
                T0 + timedelta(seconds=n)).isoformat(), "customer_name": "c"})
                for n in range(start, min(start + per_transaction, numbers.stop))}
            db.run(lambda cursor: insert_events(cursor, key, OUTPUT, batch, epoch=1, batch_id=start))


def outbox(url: str) -> list[str]:
    """The output's events in the outbox's order, as order numbers."""
    with Database(url, "test-outbox") as db:
        return [e["payload"]["order_no"] for e in db.run(lambda c: events_after(c, PLAN, OUTPUT, START, 1_000_000))]


def publish_all(relay: Relay, count: int) -> int:
    """What ``relay`` stores in calls of ``publish_pending`` until ``count`` events are in the stream.

    A relay reads only events below the cluster-wide snapshot xmin (store.outputs.events_after): another
    test's open transaction can hold the newest ones back for a while.
    """
    stored = [0]

    def enough() -> bool:
        stored[0] += relay.publish_pending()
        return stored[0] >= count
    wait_for(enough, 60, f"the relay to store {count} events", poll_s=0.2)
    return stored[0]


def visible_events(db: Database, after: EventPosition, count: int) -> list[dict]:
    """The first ``count`` events after ``after``, once a relay can see them all (see ``publish_all``)."""
    def all_visible() -> list[dict] | None:
        events = db.run(lambda c: events_after(c, PLAN, OUTPUT, after, count))
        return events if len(events) == count else None
    return wait_for(all_visible, 60, f"{count} events past the xmin horizon", poll_s=0.2)


@pytest.fixture
def setup(project: Path, database_url: str, nats_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch):
    prefix = use_nats(project, nats_server, monkeypatch, PLAN)
    edit_plan(project, PLAN, publish_output(OUTPUT, STREAM, 3, "order_no",
                                            {"order_no": "string", "expiry_time": "epoch_millis"}))
    with Database(database_url) as db:
        migrate(db)
    cluster = load_cluster()
    return cluster, load_plan(PLAN, cluster), prefix


def test_two_relays_and_two_writers_at_once_publish_every_event_once_in_outbox_order(
        setup, database_url: str, nats_server: EmbeddedServer, capsys: pytest.CaptureFixture) -> None:
    cluster, plan, prefix = setup
    writers = [threading.Thread(target=write_events, args=(database_url, instance, numbers))
               for instance, numbers in (("shop-1", range(0, 1500)), ("shop-2", range(1500, 3000)))]
    done = threading.Event()
    stored: list[int] = []
    errors: list[BaseException] = []

    def relay() -> None:
        try:
            with Database(database_url, "test-relay") as db:
                one = Relay(plan, OUTPUT, cluster.nats, db)
                try:
                    while not done.is_set():
                        stored.append(one.publish_pending())
                    stored.append(one.publish_pending())
                finally:
                    one.close()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    relays = [threading.Thread(target=relay) for _ in range(2)]
    for thread in writers + relays:
        thread.start()
    for thread in writers:
        thread.join()
    # a relay reads only events below the cluster-wide snapshot xmin (store.outputs.events_after): another test's
    # open transaction can hold the last ones back past one more call, so the relays go on until the stream has them
    try:
        wait_for(lambda: errors or len(stream_lines(nats_server.url, prefix, STREAM)) >= 3000, 60,
                 "the relays to publish every event")
    finally:
        done.set()
        for thread in relays:
            thread.join(60)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in relays), "a relay did not end"

    expected = outbox(database_url)
    assert len(expected) == 3000
    got = stream_lines(nats_server.url, prefix, STREAM)
    assert [line["order_no"] for _, line in got] == expected, "every event once, in the outbox's order"
    assert [sequence for sequence, _ in got] == list(range(1, 3001))
    assert sum(stored) == 3000, "what the relays say they stored is what the stream holds"
    assert cli.main(["status", PLAN]) == 0
    assert "pizza_shop / overdue_orders -> NATS stream overdue: 3,000 events in PostgreSQL, the stream at sequence " \
           "3,000" in " ".join(capsys.readouterr().out.split())
    assert got[5][1]["expiry_time"] == int((T0 + timedelta(seconds=int(got[5][1]["order_no"][2:]))).timestamp() * 1000)


def test_a_relay_resumed_after_others_went_on_stores_nothing_and_a_lost_tail_comes_from_postgresql(
        setup, database_url: str, nats_server: EmbeddedServer) -> None:
    cluster, plan, prefix = setup
    name = stream_name(prefix, STREAM)
    write_events(database_url, "shop-1", range(0, 100))
    with Database(database_url, "test-relays") as db, JetStream([nats_server.url]) as js:
        frozen, live = Relay(plan, OUTPUT, cluster.nats, db), Relay(plan, OUTPUT, cluster.nats, db)
        try:
            assert publish_all(frozen, 100) == 100
            write_events(database_url, "shop-1", range(100, 150))
            stale_tail = frozen.tail()  # what the frozen one read before SIGSTOP
            stale = visible_events(db, stale_tail.position, 50)
            assert publish_all(live, 50) == 50  # the new ACTIVE goes on
            write_events(database_url, "shop-1", range(150, 160))
            acks = js.publish(messages_after(stale_tail, stale, prefix, STREAM, plan.streams[STREAM]),
                              refusals=(WRONG_LAST_SEQUENCE,))
            assert all(ack.get("error") or ack.get("duplicate") for ack in acks), "the resumed relay stored nothing"
            assert publish_all(live, 10) == 10

            # retention dropped the last message: the tail is the position PostgreSQL recorded for it
            js.connection.request(f"$JS.API.STREAM.MSG.DELETE.{name}", {"seq": 160})
            last = db.run(lambda c: events_after(c, PLAN, OUTPUT, START, 1000))[-1]
            assert live.tail().sequence == 160 and live.tail().position == (last["xid"], last["event_id"])
            write_events(database_url, "shop-1", range(160, 170))
            assert publish_all(live, 10) == 10
            lines = stream_lines(nats_server.url, prefix, STREAM)
            assert [line["order_no"] for _, line in lines] == [f"o-{n}" for n in range(170) if n != 159]
            assert [sequence for sequence, _ in lines] == [s for s in range(1, 171) if s != 160]

            # a message from anyone else: the relay cannot tell how far it got and says so
            js.publish([(f"{prefix}.{STREAM}.0", b'{"order_no": "x"}', None)])
            write_events(database_url, "shop-1", range(170, 171))
            with pytest.raises(RelayError, match=f"{name}: message 171 has no Tandem-Position header"):
                live.publish_pending()
        finally:
            frozen.close()
            live.close()
