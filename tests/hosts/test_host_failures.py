"""Nodes on separate hosts: a host crash and network partitions, on real network namespaces.

Three hosts made of network namespaces joined by a bridge (``_hosts.HostNetwork``): ``control``
runs the test's own PostgreSQL (listening on its bridge address only), ``host-a`` runs node-a and
``host-b`` node-b, each under its own host name. Each node's instance is launched *on its host*
with ``tandem launch`` (a detached ``spark-submit`` that lives in that namespace), so nothing of
node-a runs on host-b and no host ever signals another host's process. Storage is the shared
filesystem (the part NFS plays in a deployment). The load (~200 trade events/s) lands from the
test process through that storage.

The tests share one running pair (``HotPair``, as in ``test_failover.py``) and, after each
failure, compare every output with the test's own aggregation of every event written so far
(all six granularities, PostgreSQL and Delta) and check that no two nodes ever published at once.
The last one adds ``host-c``'s node-c as BACKUP and crashes both other hosts.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from collections.abc import Iterator

import pytest
from _ha import (
    REPO,
    SHARD,
    HotPair,
    configure_one_shard,
    db_now,
    failover_events,
    group_alive,
    instance_row,
    lease,
    publish_log,
    split_brain,
    under_load,
    wait_for,
)
from _hosts import BACKUP_HOST, BACKUP_NODE, HOST_OF, HostPair, add_backup_node, hosts_with_postgres
from _project import kill_groups, use_project
from tandem.config import load_cluster, load_plan
from tandem.packaging import build_dist
from tandem.supervisor import stop_instance

pytestmark = [pytest.mark.integration, pytest.mark.hosts]
TAKEOVER_TIMEOUT_S = 20  # lease ttl 3 s + one 1 s heartbeat, with room for a loaded 2-core machine
PARTITION_S = 20


def take_over(pair: HostPair, standby: str, epoch: int, failed_at: float, what: str) -> dict:
    """Wait for ``standby`` to be PROMOTED above ``epoch`` and publish; print both times since ``failed_at``."""
    failed = ({"node-a", "node-b"} - {standby}).pop()
    promoted = wait_for(lambda: pair.promoted(standby, epoch), TAKEOVER_TIMEOUT_S, f"{standby} to take over",
                        detail=lambda: f"lease {lease(pair.url)} (failed at {failed_at:.3f})\n"
                                       f"links of {pair.host_of[failed]}: {pair.network.link_state(pair.host_of[failed])}"
                                       f"\n{pair.log_tail(failed, 60)}\n{pair.log_tail(standby)}")
    first = wait_for(lambda: pair.first_publish(standby, promoted["epoch"]), TAKEOVER_TIMEOUT_S,
                     f"{standby} to publish", detail=lambda: pair.log_tail(standby))
    pair.note(f"{what} -> PROMOTED {standby} {promoted['happened_at'].timestamp() - failed_at:.2f}s, "
              f"first publish {first['published_at'].timestamp() - failed_at:.2f}s")
    return promoted


@pytest.fixture(scope="class")
def on_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HotPair]:
    """node-a ACTIVE on host-a, node-b PASSIVE on host-b, PostgreSQL on the control host; host-c for
    node-c (BACKUP), which the last test starts."""
    if os.geteuid() != 0:
        pytest.fail("the multi-host tests make network namespaces: run them as root (CI does)")
    root = tmp_path_factory.mktemp("hosts")
    groups: list[int] = []
    shared: HotPair | None = None
    with pytest.MonkeyPatch.context() as monkeypatch, \
            hosts_with_postgres(root, [*HOST_OF.values(), BACKUP_HOST]) as (network, server, url):
        try:
            use_project(root / "project", url, monkeypatch)
            configure_one_shard(root / "project")
            add_backup_node(root / "project")
            cluster = load_cluster()
            pair = HostPair(cluster, load_plan("trades", cluster), build_dist(REPO), groups, network=network,
                            host_of={**HOST_OF, BACKUP_NODE: BACKUP_HOST})
            shared = HotPair(pair, server)
            pair.start_pair("node-a", "node-b")
            for node, host in HOST_OF.items():
                assert instance_row(pair.url, node)["host"] == host, instance_row(pair.url, node)
            yield shared
        finally:
            if shared is not None and shared.writer is not None:
                shared.writer.stopping.set()
            kill_groups(groups)


@pytest.fixture
def live(on_hosts: HotPair) -> Iterator[HotPair]:
    for host in [*HOST_OF.values(), BACKUP_HOST]:  # an earlier test may have failed while a host was cut off
        on_hosts.pair.network.reconnect(host)
    for a, b in list(on_hosts.pair.network.cuts):
        on_hosts.pair.network.mend(a, b)
    with under_load(on_hosts):
        yield on_hosts


class TestTwoHostsUnderLoad:
    """One ACTIVE / hot PASSIVE pair on two hosts, for these tests in this order."""

    def test_a_partition_between_the_two_nodes_only_changes_nothing(self, live: HotPair) -> None:
        """Both nodes still reach PostgreSQL: they never talk to each other, so nothing fails over."""
        url, network = live.url, live.pair.network
        before, since = lease(url), db_now(url)
        network.cut("host-a", "host-b")
        try:
            time.sleep(PARTITION_S)
        finally:
            network.mend("host-a", "host-b")
        after = lease(url)
        assert (after["holder"], after["epoch"]) == (before["holder"], before["epoch"]), (before, after)
        assert failover_events(url, since=since) == []
        live.finish_and_compare()
        assert split_brain(url) == []

    def test_a_partitioned_active_is_fenced_and_rejoins_as_passive(self, live: HotPair) -> None:
        """The ACTIVE's host is cut off from everything for 20 s while its processes run on: the
        standby takes over once the lease expires, the cut-off node publishes nothing after that,
        and when the partition heals it finds its epoch gone, demotes itself and runs on as PASSIVE."""
        pair, url, network = live.pair, live.url, live.pair.network
        active, standby = live.roles()
        before, since = lease(url), db_now(url)
        network.isolate(pair.host_of[active])
        isolated_at = time.time()
        try:
            promoted = take_over(pair, standby, before["epoch"], isolated_at, f"{active}'s host cut off")
            assert promoted["epoch"] == before["epoch"] + 1 and promoted["previous_node"] == active
            time.sleep(max(0.0, PARTITION_S - (time.time() - isolated_at)))
            assert group_alive(pair.pgids[active]), f"{active} should still run while it is cut off"
        finally:
            network.reconnect(pair.host_of[active])
        pair.note(f"{active}'s host reconnected after {time.time() - isolated_at:.1f}s")

        demoted = wait_for(lambda: [e for e in failover_events(url, since=since)
                                    if e["kind"] == "DEMOTED" and e["node"] == active],
                           90, f"the reconnected {active} to demote itself", detail=lambda: pair.log_tail(active))
        assert demoted[0]["epoch"] == before["epoch"], demoted
        wait_for(lambda: instance_row(url, active)["role"] == "PASSIVE", 30, f"{active} to run on as PASSIVE",
                 detail=lambda: f"{instance_row(url, active)}\n{pair.log_tail(active)}")
        live.finish_and_compare()
        late = [r for r in publish_log(url, active) if r["published_at"] >= promoted["happened_at"]]
        assert late == [], f"{active} published after the epoch moved on: {late}"
        row = instance_row(url, active)
        assert (row["role"], row["status"], row["host"]) == ("PASSIVE", "RUNNING", pair.host_of[active]), row
        assert lease(url)["holder"] == standby
        assert split_brain(url) == []

    def test_a_node_on_another_host_stops_at_a_request_in_postgresql(self, live: HotPair) -> None:
        """The test process's host never saw the standby's PIDs: the stop goes through PostgreSQL, the
        driver obeys it with its next beat and ends its own processes on its host."""
        pair, url = live.pair, live.url
        active, standby = live.roles()
        assert instance_row(url, standby)["host"] != socket.gethostname()
        started = time.monotonic()
        result = stop_instance(pair.cluster, pair.plan.name, SHARD, standby, timeout_s=60)
        pair.note(f"{standby} on {pair.host_of[standby]} stopped at a request in {time.monotonic() - started:.1f}s")
        assert (result.status, result.graceful) == ("STOPPED", True), result
        assert "at the stop request" in result.detail, result
        assert instance_row(url, standby)["error"].startswith("stopped at the request of "), instance_row(url, standby)
        pair.wait_group_gone(standby)  # its spark-submit exits after the driver: nobody signalled it from here
        assert lease(url)["holder"] == active
        live.finish_and_compare()
        assert split_brain(url) == []

    def test_crashed_hosts_fail_over_to_the_backup_on_a_third_host(self, live: HotPair) -> None:
        """node-c runs as BACKUP on host-c; every process of the ACTIVE's host and of the PASSIVE's host
        is killed at once: the BACKUP takes the lease by itself (one lease ttl after a PASSIVE would
        have), publishes, and every output is exact. (One crashed host, the PASSIVE taking over and
        the crashed node rejoining as PASSIVE on its host, under Airflow's supervision:
        ``test_airflow_on_hosts.py``.)"""
        pair, url, network = live.pair, live.url, live.pair.network
        pair.launch(BACKUP_NODE, "BACKUP")
        pair.wait_running(BACKUP_NODE)
        pair.wait_caught_up(BACKUP_NODE)
        row = instance_row(url, BACKUP_NODE)
        assert (row["role"], row["host"]) == ("BACKUP", BACKUP_HOST), row
        active, standby = live.roles()
        before = lease(url)
        crashed_at = time.time()
        killed = network.crash(pair.host_of[active]) + network.crash(pair.host_of[standby])
        assert killed >= 4, f"expected spark-submit and its driver on both hosts, killed {killed}"
        promoted = take_over(pair, BACKUP_NODE, before["epoch"], crashed_at,
                             f"{pair.host_of[active]} and {pair.host_of[standby]} crashed ({killed} processes)")
        assert promoted["previous_node"] == active and promoted["epoch"] == before["epoch"] + 1, promoted
        assert promoted["happened_at"] >= before["expires_at"] + timedelta(seconds=pair.plan.heartbeat.timeout_s
                                                                            - 0.5), \
            "a BACKUP waits one more lease ttl after expiry, so that a live PASSIVE always goes first"

        live.finish_and_compare()
        assert lease(url)["holder"] == BACKUP_NODE
        assert split_brain(url) == []
