"""Every output kind exactly once across failovers, with real spark-submit processes under load.

One instance runs ACTIVE on node-a and hot PASSIVE on node-b while its plan's events stream in.
The pizza shop's: node-a is killed with SIGKILL (node-b takes over), relaunched as PASSIVE, then
node-b is frozen with SIGSTOP past its lease (node-a takes over) and resumed with SIGCONT (it must
fence itself). The temperatures': node-a is frozen and resumed (the kill half of these outputs'
kind, events from a pattern, is the fourth plan's test, under the supervisor). Each failover acts on the node
holding the lease at that moment: on a starved machine a 3-s lease can also change hands unprompted.
At the end PostgreSQL and Delta hold every expected row exactly once, as the test computes it with
plain Python from the events it wrote; no epoch was published by two nodes and nothing was
published under an epoch after the next one was granted.

- The pizza shop (``shop-1``): an ``events`` output (overdue orders), a ``table`` output (orders
  delivered on time per customer) and an ``aggregation`` of facts (order stats, every order once).
- The temperatures (``group-1-1``): two ``events`` outputs from windows and patterns over event
  time (2-minute room averages, rising-temperature alerts), whose ids and values must come out
  the same on both replicas whatever their micro-batch boundaries.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import zlib
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from _ha import Pair, PlanWriter, failover_events, fetch, lease, one_core_nodes, split_brain, wait_for
from _nats import edit_plan, messaging_layer, publish_output, stream_lines
from _references import last_orders_reference, pizza_reference, temperature_reference, temperature_row
from tandem.config import PlanConfig, load_cluster, load_plan
from tandem.layout import delta_table_dir
from tandem.messaging.server import EmbeddedServer
from tandem.packaging import build_dist
from tandem.presenter.views import event_page
from tandem.producer import advance_watermark
from tandem.outputs.events import read_events_lake
from tandem.outputs.table import read_table_lake
from tandem.store import Database, migrate
from tandem.reading import read_output

pytestmark = pytest.mark.integration
TAKEOVER_TIMEOUT_S = 20
CATCH_UP_TIMEOUT_S = 600
"""For outputs that depend on how fast the nodes get through their backlog (a micro-batch took 25 s on a slow
shared machine): a wait that passes costs nothing, and one that times out has lost or held something."""


def configure(project: Path, plan_name: str) -> None:
    """Every group of the plan at one instance (reading all four partitions)."""
    path = project / "conf" / "plans" / f"{plan_name}.yaml"
    plan = yaml.safe_load(path.read_text())
    for group in plan["groups"].values():
        group["parallel"] = 1
    path.write_text(yaml.safe_dump(plan))
    one_core_nodes(project)


def kill_then_pause(pair: Pair, plan: PlanConfig, instance: str) -> str:
    """kill -9 of the ACTIVE (the PASSIVE takes over), the killed node back as PASSIVE, SIGSTOP of the new ACTIVE
    past its lease (the other takes over), SIGCONT: it fences itself. Each step acts on the node holding the lease
    then: on a starved machine a lease can also change hands between the steps. Returns the last to take over."""
    url = pair.url
    before = lease(url, plan.name, instance)
    killed, standby = before["holder"], pair.other(before["holder"])
    pair.kill(killed, signal.SIGKILL)
    promoted = wait_for(lambda: pair.promoted(standby, before["epoch"]), TAKEOVER_TIMEOUT_S,
                        f"{standby} to take over from the killed {killed}", detail=lambda: pair.log_tail(standby))
    pair.note(f"SIGKILL {killed} -> {standby} PROMOTED at epoch {promoted['epoch']}")
    pair.wait_group_gone(killed)
    pair.launch(killed, "PASSIVE")
    pair.wait_running(killed)
    time.sleep(15)  # the relaunched node processes the backlog as a standby, holding what it would publish
    return pause(pair, plan, instance)


def pause(pair: Pair, plan: PlanConfig, instance: str) -> str:
    """SIGSTOP of the ACTIVE past its lease (the standby takes over), SIGCONT: it fences itself. Returns the node
    that took over."""
    url = pair.url
    before = lease(url, plan.name, instance)
    active, standby = before["holder"], pair.other(before["holder"])
    pair.kill(active, signal.SIGSTOP)
    try:
        promoted = wait_for(lambda: pair.promoted(standby, before["epoch"]), TAKEOVER_TIMEOUT_S,
                            f"{standby} to take over from the paused {active}", detail=lambda: pair.log_tail(standby))
        pair.note(f"SIGSTOP {active} -> {standby} PROMOTED at epoch {promoted['epoch']}")
        time.sleep(5)
    finally:
        pair.kill(active, signal.SIGCONT)
    wait_for(lambda: [e for e in failover_events(url, plan=plan.name, instance=instance)
                      if e["kind"] == "DEMOTED" and e["node"] == active and e["epoch"] == before["epoch"]], 30,
             f"the resumed {active} to fence itself", detail=lambda: pair.log_tail(active))
    time.sleep(5)
    return standby


def failovers_under_load(project: Path, process_groups: list[int], plan_name: str, instance: str, rate: int,
                         first_output: Callable[[str], object], what: str,
                         failovers: Callable[[Pair, PlanConfig, str], str],
                         change: Callable[[dict], object] | None = None,
                         spell: Callable[[str, dict], str] | None = None
                         ) -> tuple[PlanConfig, Pair, dict[str, list[dict]], str]:
    """The instance as a hot pair while ``rate`` events/s stream in, through ``failovers``; then an event an hour
    later in every partition, so every result becomes final. Returns the events written and the node that took
    over last (``failovers`` returns it). ``change``: of the plan's YAML first; ``spell``: how an event is written."""
    configure(project, plan_name)
    if change is not None:
        edit_plan(project, plan_name, change)
    cluster = load_cluster()
    plan = load_plan(plan_name, cluster)
    pair = Pair(cluster, plan, build_dist(project), process_groups, instance=instance)
    writer = PlanWriter(cluster, plan, rate=rate, spell=spell)
    try:
        pair.start_pair("node-a", "node-b")
        writer.start()  # after the start: the first batches are not a backlog of the launch time
        wait_for(lambda: first_output(pair.url), CATCH_UP_TIMEOUT_S, what, detail=lambda: pair.log_tail("node-a"))
        holder = failovers(pair, plan, instance)
    finally:
        events = writer.stop()
    advance_watermark(cluster, plan, int(time.time() * 1000) + 3_600_000)
    return plan, pair, events, holder


