"""The presenter's REST API inside a real Airflow API server, over real outputs of the pizza-shop plan.

The plan runs on real Spark (both instances, available-now); the test computes every expected row
with plain Python. Then, through HTTP: every endpoint against that reference, Airflow's
authentication (no token, expired token, forged token) and permissions (a viewer reads but cannot
act, a user without a role reads nothing: SimpleAuthManager grants a DAG's read to every role, so
"plan A but not B" is unit-tested with a fake auth manager), bounded reads, a cookie POST without
the page's header refused, actions triggered as the caller (Airflow records who), cursor polling,
the page in headless Chromium at 1500 px over these stopped instances (why no node is ACTIVE,
epoch-millis fields as UTC times, an instance's error), and a schemathesis run from the OpenAPI
description (no 500s, every response as documented).
"""

from __future__ import annotations

import configparser
import json
import os
import random
import secrets
import stat
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import jwt
import pytest
import requests
from _page import assert_shown_whole
from _references import PIZZA_T0, arrival_order, last_orders_reference, make_orders, pizza_reference
from tandem.config import load_cluster, load_plan
from tandem.layout import landing_dir
from tandem.plan_version import plan_version
from tandem.producer import advance_watermark, partitioned
from tandem.sources.files import write_atomically
from tandem.runtime.node import run_instance
from tandem.store import Database
from tandem.store.snapshots import begin_snapshot, mark_bad, mark_good, record_contents

pytestmark = pytest.mark.e2e
PLAN = "pizza_shop"
BAD_LINES = {("orders", 2): ['{"order_no": "o-x", "time": 5}'], ("deliveries", 1): ['{"order_no": "", "time": 5}']}


def publish_pizza_outputs(spark) -> tuple[list[dict], dict[str, int], set[str], dict[str, dict]]:
    """Orders and deliveries through the partition layout, both instances run to the end; the reference."""
    cluster = load_cluster()
    plan = load_plan(PLAN, cluster)
    orders, deliveries = make_orders(11, 240)
    rng = random.Random(5)
    streams = {name: [(e, json.dumps(e)) for e in arrival_order(events, rng)]
               for name, events in (("orders", orders), ("deliveries", deliveries))}
    for (stream, partition), lines in partitioned(plan, streams).items():
        write_atomically(landing_dir(cluster, stream, partition), lines)
    for (stream, partition), lines in BAD_LINES.items():
        write_atomically(landing_dir(cluster, stream, partition), lines)
    advance_watermark(cluster, plan, PIZZA_T0 + 3_600_000)
    for instance in plan.instances:
        result = run_instance(cluster, plan, "node-a", instance, spark=spark, available_now=True)
        assert result.status == "STOPPED", result.error
    per_customer, overdue = pizza_reference(orders, deliveries)
    return orders, per_customer, overdue, last_orders_reference(orders, deliveries)


def catalog_two_snapshots(database_url: str, storage: Path) -> tuple[str, str]:
    """A GOOD and a BAD snapshot in the catalog (rows only: the endpoint reads the catalog)."""
    with Database(database_url) as db:
        ids = []
        for instance in ("shop-1", "shop-2"):
            record = begin_snapshot(db, plan=PLAN, instance=instance, node="node-a", snapshots_dir=storage / "snapshots")
            record_contents(db, record.id, batch_id=3, state_rows=12, checkpoint_bytes=2048, state_bytes=1024,
                            query_batches={"orders": 3}, output_versions={"overdue_orders": 1})
            ids.append(record.id)
        mark_good(db, ids[0], {"success": True, "expectations": []})
        mark_bad(db, ids[1], "expectation failed: state rows do not match")
    return ids[0], ids[1]


USERS = "admin:admin,viewer:viewer,nobody:"
"""SimpleAuthManager's users: ``nobody`` has no role, so Airflow denies it every DAG."""


def write_users(home: Path) -> dict[str, str]:
    """SimpleAuthManager's password file with an admin, a viewer and a user without a role."""
    passwords = {"admin": secrets.token_urlsafe(16), "viewer": secrets.token_urlsafe(16),
                 "nobody": secrets.token_urlsafe(16)}
    home.mkdir(parents=True)
    path = home / "simple_auth_manager_passwords.json"
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "w") as handle:
        json.dump(passwords, handle)
    return passwords


def login(base: str, user: str, password: str) -> str:
    response = requests.post(f"{base}/auth/token", json={"username": user, "password": password}, timeout=30)
    assert response.status_code == 201, response.text
    return response.json()["access_token"]


