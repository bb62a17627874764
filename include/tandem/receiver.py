"""The receiver: an authenticated HTTP endpoint that turns events from outside into messages of a ``nats`` stream.

Purpose
    The seeds' receiver nodes turn an outside source (HTTP, Thrift) into messages of the messaging
    layer. A service that cannot speak NATS POSTs its events here; ``tandem receive`` serves it.

How it works
    ``POST /v1/plans/{plan}/streams/{stream}/events`` with ``Authorization: Bearer <token>`` (the
    token is ``TANDEM_RECEIVER_TOKEN``) and a JSON array of events. Every event is checked against
    the stream's declaration (:func:`tandem.event_checks.event_problems`); the good ones are
    published to their partition subjects, each with a message id (the client's ``id`` for the
    event when ``id_field`` names one, else :func:`tandem.client.content_id`), and the answer
    comes only once JetStream acknowledged every one: ``200 {"published": n, "sequences": [...]}``,
    or ``400`` with ``rejected: [{"index", "reasons"}]`` for the bad ones (the good ones of the
    request are published all the same: sending the whole request again is safe, the message ids
    make JetStream store each event once within its duplicate window).

What it does not do
    It keeps nothing: an event is either acknowledged by JetStream before the answer, or the
    answer is an error (``502``: NATS did not acknowledge) and the client sends it again.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, HTTPException, Path, Query
from fastapi.responses import JSONResponse

from tandem.client import content_id
from tandem.config import ClusterConfig, PlanConfig, load_plans_and_errors
from tandem.declarations import partition_of
from tandem.event_checks import event_problems
from tandem.messaging import JetStream, ensure_declared, partition_subject

log = logging.getLogger(__name__)
TOKEN_VARIABLE = "TANDEM_RECEIVER_TOKEN"
MAX_EVENTS = 10_000
"""Events in one request at most (a larger batch is refused with 413)."""


def receiver_app(cluster: ClusterConfig, token: str) -> FastAPI:
    """The receiver's ASGI app for the plans of ``cluster``; clients authenticate with ``token``."""
    if not token:
        raise ValueError(f"the receiver needs a token: set {TOKEN_VARIABLE}")
    if cluster.nats is None:
        raise ValueError(f"the receiver needs the messaging layer: a nats: section in {cluster.path} or TANDEM_NATS_URL")
    plans, _broken = load_plans_and_errors(cluster)
    nats = cluster.nats
    local = threading.local()
    ready: set[tuple[str, str]] = set()
    app = FastAPI(title="Tandem receiver", version="1")

    def authenticated(authorization: Annotated[str, Header()] = "") -> None:
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(401, "send Authorization: Bearer <the receiver's token>",
                                headers={"WWW-Authenticate": "Bearer"})

    def connection() -> JetStream:
        if getattr(local, "js", None) is None:
            local.js = JetStream(nats.servers, name="tandem-receiver")
        return local.js

    def publish(messages: list[tuple[str, bytes, str | None]]) -> list[dict[str, Any]]:
        """Publish on this thread's connection; one more try on a new one when it broke."""
        try:
            return connection().publish(messages)
        except (ConnectionError, OSError):
            local.js = None
            return connection().publish(messages)

    def declared(plan_name: str, stream_name: str) -> tuple[PlanConfig, str]:
        plan = plans.get(plan_name)
        if plan is None or stream_name not in plan.streams:
            raise HTTPException(404, f"no stream {stream_name!r} in plan {plan_name!r}")
        if plan.streams[stream_name].source != "nats":
            raise HTTPException(409, f"stream {stream_name} of plan {plan_name} reads files, not NATS: the receiver "
                                     "publishes to nats streams only")
        publisher = plan.publisher_of(stream_name)
        if publisher is not None:
            raise HTTPException(409, f"stream {stream_name} of plan {plan_name} is published by its output "
                                     f"{publisher}: only Tandem writes to it")
        if (plan_name, stream_name) not in ready:
            ensure_declared(nats, plan, stream_name)
            ready.add((plan_name, stream_name))
        return plan, stream_name

    @app.get("/v1/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "plans": sorted(plans)}

    @app.post("/v1/plans/{plan}/streams/{stream}/events", dependencies=[Depends(authenticated)])
    def receive(events: list[Any], plan: Annotated[str, Path()], stream: Annotated[str, Path()],
                id_field: Annotated[str | None, Query(description="the event field that is its id (message id)")]
                = None) -> JSONResponse:
        if len(events) > MAX_EVENTS:
            raise HTTPException(413, f"at most {MAX_EVENTS} events a request, got {len(events)}")
        declaration, name = declared(plan, stream)
        config = declaration.streams[name]
        id_of: Callable[[dict[str, Any]], str] = (lambda e: str(e[id_field])) if id_field else content_id
        rejected, messages = [], []
        for index, event in enumerate(events):
            problems = event_problems(config, event)
            if id_field and not problems and event.get(id_field) in (None, ""):
                problems = [f"no id: field '{id_field}' is missing"]
            if problems:
                rejected.append({"index": index, "reasons": problems})
                continue
            subject = partition_subject(nats.prefix, name, partition_of(event[config.key], config.partitions))
            messages.append((subject, _line(event), id_of(event)))
        try:
            acks = publish(messages) if messages else []
        except Exception as exc:  # noqa: BLE001 - the client is told to send again; nothing was promised
            log.warning("receiver: publishing %d events of %s/%s failed: %s", len(messages), plan, stream, exc)
            raise HTTPException(502, f"NATS did not acknowledge the events ({type(exc).__name__}): send them "
                                     "again") from None
        body: dict[str, Any] = {"published": len(acks), "sequences": [ack["seq"] for ack in acks]}
        if rejected:
            return JSONResponse({**body, "rejected": rejected}, status_code=400)
        return JSONResponse(body)

    return app


def _line(event: dict[str, Any]) -> bytes:
    return json.dumps(event, ensure_ascii=False).encode("utf-8")


def serve(cluster: ClusterConfig, host: str, port: int) -> None:
    """Serve the receiver until interrupted (``tandem receive``); the token comes from the environment."""
    import uvicorn

    uvicorn.run(receiver_app(cluster, os.environ.get(TOKEN_VARIABLE, "")), host=host, port=port, log_level="info")
