"""No default Airflow password: a random one at first set-up, an operator's change kept, mode 0600 (issue 9, item 9)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

from tandem.airflow_rest import AirflowClient, AirflowError, admin_password, ensure_admin_password


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_first_set_up_generates_a_random_password_readable_by_the_owner_only(tmp_path: Path) -> None:
    first, second = tmp_path / "a" / "passwords.json", tmp_path / "b" / "passwords.json"
    assert ensure_admin_password(first) and ensure_admin_password(second)
    assert mode(first) == mode(second) == 0o600
    assert admin_password(first) != admin_password(second)
    assert len(admin_password(first)) >= 20 and admin_password(first) != "admin"


def test_an_operators_change_is_kept_and_a_readable_file_is_closed(tmp_path: Path) -> None:
    path = tmp_path / "passwords.json"
    path.write_text(json.dumps({"admin": "chosen-by-the-operator", "viewer": "v"}))
    os.chmod(path, 0o644)
    assert not ensure_admin_password(path)
    assert json.loads(path.read_text()) == {"admin": "chosen-by-the-operator", "viewer": "v"}
    assert mode(path) == 0o600


def test_the_old_default_password_is_replaced(tmp_path: Path) -> None:
    path = tmp_path / "passwords.json"
    path.write_text('{"admin": "admin"}\n')
    assert ensure_admin_password(path)
    assert admin_password(path) != "admin"


def test_a_missing_or_broken_file_is_an_error_naming_it_and_there_is_no_fallback(tmp_path: Path) -> None:
    with pytest.raises(AirflowError, match=f"{tmp_path}/none.json: not found"):
        admin_password(tmp_path / "none.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(AirflowError, match="broken.json: not a JSON object"):
        admin_password(broken)
    with pytest.raises(TypeError):
        AirflowClient("http://127.0.0.1:8080")  # type: ignore[call-arg]  (no default credentials)


def test_the_cli_says_where_the_password_is_and_never_prints_it(tmp_path: Path) -> None:
    path = tmp_path / "home" / "simple_auth_manager_passwords.json"
    env = {**os.environ, "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(path)}
    done = subprocess.run([sys.executable, "-m", "tandem.cli", "airflow-login", "--ensure"], env=env,
                          capture_output=True, text=True, timeout=60, check=True)
    assert f"password in {path}" in done.stdout and "generated a random password" in done.stdout
    assert admin_password(path) not in done.stdout + done.stderr
    again = subprocess.run([sys.executable, "-m", "tandem.cli", "airflow-login", "--ensure"], env=env,
                           capture_output=True, text=True, timeout=60, check=True)
    assert "generated" not in again.stdout


class FakeAirflow(BaseHTTPRequestHandler):
    """What the fake API servers below share: quiet, and JSON answers."""

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except BrokenPipeError:  # a client that timed out has gone
            pass


class FlakyAirflow(FakeAirflow):
    """A fake API server: a token for anyone; the first POST of a run answers 500 after creating it (its database
    commit succeeded, the answer did not), later ones 409."""

    created: list[str] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/auth/token":
            return self._answer(201, {"access_token": "t"})
        if self.path.endswith("/refused/dagRuns"):
            return self._answer(400, {"detail": "bad conf"})
        if body["dag_run_id"] in self.created:
            return self._answer(409, {"detail": "exists"})
        self.created.append(body["dag_run_id"])
        return self._answer(500, {"detail": {"reason": "Database error"}})

    patched: list[str] = []

    def do_PATCH(self) -> None:
        """A pause or unpause: the first of each DAG meets a locked SQLite database (500), the next one is done."""
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.path.endswith("/missing"):
            return self._answer(404, {"detail": "no such DAG"})
        first = self.path not in self.patched
        self.patched.append(self.path)
        return self._answer(500 if first else 200, {"detail": {"reason": "Database error"}} if first else {})


@pytest.fixture
def flaky_client(monkeypatch) -> Iterator[AirflowClient]:
    """A client of a :class:`FlakyAirflow` server, its retries 10 ms apart."""
    server = HTTPServer(("127.0.0.1", 0), FlakyAirflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr("tandem.airflow_rest.TRIGGER_RETRY_S", 0.01)
    try:
        yield AirflowClient(f"http://127.0.0.1:{server.server_port}", "admin", "secret")
    finally:
        server.shutdown()


def test_a_trigger_answered_with_a_server_error_is_tried_again_with_the_same_run_id(flaky_client) -> None:
    assert flaky_client.trigger("plan_maintenance", {}, run_id="r-1") == "r-1"  # 500, then 409: it exists once
    assert FlakyAirflow.created == ["r-1"]
    with pytest.raises(AirflowError, match="cannot trigger refused: 400"):
        flaky_client.trigger("refused", {})  # a client error is not tried again
    with pytest.raises(AirflowError, match="cannot trigger other: 500"):
        flaky_client.trigger("other", {}, run_id="r-2", attempts=1)


def test_a_pause_or_unpause_answered_with_a_server_error_is_tried_again(flaky_client) -> None:
    flaky_client.set_paused("tandem_trades_run", False)  # 500, then done
    assert [path.rsplit("/", 1)[1] for path in FlakyAirflow.patched] == ["tandem_trades_run"] * 2
    with pytest.raises(AirflowError, match="cannot pause missing: 404"):
        flaky_client.set_paused("missing", True)  # a client error is not tried again
    with pytest.raises(AirflowError, match="cannot unpause other: 500"):
        flaky_client.set_paused("other", False, attempts=1)


class SlowAirflow(FakeAirflow):
    """A fake API server too busy to answer the first read of a run, or a trigger, in time (the demo's start on two
    cores); it answers the next one. A trigger it was too slow for was created all the same."""

    reads: list[str] = []
    created: list[str] = []
    delay_s = 1.0

    def do_GET(self) -> None:
        self.reads.append(self.path)
        if len(self.reads) == 1:
            threading.Event().wait(self.delay_s)
        return self._answer(200, {"state": "success"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/auth/token":
            return self._answer(201, {"access_token": "t"})
        if body["dag_run_id"] in self.created:
            return self._answer(409, {"detail": "exists"})
        self.created.append(body["dag_run_id"])
        threading.Event().wait(self.delay_s)
        return self._answer(200, {"dag_run_id": body["dag_run_id"]})


def test_a_read_or_a_trigger_that_timed_out_is_sent_again_when_the_client_allows_it(monkeypatch) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), SlowAirflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr("tandem.airflow_rest.TRIGGER_RETRY_S", 0.01)
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        with pytest.raises(requests.Timeout):  # one attempt: the default, as before
            AirflowClient(base, "admin", "secret", timeout_s=0.3).run_state("d", "r")
        SlowAirflow.reads.clear()
        patient = AirflowClient(base, "admin", "secret", timeout_s=0.3, read_attempts=2)
        assert patient.run_state("d", "r") == "success"
        assert SlowAirflow.reads == ["/api/v2/dags/d/dagRuns/r"] * 2
        assert patient.trigger("d", {}, run_id="r-9") == "r-9"  # timed out, then 409: it was created, once
        assert SlowAirflow.created == ["r-9"]
    finally:
        server.shutdown()
