"""A small client for Airflow 3's REST API (``/api/v2``), for the demo, the CLI and e2e tests."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import requests

from tandem.errors import TandemError

FINISHED = {"success", "failed"}


class AirflowError(TandemError):
    """Airflow's API refused a request or a run did not finish as expected."""


@dataclass
class AirflowClient:
    """Token-authenticated calls to one Airflow API server."""

    base_url: str
    username: str = "admin"
    password: str = "admin"
    timeout_s: float = 30.0
    _token: str | None = field(default=None, repr=False)

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

    def wait_for_dag(self, dag_id: str, timeout_s: float = 180.0) -> dict[str, Any]:
        """Wait until the DAG processor has parsed ``dag_id``; fail with its import errors otherwise."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            response = self.request("GET", f"/dags/{dag_id}")
            if response.ok:
                return response.json()
            time.sleep(2)
        errors = self.request("GET", "/importErrors").json().get("import_errors", [])
        detail = "; ".join(f"{e.get('filename')}: {e.get('stack_trace', '')[-300:]}" for e in errors) or "none"
        raise AirflowError(f"DAG {dag_id} did not appear within {timeout_s:.0f} s (import errors: {detail})")

    def unpause(self, dag_id: str) -> None:
        response = self.request("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        if not response.ok:
            raise AirflowError(f"cannot unpause {dag_id}: {response.status_code} {response.text[:200]}")

    def trigger(self, dag_id: str, conf: dict[str, Any], run_id: str | None = None) -> str:
        """Trigger a run with ``conf`` (the DAG's Params); return its run id."""
        run_id = run_id or f"tandem__{uuid.uuid4().hex[:12]}"
        response = self.request("POST", f"/dags/{dag_id}/dagRuns",
                                json={"dag_run_id": run_id, "logical_date": None, "conf": conf})
        if not response.ok:
            raise AirflowError(f"cannot trigger {dag_id}: {response.status_code} {response.text[:300]}")
        return response.json()["dag_run_id"]

    def runs(self, dag_id: str, run_type: str | None = None) -> list[dict[str, Any]]:
        """The DAG's runs (newest first), optionally of one type (``scheduled``, ``manual``)."""
        params: dict[str, Any] = {"order_by": "-run_after", "limit": 100}
        if run_type:
            params["run_type"] = [run_type]
        response = self.request("GET", f"/dags/{dag_id}/dagRuns", params=params)
        if not response.ok:
            raise AirflowError(f"cannot list runs of {dag_id}: {response.status_code} {response.text[:200]}")
        return response.json()["dag_runs"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        response = self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
        if not response.ok:
            raise AirflowError(f"cannot read run {run_id} of {dag_id}: {response.status_code}")
        return response.json()["state"]

    def wait_for_run(self, dag_id: str, run_id: str, timeout_s: float = 300.0) -> str:
        """Wait until a run finishes; return ``success`` or raise with the failed tasks."""
        deadline = time.monotonic() + timeout_s
        state = "queued"
        while time.monotonic() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in FINISHED:
                break
            time.sleep(2)
        if state != "success":
            tasks = self.request("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()
            summary = ", ".join(f"{t['task_id']}={t['state']}" for t in tasks.get("task_instances", []))
            raise AirflowError(f"run {run_id} of {dag_id} ended {state!r} (tasks: {summary or 'none'})")
        return state
