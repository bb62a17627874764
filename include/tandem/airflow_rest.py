"""A small client for Airflow 3's REST API (``/api/v2``), for the demo, the CLI and e2e tests.

The local stack's login is ``admin`` with a random password that set-up writes into
SimpleAuthManager's password file (mode 0600); an operator who changes it there keeps the change.
There is no default password anywhere.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

import requests

from tandem.errors import TandemError

FINISHED = {"success", "failed"}


class AirflowError(TandemError):
    """Airflow's API refused a request or a run did not finish as expected."""


ADMIN = "admin"
PASSWORDS_FILE_NAME = "simple_auth_manager_passwords.json"
_OLD_DEFAULT = "admin"  # what set-up used to force on every run: never an operator's choice, so it is replaced


def passwords_file(airflow_home: Path | None = None) -> Path:
    """SimpleAuthManager's password file: of ``airflow_home``, else the configured one (``.tandem/env.sh``)."""
    if airflow_home is None:
        configured = os.environ.get("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE")
        if configured:
            return Path(configured)
        airflow_home = Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow")
    return Path(airflow_home) / PASSWORDS_FILE_NAME


def _read_passwords(path: Path) -> dict[str, str]:
    try:
        passwords = json.loads(path.read_text())
    except FileNotFoundError:
        raise AirflowError(f"{path}: not found (run `make setup`)") from None
    except (OSError, ValueError) as exc:
        raise AirflowError(f"{path}: not a JSON object of user -> password ({type(exc).__name__})") from None
    if not isinstance(passwords, dict):
        raise AirflowError(f"{path}: not a JSON object of user -> password")
    return passwords


