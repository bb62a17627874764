"""A blue/green upgrade of a running hot pair under steady load (issue 48 §2), real ``spark-submit`` nodes.

The trades plan's module changes twice while trades keep arriving: first a refactor (the same output), then a
change of semantics (prices doubled). Each new version runs first on the standby, re-synced from the ACTIVE, and
compares what it would publish with what the ACTIVE published; the refactor is handed the ACTIVE role through the
lease, rolled back, and the change of semantics is stopped at its first difference, then taken once confirmed.
A kill -9 of the old version after the hand-over ends the rollback window. Every trade is counted once throughout
(count and quantity of every second, against the test's own sums), and each second's prices are those of the old
version up to the hand-over and of the new one after it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from _ha import ALL_TIME, configure_one_instance, expected_aggregates, fetch, start_writer, wait_for
from _nats import edit_plan
from _project import kill_groups

from tandem.cli import upgrade_line
from tandem.config import load_cluster, load_plan
from tandem.packaging import build_dist
from tandem.plan_version import plan_version
from tandem.presenter.views import plan_status
from tandem.reading import read_output
from tandem.store import Database
from tandem.store.upgrades import FAILED, FINISHED, HANDED_OVER, ROLLED_BACK
from tandem.supervisor.reconcile import OpsRefused, Supervisor
from tandem.supervisor.upgrade import Upgrader

pytestmark = pytest.mark.integration
INSTANCE = "shard-1"
DOUBLED_PRICES = "ctx.events(STREAM).withColumn('price', F.col('price') * 2)"


def node_row(supervisor: Supervisor, node: str) -> dict:
    return fetch(supervisor.cluster.database_url, "SELECT * FROM plan_instances WHERE instance_id = %s",
                 (f"trades/{INSTANCE}/{node}",))[0]


def holder(supervisor: Supervisor) -> str | None:
    return supervisor.observe(INSTANCE).view.active


def module_with(project: Path, edit) -> str:
    """Write the trades module beside the plan's YAML (it then replaces the bundled one), edited; its version."""
    import tandem.plans.trades as bundled

    (project / "conf" / "plans" / "trades.py").write_text(edit(Path(bundled.__file__).read_text()))
    edit_plan(project, "trades", lambda declared: declared.pop("module", None))
    return plan_version(load_plan("trades", load_cluster()))


@pytest.fixture
def pair(project: Path, database_url: str, process_groups: list[int]):
    configure_one_instance(project, "hot")
    cluster = load_cluster()
    supervisor = Supervisor(cluster, load_plan("trades", cluster), launched_by="test_upgrade",
                            py_files=build_dist(project), running_timeout_s=300)
    try:
        yield supervisor
    finally:
        for node in supervisor.plan.nodes:
            rows = fetch(cluster.database_url, "SELECT submit_pid FROM plan_instances WHERE instance_id = %s",
                         (f"trades/{INSTANCE}/{node}",))
            process_groups.extend(r["submit_pid"] for r in rows if r["submit_pid"])
        kill_groups(process_groups)
        supervisor.close()


