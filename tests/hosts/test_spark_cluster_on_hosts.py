"""A plan pair on a Spark standalone cluster across hosts (issue 28 §3).

Hosts are network namespaces (``_hosts.HostNetwork``): ``control`` runs the test's PostgreSQL, ``spark-1`` the
standalone master and a worker, ``spark-2`` a second worker (both from the pyspark wheel, ``tandem.spark_cluster``),
``host-a`` and ``host-b`` the drivers of trades' shard-1 as a hot pair (node-a ACTIVE, node-b PASSIVE), each
application with one one-core executor on each worker, under load:

1. ``spark-2`` crashes (every process of the host killed at once with ``kill -9``: its worker and both
   applications' executors there): Spark runs the lost tasks again on ``spark-1``; nobody fails over (same holder,
   same epoch, no failover event);
2. ``host-a`` crashes (the ACTIVE driver): node-b takes over through the lease, as with local masters.

At the end PostgreSQL and Delta hold the merged aggregates of every trade written, each batch once.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from _ha import (
    TradeWriter,
    configure_one_instance,
    db_now,
    failover_events,
    instance_row,
    lease,
    mismatches,
    published_total,
    wait_for,
)
from _hosts import HostPair, hosts_with_postgres
from _project import use_project
from tandem.config import load_cluster, load_plan
from tandem.layout import instance_landing_dir
from tandem.packaging import build_dist
from tandem.spark_cluster import start_cluster, stop_cluster
from tandem.store import Database, migrate

pytestmark = [pytest.mark.integration, pytest.mark.hosts]
INSTANCE = "shard-1"
MASTER_PORT, WEB_PORT = 7077, 8081  # every host has its own network stack: nothing competes for them
EXECUTOR_SETTINGS = {"spark.cores.max": "2", "spark.executor.cores": "1", "spark.executor.memory": "512m"}
TAKEOVER_TIMEOUT_S = 30


def test_a_pair_on_a_cluster_rides_out_a_worker_host_crash_and_fails_over_when_the_driver_host_crashes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, process_groups: list[int]) -> None:
    if os.geteuid() != 0:
        pytest.fail("the multi-host tests make network namespaces: run them as root (CI does)")
    with hosts_with_postgres(tmp_path, ["spark-1", "spark-2", "host-a", "host-b"]) as (network, _server, url):
        spark = start_cluster(tmp_path / "spark-cluster", workers=2, cores=2, memory="2g",
                              host=network.address("spark-1"), port=MASTER_PORT, web_port=WEB_PORT,
                              worker_hosts=[network.address("spark-1"), network.address("spark-2")],
                              prefix=network.command("spark-1", []),
                              worker_prefixes=[network.command("spark-1", []), network.command("spark-2", [])])
        try:
            project = use_project(tmp_path / "project", url, monkeypatch)
            configure_one_instance(project)
            for node in ("NODE_A", "NODE_B"):
                monkeypatch.setenv(f"AIRFLOW_CONN_TANDEM_{node}",
                                   json.dumps({"conn_type": "spark", "host": spark.master_url}))
            with open(project / "conf" / "spark-defaults.conf", "a") as defaults:
                defaults.writelines(f"{key} {value}\n" for key, value in EXECUTOR_SETTINGS.items())
            with Database(url) as db:
                migrate(db)
            cluster = load_cluster()
            plan = load_plan("trades", cluster)
            pair = HostPair(cluster, plan, build_dist(project), process_groups, network=network,
                            drivers_on_host_address=True)
            writer = TradeWriter(instance_landing_dir(cluster, plan, INSTANCE), rate=100, seed=9)
            pair.start_pair("node-a", "node-b", timeout_s=300)
            for node in ("node-a", "node-b"):
                assert instance_row(url, node)["spark_app_id"].startswith("app-"), "a standalone application"
            wait_for(lambda: all(w["coresused"] == 2 for w in spark.status()["workers"]), 120,
                     "each application's executors on both workers", detail=lambda: json.dumps(spark.status()))
            writer.start()
            try:
                wait_for(lambda: published_total(url) >= 500, 240, "the first trades published",
                         detail=lambda: pair.log_tail("node-a"))
                before, worker_crashed_at = lease(url), db_now(url)
                pair.note(f"crash of spark-2 ({network.crash('spark-2')} processes: a worker and its executors)")
                wait_for(lambda: spark.alive_workers() == 1, 120, "the master to count spark-2's worker out")
                at_crash = published_total(url)
                wait_for(lambda: published_total(url) >= at_crash + 1000, 240,
                         "publishing to go on with spark-1's executors", detail=lambda: pair.log_tail("node-a"))
                assert (lease(url)["holder"], lease(url)["epoch"]) == ("node-a", before["epoch"]), "nobody failed over"
                assert failover_events(url, since=worker_crashed_at) == []

                pair.note(f"crash of host-a ({network.crash('host-a')} processes: node-a's driver)")
                promoted = wait_for(lambda: pair.promoted("node-b", before["epoch"]), TAKEOVER_TIMEOUT_S,
                                    "node-b to take over from the crashed host-a",
                                    detail=lambda: pair.log_tail("node-b"))
                pair.note(f"node-b PROMOTED at epoch {promoted['epoch']}")
                at_takeover = published_total(url)
                wait_for(lambda: published_total(url) >= at_takeover + 500, 240, "node-b to publish",
                         detail=lambda: pair.log_tail("node-b"))
            finally:
                events = writer.stop()
            wait_for(lambda: published_total(url) >= len(events), 240, f"all {len(events)} trades published",
                     detail=lambda: f"published {published_total(url)}\n{pair.log_tail('node-b')}")
            deadline = time.monotonic() + 30  # Delta is appended right after the PostgreSQL commit
            while (problems := mismatches(cluster, events)) and time.monotonic() < deadline:
                time.sleep(2)
            assert not problems, "\n".join(problems)
        finally:
            stop_cluster(spark)
