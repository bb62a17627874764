"""A real monitoring stack around a test's plan (issue 49): ``tandem exporter`` (the CLI, with a bearer token),
Prometheus scraping it every second with ``conf/prometheus/tandem-rules.yml``, Alertmanager sending to a webhook
receiver of the test's own (an HTTP server in a thread that records each alert with the time it arrived).

Used by the supervision tests (a kill -9 of the ACTIVE, a BLOCKED instance) and ``bench/alert_latency.py``.
Everything started is stopped on exit, even after a failure; logs stay in the folder given.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
import yaml
from _ha import free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "conf" / "prometheus" / "tandem-rules.yml"


@dataclass
class Received:
    """One alert as the webhook receiver got it: when, its status (firing, resolved), labels and annotations."""

    at: float
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]


@dataclass
class Receiver:
    """Alerts Alertmanager posted, in arrival order."""

    alerts: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def firing(self, alertname: str, **labels: str) -> Received | None:
        """The first firing alert of that name whose labels include ``labels``."""
        with self.lock:
            return next((a for a in self.alerts if a.status == "firing" and a.labels.get("alertname") == alertname
                         and all(a.labels.get(k) == v for k, v in labels.items())), None)

    def names(self) -> list[str]:
        with self.lock:
            return [f"{a.status}:{a.labels.get('alertname')}" for a in self.alerts]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            arrived = time.time()
            with receiver.lock:
                receiver.alerts.extend(Received(arrived, a["status"], a["labels"], a["annotations"])
                                       for a in body.get("alerts", []))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@dataclass
class Stack:
    receiver: Receiver
    prometheus_url: str
    exporter_url: str
    token: str
    folder: Path

    def query(self, expr: str) -> list[dict]:
        answer = requests.get(f"{self.prometheus_url}/api/v1/query", params={"query": expr}, timeout=10).json()
        return answer["data"]["result"]

    def wait_scraped(self, expr: str, timeout_s: float = 60) -> list[dict]:
        """Until Prometheus has a non-empty answer to ``expr`` (the exporter was scraped with the figure)."""
        return wait_for(lambda: self.query(expr), timeout_s, f"Prometheus to answer {expr}",
                        detail=self.logs)

    def wait_alert(self, alertname: str, timeout_s: float = 90, **labels: str) -> Received:
        return wait_for(lambda: self.receiver.firing(alertname, **labels), timeout_s,
                        f"alert {alertname} {labels} at the webhook (got {self.receiver.names()})", poll_s=0.2,
                        detail=self.logs)

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
                         for path in sorted(self.folder.glob("*.log")))


def _start(command: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


@contextmanager
def monitoring_stack(folder: Path, scrape_interval: str = "1s") -> Iterator[Stack]:
    """Start the exporter (reading the configuration of this process's environment), Alertmanager, Prometheus and the
    receiver; stop them all on exit."""
    folder.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(16)
    (folder / "token").write_text(token)
    (folder / "token").chmod(0o600)
    receiver = Receiver()
    webhook = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    threading.Thread(target=webhook.serve_forever, daemon=True).start()
    exporter_port, alertmanager_port, prometheus_port = free_port(), free_port(), free_port()
    (folder / "alertmanager.yml").write_text(yaml.safe_dump({
        "route": {"receiver": "test", "group_by": ["alertname", "plan", "plan_instance", "node"],
                  "group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "test", "webhook_configs": [
            {"url": f"http://127.0.0.1:{webhook.server_address[1]}/alerts", "send_resolved": True}]}]}))
    (folder / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": [str(RULES)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]},
        "scrape_configs": [{"job_name": "tandem", "authorization": {"credentials_file": str(folder / "token")},
                            "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}]}))
    processes: list[subprocess.Popen] = []
    try:
        processes.append(_start([shutil.which("tandem") or "tandem", "exporter", "--port", str(exporter_port),
                                 "--token-file", str(folder / "token")], folder / "exporter.log"))
        processes.append(_start(["prometheus-alertmanager", f"--config.file={folder / 'alertmanager.yml'}",
                                 f"--storage.path={folder / 'alertmanager'}",
                                 f"--web.listen-address=127.0.0.1:{alertmanager_port}", "--cluster.listen-address="],
                                folder / "alertmanager.log"))
        processes.append(_start(["prometheus", f"--config.file={folder / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={folder / 'prometheus'}",
                                 f"--web.listen-address=127.0.0.1:{prometheus_port}"], folder / "prometheus.log"))
        stack = Stack(receiver, f"http://127.0.0.1:{prometheus_port}", f"http://127.0.0.1:{exporter_port}", token,
                      folder)
        wait_for(lambda: _ready(stack.prometheus_url) and _ready(f"http://127.0.0.1:{alertmanager_port}"), 60,
                 "Prometheus and Alertmanager to be ready", detail=stack.logs)
        stack.wait_scraped('tandem_up == 1')
        yield stack
    finally:
        for process in processes:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGKILL)
        webhook.shutdown()
        webhook.server_close()


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/-/ready", timeout=2).status_code == 200
    except requests.RequestException:
        return False
