"""What a shell's ``tridentflow`` command connects to when told nothing (no ``--redis-url``,
no ``TRIDENTFLOW_REDIS_URL``): the deployment an installed integration names - Airflow's
``redis_default`` connection, through the ``tridentflow.deployments`` entry point
(tridentflow_airflow.deployment) - else the local default. Either way it says which on
stderr, once: a shell never reads or writes another Redis than the tasks do silently."""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points
from typing import Any, TextIO

from tridentflow.redisconn import DEFAULT_REDIS_URL, REDIS_URL_ENV, redacted

GROUP = "tridentflow.deployments"


def found_deployment() -> dict[str, Any] | None:
    """The first installed integration's answer (``{"redis_url", "from"}``), None if none
    answers. An integration that fails to load or answer is skipped."""
    for point in entry_points(group=GROUP):
        try:
            answer = point.load()()
        except Exception:
            continue
        if answer and answer.get("redis_url"):
            return dict(answer)
    return None


def cli_redis_url(explicit: str | None, err: TextIO | None = None) -> str | None:
    """The Redis URL the CLI uses: ``explicit`` or TRIDENTFLOW_REDIS_URL (None: as given),
    else the deployment's, else the local default - those two said on ``err`` in one line."""
    if explicit or os.environ.get(REDIS_URL_ENV):
        return explicit
    err = err or sys.stderr
    found = found_deployment()
    if found is not None:
        url = str(found["redis_url"])
        how = (
            f"asked Airflow: seconds; later commands reuse the answer while the connection is "
            f"unchanged, or export {REDIS_URL_ENV}"
            if found.get("asked_airflow", True)
            else "remembered, the connection unchanged"
        )
        err.write(f"tridentflow: Redis {redacted(url)} from {found['from']} ({how})\n")
        return url
    err.write(
        f"tridentflow: no Redis given (--redis-url, {REDIS_URL_ENV}, or an Airflow connection "
        f"redis_default): using {DEFAULT_REDIS_URL}\n"
    )
    return DEFAULT_REDIS_URL