def expired_copy(token: str, home: Path) -> str:
    """The same claims, signed with the stack's own secret, expired a minute ago."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(home / "airflow.cfg")
    header = jwt.get_unverified_header(token)
    claims = jwt.decode(token, options={"verify_signature": False})
    now = int(time.time())
    claims.update(iat=now - 120, nbf=now - 120, exp=now - 60)
    return jwt.encode(claims, config["api_auth"]["jwt_secret"], algorithm=header["alg"], headers={"kid": header["kid"]})


class Api:
    def __init__(self, base: str, token: str | None) -> None:
        self.base, self.token = f"{base}/tandem/api/v1", token

    def get(self, path: str, **params) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return requests.get(f"{self.base}{path}", params=params, headers=headers, timeout=60)

    def ok(self, path: str, **params) -> dict | list:
        response = self.get(path, **params)
        assert response.status_code == 200, f"{path}: {response.status_code} {response.text[:500]}"
        return response.json()

    def post(self, path: str, body: dict) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return requests.post(f"{self.base}{path}", json=body, headers=headers, timeout=60)

    def post_with_cookie(self, path: str, body: dict, **headers: str) -> requests.Response:
        """As the page does, with the Airflow UI's cookie instead of a Bearer token."""
        return requests.post(f"{self.base}{path}", json=body, cookies={"_token": self.token}, headers=headers,
                             timeout=60)


READ_PATHS = ["/plans", f"/plans/{PLAN}", f"/plans/{PLAN}/status", f"/plans/{PLAN}/timeline",
              f"/plans/{PLAN}/snapshots", f"/plans/{PLAN}/quarantine", f"/plans/{PLAN}/batch",
              f"/plans/{PLAN}/outputs/order_stats/aggregates", f"/plans/{PLAN}/outputs/delivered_orders/rows",
              f"/plans/{PLAN}/outputs/overdue_orders/events"]


def check_page(browser, base: str, token: str, database_url: str, epoch: int, tmp_path: Path) -> None:
    """The page at 1500 px over the stopped instances: each node's pid and buttons inside its card, why no
    node is ACTIVE, the overdue orders' expiry times (epoch milliseconds, read as ISO text) as UTC times, and an
    instance's recorded error shown with its status (BLOCKED, migration 008)."""
    from playwright.sync_api import expect

    with Database(database_url) as db:
        db.run(lambda c: c.execute("UPDATE plan_instances SET status = 'BLOCKED', error = %s WHERE plan = %s AND "
                                   "instance = 'shop-2' AND node = 'node-a'", (PAGE_ERROR, PLAN)))
    context = browser.new_context(viewport={"width": 1500, "height": 1000})
    context.add_cookies([{"name": "_token", "value": token, "url": base}])
    page = context.new_page()
    try:
        page.goto(f"{base}/tandem/#{PLAN}")
        lease_line = page.get_by_test_id("lease-shop-1")
        expect(lease_line).to_contain_text("no ACTIVE since ", timeout=30_000)
        expect(lease_line).to_contain_text(f"stopped: instance stopped · last holder node-a at epoch {epoch}")
        for instance in ("shop-1", "shop-2"):  # two cards side by side would each be too narrow for its table
            assert_shown_whole(page, instance, ("node-a", "node-b"), 0, 1500)
        expect(page.get_by_test_id("status-shop-2-node-a")).to_have_text("BLOCKED")
        expect(page.get_by_test_id("error-shop-2-node-a")).to_have_text(f"node-a BLOCKED: {PAGE_ERROR}")
        feed = page.get_by_test_id("feed-overdue_orders")
        expect(feed).to_contain_text("expiry_time=2025-", timeout=30_000)
        expect(feed).not_to_contain_text("expiry_time=17")  # epoch millis of 2025 start with 17…
        expect(page.get_by_test_id("backfill")).to_be_visible()  # the backfill form, with no backfill yet
        expect(page.locator("#batch")).to_contain_text("no backfills yet")
        page.screenshot(path=tmp_path / "pizza-page.png", full_page=True)
    finally:
        context.close()


PAGE_ERROR = "psycopg2.errors.DataError: invalid input syntax for type json"


