"""Notifications reach a webhook and output asset events queue a downstream DAG, in a real Airflow (``dag.test()``,
SQLite metadata, Variables and connections through Airflow's own API) over real PostgreSQL and Delta tables.

One fresh interpreter runs every DAG of the scenario (Airflow reads its configuration once per process); the
webhook receiver is a thread of this test that records the POSTs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from _airflow import migrated_sqlite
from tandem.config import load_cluster
from tandem.layout import delta_table_dir
from tandem.store import Database, migrate
from tandem.store.supervision import mark

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
TOKEN = "tok-test-5f1d2c"
HOOK = "tandem_test_hook"

DOWNSTREAM_DAG = '''
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

from tandem.airflow.assets import output_asset

with DAG(dag_id="downstream_of_trades", schedule=[output_asset("trades", "trade_aggregates")],
         is_paused_upon_creation=False, tags=["test"]):
    EmptyOperator(task_id="read")
'''

PROBE_DAG = '''
import logging

from airflow.sdk import DAG, task

from tandem.airflow.notifications import notify_conn_ids, notify_supervision_events
from tandem.config import load_cluster
from tandem.store import Database

with DAG(dag_id="supervision_probe", schedule=None, tags=["test"]):

    @task
    def notify(**context):
        """What the supervision DAG's ensure and react tasks do after reconciling."""
        with Database(load_cluster().database_url) as db:
            notices = notify_supervision_events(logging.getLogger("probe"), db, "trades", notify_conn_ids(), context,
                                                cause="DEAD on node-a: no liveness beat for 3 s")
        return [n.summary for n in notices]

    notify()
'''

SCENARIO = '''
import json, sys
from sqlalchemy import select
from airflow.dag_processing.dagbag import DagBag
from airflow.models.asset import AssetDagRunQueue, AssetEvent, AssetModel
from airflow.models.dag import DagModel
from airflow.utils.session import create_session
from tandem.config import load_cluster
from tandem.store import Database
from tandem.store.supervision import mark

bag = DagBag(sys.argv[1], safe_mode=False)
assert not bag.import_errors, bag.import_errors
runs = []
for step, what, arg in json.loads(sys.argv[2]):
    if step == "events":
        with Database(load_cluster().database_url) as db:
            for e in what:
                mark(db, "trades", e.pop("instance"), e.pop("kind"), e.pop("reason"), **e)
        continue
    run = bag.dags[what].test(run_conf=arg or None)
    runs.append({"dag_id": what, "state": str(run.state),
                 "tis": {ti.task_id: str(ti.state) for ti in run.get_task_instances()}})
with create_session() as session:
    names = {a.id: a.name for a in session.scalars(select(AssetModel))}
    events = [{"asset": names[e.asset_id], "dag": e.source_dag_id, "task": e.source_task_id, "extra": e.extra}
              for e in session.scalars(select(AssetEvent))]
    queued = [{"dag": q.target_dag_id, "asset": names[q.asset_id]} for q in session.scalars(select(AssetDagRunQueue))]
    _, triggered = DagModel.dags_needing_dagruns(session)
print("RESULT " + json.dumps({"runs": runs, "events": events, "queued": queued, "triggered": sorted(triggered)},
                             default=str))
