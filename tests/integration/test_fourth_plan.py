"""A fourth plan that is only a YAML and a module (issue 25's acceptance test).

A temp project holds one plan, ``fraud_alerts``, as ``conf/plans/fraud_alerts.yaml`` and
``conf/plans/fraud_alerts.py`` (copied from ``tests/integration/fraud_alerts/``; the copy's YAML gets
a supervisor's stall timeout fit for a loaded test machine, :data:`HA`): no bundled code knows it.
Stream ``payments {card_id, merchant, amount, time}``; one query with ``transformWithStateInPandas``
routes every payment to ``card_totals`` (a ``table`` with ``id``) and every card-testing alert to
``fraud_alerts`` (``events``, emitted once final).

With real processes: ``tandem config check`` and ``tandem produce`` (subprocesses); under a steady
writer, Tandem's supervisor (:class:`~tandem.supervisor.reconcile.Supervisor`, the observe → decide →
act loop the supervision DAG runs each round) launches the ACTIVE and then the hot PASSIVE, re-synced
from it, as spark-submit jobs; a kill -9 of the ACTIVE's process group (the PASSIVE takes the lease by
itself); a supervisor round that sees the killed node DEAD, stops what is left of it, re-syncs it from
the new ACTIVE and relaunches it as PASSIVE (in a thread, while the test goes on: a snapshot of the new
ACTIVE mid-stream, the end of the input). Then, with the relaunched PASSIVE running, every output
(PostgreSQL and Delta) must equal the plain-Python reference below over every payment in the landing
folders, with no epoch published by two nodes. Then a restore to the snapshot (it stops both
instances; nothing is relaunched) and a replay from its cut: the outputs must still be exactly the
reference (the replay re-emits rows already published: none may count twice). The reference
restates the plan's rules without its code. Every process group the supervisor launched is killed
after the test, whatever happens.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from _ha import (Pair, PlanWriter, Reconciling, db_now, failover_events, fetch, instance_row, launched, lease,
                 register_last_launches, split_brain, wait_for)
from tandem.checkpoints import committed_batch
from tandem.config import ClusterConfig, load_cluster, load_plan
from tandem.lake.tables import read_table, table_exists
from tandem.layout import checkpoint_dir, delta_table_dir, landing_dir, snapshot_dir
from tandem.outputs.events import read_events_lake
from tandem.outputs.table import read_table_lake
from tandem.packaging import build_dist
from tandem.producer import advance_watermark
from tandem.runtime.node import run_instance
from tandem.snapshots.restore import restore_instance
from tandem.snapshots.state_export import STATE_TABLE, TIMERS, read_state
from tandem.snapshots.take import take_snapshot
from tandem.supervisor.health import DEAD
from tandem.supervisor.launch_decision import ENDED_STATUSES
from tandem.supervisor.reconcile import Supervisor

pytestmark = pytest.mark.integration

PLAN, INSTANCE, STREAM = "fraud_alerts", "cards-1", "payments"
PLAN_FILES = Path(__file__).resolve().parent / "fraud_alerts"
TANDEM = Path(sys.executable).with_name("tandem")

# the plan's rules, restated (docs of fraud_alerts.py): tiny < 2.00, large >= 500.00, within 30 s
TINY_BELOW, LARGE_AT_LEAST, WITHIN_MS = 2.0, 500.0, 30_000

Payment = tuple[str, int, str, float]  # (card_id, time, merchant, amount)
Alert = tuple[str, int, str, float, int, str, float]  # the tiny payment, then (time, merchant, amount) of the large one


# --- the reference -------------------------------------------------------------------------------------------


def reference(payments: set[Payment]) -> tuple[list[Alert], dict[str, tuple[int, float]]]:
    """The alerts (sorted) and per card (payments, amount), by brute force: a payment is its four fields.

    Every tiny payment gets the earliest large payment of its card with ``tiny < large <= tiny + 30 s``
    (ties by merchant, then amount), if there is one.
    """
    by_card: dict[str, list[Payment]] = defaultdict(list)
    for p in payments:
        by_card[p[0]].append(p)
    alerts, totals = [], {}
    for card, mine in by_card.items():
        totals[card] = (len(mine), round(sum(p[3] for p in mine), 2))
        large = sorted((p for p in mine if p[3] >= LARGE_AT_LEAST), key=lambda p: (p[1], p[2], p[3]))
        for tiny in (p for p in mine if p[3] < TINY_BELOW):
            after = [p for p in large if tiny[1] < p[1] <= tiny[1] + WITHIN_MS]
            if after:
                alerts.append((*tiny, after[0][1], after[0][2], after[0][3]))
    return sorted(alerts), totals


def test_the_reference_itself() -> None:
    """The oracle on a hand-made card: edges of the window, ties, a large payment at the tiny one's time."""
    t = 1_000_000
    payments = {("c", t, "m", 1.0), ("c", t, "big", 900.0),  # a large one at the same time does not count
                ("c", t + 30_000, "z", 600.0), ("c", t + 30_000, "a", 700.0),  # the edge counts; tie: merchant a
                ("c", t + 40_000, "m", 1.5), ("c", t + 70_001, "x", 800.0),  # 30.001 s later: too late
                ("d", t + 1, "m", 0.5), ("d", t + 2, "m", 5000.0), ("d", t + 3, "m", 600.0)}
    alerts, totals = reference(payments)
    assert alerts == [("c", t, "m", 1.0, t + 30_000, "a", 700.0), ("d", t + 1, "m", 0.5, t + 2, "m", 5000.0)]
    assert totals == {"c": (6, round(1.0 + 900 + 600 + 700 + 1.5 + 800, 2)), "d": (3, 5600.5)}


