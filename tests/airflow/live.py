"""The live Airflow stack for tests: `tridentflow-airflow up` in this process, with extra
environment for its components, and what tests wait for on it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tridentflow.devtools import devredis
from tridentflow_airflow import launcher
from tridentflow_airflow.rest import AirflowApi

DAG = "tridentflow_wordcount"
QUIET_DAGS = (
    "tridentflow_partitioned_count",
    "tridentflow_wordcount_continuous",
    "tridentflow_wordcount_on_data",
)
"""Scheduled DAGs a test's runs should not compete with."""
TEARDOWN_GRACE_S = 3
"""How long a component may take to stop after the test is done before it is killed (the
launcher's own default, 20 s, is for a deployment's tasks to finish; a test's are over)."""


@contextmanager
def stack(
    home: Path, redis_url: str, env: dict[str, str], dag: str = DAG, **up: Any
) -> Iterator[AirflowApi]:
    """The stack up (its components see ``env`` too), ``dag`` (the word count's) listed and
    the scheduled DAGs paused; down (Connect server included) afterwards."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        info = launcher.up(home, devredis.free_port(), redis_url, **up)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        api = AirflowApi(info["url"], launcher.admin_password(home), dag)
        api.wait_for_dag(timeout=180)
        api.pause(*QUIET_DAGS)
        yield api
    finally:
        launcher.down(home, grace=TEARDOWN_GRACE_S)
        launcher.drop_metadata_db(home)


def wait_task_running(
    api: AirflowApi, run_id: str, task_id: str, timeout: float = 240, dag_id: str | None = None
) -> None:
    """Until ``task_id`` of ``run_id`` runs (AssertionError with its state past ``timeout``)."""
    deadline = time.monotonic() + timeout
    while api.task(run_id, task_id, dag_id=dag_id)["state"] != "running":
        assert time.monotonic() < deadline, api.task(run_id, task_id, dag_id=dag_id)
        time.sleep(0.2)


def view_json(api: AirflowApi, path: str) -> Any:
    """An answer of the tridentflow view's JSON API, with the REST client's token."""
    import json
    import urllib.request

    request = urllib.request.Request(
        f"{api.base}/tridentflow/api/{path}", headers={"Authorization": f"Bearer {api.token}"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())
