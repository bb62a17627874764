"""The presenter's FastAPI app: Tandem's page and its versioned REST endpoints, inside Airflow's API server.

Mounted by the ``tandem_ui`` plugin under ``/tandem``. Airflow does not protect a plugin's app:
every endpoint here takes Airflow's JWT (``Authorization: Bearer`` from ``POST /auth/token``, or the
UI's ``_token`` cookie) through Airflow's own ``get_user`` dependency — no token: 401, an expired
one: 401, an invalid one: 403. A plan whose file does not load is listed with its error (``state``
``broken``) and its own endpoints answer 409 naming the file and field; the other plans are served as
usual. Reading a plan needs the right to read the plan's DAG (see
:mod:`tandem.presenter.access`); an action needs the right to trigger the plan's own DAG (per plan)
and the DAG that carries it out, and then that DAG is triggered through Airflow's REST API — at the
configured Airflow address, never one taken from the request — with the caller's own token, so
Airflow's permissions and audit log apply to the user, not to Tandem. A POST authenticated by the UI's cookie must carry the header
``X-Tandem-Request: 1`` (the page sends it; another site's form or ``fetch`` cannot without CORS).
Reads are bounded: capped ranges and rows (400s that say how to narrow), pooled PostgreSQL
connections with a statement timeout, and a cached quarantine summary.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from importlib import resources
from typing import Annotated

import requests
from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
from airflow.api_fastapi.core_api.security import GetUserDep, get_user
from airflow.configuration import conf
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response

from tandem.config import ClusterConfig, ConfigError, PlanConfig
from tandem.declarations import parse_instant
from tandem.errors import TandemError
from tandem.names import OPS_DAG_ID, RESTORE_DAG_ID, plan_dag_id
from tandem.presenter import access, configuration, views
from tandem.presenter.connections import PresenterBusy, pool_for
from tandem.presenter.models import (
    ActionRequest, ActionRun, AggregateRows, BatchReport, BrokenPlanSummary, EventPage, PlanEntry, PlanStatus, PlanSummary, Problem,
    QuarantineReport, SnapshotCatalog, OutputRows, Timeline,
)
from tandem.store.db import Database
from tandem.store.snapshots import STATUSES

API_VERSION = "v1"
ACTION_DAGS = {"failover_now": OPS_DAG_ID, "drain_node": OPS_DAG_ID, "restart_node": OPS_DAG_ID,
               "snapshot_now": OPS_DAG_ID, "cutover": OPS_DAG_ID, "upgrade": OPS_DAG_ID, "finish_upgrade": OPS_DAG_ID,
               "rollback": OPS_DAG_ID, "restore": RESTORE_DAG_ID}
"""The DAG each action triggers; ``backfill`` triggers the plan's own ``tandem_<plan>_backfill``."""
NEEDS_NODE = {"drain_node", "restart_node"}
PAGE_HEADER = "X-Tandem-Request"
"""The header a POST authenticated by the UI's cookie must carry (value ``1``): the page's ``fetch`` sends it,
a form or a cross-site request cannot (a custom header needs a CORS preflight Airflow does not grant)."""
PAGE_SECURITY_HEADERS = {"Content-Security-Policy": "frame-ancestors 'self'", "Cache-Control": "no-store"}
"""The page may be framed by Airflow's UI (same origin) and by nothing else."""
DEFAULT_AGGREGATE_ROWS = 10_000
DEFAULT_TABLE_ROWS = 1_000
ERRORS = {400: {"model": Problem, "description": "a parameter the presenter cannot serve, or a read too large "
                                                 "(the message says the limit and how to narrow it)"},
          401: {"model": Problem, "description": "no token, or an expired one"},
          403: {"model": Problem, "description": "an invalid token, or a user without the right"},
          404: {"model": Problem, "description": "no such plan or output"},
          409: {"model": Problem, "description": "the plan's file does not load (the message names the file and "
                                                 "the field): fix it, `tandem config check` says the same"},
          503: {"model": Problem, "description": "every PostgreSQL connection of the presenter stayed busy"}}


