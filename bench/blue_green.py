#!/usr/bin/env python
"""Blue/green upgrade benchmark: the publishing pause of ``tandem upgrade``'s hand-over, against a hot
``failover_now`` hand-over in the same run (issue 48 §5: no longer than a hot failover, <= 3 s median of 5).

The trades plan's ``shard-1`` runs as a supervised hot pair of ``spark-submit`` nodes under ``--rate`` trades/s.
Once both nodes have caught up, ``--runs`` times: an operator failover (``failover_now``: a lease hand-over between
two nodes of one version), then an upgrade to a new version of the plan's module (a refactor: the same output), so
both run in the same conditions. The upgrade's standby restarts
on it re-synced from the ACTIVE (the *catch-up*), compares its rows with the ACTIVE's for ``--verify-seconds``,
then takes over through the lease. Per run: the publishing pause (the old holder's last publish to the new one's
first, from ``publish_log``), and for an upgrade the catch-up (start to verifying), the verification and the whole
upgrade; for both, the pause's parts (the hand-over to the new holder's promotion and first publish). At the end
every output is checked against every trade written (exact, or the run says so). With ``--chaos``, before that
check, three more upgrades each lose a node to kill -9: the shadow while it verifies, the old ACTIVE while the shadow
verifies, the new ACTIVE right after the hand-over (what the upgrade ends as, who is ACTIVE after, and the supervisor
bringing the node back).

Results: ``bench/results/blue_green.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(BENCH))

import yaml  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import Progress  # noqa: E402

import _ha  # noqa: E402
from _common import git_commit, machine_info, now_iso  # noqa: E402
from failover import private_project  # noqa: E402
from tandem.config import load_cluster, load_plan  # noqa: E402
from tandem.plan_version import plan_version  # noqa: E402
from tandem.store import Database, upgrades  # noqa: E402
from tandem.store.publish_log import first_publish_after  # noqa: E402
from tandem.store.registry import get_instance, instance_id  # noqa: E402
from tandem.supervisor.reconcile import Supervisor  # noqa: E402
from tandem.supervisor.upgrade import Upgrader, publishing_pause  # noqa: E402

console = Console()
INSTANCE = "shard-1"
TARGET_PAUSE_S = 3.0


def new_version(conf: Path, run: int) -> str:
    """The trades module beside the plan's YAML with a comment naming the run (a refactor); its version."""
    import tandem.plans.trades as bundled

    (conf / "plans" / "trades.py").write_text(Path(bundled.__file__).read_text() + f"\n# release {run}\n")
    path = conf / "plans" / "trades.yaml"
    declared = yaml.safe_load(path.read_text())
    if declared.pop("module", None) is not None:
        path.write_text(yaml.safe_dump(declared, sort_keys=False))
    return plan_version(load_plan("trades", load_cluster()))


def remember_groups(url: str, groups: list[int]) -> None:
    """The supervisor's launches, so leaving the project kills them."""
    for row in _ha.fetch(url, "SELECT submit_pid FROM plan_instances WHERE submit_pid IS NOT NULL"):
        if row["submit_pid"] not in groups:
            groups.append(row["submit_pid"])


def caught_up(url: str, node: str) -> bool:
    """Whether the node's instance has read to within 25 s of now."""
    watermark = _ha.latest_watermark(url, node)
    return watermark is not None and watermark.timestamp() > time.time() - 25


def pause_breakdown(url: str) -> dict:
    """The newest hand-over, from PostgreSQL's clock: the old holder's last publish before it
    (``last_publish_before_s``, negative), the new holder's promotion (``promotion_s``) and first publish
    (``first_publish_s``) after it, and the publishing pause (the old holder's last publish to the new one's first)."""
    [row] = _ha.fetch(url, """
        WITH h AS (SELECT happened_at, epoch FROM failover_events WHERE instance = %(i)s AND kind = 'HANDOVER'
                   ORDER BY id DESC LIMIT 1)
        SELECT h.happened_at AS handed,
               (SELECT max(published_at) FROM publish_log WHERE instance = %(i)s AND epoch < h.epoch) AS last,
               (SELECT min(happened_at) FROM failover_events WHERE instance = %(i)s AND kind = 'PROMOTED'
                   AND epoch >= h.epoch) AS promoted,
               (SELECT min(published_at) FROM publish_log WHERE instance = %(i)s AND epoch >= h.epoch) AS first
        FROM h""", {"i": INSTANCE})
    seconds = (lambda a, b: None if a is None or b is None else round((b - a).total_seconds(), 3))
    return {"pause_s": seconds(row["last"], row["first"]), "last_publish_before_s": seconds(row["handed"], row["last"]),
            "promotion_s": seconds(row["handed"], row["promoted"]), "first_publish_s": seconds(row["handed"], row["first"])}