'''


class Receiver(ThreadingHTTPServer):
    """A webhook: records each request's method, path, Authorization header and JSON body; answers 204, or
    ``redirect`` (a status and a ``Location``) when given."""

    def __init__(self, redirect: tuple[int, str] | None = None) -> None:
        self.posts: list[dict[str, Any]] = []

        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.posts.append({"method": self.command, "path": self.path,
                                       "authorization": self.headers.get("Authorization"),
                                       "body": json.loads(body) if body else None})
                if redirect is None:
                    self.send_response(204)
                else:
                    self.send_response(redirect[0])
                    self.send_header("Location", redirect[1])
                    self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_PUT = do_POST  # noqa: N815 - a redirected POST may come back as another method

            def log_message(self, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def serving(server: Receiver) -> Iterator[Receiver]:
    """``server`` answering on a thread until the block ends (then shut and closed, whatever happened)."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with serving(Receiver()) as server:
        yield server


def scenario_env(tmp_path: Path, port: int) -> tuple[dict[str, str], Path]:
    """A private Airflow (SQLite) whose DAGs folder holds the backfill and maintenance DAGs, the probe and the
    downstream DAG; the webhook connection and TANDEM_NOTIFY_CONN_IDS in its environment."""
    dags = tmp_path / "dags"
    dags.mkdir()
    for name in ("tandem_backfill.py", "tandem_maintenance.py"):
        shutil.copy(REPO / "dags" / name, dags / name)
    (dags / "downstream_of_trades.py").write_text(DOWNSTREAM_DAG)
    (dags / "supervision_probe.py").write_text(PROBE_DAG)
    home = tmp_path / "airflow"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        f"AIRFLOW_CONN_{HOOK.upper()}": json.dumps({"conn_type": "http", "host": f"http://127.0.0.1:{port}/hooks/ops",
                                                    "password": TOKEN}),
        "TANDEM_NOTIFY_CONN_IDS": HOOK,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    })
    migrated_sqlite(home, env)
    return env, dags


def small_delta_files(path: Path, count: int) -> None:
    """``count`` appends to the Delta table at ``path``: as many small files for compaction to merge."""
    from deltalake import write_deltalake

    for i in range(count):
        write_deltalake(str(path), pa.table({"symbol": [f"S{i}"], "trade_count": [i]}), mode="append")


def test_notices_reach_a_webhook_once_and_a_changed_output_queues_its_downstream_dag(tmp_path, project, receiver):
    cluster = load_cluster()
    with Database(cluster.database_url) as db:
        migrate(db)
        mark(db, "trades", "shard-1", "PROMOTED", "lease free", node="node-a", epoch=1)  # the first start
        mark(db, "trades", "shard-1", "PROMOTED", "lease of node-a expired 3.2 s ago", node="node-b",
             previous_node="node-a", epoch=2)
        mark(db, "trades", "shard-2", "BLOCK", "failed the same way at batch 7 again", node="node-b")
    small_delta_files(delta_table_dir(cluster, "trades", "trade_aggregates"), 3)
    env, dags = scenario_env(tmp_path, receiver.server_address[1])
    later = [{"instance": "shard-2", "kind": "BLOCKED", "reason": "BLOCKED: failed at batch 7", "node": "node-b"},
             {"instance": "shard-1", "kind": "PROMOTED", "reason": "lease of node-b expired", "node": "node-a",
              "previous_node": "node-b", "epoch": 3}]
    steps = [["dag", "supervision_probe", {}], ["events", later, None], ["dag", "supervision_probe", {}],
             ["dag", "tandem_trades_backfill", {"start": "2020-01-01T00:00:00Z", "end": "2020-01-01T01:00:00Z"}],
             ["dag", "tandem_trades_maintenance", {}]]
    done = subprocess.run([sys.executable, "-c", SCENARIO, str(dags), json.dumps(steps)], env=env,
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-6000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    states = {(r["dag_id"], i): r["state"] for i, r in enumerate(result["runs"])}
    assert list(states.values()) == ["success", "success", "failed", "success"], (result["runs"], output[-6000:])
    assert result["runs"][2]["tis"]["register"] == "failed" and result["runs"][2]["tis"]["report"] == "failed"

    posts = receiver.posts
    assert [(p["body"]["event"], p["body"].get("instance"), p["body"].get("epoch")) for p in posts] == [
        ("failover", "shard-1", 2), ("blocked", "shard-2", None), ("failover", "shard-1", 3),
        ("backfill_failed", None, None)], "each failover and block once; one notice of the failed backfill"
    assert all(p["path"] == "/hooks/ops" and p["authorization"] == f"Bearer {TOKEN}" for p in posts)
    failover, blocked, _, backfill = (p["body"] for p in posts)
    assert {k: failover[k] for k in ("source", "plan", "instance", "node", "epoch", "reason")} == {
        "source": "tandem", "plan": "trades", "instance": "shard-1", "node": "node-b", "epoch": 2,
        "reason": "lease of node-a expired 3.2 s ago"}
    assert failover["details"]["previous_node"] == "node-a" and failover["details"]["detected"].startswith("DEAD")
    assert failover["airflow"]["dag_id"] == "supervision_probe" and failover["airflow"]["task_id"] == "notify"
    assert (blocked["node"], blocked["reason"]) == ("node-b", "failed the same way at batch 7 again")
    assert backfill["plan"] == "trades" and backfill["summary"] == "backfill refused" and backfill["reason"]
    assert backfill["airflow"]["task_id"] == "register"
    assert TOKEN not in output, "the webhook's token must never reach a log"

    [event] = result["events"]
    assert (event["asset"], event["dag"], event["task"]) == ("tandem.trades.trade_aggregates",
                                                             "tandem_trades_maintenance", "delta_upkeep")
    assert event["extra"]["changed_by"] == "delta_upkeep" and event["extra"]["files_compacted"] == 3
    assert result["queued"] == [{"dag": "downstream_of_trades", "asset": "tandem.trades.trade_aggregates"}]
    assert "downstream_of_trades" in result["triggered"], "the scheduler would start the downstream DAG now"


@pytest.mark.parametrize("status", [302, 307])
def test_a_webhook_redirecting_to_another_host_is_a_failed_delivery_and_the_token_never_reaches_that_host(
        monkeypatch, status):
    """Two real servers on two ports (two origins): the configured one answers with a redirect to the other."""
    import logging
    from logging.handlers import BufferingHandler

    from tandem.airflow.notifications import FAILOVER, Notice, TandemWebhookNotifier, WebhookError, send_notice

    conn_id = f"tandem_redirecting_hook_{status}"
    with serving(Receiver()) as elsewhere, \
            serving(Receiver(redirect=(status, f"{elsewhere.url}/collect?from=tandem"))) as hook:
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
            {"conn_type": "http", "host": f"{hook.url}/hooks/ops", "password": TOKEN}))
        with pytest.raises(WebhookError) as refused:
            TandemWebhookNotifier(webhook_conn_id=conn_id, payload={"event": "failover"}).notify({})
        notice = Notice(FAILOVER, "trades", "shard-1: node-b took over from node-a at epoch 2")
        log, records = logging.getLogger(f"webhook-test-{status}"), BufferingHandler(100)
        log.addHandler(records)
        try:
            sent = send_notice(notice, [conn_id], {}, log)
        finally:
            log.removeHandler(records)
    assert [p["authorization"] for p in hook.posts] == [f"Bearer {TOKEN}"] * 2, "the configured host got both"
    assert elsewhere.posts == [], "nothing, and above all not the token, reaches the host the redirect names"
    message = str(refused.value)
    assert f"HTTP {status}" in message and "redirect" in message and "not followed" in message
    assert f"127.0.0.1:{elsewhere.server_address[1]}" in message and "/collect" not in message
    assert sent == [], "a refused redirect is a failed delivery"
    logged = "\n".join(record.getMessage() for record in records.buffer)
    assert "not followed" in logged and TOKEN not in logged + message


def test_a_reconciles_repair_emits_an_event_per_output_it_changed_and_says_so_in_an_xcom(project):
    """The reconcile Spark task's ``post_execute`` hook finds the backfill its job ran as the repair (by its
    ``requested_by``) in PostgreSQL."""
    from datetime import datetime, timedelta, timezone

    from airflow.sdk.execution_time.context import OutletEventAccessors

    from tandem.airflow.assets import RepairedOutputs, outputs_alias
    from tandem.store import backfills as catalog

    class TI:
        def __init__(self) -> None:
            self.pushed: dict[str, Any] = {}

        def xcom_push(self, key: str, value: Any) -> None:
            self.pushed[key] = value

    class Task:
        outlets = [outputs_alias("trades")]

    def hook_context(run_id: str) -> dict[str, Any]:
        return {"run_id": run_id, "ti": TI(), "task": Task(), "outlet_events": OutletEventAccessors()}

    day = datetime(2026, 11, 30, tzinfo=timezone.utc)
    with Database(load_cluster().database_url) as db:
        migrate(db)
        other = catalog.register(db, "trades", day - timedelta(days=1), day, ["shard-1"], "tandem backfill")
        catalog.finish(db, other.id, catalog.DONE, {"shard-1": {"trade_aggregates": {"recomputed": True,
                                                                                      "rows_written": 9}}})
        repair = catalog.register(db, "trades", day.replace(hour=1), day.replace(hour=2), ["shard-1", "shard-2"],
                                  "reconcile scheduled__2026-12-01T01:00:00+00:00")
        catalog.finish(db, repair.id, catalog.DONE, {
            "shard-1": {"trade_aggregates": {"recomputed": True, "seconds_before": 4, "events_before": 10,
                                             "seconds_after": 4, "events_after": 12, "rows_written": 4}},
            "shard-2": {"trade_aggregates": {"recomputed": True, "seconds_before": 0, "events_before": 0,
                                             "seconds_after": 0, "events_after": 0, "rows_written": 0}}})
    hook = RepairedOutputs("trades")
    context = hook_context("scheduled__2026-12-01T01:00:00+00:00")
    hook(context, None)
    [event] = context["outlet_events"][outputs_alias("trades")].asset_alias_events
    assert event.dest_asset_key.uri == "x-tandem://trades/trade_aggregates"
    assert (event.extra["changed_by"], event.extra["backfill_id"]) == ("reconcile repair", repair.id)
    assert list(event.extra["instances"]) == ["shard-1"]
    assert context["ti"].pushed["repaired"] == {"backfill_id": repair.id, "status": "DONE",
                                                "outputs": ["trade_aggregates"]}
    quiet = hook_context("scheduled__2026-12-02T01:00:00+00:00")
    hook(quiet, None)
    assert not quiet["outlet_events"][outputs_alias("trades")].asset_alias_events, "no repair, no event"
    assert "repaired" not in quiet["ti"].pushed