# --- what was written, and what was published ----------------------------------------------------------------


def written_payments(cluster: ClusterConfig, partitions: int) -> list[Payment]:
    """Every payment in the landing folders (hidden files are a writer's temporary files: Spark skips them too)."""
    out = []
    for partition in range(partitions):
        for path in sorted(landing_dir(cluster, STREAM, partition).glob("*")):
            if path.is_file() and not path.name.startswith("."):
                for line in path.read_text().splitlines():
                    e = json.loads(line)
                    out.append((e["card_id"], e["time"], e["merchant"], e["amount"]))
    return out


def alert_of(row: dict) -> Alert:
    return (row["card_id"], int(row["time"]), row["merchant"], float(row["amount"]),
            int(row["large_time"]), row["large_merchant"], float(row["large_amount"]))


def postgres_alerts(url: str) -> list[Alert]:
    return sorted(alert_of(r["payload"]) for r in fetch(
        url, "SELECT payload FROM output_events WHERE plan = %s AND output = 'fraud_alerts'", (PLAN,)))


def postgres_totals(url: str) -> dict[str, tuple[int, float]]:
    rows = fetch(url, "SELECT key->>'card_id' AS card, sum((value->>'payments')::numeric) AS n, "
                      "sum((value->>'amount')::numeric) AS amount FROM output_table_rows "
                      "WHERE plan = %s AND output = 'card_totals' GROUP BY 1", (PLAN,))
    return {r["card"]: (int(r["n"]), round(float(r["amount"]), 2)) for r in rows}


def published_payments(url: str, node: str, epoch: int) -> bool:
    """Whether ``node`` has published a batch of the ``payments`` query's outputs at ``epoch``."""
    return bool(fetch(url, "SELECT 1 FROM publish_log WHERE plan = %s AND instance = %s AND node = %s AND epoch = %s "
                           "AND output IN ('card_totals', 'fraud_alerts') LIMIT 1", (PLAN, INSTANCE, node, epoch)))


def outputs(cluster: ClusterConfig, plan) -> dict[str, object]:
    """Every output as the test compares it: alerts and totals from PostgreSQL and from Delta, and the quarantine."""
    url = cluster.database_url
    lake_totals = read_table_lake(delta_table_dir(cluster, PLAN, "card_totals"), plan.outputs["card_totals"])
    quarantine = delta_table_dir(cluster, PLAN, "quarantine")
    return {
        "postgres alerts": postgres_alerts(url),
        "delta alerts": sorted(alert_of(r) for r in read_events_lake(delta_table_dir(cluster, PLAN, "fraud_alerts"))
                               .to_pylist()),
        "postgres totals": postgres_totals(url),
        "delta totals": {r["card_id"]: (int(r["payments"]), round(r["amount"], 2)) for r in lake_totals},
        "quarantine": read_table(quarantine).num_rows if table_exists(quarantine) else 0,
    }