def test_upgrade_verifies_the_new_version_hands_over_rolls_back_and_refuses_a_difference_under_load(
        project: Path, pair: Supervisor) -> None:
    supervisor = pair
    writer = start_writer(supervisor.cluster, rate=100)
    try:
        report = supervisor.reconcile(INSTANCE, cause="test bootstrap")
        assert report.converged, report.lines()
        first = node_row(supervisor, "node-a")["plan_version"]
        assert holder(supervisor) == "node-a" and node_row(supervisor, "node-b")["plan_version"] == first
        wait_for(lambda: fetch(supervisor.cluster.database_url, "SELECT 1 FROM publish_log LIMIT 1"), 120,
                 "a first publish")

        # 1. a refactor: verified equal, then handed the ACTIVE role; the old version runs on as the standby
        refactored = module_with(project, lambda source: source + "\n# refactored: the same output\n")
        assert refactored != first
        seen: list[str] = []
        upgrader = Upgrader(supervisor, verify_s=8, min_rows=20, timeout_s=180, progress=seen.append)
        result = upgrader.upgrade(INSTANCE)
        assert result.state == HANDED_OVER, result.line
        [check] = [c for c in result.checks if c.output == "trade_aggregates"]
        assert check.checked >= 20 and check.differing == 0, result.checks
        assert holder(supervisor) == "node-b" and node_row(supervisor, "node-b")["plan_version"] == refactored
        wait_for(lambda: node_row(supervisor, "node-a")["role"] == "PASSIVE", 30, "the old version to step down")
        assert node_row(supervisor, "node-a")["plan_version"] == first
        assert result.pause_s is not None and result.pause_s < 30, result.pause_s
        assert any("verifying node-b" in line for line in seen)
        with Database(supervisor.cluster.database_url) as db:  # what the page, the REST API and the CLI show
            [shown] = plan_status(db, supervisor.cluster, supervisor.plan).instances
        assert (shown.upgrade.state, shown.upgrade.from_version, shown.upgrade.to_version) == (
            HANDED_OVER, first, refactored)
        assert [(c.output, c.differing) for c in shown.upgrade.checks if c.output == "trade_aggregates"] == [
            ("trade_aggregates", 0)]
        assert "HANDED_OVER (trade_aggregates" in upgrade_line(shown.upgrade)

        # 2. rollback: the old version is ACTIVE again, nothing restarted
        pids = {node: node_row(supervisor, node)["pid"] for node in ("node-a", "node-b")}
        rolled = upgrader.rollback(INSTANCE)
        assert rolled.state == ROLLED_BACK and holder(supervisor) == "node-a", rolled.line
        assert {node: node_row(supervisor, node)["pid"] for node in pids} == pids
        with pytest.raises(OpsRefused, match="nothing to roll back"):
            upgrader.rollback(INSTANCE)

        # 3. a change of semantics: stopped at its first difference, nothing handed over
        doubled = module_with(project, lambda source: source.replace(
            "second_partials(ctx.events(STREAM),", f"second_partials({DOUBLED_PRICES},").replace(
            "from pyspark.sql import DataFrame\n",
            "from pyspark.sql import DataFrame\nfrom pyspark.sql import functions as F\n"))
        refused = upgrader.upgrade(INSTANCE)
        assert refused.state == FAILED and "differ from the old version's" in refused.line, refused.line
        assert "price_sum" in refused.line and "(old) !=" in refused.line, refused.line
        assert holder(supervisor) == "node-a" and node_row(supervisor, "node-a")["plan_version"] == first

        # ... and taken once confirmed: the hand-over is at one position, old prices before it, new after
        shown: list[int] = []
        shadow_started = datetime.now(timezone.utc)
        confirming = Upgrader(supervisor, verify_s=8, min_rows=20, timeout_s=180,
                              confirm=lambda checks: shown.append(sum(c.differing for c in checks)) or True)
        taken = confirming.upgrade(INSTANCE)
        assert taken.state == HANDED_OVER and shown and shown[0] > 0, taken.line
        assert holder(supervisor) == "node-b" and node_row(supervisor, "node-b")["plan_version"] == doubled
        handed_over_at = datetime.now(timezone.utc)

        # 4. kill -9 the old version: it comes back on the files' version; the rollback window is over
        os.killpg(node_row(supervisor, "node-a")["submit_pid"], signal.SIGKILL)
        wait_for(lambda: supervisor.observe(INSTANCE).view.health("node-a").state == "DEAD", 60, "node-a DEAD")
        assert supervisor.reconcile(INSTANCE, cause="test: old version killed").converged
        assert node_row(supervisor, "node-a")["plan_version"] == doubled
        with pytest.raises(OpsRefused, match="no longer runs version"):
            confirming.rollback(INSTANCE)
        finished = confirming.finish(INSTANCE)
        assert finished.state == FINISHED and "restarted" not in finished.line, finished.line
        cli = subprocess.run([sys.executable, "-m", "tandem.cli", "upgrade", "trades"], capture_output=True,
                             text=True, timeout=120)
        assert cli.returncode == 2 and f"every node runs version {doubled} already" in cli.stderr + cli.stdout, cli
    finally:
        events = writer.stop()

    # every trade once; the prices of the old version before the new one started, of the new one after its
    # hand-over; a second in flight between the two carries state of both (the new version took the old one's)
    def counted() -> dict:
        rows = read_output(supervisor.cluster, "trades", "second", *ALL_TIME)
        return {(r["bucket_start"].astimezone(timezone.utc), r["symbol"]): r for r in rows}

    expected = expected_aggregates(events, "second")
    wait_for(lambda: {k: (r["trade_count"], r["quantity_sum"]) for k, r in counted().items()} ==
             {k: (e["trade_count"], e["quantity_sum"]) for k, e in expected.items()}, 120,
             f"{len(events)} trades counted once")
    rows = counted()
    factors = {key: rows[key]["price_sum"] / want["price_sum"] for key, want in expected.items()}
    old_seconds = [key for key in expected if key[0] < shadow_started - timedelta(seconds=15)]
    new_seconds = [key for key in expected if key[0] > handed_over_at + timedelta(seconds=1)]
    assert old_seconds and new_seconds
    for keys, factor in ((old_seconds, 1.0), (new_seconds, 2.0)):
        for key in keys:
            assert factors[key] == pytest.approx(factor), (key, factors[key])
            assert (rows[key]["price_min"], rows[key]["price_max"]) == pytest.approx(
                (expected[key]["price_min"] * factor, expected[key]["price_max"] * factor)), key
    assert all(1.0 - 1e-9 <= f <= 2.0 + 1e-9 for f in factors.values()), sorted(set(factors.values()))