# --- the pizza shop ---------------------------------------------------------------------------------------------

PLAN, INSTANCE = "pizza_shop", "shop-1"


def fields_as_another_producer_spells_them(declared: dict) -> None:
    """The orders as another producer writes them: the customer nested (``from: customer.name``), a boolean, the
    time a ``timestamp`` (ISO-8601 text with an offset, or epoch milliseconds)."""
    fields = declared["streams"]["orders"]["fields"]
    fields["customer_name"]["from"] = "customer.name"
    fields["time"] = {"type": "timestamp"}
    fields["rush"] = {"type": "boolean"}


def spelled(stream: str, event: dict) -> str:
    """An event's line as :func:`fields_as_another_producer_spells_them` declares it: every other order's time as
    ISO-8601 text at +02:00 (the same instant), the rest as epoch milliseconds."""
    if stream != "orders":
        return json.dumps(event)
    iso = zlib.crc32(event["order_no"].encode()) % 2 == 0
    at = datetime.fromtimestamp(event["time"] / 1000, timezone(timedelta(hours=2))).isoformat(timespec="milliseconds")
    return json.dumps({"order_no": event["order_no"], "customer": {"name": event["customer_name"]},
                       "time": at if iso else event["time"], "rush": iso})


def published(url: str) -> tuple[list[str], dict[str, int]]:
    overdue = [r["order_no"] for r in fetch(url, "SELECT payload->>'order_no' AS order_no FROM output_events "
                                                 "WHERE plan = %s AND output = 'overdue_orders'", (PLAN,))]
    table = {r["customer"]: int(r["n"]) for r in fetch(
        url, "SELECT key->>'customer_name' AS customer, sum((value->>'delivered')::numeric) AS n "
             "FROM output_table_rows WHERE plan = %s AND output = 'delivered_orders' GROUP BY 1", (PLAN,))}
    return overdue, table