def upgrade_in_background(supervisor: Supervisor) -> tuple[threading.Thread, dict]:
    """An upgrade (30 s of verification) on a thread of its own; its result lands in the dict."""
    outcome: dict = {}
    upgrader = Upgrader(supervisor, verify_s=30, min_rows=20, timeout_s=600, progress=lambda line: None)
    thread = threading.Thread(target=lambda: outcome.update(result=upgrader.upgrade(INSTANCE)), daemon=True)
    thread.start()
    return thread, outcome


def verifying_shadow(db: Database, version: str) -> tuple[str, str]:
    """(shadow, old active) once the upgrade to ``version`` verifies on a shadow running it (``db``: not the
    supervisor's, which the upgrade's thread uses)."""
    def ready():
        upgrade = upgrades.current(db, "trades", INSTANCE)
        if upgrade is None or upgrade.state != upgrades.VERIFYING or upgrade.to_version != version:
            return None
        row = get_instance(db, instance_id("trades", INSTANCE, upgrade.shadow_node))
        running = row and row["status"] == "RUNNING" and row["plan_version"] == version
        return (upgrade.shadow_node, upgrade.from_node) if running else None

    return _ha.wait_for(ready, 300, f"a shadow verifying {version}")


def kill9(db: Database, node: str) -> None:
    os.killpg(get_instance(db, instance_id("trades", INSTANCE, node))["submit_pid"], signal.SIGKILL)


