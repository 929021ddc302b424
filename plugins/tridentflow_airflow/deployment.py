"""The deployment a shell's ``tridentflow`` command means when told nothing: the Redis the
Airflow tasks write through (its ``redis_default`` connection, as the api-server finds it:
environment, secrets backends, the metadata DB). Registered under the ``tridentflow.deployments``
entry point, so the CLI (which imports no Airflow) finds it where Airflow is installed."""

from __future__ import annotations

from typing import Any


def deployment() -> dict[str, Any] | None:
    """``{"redis_url", "from"}`` of Airflow's ``redis_default`` connection; None where it is
    not defined (or Airflow cannot be asked here)."""
    try:
        from tridentflow_airflow.hooks import server_redis_url

        url = server_redis_url()
    except Exception:  # no metadata DB, Airflow not configured here: nothing to say
        return None
    if url is None:
        return None
    return {"redis_url": url, "from": "Airflow's connection redis_default"}