def differences(got: dict[str, object], alerts: list[Alert], totals: dict[str, tuple[int, float]]) -> list[str]:
    """Each output that is not exactly the reference, with what is missing and what is extra ([] when all are)."""
    problems = []
    for name in ("postgres alerts", "delta alerts"):
        if got[name] != alerts:
            missing = sorted(set(alerts) - set(got[name]))
            extra = sorted(set(got[name]) - set(alerts))
            problems.append(f"{name}: {len(got[name])} rows, {len(alerts)} expected; missing {missing[:3]}, "
                            f"extra {extra[:3]}" + (", a row twice" if not missing and not extra else ""))
    for name in ("postgres totals", "delta totals"):
        if got[name] != totals:
            wrong = {card: (got[name].get(card), totals.get(card)) for card in set(got[name]) | set(totals)
                     if got[name].get(card) != totals.get(card)}
            problems.append(f"{name}: (published, expected) per card: {dict(sorted(wrong.items())[:4])}")
    if got["quarantine"]:
        problems.append(f"quarantine: {got['quarantine']} rows, none expected")
    return problems


# --- the CLI -------------------------------------------------------------------------------------------------


def tandem(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess:
    """``tandem ARGS`` in a subprocess, with the temp project's environment (``TANDEM_*``, set by the fixtures)."""
    done = subprocess.run([str(TANDEM), *args], env=dict(os.environ), capture_output=True, text=True,
                          timeout=timeout_s)
    assert done.returncode == 0, f"tandem {' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


HA = "ha:\n  stall_timeout: 2 minutes\n"
"""What the test adds to its copy of fraud_alerts.yaml (the default stall timeout is 30 s): on the loaded 2-core
test machine a micro-batch of the ``transformWithStateInPandas`` query took 35 to 70 s (the first one while the other
node's JVM starts, the new ACTIVE's first after the takeover), and with 30 s the supervisor stopped each instance in
turn as STALLED (a flapping loop)."""


def install_the_plan(project: Path) -> None:
    """The temp project's conf/plans holds fraud_alerts.yaml (with :data:`HA` added) and fraud_alerts.py, and nothing
    else."""
    plans = project / "conf" / "plans"
    for path in plans.iterdir():
        path.unlink()
    for name in ("fraud_alerts.yaml", "fraud_alerts.py"):
        shutil.copy(PLAN_FILES / name, plans / name)
    declared = (plans / "fraud_alerts.yaml").read_text()
    assert "\nha:" not in declared, "the plan declares its own ha: the test's HA would clash with it"
    (plans / "fraud_alerts.yaml").write_text(declared.rstrip("\n") + "\n" + HA)


# --- the test ------------------------------------------------------------------------------------------------


def cut_watermark(query_dir: Path) -> int:
    """The event-time watermark (epoch ms) of the last batch a query checkpoint (here a snapshot's cut) committed."""
    batch = committed_batch(query_dir)
    return json.loads((query_dir / "offsets" / str(batch)).read_text().splitlines()[1])["batchWatermarkMs"]


def test_a_plan_of_a_yaml_and_a_module_fails_over_and_restores_exactly_once(project: Path, database_url: str,
                                                                           process_groups: list[int], spark) -> None:
    started = time.monotonic()
    install_the_plan(project)
    checked, yaml_path = tandem("config", "check"), project / "conf" / "plans" / "fraud_alerts.yaml"
    assert f"{yaml_path}: ok: plan fraud_alerts" in checked.stdout, checked.stdout
    assert "queries payments, quarantine" in checked.stdout and "1 of 1 plan file(s) valid" in checked.stdout
    tandem("produce", PLAN, "--rate", "10", "--duration", "2", "--seed", "7")  # the initial load
    print(f"config check and the initial load took {time.monotonic() - started:.1f}s", flush=True)

    cluster = load_cluster()
    plan = load_plan(PLAN, cluster)
    url = cluster.database_url
    dist = build_dist(project)
    pair = Pair(cluster, plan, dist, process_groups, instance=INSTANCE)  # notes, logs, kills; the supervisor launches
    supervisor = Supervisor(cluster, plan, launched_by="test_fourth_plan", py_files=dist, running_timeout_s=300)
    writer = PlanWriter(cluster, plan, rate=10, seed=11)  # the module's generator: card tests among payments
    relaunch = Reconciling(supervisor, INSTANCE, "test: the ACTIVE was killed")
    try:
        try:
            writer.start()  # a backlog piles up while the JVMs start: the first alerts are final at the first batches
            # one round: the ACTIVE (it takes the free lease before it reports RUNNING), then the PASSIVE re-synced
            # from it; a launch waits for RUNNING, so the PASSIVE cannot take a never-held lease first
            report = supervisor.reconcile(INSTANCE, cause="test: start the pair")
            pair.note("\n".join(report.lines()))
            assert report.converged and not report.failed, report.lines()
            assert launched(report, pair) == [("node-a", "ACTIVE"), ("node-b", "PASSIVE")], report.lines()
            resynced_at = {s.action.node: ((s.data.get("cut") or {}).get("payments") or {}).get("batch_id")
                           for s in report.steps if s.action.kind == "LAUNCH"}  # the PASSIVE's start: a cut, or none
            wait_for(lambda: postgres_alerts(url), 240, "the first alerts", detail=lambda: pair.log_tail("node-a"))
            before = lease(url, PLAN, INSTANCE)  # the roles as the runtime holds them, whatever the launches were
            active, standby = before["holder"], ({"node-a", "node-b"} - {before["holder"]}).pop()
            standby_query = checkpoint_dir(cluster, PLAN, INSTANCE, standby, "payments")
            wait_for(lambda: (batch := committed_batch(standby_query)) is not None
                     and (resynced_at.get(standby) is None or batch > resynced_at[standby]), 240,
                     f"{standby} to process the backlog",  # a batch of its own, after the cut it was re-synced to
                     detail=lambda: pair.log_tail(standby))  # it holds what it would publish: the takeover flushes it
            pair.note(f"{active} publishes alerts, {standby} has processed the backlog")
            pair.kill(active, signal.SIGKILL)
            promoted = wait_for(lambda: pair.promoted(standby, before["epoch"]), 20,
                                f"{standby} to take over from the killed {active}",
                                detail=lambda: pair.log_tail(standby))
            pair.note(f"SIGKILL {active} -> {standby} PROMOTED at epoch {promoted['epoch']}")
            wait_for(lambda: supervisor.observe(INSTANCE).view.health(active).state == DEAD, 30,
                     f"the supervisor to see {active} DEAD")
            relaunched_since = db_now(url)
            relaunch.start()  # stop, re-sync from the new ACTIVE, relaunch as PASSIVE: meanwhile the test goes on
            wait_for(lambda: published_payments(url, standby, promoted["epoch"]), 120,
                     f"{standby} to publish payments", detail=lambda: pair.log_tail(standby))
        finally:
            by_writer = writer.stop()
        snapshot = take_snapshot(cluster, plan, INSTANCE, spark)  # the new ACTIVE's, while it works through the last files
        pair.note(f"snapshot: {snapshot.summary()}")
        assert snapshot.good and snapshot.record.node == standby and "payments" in snapshot.record.query_batches, \
            snapshot.summary()
        advance_watermark(cluster, plan, int(time.time() * 1000) + 3_600_000)  # every alert becomes final

        payments = written_payments(cluster, plan.streams[STREAM].partitions)
        assert {(e["card_id"], e["time"], e["merchant"], e["amount"]) for e in by_writer[STREAM]} <= set(payments)
        alerts, totals = reference(set(payments))
        assert len(alerts) >= 5, f"the input must raise alerts: {len(alerts)} of {len(payments)} payments"
        cut_at = cut_watermark(snapshot_dir(cluster, PLAN, snapshot.record.id) / "payments")
        after_the_cut = [a for a in alerts if a[4] > cut_at]
        assert after_the_cut, \
            "the replay after the restore must emit again alerts the new ACTIVE published after the cut"

        # the supervisor's round after the kill: the killed node stopped, re-synced from the new ACTIVE, PASSIVE again
        report = relaunch.report(360)
        pair.note("\n".join(report.lines()))
        assert report.converged and not report.failed, report.lines()
        assert [(s.action.kind, s.action.node) for s in report.steps] == [("STOP", active), ("LAUNCH", active)], \
            report.lines()
        assert "DEAD" in report.steps[0].action.reason, report.lines()
        assert launched(report, pair) == [(active, "PASSIVE")], report.lines()
        assert report.steps[1].action.resync_from == standby, report.lines()
        cut = report.steps[1].data.get("cut") or {}
        assert (cut.get("payments") or {}).get("batch_id") is not None, f"{active} was not re-synced: {cut}"
        recorded = [(e["kind"], e["node"], e["previous_node"]) for e in failover_events(
            url, since=relaunched_since, kinds=("STOP", "RESYNC", "RESYNC_FAILED", "LAUNCH"), plan=PLAN, instance=INSTANCE)]
        assert recorded == [("STOP", active, None), ("LAUNCH", active, None), ("RESYNC", active, standby)], recorded
        row = instance_row(url, active, PLAN, INSTANCE)
        assert (row["status"], row["role"]) == ("RUNNING", "PASSIVE"), row
        assert lease(url, PLAN, INSTANCE)["holder"] == standby, "the relaunched PASSIVE took the lease from a live ACTIVE"

        # the failover: the new ACTIVE publishes everything, exactly once, in PostgreSQL and Delta (the PASSIVE runs)
        wait_for(lambda: not differences(outputs(cluster, plan), alerts, totals), 90,
                 f"{standby} to publish every output",
                 detail=lambda: "\n".join([*differences(outputs(cluster, plan), alerts, totals),
                                           pair.log_tail(standby)]))
        assert split_brain(url, PLAN, INSTANCE) == []
        pair.note(f"after the failover: {len(alerts)} alerts ({len(after_the_cut)} after the cut) and {len(payments)} "
                  f"payments of {len(totals)} cards, exactly; {active} runs as PASSIVE")

        # the snapshot's state: watched payments are tiny or large payments the test wrote, of their card
        state = read_state(delta_table_dir(cluster, PLAN, STATE_TABLE), snapshot.record.id)
        assert {r["store_name"] for r in state} <= {"watched", "progress", TIMERS} and state, state[:3]
        watched = {(r["key"]["card_id"], e["time"], e["merchant"], e["amount"])
                   for r in state if r["store_name"] == "watched" for e in r["value"]}
        assert watched <= set(payments)
        assert all(p[3] < TINY_BELOW or p[3] >= LARGE_AT_LEAST for p in watched)

        # restore the new ACTIVE's cut (both instances stopped first, none relaunched) and replay everything after it:
        # the outputs are kept, and nothing counts twice
        lines = restore_instance(cluster, plan, INSTANCE, snapshot_id=snapshot.record.id, start=False).lines()
        pair.note("\n".join(lines))
        ended = {n: instance_row(url, n, PLAN, INSTANCE)["status"] for n in plan.nodes}
        assert all(status in ENDED_STATUSES for status in ended.values()), f"the restore left running: {ended}"
        query_dir = checkpoint_dir(cluster, PLAN, INSTANCE, standby, "payments")
        assert committed_batch(query_dir) == snapshot.record.query_batches["payments"]
        result = run_instance(cluster, plan, standby, INSTANCE, spark=spark, available_now=True)
        assert result.status == "STOPPED", result.error
        assert committed_batch(query_dir) > snapshot.record.query_batches["payments"], "the replay processed nothing"
        assert differences(outputs(cluster, plan), alerts, totals) == []
        assert split_brain(url, PLAN, INSTANCE) == []
        pair.note("after the restore and the replay: every output exactly the reference")
    finally:
        if relaunch.is_alive():  # the test failed while the supervisor relaunches: let its launch end, then kill it
            relaunch.join(360)
        register_last_launches(pair)
        supervisor.close()


def test_a_new_plan_runs_as_written(project: Path, spark) -> None:
    """`tandem plan new`'s two files, unedited: sample events from the declarations, one available-now run,
    and the events output exactly the events whose value is at least the module's threshold."""
    from tandem.producer import produce
    from tandem.scaffold import new_plan

    cluster = load_cluster()
    new_plan(cluster, "readings")
    plan = load_plan("readings", cluster)
    written: list[dict] = []
    ticks = iter(range(1_700_000_000, 1_800_000_000))  # a clock one second further at every call: no sleeping
    files = list(produce(cluster, plan, rate=40, duration_s=2, clock=ticks.__next__,
                         on_tick=lambda batch: written.extend(e for e, _ in batch["readings_events"])))
    assert files and len(written) == 80
    result = run_instance(cluster, plan, plan.nodes[0], plan.instances[0], spark=spark, available_now=True)
    assert result.status == "STOPPED", result.error
    expected = sorted({(e["device_id"], e["value"], e["time"]) for e in written if e["value"] >= 50.0})  # one per key
    published = sorted((r["payload"]["device_id"], r["payload"]["value"], r["payload"]["time"]) for r in fetch(
        cluster.database_url, "SELECT payload FROM output_events WHERE plan = 'readings' AND output = 'high_values'"))
    assert expected and published == expected