def chaos(supervisor: Supervisor, conf: Path, url: str, groups: list[int]) -> list[dict]:
    """kill -9 of either version at each step of an upgrade: the shadow while it verifies (the upgrade fails, nothing
    is handed over), the old ACTIVE while the shadow verifies (the shadow takes over by failover), the new ACTIVE
    right after the hand-over (the old version, still the standby, takes over by failover). Each time the
    supervisor then brings the killed node back."""
    steps = []
    db = Database(url)
    for step, victim in enumerate(("shadow", "old active", "new active")):
        version = new_version(conf, 100 + step)
        thread, outcome = upgrade_in_background(supervisor)
        if victim == "new active":
            thread.join()
            upgrade = upgrades.current(db, "trades", INSTANCE)
            shadow, active = upgrade.shadow_node, upgrade.from_node
            killed, survivor = shadow, active
        else:
            shadow, active = verifying_shadow(db, version)
            killed, survivor = (shadow, active) if victim == "shadow" else (active, shadow)
        epoch = _ha.lease(url)["epoch"]
        kill9(db, killed)
        killed_at = time.time()  # against publish_log's published_at: PostgreSQL runs on this host
        thread.join()
        result = outcome["result"]
        _ha.wait_for(lambda: _ha.lease(url)["holder"] == survivor and _ha.lease(url)["epoch"] >= epoch, 120,
                     f"{survivor} to hold the lease")
        first = _ha.wait_for(lambda: first_publish_after(supervisor.db, "trades", INSTANCE, epoch)
                             if victim != "shadow" else {"published_at": None}, 120, "a publish by the survivor")
        _ha.wait_for(lambda: supervisor.observe(INSTANCE).view.health(killed).state == "DEAD", 60, f"{killed} DEAD")
        report = supervisor.reconcile(INSTANCE, cause=f"bench: {victim} killed during an upgrade")
        remember_groups(url, groups)
        steps.append({"killed": victim, "node": killed, "upgrade_state": result.state, "upgrade_line": result.line[:300],
                      "active_after": _ha.lease(url)["holder"], "first_publish_after_kill_s": None
                      if first["published_at"] is None else round(first["published_at"].timestamp() - killed_at, 3),
                      "recovered": report.converged})
        console.log(f"chaos: kill -9 the {victim} ({killed}): upgrade {result.state}, ACTIVE {survivor}, "
                    f"{killed} back: {report.converged}")
    db.close()
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="failovers, then upgrades")
    parser.add_argument("--rate", type=int, default=200, help="trades per second")
    parser.add_argument("--verify-seconds", type=float, default=10.0)
    parser.add_argument("--standby", choices=("hot", "warm"), default="hot",
                        help="warm: the upgrade restarts the WARM standby on the new version and fails over to it "
                             "(nothing to verify); results in blue_green_warm.json")
    parser.add_argument("--chaos", action="store_true",
                        help="then kill -9 either version at each step of three more upgrades")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    args.out = args.out or BENCH / "results" / ("blue_green.json" if args.standby == "hot" else "blue_green_warm.json")

    with private_project("bluegreen", {"ha": {"standby": args.standby}}) as project:
        cluster = load_cluster()
        url = project.database_url
        supervisor = Supervisor(cluster, load_plan("trades", cluster), launched_by="bench/blue_green.py",
                                py_files=project.root / "dist" / "tandem.zip", running_timeout_s=600)
        writer = _ha.start_writer(cluster, rate=args.rate, seed=17)
        failovers, upgrades = [], []
        try:
            report = supervisor.reconcile(INSTANCE, cause="bench bootstrap")
            remember_groups(url, project.groups)
            assert report.converged, report.lines()
            _ha.wait_for(lambda: _ha.publish_log(url), 180, "a first publish")
            with Progress(console=console) as progress:
                task = progress.add_task("warming up", total=2 * args.runs)
                for node in ("node-a", "node-b") if args.standby == "hot" else ("node-a",):  # a steady pair
                    _ha.wait_for(lambda: caught_up(url, node), 300, f"{node} to catch up")
                for run in range(args.runs):  # a failover_now, then an upgrade, in the same conditions
                    progress.update(task, description=f"failover_now {run + 1}")
                    time.sleep(5)
                    epoch = supervisor.observe(INSTANCE).view.lease.epoch
                    began = time.monotonic()
                    report = supervisor.fail_over_now(INSTANCE)
                    assert report.converged, report.lines()
                    pause = publishing_pause(supervisor.db, "trades", INSTANCE, epoch)
                    failovers.append({"handover_s": round(time.monotonic() - began, 3),
                                      "pause_s": None if pause is None else round(pause, 3),
                                      **(pause_breakdown(url) if args.standby == "hot" else {})})
                    progress.console.log(f"failover_now {run + 1}: {failovers[-1]}")
                    progress.advance(task)

                    version = new_version(project.root / "conf", run)
                    progress.update(task, description=f"upgrade {run + 1} to {version}")
                    began = time.monotonic()
                    result = Upgrader(supervisor, verify_s=args.verify_seconds, min_rows=20, timeout_s=600,
                                      progress=lambda line: None).upgrade(INSTANCE)
                    remember_groups(url, project.groups)
                    assert result.state == ("HANDED_OVER" if args.standby == "hot" else "FINISHED"), result.line
                    total = time.monotonic() - began
                    upgrades.append({"version": version, "catch_up_s": result.catch_up_s,
                                     "upgrade_s": round(total, 3),
                                     "rows_compared": sum(c.checked for c in result.checks),
                                     "rows_differing": sum(c.differing for c in result.checks),
                                     "pause_s": None if result.pause_s is None else round(result.pause_s, 3),
                                     **(pause_breakdown(url) if args.standby == "hot" else {})})
                    progress.console.log(f"upgrade {run + 1}: {upgrades[-1]}")
                    progress.advance(task)
            steps = chaos(supervisor, project.root / "conf", url, project.groups) if args.chaos else []
            events = writer.stop()
            _ha.wait_for(lambda: _ha.published_total(url) >= len(events), 180, "every event to be published")
            deadline = time.monotonic() + 60
            while (problems := _ha.mismatches(cluster, events)) and time.monotonic() < deadline:
                time.sleep(2)
        finally:
            writer.stopping.set()
            remember_groups(url, project.groups)
            supervisor.close()

    upgrade_pause = statistics.median(r["pause_s"] for r in upgrades)
    failover_pause = statistics.median(r["pause_s"] for r in failovers)
    result = {"bench": "blue_green", "at": now_iso(), "commit": git_commit(ROOT), "machine": machine_info(),
              "standby": args.standby, "rate_per_s": args.rate, "verify_seconds": args.verify_seconds, "failover_now": failovers,
              "upgrades": upgrades, "median_failover_pause_s": failover_pause,
              "median_upgrade_pause_s": upgrade_pause,
              "upgrade_over_failover_pause": round(upgrade_pause / failover_pause, 2),
              "median_catch_up_s": statistics.median(r["catch_up_s"] for r in upgrades),
              "target_pause_s": TARGET_PAUSE_S, "meets_target": upgrade_pause <= TARGET_PAUSE_S,
              "target_applies": args.standby == "hot",  # a warm upgrade's pause is a warm failover's
              "chaos": steps, "events_written": len(events), "outputs_exact": not problems, "output_problems": problems[:10],
              "note": "pause: from the last batch the old lease holder published to the first its successor "
                      "published (publish_log, PostgreSQL's clock); it includes the trigger interval. catch_up: "
                      "from the upgrade's start (the standby's restart on the new version: re-sync from the ACTIVE's "
                      "checkpoint, spark-submit, its queries) until it was no more than two micro-batches behind the "
                      "ACTIVE (its queries' watermarks); the hand-over waits for that and for the verification"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    console.print_json(json.dumps({k: v for k, v in result.items() if k not in ("machine",)}))


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    main()
