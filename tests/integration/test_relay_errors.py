"""The relay of an events output to NATS when something goes wrong (issue 46 §3.2, §3.3), against a real
nats-server (``max_payload`` 4 KiB), PostgreSQL and the plan's Delta quarantine.

A relay never dies silently: a malformed header on its stream is a ``RelayError``, recorded for the instance
(``tandem status``, the Tandem page), tried again with back-off, and cleared once a round goes through. An
event whose message is over the server's ``max_payload`` goes to the plan's quarantine with its reason, once,
while two relays run at once, and the stream's sequences stay gapless in the outbox's order.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow.compute as pc
import pytest
from _ha import wait_for
from _nats import edit_plan, publish_output, stream_lines, use_nats
from tandem import cli
from tandem.config import load_cluster, load_plan
from tandem.lake.tables import read_table
from tandem.layout import delta_table_dir
from tandem.messaging import JetStream, ensure_declared
from tandem.messaging.server import EmbeddedServer, start_server
from tandem.messaging.wire import Message
from tandem.outputs.relay import POSITION_HEADER, Relay
from tandem.presenter.views import plan_status
from tandem.runtime.relays import RelayThread
from tandem.store import Database, migrate
from tandem.store.leases import try_acquire
from tandem.store.outputs import START, events_after, insert_events
from tandem.store.registry import InstanceKey, record_start, register_nodes

pytestmark = pytest.mark.integration
PLAN, OUTPUT, STREAM = "pizza_shop", "overdue_orders", "overdue"
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
MAX_PAYLOAD = 4096


@pytest.fixture(scope="module")
def small_nats(tmp_path_factory: pytest.TempPathFactory):
    started = start_server(tmp_path_factory.mktemp("nats-small") / "js", max_payload=MAX_PAYLOAD)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def setup(project: Path, database_url: str, small_nats: EmbeddedServer, monkeypatch: pytest.MonkeyPatch):
    prefix = use_nats(project, small_nats, monkeypatch, PLAN)
    edit_plan(project, PLAN, publish_output(OUTPUT, STREAM, 3, "order_no", {
        "order_no": "string", "expiry_time": "epoch_millis", "customer_name": "string"}))
    with Database(database_url) as db:
        migrate(db)
    cluster = load_cluster()
    return cluster, load_plan(PLAN, cluster), prefix


class ActiveRole:
    """What the relay reads of the role controller: the instance, and its epoch while it is ACTIVE."""

    def __init__(self, instance: InstanceKey, epoch: int | None) -> None:
        self.instance, self.epoch = instance, epoch


def active(cluster, url: str, instance: str) -> ActiveRole:
    """The instance ``instance`` on node-a, started and holding its lease."""
    key = InstanceKey(PLAN, instance, "node-a")
    with Database(url, "test-instance") as db:
        register_nodes(db, cluster)
        record_start(db, key, host="test", pid=1, pid_started_at=0.0, ancestors=[], spark_app_id="app",
                     trigger_interval_s=1.0, checkpoint_root="/nowhere")
        return ActiveRole(key, try_acquire(db, PLAN, instance, "node-a", ttl_s=600.0))


def write_events(url: str, instance: str, numbers: range, big: set[int] = frozenset()) -> None:
    """Overdue orders ``o-<n>`` as the events sink writes them; those in ``big`` with a 5,000-character name."""
    key = InstanceKey(PLAN, instance, "node-a")
    batch = {f"e-{n:06d}": (T0 + timedelta(seconds=n), {
        "order_no": f"o-{n}", "expiry_time": (T0 + timedelta(seconds=n)).isoformat(),
        "customer_name": "x" * 5000 if n in big else "c"}) for n in numbers}
    with Database(url, "test-writer") as db:
        db.run(lambda cursor: insert_events(cursor, key, OUTPUT, batch, epoch=1, batch_id=numbers.start))


def published(url: str, prefix: str) -> int:
    """How many messages the output's stream holds (0 before a relay created it)."""
    try:
        return len(stream_lines(url, prefix, STREAM))
    except LookupError:
        return 0


def relay_errors(cluster, plan) -> dict[str, str | None]:
    """Each instance's recorded relay error, as the status view reads it."""
    with Database(cluster.database_url, "test-status") as db:
        return {instance.instance: node.relay_error for instance in plan_status(db, cluster, plan).instances
                for node in instance.nodes if node.node == "node-a"}