class EventPoller(threading.Thread):
    """A client of the presenter's events endpoint: polls ``output`` after its cursor every half second and
    keeps every event id it is given, in order (the endpoint's function, on its own connection)."""

    def __init__(self, url: str, plan: PlanConfig, output: str) -> None:
        super().__init__(daemon=True)
        self.url, self.plan, self.output = url, plan, output
        self.received: list[str] = []
        self.cursor: str | None = None
        self.stopped = threading.Event()
        self.error: BaseException | None = None

    def poll(self, db: Database) -> int:
        page = event_page(db, self.plan, self.output, cursor=self.cursor, limit=7)  # small pages: many cursors
        self.received += [e.event_id for e in page.events]
        self.cursor = page.next_cursor
        return len(page.events)

    def run(self) -> None:
        try:
            with Database(self.url, "test-poller") as db:
                while not self.stopped.wait(0.5):
                    while self.poll(db):
                        pass
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc



def test_events_and_table_outputs_exactly_once_across_kill_and_pause(
        project: Path, database_url: str, process_groups: list[int], nats_server: EmbeddedServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """... and the overdue orders published to a NATS stream (issue 26 §3): a consumer of the stream receives every
    one exactly once, in the order of the events endpoint. The orders are written as another producer spells them
    (issue 47 §4: a nested key read with ``from:``, a boolean, ISO-8601 times and epoch milliseconds mixed), and the
    customers' last orders are a ``latest`` output."""
    with Database(database_url) as db:
        migrate(db)
    prefix = messaging_layer(project, nats_server, monkeypatch)
    poller = EventPoller(database_url, load_plan(PLAN), "overdue_orders")
    poller.start()
    try:
        plan, pair, events, holder = failovers_under_load(
            project, process_groups, PLAN, INSTANCE, 20, lambda url: published(url)[0], "the first overdue orders",
            kill_then_pause, lambda declared: (publish_output("overdue_orders", "overdue", 2, "order_no",
                                                              {"order_no": "string", "customer_name": "string",
                                                               "expiry_time": "epoch_millis"})(declared),
                                               fields_as_another_producer_spells_them(declared)), spelled)
        polled_by_the_failovers = len(poller.received)
    except BaseException:
        poller.stopped.set()
        raise
    cluster, url = pair.cluster, pair.url

    per_customer, overdue = pizza_reference(events["orders"], events["deliveries"])
    assert overdue and per_customer
    def days(source: str) -> list[dict]:  # the aggregation of facts at its coarsest bucket
        return read_output(cluster, PLAN, "day", datetime(2000, 1, 1, tzinfo=timezone.utc),
                           datetime(2100, 1, 1, tzinfo=timezone.utc), output="order_stats", source=source)

    # the last batch decides ~1000 orders at once: its events, table rows and facts are three transactions
    # (and three Delta appends), so wait for all of them before comparing
    wait_for(lambda: (lambda got: sorted(got[0]) == sorted(overdue) and got[1] == per_customer)(published(url))
             and all(sum(r["orders"] for r in days(source)) >= len(events["orders"]) for source in ("postgres", "delta")),
             CATCH_UP_TIMEOUT_S, "every order decided and counted", detail=lambda: f"{len(published(url)[0])} of {len(overdue)} overdue, "
             f"{[sum(r['orders'] for r in days(s)) for s in ('postgres', 'delta')]} of {len(events['orders'])} orders "
             f"counted\n{pair.log_tail(holder)}")
    poller.stopped.set()
    got_overdue, got_table = published(url)
    assert len(got_overdue) == len(set(got_overdue)) == len(overdue)
    assert got_table == per_customer
    lake_events = read_events_lake(delta_table_dir(cluster, PLAN, "overdue_orders"))
    assert sorted(lake_events.column("order_no").to_pylist()) == sorted(overdue)
    lake_table = {r["customer_name"]: int(r["delivered"]) for r in read_table_lake(
        delta_table_dir(cluster, PLAN, "delivered_orders"), plan.outputs["delivered_orders"])}
    assert lake_table == per_customer
    for source in ("postgres", "delta"):  # the aggregation of facts: every order counted once
        assert sum(r["orders"] for r in days(source)) == len(events["orders"]), source
        assert sum(r["on_time"] for r in days(source)) == sum(per_customer.values()), source
    # latest per key (published after the facts in the same batch): no older order of a customer won over a newer
    want = {c: {**row, "instance": INSTANCE} for c, row in last_orders_reference(events["orders"],
                                                                             events["deliveries"]).items()}

    def last_orders(source: str) -> dict[str, dict]:
        return {row["customer_name"]: row for row in read_output(cluster, PLAN, output="last_orders", source=source)}

    wait_for(lambda: all(last_orders(source) == want for source in ("postgres", "delta")), 60,
             "every customer's last order", detail=lambda: f"{last_orders('postgres')}\n{want}")
    assert split_brain(url, PLAN, INSTANCE) == []
    assert lease(url, PLAN, INSTANCE)["holder"] == holder

    # a client that polled the events endpoint through both failovers got every overdue order exactly once
    poller.join(10)
    assert poller.error is None, repr(poller.error)
    with Database(url) as db:
        while poller.poll(db):
            pass
    assert polled_by_the_failovers > 0, "the poller must have read events before and across the failovers"
    assert len(poller.received) == len(set(poller.received)), "an event polled twice"
    assert sorted(poller.received) == sorted(r["event_id"] for r in fetch(
        url, "SELECT event_id FROM output_events WHERE plan = %s AND output = 'overdue_orders'", (PLAN,)))

    # a consumer of the NATS stream got every overdue order exactly once, in the outbox's order
    in_order = [e["payload"]["order_no"] for e in fetch(
        url, "SELECT payload FROM output_events WHERE plan = %s AND output = 'overdue_orders' ORDER BY xid, event_id",
        (PLAN,))]
    def in_stream() -> list[str]:
        return [line["order_no"] for _, line in stream_lines(nats_server.url, prefix, "overdue")]

    wait_for(lambda: len(in_stream()) >= len(in_order), 60, "the relay to publish every overdue order",
             detail=lambda: f"{len(in_stream())} of {len(in_order)} in the stream\n{pair.log_tail(holder)}")
    consumed = in_stream()
    assert consumed == in_order
    assert sorted(consumed) == sorted(overdue)


# --- the temperatures --------------------------------------------------------------------------------------------

TEMPERATURES, GROUP_1 = "temperatures", "group-1-1"
WINDOWED = ("avg_temps", "temp_alerts")


def temperature_events(url: str, output: str) -> list[dict]:
    return fetch(url, "SELECT event_id, payload FROM output_events WHERE plan = %s AND output = %s",
                 (TEMPERATURES, output))


def test_windowed_and_pattern_events_exactly_once_across_a_pause(project: Path, database_url: str,
                                                                   process_groups: list[int]) -> None:
    plan, pair, events, holder = failovers_under_load(project, process_groups, TEMPERATURES, GROUP_1, 10,
                                              lambda url: temperature_events(url, "avg_temps"), "the first room averages",
                                              pause)
    cluster, url, readings = pair.cluster, pair.url, events["temps"]

    expected = temperature_reference(readings)
    assert expected["temp_alerts"], "the input must raise alerts"

    def rows(output: str) -> list[tuple]:
        return [temperature_row(output, r["payload"]) for r in temperature_events(url, output)]

    wait_for(lambda: all(set(rows(output)) == expected[output] for output in WINDOWED), CATCH_UP_TIMEOUT_S,
             "every reading's average and alert",
             detail=lambda: ", ".join(f"{o}: {len(rows(o))} of {len(expected[o])}, missing "
                                      f"{sorted(expected[o] - set(rows(o)))[:2]}, extra {sorted(set(rows(o)) - expected[o])[:2]}"
                                      for o in WINDOWED))
    def in_lake(output: str) -> list[str]:
        return sorted(read_events_lake(delta_table_dir(cluster, TEMPERATURES, output)).column("event_id").to_pylist())

    # each batch appends to Delta right after its PostgreSQL commit: the last batch's append may still be on its way
    wait_for(lambda: all(len(in_lake(o)) >= len(temperature_events(url, o)) for o in WINDOWED), 60,
             "the Delta copies to catch up with PostgreSQL",
             detail=lambda: ", ".join(f"{o}: {len(in_lake(o))} of {len(temperature_events(url, o))}" for o in WINDOWED))
    for output in WINDOWED:
        got = temperature_events(url, output)
        assert len(got) == len({temperature_row(output, r["payload"]) for r in got}), f"{output}: a row twice"
        assert in_lake(output) == sorted(r["event_id"] for r in got), output
    assert split_brain(url, TEMPERATURES, GROUP_1) == []
    assert lease(url, TEMPERATURES, GROUP_1)["holder"] == holder
