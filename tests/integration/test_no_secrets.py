"""A password in the database URL appears in no output, log or command line (issue 9, item 4).

Each failing path runs for real (the CLI, provision_postgres.sh, the library) with a URL whose
password is a marker; stdout, stderr, and the command lines of every process started meanwhile
are searched for it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SECRET = "Pw4SecretMarker"
URLS = {
    "refused": f"postgresql://tandem_user:{SECRET}@127.0.0.1:1/tandem",
    "query parameter": f"postgresql://no_such_role@127.0.0.1:5432/postgres?password={SECRET}",
    "bad percent-escape": f"postgresql://tandem_user:{SECRET}%zz@127.0.0.1:5432/tandem",
    "wrong password": f"postgresql://no_such_role:{SECRET}@127.0.0.1:5432/postgres",
    "not postgresql": f"mysql://tandem_user:{SECRET}@127.0.0.1:3306/tandem",
}


class CommandLines(threading.Thread):
    """Collects the command lines of every process while it runs (what `ps` would show)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.seen: set[str] = set()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for process in psutil.process_iter(["cmdline"]):
                self.seen.add(" ".join(process.info["cmdline"] or []))

    def __enter__(self) -> "CommandLines":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.join()


def run(argv: list[str], url: str, conf: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TANDEM_DATABASE_URL": url, "TANDEM_CONF_DIR": str(conf)}
    with CommandLines() as lines:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    leaked = [line for line in lines.seen if SECRET in line]
    assert leaked == [], f"the password was on a command line: {leaked[:2]}"
    assert SECRET not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(REPO / "conf", tmp_path / "conf")
    return tmp_path / "conf"


@pytest.mark.parametrize("url", [u for name, u in URLS.items() if name != "refused"],
                         ids=[name for name in URLS if name != "refused"])
def test_the_cli_fails_with_one_line_and_no_password(url: str, conf: Path) -> None:
    """(A refused connection is retried for 30 s first: its messages are checked in test_db_errors.)"""
    for command in (["migrate"], ["status", "trades"]):
        done = run([sys.executable, "-m", "tandem.cli", *command], url, conf)
        assert done.returncode == 2 and done.stderr.startswith("error: "), done.stderr
        assert "Traceback" not in done.stderr


@pytest.mark.parametrize("url", [u for name, u in URLS.items() if name != "not postgresql"],
                         ids=[name for name in URLS if name != "not postgresql"])
def test_provisioning_a_database_url_that_does_not_connect_says_so_without_the_password(url: str, conf: Path) -> None:
    done = run(["bash", str(REPO / "scripts" / "provision_postgres.sh"), "ensure"], url, conf)
    assert done.returncode == 1
    assert "does not connect" in done.stderr and done.stdout == ""


def test_a_config_error_about_the_url_names_the_environment_variable(conf: Path) -> None:
    done = run([sys.executable, "-m", "tandem.cli", "status"], URLS["not postgresql"], conf)
    assert done.stderr.startswith("error: TANDEM_DATABASE_URL (environment): expected a postgresql:// URL"), done.stderr
    assert "cluster.yaml" not in done.stderr


class _SlowAirflow(BaseHTTPRequestHandler):
    """``POST /auth/token`` and ``GET /api/v2/dags`` as Airflow answers them, each after a pause that keeps
    ``curl`` (and its command line) alive long enough to be seen."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ok = self.path == "/auth/token" and body == {"username": "admin", "password": SECRET}
        self._answer(201 if ok else 401, {"access_token": TOKEN} if ok else {"detail": "bad login"})

    def do_GET(self) -> None:
        ok = self.path == "/api/v2/dags" and self.headers["Authorization"] == f"Bearer {TOKEN}"
        self._answer(200 if ok else 401, {"dags": [], "total_entries": 0} if ok else {"detail": "no token"})

    def _answer(self, status: int, payload: dict) -> None:
        time.sleep(0.5)
        text = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args: object) -> None:
        pass


TOKEN = "Tok3nSecretMarker"


def test_the_readmes_rest_api_login_puts_no_password_or_token_on_a_command_line(tmp_path: Path) -> None:
    """The README's `curl` example, run as written against a stand-in for Airflow's API (issue 24, §3)."""
    readme = (REPO / "README.md").read_text()
    [snippet] = [block for block in re.findall(r"```bash\n(.*?)```", readme, re.DOTALL) if "/auth/token" in block
                 and "python3" in block]
    passwords = tmp_path / ".tandem" / "airflow" / "simple_auth_manager_passwords.json"
    passwords.parent.mkdir(parents=True)
    passwords.write_text(json.dumps({"admin": SECRET}))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowAirflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script = snippet.replace("http://127.0.0.1:8080", f"http://127.0.0.1:{server.server_port}")
        with CommandLines() as lines:
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=60)
    finally:
        server.shutdown()
    assert done.returncode == 0 and json.loads(done.stdout) == {"dags": [], "total_entries": 0}, done
    assert any("/auth/token" in line for line in lines.seen), "the watcher saw no curl at all"
    leaked = [line for line in lines.seen if SECRET in line or TOKEN in line]
    assert leaked == [], f"a secret was on a command line: {leaked[:2]}"