User = GetUserDep
"""The logged-in Airflow user: Airflow's own dependency (401 without a token or with an expired one, 403 with an
invalid one), which also puts Airflow's security schemes into the OpenAPI description."""


def cluster_config() -> ClusterConfig:
    return configuration.current()[0]


def plan_configs() -> dict[str, PlanConfig]:
    return configuration.current()[1]


def broken_plans() -> dict[str, ConfigError]:
    return configuration.broken()


def database(cluster: Annotated[ClusterConfig, Depends(cluster_config)]) -> Iterator[Database]:
    """A pooled connection (with a statement timeout) for the duration of one request."""
    with pool_for(cluster.database_url).borrow() as db:
        yield db


def auth_manager() -> access.DagAuthority:
    """Airflow's auth manager (a dependency, so that a test can give the app another)."""
    return get_auth_manager()


def dag_teams() -> access.TeamsOf:
    """How to find a DAG's team (multi-team mode), as a dependency for the same reason."""
    return access.airflow_teams


Cluster = Annotated[ClusterConfig, Depends(cluster_config)]
Plans = Annotated[dict[str, PlanConfig], Depends(plan_configs)]
Broken = Annotated[dict[str, ConfigError], Depends(broken_plans)]
Db = Annotated[Database, Depends(database)]
AuthManager = Annotated[access.DagAuthority, Depends(auth_manager)]
Teams = Annotated[access.TeamsOf, Depends(dag_teams)]


def readable_plan(plan: str, plans: Plans, broken: Broken, user: User, auth: AuthManager, teams: Teams) -> PlanConfig:
    """The plan of the path if the user may read it (404 for no such plan, 403 for a plan Airflow denies, 409
    for a plan whose file does not load)."""
    found = access.plan_for_reader(auth, user, {**plans, **broken}, plan, teams)
    if isinstance(found, ConfigError):
        raise views.PlanBroken(f"plan {plan} is broken: {found}")
    return found


Plan = Annotated[PlanConfig, Depends(readable_plan)]


def instance_query(
    instance: Annotated[str | None, Query(description="one group instance, e.g. shop-1")] = None,
    shard_id: Annotated[str | None, Query(deprecated=True, description="the former name of `instance`, "
                                                                       "accepted until the next release")] = None,
) -> str | None:
    """The group instance a read asks for: ``instance``, or ``shard_id``, its deprecated name (a 400 when both
    are given and differ)."""
    if instance and shard_id and instance != shard_id:
        raise views.BadRequest("instance and shard_id (its deprecated name) differ: give instance only")
    return instance or shard_id or None


Instance = Annotated[str | None, Depends(instance_query)]
router = APIRouter(dependencies=[Depends(get_user)], responses=ERRORS)


@router.get("/plans", response_model=list[PlanEntry],
            summary="Every plan you may read: nodes, groups, outputs; a plan whose file does not load: its error")
def list_plans(plans: Plans, broken: Broken, user: User, auth: AuthManager,
               teams: Teams) -> list[PlanSummary | BrokenPlanSummary]:
    readable = access.readable_plans(auth, user, {**plans, **broken}, teams)
    return [views.plan_entry(name, found) for name, found in sorted(readable.items())]


@router.get("/plans/{plan}", response_model=PlanSummary, summary="One plan's declaration")
def get_plan(plan: Plan) -> PlanSummary:
    return views.plan_summary(plan)


@router.get("/plans/{plan}/status", response_model=PlanStatus,
            summary="Who is ACTIVE at which epoch since when, each node's health and lag, the last failover and snapshot")
def get_status(plan: Plan, cluster: Cluster, db: Db) -> PlanStatus:
    return views.plan_status(db, cluster, plan)


