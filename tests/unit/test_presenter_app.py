"""The presenter's app in-process: per-plan read rights, the page header on cookie POSTs, the page's
framing policy, and where an action calls Airflow.

Airflow's user, auth manager and REST API are hand-written fakes here (the fake REST API is a real
HTTP server on loopback that records what it gets); the e2e tests run the same app inside a real
Airflow.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pyarrow as pa
import pytest
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient
from tandem.config import load_cluster
from tandem.lake.tables import append_once
from tandem.layout import delta_table_dir
from tandem.outputs.quarantine import QUARANTINE_SCHEMA
from tandem.presenter import access
from tandem.presenter.api import auth_manager, create_app, dag_teams

TRADES_ONLY = {("GET", "tandem_trades_supervise"), ("POST", "tandem_trades_supervise"), ("POST", "tandem_ops")}
"""ann reads and acts on trades only: acting is triggering the plan's own DAG, and the DAG that carries the action out."""


@dataclass
class FakeUser:
    name: str

    def get_name(self) -> str:
        return self.name


@dataclass
class FakeAuthManager:
    grants: set[tuple[str, str]]

    def is_authorized_dag(self, *, method, user, access_entity=None, details=None) -> bool:
        return (method, details.id) in self.grants


@dataclass
class FakeAirflowApi:
    """Airflow's ``POST /api/v2/dags/{dag_id}/dagRuns`` on a loopback port: records each call, answers queued."""

    calls: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        calls = self.calls

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                calls.append({"path": self.path, "authorization": self.headers.get("Authorization"), "body": body})
                answer = json.dumps({"dag_run_id": body["dag_run_id"], "state": "queued"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake_airflow() -> Iterator[FakeAirflowApi]:
    api = FakeAirflowApi()
    yield api
    api.close()


@pytest.fixture
def app(conf: Path, fake_airflow: FakeAirflowApi, monkeypatch: pytest.MonkeyPatch):
    """The app over the shipped plans, with Airflow's base_url unset and its API at the fake's address."""
    monkeypatch.setenv("TANDEM_CONF_DIR", str(conf))
    monkeypatch.setenv("TANDEM_AIRFLOW_URL", fake_airflow.url)
    monkeypatch.setenv("TANDEM_DATABASE_URL", "postgresql://nobody@127.0.0.1:9/none")  # never reached here
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "")
    app = create_app()
    app.dependency_overrides[get_user] = lambda: FakeUser("ann")
    app.dependency_overrides[auth_manager] = lambda: FakeAuthManager(TRADES_ONLY)
    app.dependency_overrides[dag_teams] = lambda: access.no_teams
    return app


def test_reads_are_limited_to_the_plans_whose_dag_the_user_may_read(app) -> None:
    client = TestClient(app)
    assert [p["name"] for p in client.get("/api/v1/plans").json()] == ["trades"]
    assert client.get("/api/v1/plans/trades").status_code == 200
    for path in ("/plans/pizza_shop", "/plans/pizza_shop/status", "/plans/pizza_shop/timeline",
                 "/plans/pizza_shop/snapshots", "/plans/pizza_shop/quarantine", "/plans/pizza_shop/batch",
                 "/plans/pizza_shop/outputs/order_stats/aggregates", "/plans/pizza_shop/outputs/delivered_orders/rows",
                 "/plans/pizza_shop/outputs/overdue_orders/events"):
        response = client.get(f"/api/v1{path}")
        assert response.status_code == 403, path
        assert response.json()["detail"] == ("ann may not read plan pizza_shop "
                                             "(Airflow denies reading its DAG tandem_pizza_shop_supervise)")
    missing = client.get("/api/v1/plans/nope/status")
    assert missing.status_code == 404 and missing.json()["detail"] == "no plan 'nope' (plans you may read: trades)"


def test_a_cookie_post_needs_the_page_header_and_a_bearer_post_does_not(app, fake_airflow: FakeAirflowApi) -> None:
    client = TestClient(app)
    action = {"action": "snapshot_now", "instance": "shard-1"}
    forged = client.post("/api/v1/plans/trades/actions", json=action, cookies={"_token": "cookie-jwt"})
    assert forged.status_code == 403 and "X-Tandem-Request: 1" in forged.json()["detail"]
    assert fake_airflow.calls == []
    from_page = client.post("/api/v1/plans/trades/actions", json=action, cookies={"_token": "cookie-jwt"},
                            headers={"X-Tandem-Request": "1"})
    assert from_page.status_code == 201, from_page.text
    assert fake_airflow.calls[-1]["authorization"] == "Bearer cookie-jwt"
    by_api = client.post("/api/v1/plans/trades/actions", json=action, headers={"Authorization": "Bearer api-jwt"})
    assert by_api.status_code == 201, by_api.text
    assert fake_airflow.calls[-1]["authorization"] == "Bearer api-jwt"


def test_an_action_calls_the_configured_airflow_never_the_request_host(app, fake_airflow: FakeAirflowApi) -> None:
    client = TestClient(app, base_url="http://attacker.invalid:9")
    response = client.post("/api/v1/plans/trades/actions", json={"action": "failover_now", "instance": "shard-1"},
                           headers={"Authorization": "Bearer api-jwt"})
    assert response.status_code == 201, response.text
    [call] = fake_airflow.calls
    assert call["path"] == "/api/v2/dags/tandem_ops/dagRuns" and call["authorization"] == "Bearer api-jwt"
    assert call["body"]["conf"] == {"action": "failover_now", "plan": "trades", "instance": "shard-1", "node": ""}
    run = response.json()
    assert run["url"] == f"{fake_airflow.url}/dags/tandem_ops/runs/{run['dag_run_id']}"


def test_an_action_needs_the_right_to_act_on_its_own_plan_not_only_on_tandem_ops(app,
                                                                              fake_airflow: FakeAirflowApi) -> None:
    """ann may read both plans and trigger tandem_ops and tandem_restore, but act on trades only (trigger its
    supervision DAG): every action on pizza_shop is refused before Airflow is called, and on trades it goes through."""
    reads = {("GET", "tandem_trades_supervise"), ("GET", "tandem_pizza_shop_supervise")}
    carriers = {("POST", "tandem_ops"), ("POST", "tandem_restore")}
    app.dependency_overrides[auth_manager] = lambda: FakeAuthManager(
        reads | carriers | {("POST", "tandem_trades_supervise")})
    client = TestClient(app)
    headers = {"Authorization": "Bearer api-jwt"}
    for done, action in enumerate(({"action": "failover_now"}, {"action": "snapshot_now"},
                                   {"action": "drain_node", "node": "node-a"}, {"action": "restart_node", "node": "node-a"},
                                   {"action": "restore", "confirm": True})):
        refused = client.post("/api/v1/plans/pizza_shop/actions", json=action, headers=headers)
        assert refused.status_code == 403, (action, refused.text)
        assert refused.json()["detail"] == ("ann may not act on plan pizza_shop "
                                            "(Airflow denies triggering its DAG tandem_pizza_shop_supervise)"), action
        assert len(fake_airflow.calls) == done, action
        allowed = client.post("/api/v1/plans/trades/actions", json=action, headers=headers)
        assert allowed.status_code == 201, (action, allowed.text)
    assert [call["path"] for call in fake_airflow.calls] == ["/api/v2/dags/tandem_ops/dagRuns"] * 4 + [
        "/api/v2/dags/tandem_restore/dagRuns"]
    assert fake_airflow.calls[-1]["body"]["conf"]["confirm"] is True, "tandem_restore refuses a run without confirm"


def test_the_page_may_be_framed_by_airflow_only(app) -> None:
    response = TestClient(app).get("/")
    assert response.status_code == 200
    assert response.headers["content-security-policy"] == "frame-ancestors 'self'"
    assert response.headers["cache-control"] == "no-store"


@pytest.fixture
def events(database_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The app's database: migrated, with one supervision event per instance of the trades plan."""
    from tandem.store import Database, migrate
    from tandem.store.supervision import mark

    with Database(database_url) as db:
        migrate(db)
        for instance in ("shard-1", "shard-2"):
            mark(db, "trades", instance, "DETECTED", f"test: {instance}", node="node-a")
    monkeypatch.setenv("TANDEM_DATABASE_URL", database_url)
    return database_url


def test_responses_name_the_instance_and_the_deprecated_shard_id_still_works(app, events,
                                                                               fake_airflow: FakeAirflowApi) -> None:
    """Until the next release a client of the former names is served: the ``instance`` query parameter and
    body field are accepted, and each response repeats ``instance`` as ``instance`` (marked deprecated)."""
    client = TestClient(app)
    timeline = "/api/v1/plans/trades/timeline"
    [event] = client.get(timeline, params={"instance": "shard-2"}).json()["events"]
    assert (event["instance"], event["shard_id"], event["reason"]) == ("shard-2", "shard-2", "test: shard-2")
    assert client.get(timeline, params={"shard_id": "shard-2"}).json()["events"] == [event]
    assert client.get(timeline, params={"instance": "shard-2", "shard_id": "shard-2"}).json()["events"] == [event]
    differ = client.get(timeline, params={"instance": "shard-1", "shard_id": "shard-2"})
    assert differ.status_code == 400 and differ.json()["detail"] == (
        "instance and shard_id (its deprecated name) differ: give instance only")
    assert client.get("/api/v1/plans/trades/snapshots", params={"shard_id": "shard-9"}).status_code == 400
    status = client.get("/api/v1/plans/trades/status").json()
    assert [(i["instance"], i["shard_id"]) for i in status["instances"]] == [("shard-1", "shard-1"),
                                                                             ("shard-2", "shard-2")]

    acted = client.post("/api/v1/plans/trades/actions", json={"action": "snapshot_now", "shard_id": "shard-2"},
                        headers={"Authorization": "Bearer api-jwt"})
    assert acted.status_code == 201, acted.text
    assert fake_airflow.calls[-1]["body"]["conf"] == {"action": "snapshot_now", "plan": "trades",
                                                      "instance": "shard-2", "node": ""}

    spec = client.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for model in ("TimelineEvent", "SnapshotInfo", "InstanceStatus", "QuarantineSample", "Event"):
        assert "instance" in schemas[model]["required"], model
        assert schemas[model]["properties"]["shard_id"]["deprecated"] is True, model
    assert set(schemas["ActionRequest"]["properties"]) >= {"action", "instance"}
    for path in ("/api/v1/plans/{plan}/timeline", "/api/v1/plans/{plan}/snapshots"):
        parameters = {p["name"]: p for p in spec["paths"][path]["get"]["parameters"]}
        assert parameters["shard_id"]["deprecated"] is True and not parameters["instance"].get("deprecated"), path


def test_a_backfill_from_the_page_triggers_the_plans_backfill_dag_with_its_range(app,
                                                                                 fake_airflow: FakeAirflowApi) -> None:
    app.dependency_overrides[auth_manager] = lambda: FakeAuthManager(TRADES_ONLY | {("POST", "tandem_trades_backfill")})
    client = TestClient(app)
    headers = {"Authorization": "Bearer api-jwt"}
    bad = client.post("/api/v1/plans/trades/actions", json={"action": "backfill", "start": "yesterday", "end": ""},
                      headers=headers)
    assert bad.status_code == 400 and "ISO time" in bad.json()["detail"] and fake_airflow.calls == []
    response = client.post("/api/v1/plans/trades/actions", headers=headers,
                           json={"action": "backfill", "start": "2026-11-26T10:00:00Z", "end": "2026-11-26T10:30:00Z",
                                 "instance": "shard-2"})
    assert response.status_code == 201, response.text
    [call] = fake_airflow.calls
    assert call["path"] == "/api/v2/dags/tandem_trades_backfill/dagRuns"
    assert call["body"]["conf"] == {"start": "2026-11-26T10:00:00Z", "end": "2026-11-26T10:30:00Z",
                                    "instance": "shard-2"}


def test_the_quarantine_report_reads_the_quarantine_output_by_its_kind_whatever_its_name(
        app, conf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan_file = conf / "plans" / "trades.yaml"
    shipped = plan_file.read_text()
    plan_file.write_text(shipped.replace("  quarantine:\n    kind: quarantine\n", "  rejects:\n    kind: quarantine\n"))
    assert plan_file.read_text() != shipped
    monkeypatch.setenv("TANDEM_STORAGE_ROOT", str(tmp_path / "data"))
    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    lines = [{"raw": f"line {i}", "source_file": f"f{i}.json", "reason": "malformed JSON: not a JSON object",
              "plan": "trades", "instance": instance, "node": "node-a", "batch_id": 0,
              "quarantined_at": at + timedelta(seconds=i), "plan_version": "v"}
             for i, instance in enumerate(["shard-1", "shard-1", "shard-2"])]
    append_once(delta_table_dir(load_cluster(), "trades", "rejects"),
                pa.Table.from_pylist(lines, schema=QUARANTINE_SCHEMA), "test", 0)

    client = TestClient(app)
    outputs = {output["name"]: output["kind"] for output in client.get("/api/v1/plans/trades").json()["outputs"]}
    assert outputs["rejects"] == "quarantine" and "quarantine" not in outputs
    report = client.get("/api/v1/plans/trades/quarantine", params={"samples": 2}).json()
    assert report["total"] == 3 and report["by_instance"] == {"shard-1": 2, "shard-2": 1}
    assert [sample["raw"] for sample in report["samples"]] == ["line 2", "line 1"]