def test_presenter_endpoints_auth_actions_and_fuzzing(project: Path, database_url: str, spark, airflow_stack,
                                                      browser, tmp_path: Path) -> None:
    orders, per_customer, overdue, last_orders = publish_pizza_outputs(spark)
    good, bad = catalog_two_snapshots(database_url, project / "data")
    home = tmp_path / "airflow"
    passwords = write_users(home)
    with airflow_stack(home, {"TANDEM_AIRFLOW_USERS": USERS}) as airflow:
        assert stat.S_IMODE((home / "airflow.db").stat().st_mode) == 0o600, "the metadata DB is its owner's only"
        base = airflow.base_url
        admin_token = login(base, "admin", passwords["admin"])
        admin, viewer = Api(base, admin_token), Api(base, login(base, "viewer", passwords["viewer"]))
        nobody = Api(base, login(base, "nobody", passwords["nobody"]))

        # authentication: Airflow's answers, on every endpoint; reading a plan needs reading its DAG
        for path in READ_PATHS:
            assert Api(base, None).get(path).status_code == 401, path
            assert Api(base, expired_copy(admin_token, home)).get(path).status_code == 401, path
            assert Api(base, admin_token[:-4] + "AAAA").get(path).status_code == 403, path
            assert viewer.get(path).status_code == 200, path
        assert nobody.ok("/plans") == []
        for path in READ_PATHS[1:]:
            refused = nobody.get(path)
            assert refused.status_code == 403, path
            assert refused.json()["detail"] == ("nobody may not read plan pizza_shop "
                                                "(Airflow denies reading its DAG tandem_pizza_shop_supervise)")
        assert Api(base, expired_copy(admin_token, home)).get("/plans").json()["detail"] == "Token Expired"
        assert Api(base, None).post(f"/plans/{PLAN}/actions", {"action": "snapshot_now"}).status_code == 401

        # the plan as declared
        plans = {p["name"]: p for p in admin.ok("/plans")}
        assert set(plans) == {"hot_rooms", "pizza_shop", "temperatures", "trades"}
        assert plans[PLAN]["groups"] == [{"name": "shop", "parallel": 2, "queries": ["orders", "quarantine"],
                                          "instances": ["shop-1", "shop-2"]}]
        assert {o["name"]: o["kind"] for o in plans[PLAN]["outputs"]} == {
            "delivered_orders": "table", "overdue_orders": "events", "order_stats": "aggregation",
            "last_orders": "latest", "quarantine": "quarantine"}

        # outputs, against the reference
        table = admin.ok(f"/plans/{PLAN}/outputs/delivered_orders/rows")["rows"]
        assert {r["customer_name"]: int(r["delivered"]) for r in table} == per_customer
        one = sorted(per_customer)[0]
        assert admin.ok(f"/plans/{PLAN}/outputs/delivered_orders/rows", key=f"customer_name:{one}")["rows"] == \
            [r for r in table if r["customer_name"] == one]
        # the rows endpoint reads every kind as the kind does: the latest, events, the quarantine
        latest = admin.ok(f"/plans/{PLAN}/outputs/last_orders/rows")
        assert latest["kind"] == "latest" and {r["customer_name"]: {k: v for k, v in r.items() if k != "instance"}
                                               for r in latest["rows"]} == last_orders
        assert [r["order_no"] for r in admin.ok(f"/plans/{PLAN}/outputs/last_orders/rows",
                                                key=f"customer_name:{one}")["rows"]] == [last_orders[one]["order_no"]]
        assert sorted(r["order_no"] for r in admin.ok(f"/plans/{PLAN}/outputs/overdue_orders/rows")["rows"]) == \
            sorted(overdue)
        assert len(admin.ok(f"/plans/{PLAN}/outputs/quarantine/rows")["rows"]) == 2
        days = admin.ok(f"/plans/{PLAN}/outputs/order_stats/aggregates", granularity="day",
                        start="2025-01-01T00:00:00Z", end="2026-01-01T00:00:00Z")["rows"]
        assert sum(r["orders"] for r in days) == len(orders)
        assert sum(r["on_time"] for r in days) == sum(per_customer.values())
        minutes = admin.ok(f"/plans/{PLAN}/outputs/order_stats/aggregates", granularity="minute",
                           start="2025-03-01T00:00:00Z", end="2025-03-02T00:00:00Z")["rows"]
        expected_minutes: dict[str, int] = {}
        for order in orders:
            minute = datetime.fromtimestamp(order["time"] // 60_000 * 60, timezone.utc).isoformat().replace("+00:00", "Z")
            expected_minutes[minute] = expected_minutes.get(minute, 0) + 1
        assert {r["bucket_start"]: r["orders"] for r in minutes} == expected_minutes

        polled, cursor, pages = [], None, 0
        while True:  # pages of 7 after a cursor: every overdue order once
            page = admin.ok(f"/plans/{PLAN}/outputs/overdue_orders/events", limit=7, **({"cursor": cursor} if cursor else {}))
            polled += [e["payload"]["order_no"] for e in page["events"]]
            cursor, pages = page["next_cursor"], pages + 1
            if not page["events"]:
                break
        assert sorted(polled) == sorted(overdue) and pages > 2
        assert admin.ok(f"/plans/{PLAN}/outputs/overdue_orders/events", cursor=cursor)["events"] == []
        tail = admin.ok(f"/plans/{PLAN}/outputs/overdue_orders/events", tail=3)
        assert [e["payload"]["order_no"] for e in tail["events"]] == polled[-3:] and tail["next_cursor"] == cursor

        # operations: status, timeline, snapshots, quarantine
        status = admin.ok(f"/plans/{PLAN}/status")
        assert status["version"] == plan_version(load_plan(PLAN, load_cluster()))
        with Database(database_url) as db:
            leases = db.run(lambda c: (c.execute("SELECT instance, holder, epoch FROM leases WHERE plan = %s", (PLAN,)),
                                       {r["instance"]: r for r in c.fetchall()})[1])
        for instance in status["instances"]:
            lease = leases[instance["instance"]]
            assert (instance["lease"]["holder"], instance["lease"]["epoch"]) == (lease["holder"], lease["epoch"])
            assert [n["node"] for n in instance["nodes"]] == ["node-a", "node-b"]
            assert instance["nodes"][0]["status"] == "STOPPED" and instance["nodes"][1]["health"] == "MISSING"
            # the version its run was launched with, the same the files define now; node-b never ran
            assert [n["version"] for n in instance["nodes"]] == [status["version"], None]
            assert instance["last_failover"]["kind"] == "PROMOTED" and instance["last_failover"]["node"] == "node-a"
        for instance in status["instances"]:  # each instance stopped at the end of its input and released the lease
            assert not instance["lease"]["valid"]
            assert (instance["lease"]["state"], instance["lease"]["vacancy"]) == ("stopped", "stopped: instance stopped")
            assert instance["lease"]["vacant_since"] is not None
        assert status["instances"][0]["last_good_snapshot"]["id"] == good
        assert status["instances"][1]["last_good_snapshot"] is None
        kinds = [e["kind"] for e in admin.ok(f"/plans/{PLAN}/timeline", instance="shop-2")["events"]]
        assert "PROMOTED" in kinds
        assert {s["id"]: s["status"] for s in admin.ok(f"/plans/{PLAN}/snapshots")["snapshots"]} == {good: "GOOD", bad: "BAD"}
        assert [s["id"] for s in admin.ok(f"/plans/{PLAN}/snapshots", status="BAD")["snapshots"]] == [bad]
        assert admin.ok(f"/plans/{PLAN}/batch") == {"plan": PLAN, "backfills": [], "reconcile": None}
        quarantine = admin.ok(f"/plans/{PLAN}/quarantine", samples=5)
        assert quarantine["total"] == 2 and sum(quarantine["by_instance"].values()) == 2
        assert sorted(quarantine["by_reason"]) == ["field 'order_no' must not be empty (got \"\")",
                                                   "missing field 'customer_name'"]

        # refusals name the problem
        for path, params, status_code in [
                (f"/plans/{PLAN}/outputs/order_stats/aggregates", {"granularity": "week"}, 400),
                (f"/plans/{PLAN}/outputs/overdue_orders/events", {"cursor": "not-a-cursor!"}, 400),
                (f"/plans/{PLAN}/outputs/order_stats/rows", {"granularity": "week"}, 400),
                (f"/plans/{PLAN}/outputs/delivered_orders/rows", {"key": "colour:red"}, 400),
                ("/plans/nope/status", {}, 404), (f"/plans/{PLAN}/outputs/nope/events", {}, 404)]:
            response = admin.get(path, **params)
            assert response.status_code == status_code and response.json()["detail"], (path, response.text)

        # bounded reads: a range or a result too large is a 400 that says the limit and how to narrow
        wide = admin.get(f"/plans/{PLAN}/outputs/order_stats/aggregates", granularity="minute",
                         start="1970-01-01T00:00:00Z", end="9999-01-01T00:00:00Z")
        assert wide.status_code == 400 and "at most 10,000 are served: narrow start/end" in wide.json()["detail"]
        many = admin.get(f"/plans/{PLAN}/outputs/order_stats/aggregates", granularity="minute", limit=2,
                         start="2025-03-01T00:00:00Z", end="2025-03-02T00:00:00Z")
        assert many.status_code == 400 and "more than 2 rows (limit=2)" in many.json()["detail"]
        keys = admin.get(f"/plans/{PLAN}/outputs/delivered_orders/rows", limit=2)
        assert keys.status_code == 400 and "filter with key=customer_name:<value>" in keys.json()["detail"]

        # actions: a viewer may not act; a cookie POST without the page's header is refused; the admin's
        # trigger is recorded as the admin's
        refused = viewer.post(f"/plans/{PLAN}/actions", {"action": "failover_now", "instance": "shop-1"})
        assert refused.status_code == 403 and "viewer" in refused.json()["detail"]
        forged = admin.post_with_cookie(f"/plans/{PLAN}/actions", {"action": "failover_now", "instance": "shop-1"})
        assert forged.status_code == 403 and "X-Tandem-Request: 1" in forged.json()["detail"]
        assert airflow.runs("tandem_ops") == []
        assert admin.post(f"/plans/{PLAN}/actions", {"action": "restore", "instance": "shop-1"}).status_code == 400
        assert admin.post(f"/plans/{PLAN}/actions", {"action": "drain_node"}).status_code == 400
        assert admin.post(f"/plans/{PLAN}/actions", {"action": "drain_node", "node": "node-z"}).status_code == 400
        acted = admin.post(f"/plans/{PLAN}/actions", {"action": "snapshot_now", "instance": "shop-2"})
        assert acted.status_code == 201, acted.text
        run = acted.json()
        assert run["dag_id"] == "tandem_ops" and run["url"].endswith(f"/dags/tandem_ops/runs/{run['dag_run_id']}")
        recorded = airflow.request("GET", f"/dags/tandem_ops/dagRuns/{run['dag_run_id']}").json()
        assert recorded["conf"] == {"action": "snapshot_now", "plan": PLAN, "instance": "shop-2", "node": ""}
        assert recorded["triggering_user_name"] == "admin" and "Tandem page by admin" in recorded["note"]

        check_page(browser, base, admin_token, database_url, status["instances"][0]["lease"]["epoch"], tmp_path)

        # fuzzing from the OpenAPI description: no 500s, every response as documented (a loaded CI machine's API
        # server took over schemathesis' default 10 s to serve the description)
        config = tmp_path / "schemathesis.toml"
        config.write_text(SCHEMATHESIS_CONFIG)
        fuzz = subprocess.run(
            [str(Path(sys.executable).parent / "schemathesis"), "--config-file", str(config), "run",
             f"{base}/tandem/openapi.json", "--checks", "not_a_server_error,response_schema_conformance,"
             "content_type_conformance,status_code_conformance", "--max-examples", "25", "--workers", "1",
             "--seed", "11", "--wait-for-schema", "120", "--request-timeout", "60",
             "--report", "junit", "--report-dir", str(tmp_path / "schemathesis")],
            env={**os.environ, "TANDEM_TEST_TOKEN": viewer.token}, cwd=tmp_path,  # its cache: .schemathesis/ in cwd
            capture_output=True, text=True, timeout=900)
        assert fuzz.returncode == 0, fuzz.stdout[-6000:] + fuzz.stderr[-2000:]
        assert viewer.token not in fuzz.stdout + fuzz.stderr


# The viewer's token (from the environment: never on a command line) on every request; the plan and
# outputs fixed per operation so that the fuzzer reaches the code behind the 404s. POSTs by a viewer
# are refused (403) or invalid (400 / 422) and never trigger anything.
SCHEMATHESIS_CONFIG = """
headers = { Authorization = "Bearer ${TANDEM_TEST_TOKEN}" }

[parameters]
plan = "pizza_shop"

[[operations]]
include-path-regex = "/aggregates$"
parameters = { output = "order_stats" }

[[operations]]
include-path-regex = "/rows$"
parameters = { output = "delivered_orders" }

[[operations]]
include-path-regex = "/events$"
parameters = { output = "overdue_orders" }
"""