@router.get("/plans/{plan}/timeline", response_model=Timeline, summary="Failover and supervision events, newest first")
def get_timeline(plan: Plan, instance: Instance, db: Db,
                 limit: Annotated[int, Query(ge=1, le=500)] = 50) -> Timeline:
    return views.timeline(db, plan, instance=instance, limit=limit)


@router.get("/plans/{plan}/snapshots", response_model=SnapshotCatalog, summary="The snapshot catalog, newest first")
def get_snapshots(plan: Plan, instance: Instance, db: Db,
                  status: Annotated[list[str] | None, Query(description=f"any of {', '.join(STATUSES)}")] = None,
                  limit: Annotated[int, Query(ge=1, le=500)] = 50) -> SnapshotCatalog:
    unknown = sorted(set(status or ()) - set(STATUSES))
    if unknown:
        raise views.BadRequest(f"unknown snapshot status {', '.join(unknown)} (known: {', '.join(STATUSES)})")
    return views.snapshot_catalog(db, plan, instance=instance, statuses=tuple(status) if status else None,
                                  limit=limit)


@router.get("/plans/{plan}/batch", response_model=BatchReport,
            summary="The plan's newest backfills and its newest reconcile run (differences per instance and output)")
def get_batch(plan: Plan, cluster: Cluster, db: Db, limit: Annotated[int, Query(ge=1, le=100)] = 10) -> BatchReport:
    return views.batch_report(db, cluster, plan, limit=limit)


@router.get("/plans/{plan}/quarantine", response_model=QuarantineReport,
            summary="Quarantined input lines: counts by reason and instance, and the newest ones (cached a few "
                    "seconds while the quarantine table is unchanged)")
def get_quarantine(plan: Plan, cluster: Cluster, samples: Annotated[int, Query(ge=0, le=100)] = 10) -> QuarantineReport:
    return views.quarantine_report(cluster, plan, samples=samples)


def _key_filter(key: list[str] | None) -> dict[str, list[str]]:
    """``field:value`` items (repeatable) as ``{field: [values]}``."""
    filters: dict[str, list[str]] = {}
    for item in key or []:
        field, separator, value = item.partition(":")
        if not separator or not field:
            raise views.BadRequest(f"key {item[:80]!r}: expected field:value, e.g. symbol:IBM")
        filters.setdefault(field, []).append(value)
    return filters


KeyQuery = Annotated[list[str] | None, Query(description="field:value (repeatable), e.g. symbol:IBM")]


@router.get("/plans/{plan}/outputs/{output}/aggregates", response_model=AggregateRows,
            summary="An output kept in time buckets (an aggregation), merged over every instance, by granularity and "
                    "time range")
def get_aggregates(plan: Plan, output: str, cluster: Cluster, db: Db, granularity: str = "minute",
                   start: datetime | None = None, end: datetime | None = None, key: KeyQuery = None,
                   limit: Annotated[int, Query(ge=1, le=views.MAX_AGGREGATE_ROWS, description="at most this many rows "
                                               "(bucket × key); more: 400")] = DEFAULT_AGGREGATE_ROWS) -> AggregateRows:
    """Buckets starting in ``[start, end)`` (default: the last hour), at most 10,000 buckets of the granularity.
    avg = Σsum / Σcount over instances, distinct counts from unioned sketches or sets (a distinct_exact measure's
    ``<measure>_exact`` says whether its count is exact): the same as one node that saw every event."""
    end = _aware(end) if end else datetime.now(timezone.utc) + timedelta(seconds=1)
    start = _aware(start) if start else end - timedelta(hours=1)
    return views.aggregate_rows(cluster, db, plan, output, granularity, start, end, _key_filter(key), limit=limit)


@router.get("/plans/{plan}/outputs/{output}/rows", response_model=OutputRows,
            summary="Any output merged over instances, as its kind reads it (a table, the latest row per key, events, "
                    "aggregates, the quarantine)")