def test_a_failing_relay_keeps_trying_with_back_off_and_its_error_is_shown_until_it_goes_through(
        setup, database_url: str, small_nats: EmbeddedServer, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster, plan, prefix = setup
    role = active(cluster, database_url, "shop-1")
    write_events(database_url, "shop-1", range(0, 20))
    ensure_declared(cluster.nats, plan, STREAM)
    subject = f"{prefix}.{STREAM}.0"
    with JetStream(cluster.nats) as js:  # something other than Tandem writes to the output's stream
        js.publish([Message(subject, b"{}", None, ((POSITION_HEADER, "not a position"),))])
    tries: list[float] = []
    publish_pending = Relay.publish_pending
    monkeypatch.setattr(Relay, "publish_pending",
                        lambda self: (tries.append(time.monotonic()), publish_pending(self))[1])

    thread = RelayThread(cluster, plan, role, interval_s=0.05, max_backoff_s=0.8)
    thread.start()
    try:
        shown = wait_for(lambda: relay_errors(cluster, plan)["shop-1"], 20, "the relay's error to be recorded")
        assert shown.startswith(f"{OUTPUT} -> NATS stream {STREAM}: RelayError: JetStream stream ") \
            and "message 1 has a malformed Tandem-Position header" in shown, shown
        time.sleep(3.0)
        assert thread.is_alive(), "the relay thread died"
        gaps = [round(b - a, 2) for a, b in zip(tries, tries[1:])]
        assert 4 <= len(tries) <= 12 and gaps[:3] == sorted(gaps[:3]) and max(gaps) < 2.0, \
            f"tries back off from 0.05 s to 0.8 s: {gaps}"
        assert cli.main(["status", PLAN]) == 0
        assert f"node-a relay to NATS failing: {OUTPUT} -> NATS stream {STREAM}: RelayError" in " ".join(
            capsys.readouterr().out.split())

        with JetStream(cluster.nats) as js:  # repaired: a message saying that nothing was published yet
            js.publish([Message(subject, b"{}", None, ((POSITION_HEADER, "0/"),))])
        wait_for(lambda: published(small_nats.url, prefix) == 22, 60, "the 20 events published",
                 detail=lambda: str(relay_errors(cluster, plan)))
        wait_for(lambda: relay_errors(cluster, plan)["shop-1"] is None, 60, "the relay's error to be cleared")
    finally:
        thread.stop()
        thread.join(10)
    assert not thread.is_alive()
    assert [line.get("order_no") for _, line in stream_lines(small_nats.url, prefix, STREAM)][2:] == [
        f"o-{n}" for n in range(20)]


def test_an_event_too_large_for_nats_is_quarantined_once_and_the_others_keep_gapless_sequences(
        setup, database_url: str, small_nats: EmbeddedServer) -> None:
    cluster, plan, prefix = setup
    big = {3, 4, 11, 19}  # 19 ends the outbox: the relay goes on after it when more come
    write_events(database_url, "shop-1", range(0, 20), big)
    threads = [RelayThread(cluster, plan, active(cluster, database_url, instance), interval_s=0.05)
               for instance in ("shop-1", "shop-2")]  # two ACTIVEs relay at once
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: published(small_nats.url, prefix) >= 16, 60, "16 events published")
        write_events(database_url, "shop-2", range(20, 25))
        wait_for(lambda: published(small_nats.url, prefix) >= 21, 60, "21 events published")
        time.sleep(0.5)
        assert all(thread.is_alive() for thread in threads)
        assert set(relay_errors(cluster, plan).values()) == {None}
    finally:
        for thread in threads:
            thread.stop()
        for thread in threads:
            thread.join(10)

    with Database(database_url, "test-outbox") as db:
        outbox = [e["payload"]["order_no"] for e in db.run(lambda c: events_after(c, PLAN, OUTPUT, START, 1000))]
    lines = stream_lines(small_nats.url, prefix, STREAM)
    assert [line["order_no"] for _, line in lines] == [o for o in outbox if int(o[2:]) not in big]
    assert [sequence for sequence, _ in lines] == list(range(1, 22)), "no sequence skipped or taken twice"
    quarantined = read_table(delta_table_dir(cluster, PLAN, "quarantine"))
    relayed = quarantined.filter(pc.starts_with(quarantined["source_file"], "relay:"))
    assert sorted(relayed["source_file"].to_pylist()) == [f"relay:{OUTPUT}/e-{n:06d}" for n in sorted(big)], \
        "each event too large once, whichever relay found it"
    reason = relayed["reason"][0].as_py()
    assert reason.startswith(f"output {OUTPUT}: the message of ") and f"over the NATS server's max_payload " \
        f"({MAX_PAYLOAD}): not published to stream {STREAM}" in reason
    assert '"customer_name": "xxxx' in relayed["raw"][0].as_py()