def ensure_admin_password(path: Path) -> bool:
    """Give ``admin`` a random password in the file unless it has one (an operator's change is kept).

    The old default password (``admin``, which set-up used to force) counts as none.

    The file is made readable by its owner only (0600). Returns whether a password was generated.
    """
    passwords = _read_passwords(path) if path.exists() else {}
    generated = passwords.get(ADMIN) in (None, "", _OLD_DEFAULT)
    if generated:
        passwords[ADMIN] = secrets.token_urlsafe(18)
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_name(f".{path.name}.{os.getpid()}")
        with os.fdopen(os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as handle:
            json.dump(passwords, handle)
            handle.write("\n")
        os.replace(staged, path)
    os.chmod(path, 0o600)
    return generated


def admin_password(path: Path) -> str:
    """``admin``'s password from SimpleAuthManager's file (an error naming the file when there is none)."""
    password = _read_passwords(path).get(ADMIN)
    if not password:
        raise AirflowError(f"{path}: no password for {ADMIN!r} (run `make setup`)")
    return password


def login_hint(path: Path | None = None) -> str:
    """Where an operator finds the login, for closing lines and logs (never the password itself)."""
    return f"login {ADMIN}, password in {path or passwords_file()}"


TRIGGER_ATTEMPTS = 4
TRIGGER_RETRY_S = 2.0
"""A trigger that met a server error is tried again after this many seconds times its attempt number."""


@dataclass
class AirflowClient:
    """Token-authenticated calls to one Airflow API server."""

    base_url: str
    username: str
    password: str = field(repr=False)
    timeout_s: float = 30.0
    read_attempts: int = 1
    """Tries of a read (GET) that timed out or found no server: a busy API server (the demo's start, on two cores)
    answers a poll late; a read is safe to send again."""
    _token: str | None = field(default=None, repr=False)

    @classmethod
    def as_admin(cls, base_url: str, airflow_home: Path | None = None, **kwargs: Any) -> "AirflowClient":
        """A client logged in as ``admin`` with the password of the local stack's password file."""
        return cls(base_url, ADMIN, admin_password(passwords_file(airflow_home)), **kwargs)

    def _headers(self) -> dict[str, str]:
        if self._token is None:
            response = requests.post(f"{self.base_url}/auth/token", timeout=self.timeout_s,
                                     json={"username": self.username, "password": self.password})
            if response.status_code >= 300:
                raise AirflowError(f"login to {self.base_url} as {self.username!r} failed: "
                                   f"{response.status_code} {response.text[:200]}")
            self._token = response.json()["access_token"]
        return {"Authorization": f"Bearer {self._token}"}

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        attempts = self.read_attempts if method == "GET" else 1
        for attempt in range(1, attempts + 1):
            try:
                return self._send(method, path, **kwargs)
            except (requests.Timeout, requests.ConnectionError):
                if attempt == attempts:
                    raise
                time.sleep(TRIGGER_RETRY_S * attempt)
        raise AssertionError("unreachable")

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        response = requests.request(method, f"{self.base_url}/api/v2{path}", headers=self._headers(),
                                    timeout=self.timeout_s, **kwargs)
        if response.status_code == 401:  # token expired: log in again once
            self._token = None
            response = requests.request(method, f"{self.base_url}/api/v2{path}", headers=self._headers(),
                                        timeout=self.timeout_s, **kwargs)
        return response

    def healthy(self) -> bool:
        try:
            response = requests.get(f"{self.base_url}/api/v2/monitor/health", timeout=5)
            return response.ok and response.json().get("metadatabase", {}).get("status") == "healthy"
        except requests.RequestException:
            return False

    def wait_for_dag(self, dag_id: str, timeout_s: float = 180.0,
                     between: Callable[[], None] | None = None) -> dict[str, Any]:
        """Wait until the DAG processor has parsed ``dag_id``; fail with its import errors otherwise. ``between``
        is called before each pause (it may raise to stop waiting)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            response = self.request("GET", f"/dags/{dag_id}")
            if response.ok:
                return response.json()
            if between is not None:
                between()
            time.sleep(2)
        errors = self.request("GET", "/importErrors").json().get("import_errors", [])
        detail = "; ".join(f"{e.get('filename')}: {e.get('stack_trace', '')[-300:]}" for e in errors) or "none"
        raise AirflowError(f"DAG {dag_id} did not appear within {timeout_s:.0f} s (import errors: {detail})")

    def set_paused(self, dag_id: str, paused: bool, attempts: int = TRIGGER_ATTEMPTS) -> None:
        """Pause or unpause the DAG. A server error (a SQLite metadata database locked by another writer answers
        500) is tried again, ``attempts`` times in all, as :meth:`trigger` does: the change is the same each time."""
        for attempt in range(1, attempts + 1):
            response = self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": paused})
            if response.ok:
                return
            if response.status_code < 500 or attempt == attempts:
                raise AirflowError(f"cannot {'pause' if paused else 'unpause'} {dag_id}: "
                                   f"{response.status_code} {response.text[:200]}"
                                   + (f" (after {attempt} attempts)" if attempt > 1 else ""))
            time.sleep(TRIGGER_RETRY_S * attempt)

    def trigger(self, dag_id: str, conf: dict[str, Any], run_id: str | None = None,
                attempts: int = TRIGGER_ATTEMPTS) -> str:
        """Trigger a run with ``conf`` (the DAG's Params); return its run id.

        A server error (an API server whose metadata database is briefly unreachable answers 500), or no answer in
        time, is tried again with the same run id, ``attempts`` times in all; a retry answered "already exists"
        (409) found the run the attempt before created.
        """
        run_id = run_id or f"tandem__{uuid.uuid4().hex[:12]}"
        for attempt in range(1, attempts + 1):
            try:
                response = self.request("POST", f"/dags/{dag_id}/dagRuns",
                                        json={"dag_run_id": run_id, "logical_date": None, "conf": conf})
            except (requests.Timeout, requests.ConnectionError):
                if attempt == attempts:
                    raise
                time.sleep(TRIGGER_RETRY_S * attempt)
                continue
            if response.ok:
                return response.json()["dag_run_id"]
            if response.status_code == 409 and attempt > 1:
                return run_id
            if response.status_code < 500 or attempt == attempts:
                raise AirflowError(f"cannot trigger {dag_id}: {response.status_code} {response.text[:300]}"
                                   + (f" (after {attempt} attempts)" if attempt > 1 else ""))
            time.sleep(TRIGGER_RETRY_S * attempt)
        raise AssertionError("unreachable")

    def runs(self, dag_id: str, run_type: str | None = None) -> list[dict[str, Any]]:
        """The DAG's runs (newest first), optionally of one type (``scheduled``, ``manual``)."""
        params: dict[str, Any] = {"order_by": "-run_after", "limit": 100}
        if run_type:
            params["run_type"] = [run_type]
        response = self.request("GET", f"/dags/{dag_id}/dagRuns", params=params)
        if not response.ok:
            raise AirflowError(f"cannot list runs of {dag_id}: {response.status_code} {response.text[:200]}")
        return response.json()["dag_runs"]

    def set_run_state(self, dag_id: str, run_id: str, state: str) -> None:
        """Mark a run ``success`` or ``failed`` (its unfinished tasks end with it)."""
        response = self.request("PATCH", f"/dags/{dag_id}/dagRuns/{run_id}", json={"state": state})
        if not response.ok:
            raise AirflowError(f"cannot mark run {run_id} of {dag_id} {state}: {response.status_code} "
                               f"{response.text[:200]}")

    def run_state(self, dag_id: str, run_id: str) -> str:
        response = self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
        if not response.ok:
            raise AirflowError(f"cannot read run {run_id} of {dag_id}: {response.status_code}")
        return response.json()["state"]

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        """The run's task instances (task id, state, hostname, queue, …)."""
        response = self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        if not response.ok:
            raise AirflowError(f"cannot list the tasks of run {run_id} of {dag_id}: {response.status_code}")
        return response.json()["task_instances"]

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float = 300.0,
                     between: Callable[[], None] | None = None) -> str:
        """Wait until a run finishes; return ``success`` or raise with the failed tasks. ``between`` is called
        before each pause (it may raise to stop waiting)."""
        deadline = time.monotonic() + timeout_s
        state = "queued"
        while time.monotonic() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in FINISHED:
                break
            if between is not None:
                between()
            time.sleep(2)
        if state != "success":
            summary = ", ".join(f"{t['task_id']}={t['state']}" for t in self.task_instances(dag_id, run_id))
            raise AirflowError(f"run {run_id} of {dag_id} ended {state!r} (tasks: {summary or 'none'})")
        return state