def get_rows(plan: Plan, output: str, cluster: Cluster, db: Db, key: KeyQuery = None,
             start: datetime | None = None, end: datetime | None = None, granularity: str | None = None,
             limit: Annotated[int, Query(ge=1, le=views.MAX_TABLE_ROWS, description="at most this many rows; "
                                         "more: 400")] = DEFAULT_TABLE_ROWS) -> OutputRows:
    """``key`` filters any kind; ``start``/``end`` (default: all) and ``granularity`` (an aggregation's; default: its
    finest) where the kind has them."""
    return views.output_rows(cluster, db, plan, output, _key_filter(key), start=_aware(start) if start else None,
                             end=_aware(end) if end else None, granularity=granularity, limit=limit)


@router.get("/plans/{plan}/outputs/{output}/events", response_model=EventPage,
            summary="Rows of an appended output (events) after a cursor: poll with next_cursor to get each new "
                    "one exactly once")
def get_events(plan: Plan, output: str, db: Db, cursor: str | None = None,
               limit: Annotated[int, Query(ge=1, le=1000)] = 100,
               tail: Annotated[int | None, Query(ge=1, le=1000, description="without a cursor: start with the "
                                                                           "newest `tail` events")] = None) -> EventPage:
    return views.event_page(db, plan, output, cursor=cursor, tail=tail, limit=limit)


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def _bearer_token(request: Request) -> str | None:
    """The ``Authorization: Bearer`` token (what Airflow's ``get_user`` reads first), or ``None``: the cookie."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _caller_token(request: Request) -> str:
    return _bearer_token(request) or request.cookies.get(COOKIE_NAME_JWT_TOKEN, "")


def require_page_header(request: Request) -> None:
    """Refuse a POST authenticated by the UI's cookie without ``X-Tandem-Request: 1`` (cross-site request forgery)."""
    if _bearer_token(request) is None and request.headers.get(PAGE_HEADER) != "1":
        raise HTTPException(403, f"a request authenticated by the Airflow UI's cookie must carry the header "
                                 f"{PAGE_HEADER}: 1 (the Tandem page sends it); API clients send a Bearer token")


def airflow_api_url(cluster: ClusterConfig) -> str:
    """Where the presenter calls Airflow's REST API: the configured address (``TANDEM_AIRFLOW_URL`` /
    ``airflow.api_url``), never one built from the request's ``Host`` header."""
    return cluster.airflow_url.rstrip("/")


def airflow_ui_url(cluster: ClusterConfig) -> str:
    """The Airflow UI's address for links: ``[api] base_url`` when set, else the configured Airflow address."""
    return (conf.get("api", "base_url", fallback="") or cluster.airflow_url).rstrip("/")


def action_conf(plan: PlanConfig, body: ActionRequest) -> dict[str, object]:
    """The Params of the DAG run that carries out ``body`` (a :class:`BadRequest` for what the DAG would refuse)."""
    if body.instance:
        plan.check_instance(body.instance)
    if body.node:
        plan.check_node(body.node)
    if body.action in NEEDS_NODE and not body.node:
        raise views.BadRequest(f"{body.action} needs a node (nodes of {plan.name}: {', '.join(plan.nodes)})")
    if body.action == "backfill":
        for name, value in (("start", body.start), ("end", body.end)):
            try:
                parse_instant(value)
            except ValueError as exc:
                raise views.BadRequest(f"backfill needs {name}: {exc}") from None
        return {"start": body.start.strip(), "end": body.end.strip(), "instance": body.instance}
    if body.action == "restore":
        if not body.confirm:
            raise views.BadRequest("restore rewinds the plan's outputs to the snapshot: confirm it (confirm: true)")
        return {"plan": plan.name, "instance": body.instance, "snapshot_id": body.snapshot_id, "node": body.node,
                "force": body.force, "undo_backfills": body.undo_backfills, "confirm": True}
    params: dict[str, object] = {"action": body.action, "plan": plan.name, "instance": body.instance,
                                 "node": body.node}
    if body.action == "upgrade":
        params["expect_changes"] = body.expect_changes
    return params


