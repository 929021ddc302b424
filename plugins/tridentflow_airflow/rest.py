"""A small client of Airflow's REST API v2 (JWT from /auth/token): what the live tests and the
Airflow benchmark drive the stack with - trigger a run, wait for it, read its task instances
and XComs."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import Any

from tridentflow_airflow.launcher import ADMIN_USER

TRIGGER_ATTEMPTS = 3


class AirflowApi:
    """Calls as ``user``; ``dag_id`` is the DAG the run methods mean when not given one."""

    def __init__(self, base: str, password: str, dag_id: str = "", user: str = ADMIN_USER) -> None:
        self.base = base
        self.dag_id = dag_id
        req = urllib.request.Request(
            f"{base}/auth/token",
            data=json.dumps({"username": user, "password": password}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            self.token = json.loads(resp.read())["access_token"]

    def call(self, method: str, path: str, body: Any = None) -> Any:
        req = urllib.request.Request(
            f"{self.base}/api/v2{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            method=method,
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read() or b"null")

    def wait_for_dag(self, dag_id: str | None = None, timeout: float = 240) -> None:
        """Until the dag-processor has parsed the DAG (the API answers 404 before)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.call("GET", f"/dags/{dag_id or self.dag_id}")
                return
            except urllib.error.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def pause(self, *dag_ids: str, paused: bool = True) -> None:
        """Pause (or unpause) DAGs; one not parsed (yet) is left alone."""
        for dag_id in dag_ids:
            with contextlib.suppress(urllib.error.HTTPError):
                self.call("PATCH", f"/dags/{dag_id}", {"is_paused": paused})

    def _runs(self, dag_id: str | None) -> str:
        return f"/dags/{dag_id or self.dag_id}/dagRuns"

    def trigger(self, dag_id: str | None = None, conf: dict[str, Any] | None = None) -> str:
        """A manual run with ``logical_date: null`` (as the UI's trigger button), with
        ``conf`` (e.g. the tridentflow DAGs' ``batch_size`` param): its run id.

        Idempotent: the run id is chosen here, so a trigger answered 500 is sent again (the
        dev stack's SQLite lets one writer in at a time: two writes of one api-server process
        can wait on each other until pysqlite's 5 s lock wait fails one), and a 409 means
        the first attempt created the run."""
        run_id = f"manual__{datetime.now(UTC).isoformat()}"
        body: dict[str, Any] = {"logical_date": None, "dag_run_id": run_id}
        if conf:
            body["conf"] = conf
        for attempt in range(TRIGGER_ATTEMPTS):
            try:
                return self.call("POST", self._runs(dag_id), body)["dag_run_id"]
            except urllib.error.HTTPError as exc:
                if exc.code == 409:
                    return run_id
                if exc.code < 500 or attempt == TRIGGER_ATTEMPTS - 1:
                    raise
                time.sleep(2)
        raise AssertionError("unreachable")

    def run(self, run_id: str, dag_id: str | None = None) -> dict[str, Any]:
        return self.call("GET", f"{self._runs(dag_id)}/{urllib.parse.quote(run_id)}")

    def wait_run(
        self, run_id: str, timeout: float = 420, poll: float = 2, dag_id: str | None = None
    ) -> str:
        deadline = time.monotonic() + timeout
        state = "unknown"
        while time.monotonic() < deadline:
            state = self.run(run_id, dag_id)["state"]
            if state in ("success", "failed"):
                return state
            time.sleep(poll)
        raise TimeoutError(f"run {run_id} still {state} after {timeout}s")

    def task(self, run_id: str, task_id: str, dag_id: str | None = None) -> dict[str, Any]:
        quoted = urllib.parse.quote(run_id)
        return self.call("GET", f"{self._runs(dag_id)}/{quoted}/taskInstances/{task_id}")

    def tries(self, run_id: str, task_id: str, dag_id: str | None = None) -> list[dict[str, Any]]:
        """Every try of a task instance (Airflow's history of it and its current try); [] if
        the run has no such task instance."""
        quoted = urllib.parse.quote(run_id)
        try:
            found = self.call("GET", f"{self._runs(dag_id)}/{quoted}/taskInstances/{task_id}/tries")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise
        return found["task_instances"]

    def xcom(self, run_id: str, task_id: str, dag_id: str | None = None) -> Any:
        quoted = urllib.parse.quote(run_id)
        entry = self.call(
            "GET",
            f"{self._runs(dag_id)}/{quoted}/taskInstances/{task_id}/xcomEntries/return_value",
        )
        value = entry["value"]
        return json.loads(value) if isinstance(value, str) else value