@router.post("/plans/{plan}/actions", response_model=ActionRun, status_code=201,
             dependencies=[Depends(require_page_header)],
             summary="Fail over, drain, restart, snapshot or restore: triggers tandem_ops / tandem_restore as you",
             description=f"With the Airflow UI's cookie (not a Bearer token) the request must carry `{PAGE_HEADER}: 1`.",
             responses={502: {"model": Problem, "description": "Airflow's API refused or did not answer"}})
def act(plan: Plan, body: ActionRequest, request: Request, cluster: Cluster, user: User, auth: AuthManager,
        teams: Teams) -> ActionRun:
    dag_id = ACTION_DAGS.get(body.action) or plan_dag_id(plan.name, body.action)
    access.check_action(auth, user, plan.name, dag_id, teams)
    params = action_conf(plan, body)
    base = airflow_api_url(cluster)
    run_id = f"tandem_page__{body.action}__{uuid.uuid4().hex[:10]}"
    note = f"{body.action} of {plan.name} from the Tandem page by {user.get_name()}"
    try:
        response = requests.post(f"{base}/api/v2/dags/{dag_id}/dagRuns", timeout=30,
                                 headers={"Authorization": f"Bearer {_caller_token(request)}"},
                                 json={"dag_run_id": run_id, "logical_date": None, "conf": params, "note": note})
    except requests.RequestException as exc:
        raise HTTPException(502, f"Airflow's API at {base} did not answer: {type(exc).__name__}") from None
    if response.status_code in (401, 403, 404, 409):
        raise HTTPException(response.status_code, f"Airflow refused to trigger {dag_id}: {response.text[:300]}")
    if not response.ok:
        raise HTTPException(502, f"Airflow refused to trigger {dag_id}: {response.status_code} {response.text[:300]}")
    run = response.json()
    return ActionRun(action=body.action, dag_id=dag_id, dag_run_id=run["dag_run_id"], state=run["state"],
                     url=f"{airflow_ui_url(cluster)}/dags/{dag_id}/runs/{run['dag_run_id']}")


def _problem(status: int):
    def handler(_request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=status)

    return handler


def page_html() -> str:
    return resources.files("tandem.presenter").joinpath("page.html").read_text()


def create_app() -> FastAPI:
    """The app the ``tandem_ui`` plugin mounts (``/tandem``): the page at ``/``, the API at ``/api/v1``."""
    app = FastAPI(
        title="Tandem presenter", version=API_VERSION,
        description="Pollable endpoints of Tandem's plans: status, failover timeline, snapshots, quarantine and "
                    "outputs; actions that trigger Tandem's DAGs as the caller. Authenticate with Airflow's JWT "
                    "(`POST /auth/token`) as a Bearer token, or the Airflow UI's session cookie.",
    )
    app.include_router(router, prefix=f"/api/{API_VERSION}")
    app.add_exception_handler(views.NotFound, _problem(404))
    app.add_exception_handler(access.Forbidden, _problem(403))
    app.add_exception_handler(PresenterBusy, _problem(503))
    app.add_exception_handler(views.BadRequest, _problem(400))
    app.add_exception_handler(views.PlanBroken, _problem(409))
    app.add_exception_handler(ConfigError, _problem(400))
    app.add_exception_handler(TandemError, _problem(400))

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse(page_html(), headers=PAGE_SECURITY_HEADERS)

    @app.get("/icon.svg", include_in_schema=False)
    def icon() -> Response:
        return Response(ICON, media_type="image/svg+xml")

    return app


ICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="none" stroke="currentColor" '
        'stroke-width="2"><circle cx="8" cy="12" r="5"/><circle cx="16" cy="12" r="5"/></svg>')
