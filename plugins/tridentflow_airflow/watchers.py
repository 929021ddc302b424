"""A txid when data arrives: the asset watcher on a pipeline's source (``schedule="on-data"``).

``SourceDataTrigger`` runs in Airflow's triggerer and fires whenever a run of the pipeline has
work (``tridentflow.steps.watch``: records past the committed offsets, or a bound txid no run
holds) and no earlier fire is still unanswered. Each fire is an event of the pipeline's source
asset (``source_asset``), and the DAG scheduled on that asset runs; its run is a txid like any
other, its coordinator deciding what it reads. A fire carries no offsets: events that Airflow
merges into one run, or that come twice, cannot lose or double a record, and the watcher keeps
firing until nothing waits.

The trigger only reads (the ledger, the source's heads); it never writes to Redis - but for a
FileSource, whose listing is its taking: new files go into the manifest as the coordinator's
listing would put them (atomic, idempotent; a txid's batch is still frozen by its coordinator).
Redis or the source out of reach is logged and polled again (with a back-off): the watcher
itself never fails.
A txid held under a live lease by a run Airflow says has finished (``dag_id``'s run, asked
through the triggerer's Task SDK channel, as the coordinator asks) is work: the next run's
coordinator releases and adopts it. An unanswered fire is not repeated while ``dag_id`` has a
run queued or running that has not bound a txid yet (the same channel counts them).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.sdk import Asset, AssetWatcher
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from tridentflow.errors import one_line
from tridentflow.steps.watch import REFIRE_AFTER_S, Watch

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0
"""How often the watcher asks Redis and the source (two or three reads per partition)."""
OUTAGE_BACKOFF_CAP_S = 30.0


class SourceDataTrigger(BaseEventTrigger):
    """Fires when ``pipeline`` has work for a new run (see the module docstring).

    Keyword arguments are what the triggerer stores (no secrets: the Redis URL comes from the
    ``redis_conn_id`` connection when the trigger starts)."""

    def __init__(
        self,
        pipeline: str,
        redis_conn_id: str = "redis_default",
        home: str | None = None,
        poll_interval: float = POLL_INTERVAL_S,
        refire_after: float = REFIRE_AFTER_S,
        dag_id: str | None = None,
    ) -> None:
        super().__init__()
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval!r}")
        self.pipeline = pipeline
        self.redis_conn_id = redis_conn_id
        self.home = home
        self.poll_interval = float(poll_interval)
        self.refire_after = float(refire_after)
        self.dag_id = dag_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "pipeline": self.pipeline,
                "redis_conn_id": self.redis_conn_id,
                "home": self.home,
                "poll_interval": self.poll_interval,
                "refire_after": self.refire_after,
                "dag_id": self.dag_id,
            },
        )

    def run_state(self, run_id: str) -> str | None:
        """What Airflow says of run ``run_id`` of ``dag_id`` (None if it cannot tell)."""
        if not self.dag_id:
            return None
        try:
            from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

            found = RuntimeTaskInstance.get_dagrun_state(self.dag_id, run_id)
        except Exception:  # not in a triggerer, unknown run, API unreachable: do not guess
            return None
        return str(getattr(found, "value", found)).lower()

    def active_runs(self) -> int | None:
        """How many runs of ``dag_id`` are queued or running (None if it cannot tell): while
        one has not bound its txid yet, an unanswered fire is not repeated."""
        if not self.dag_id:
            return None
        try:
            from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

            return int(RuntimeTaskInstance.get_dr_count(self.dag_id, states=["queued", "running"]))
        except Exception:  # not in a triggerer, API unreachable: do not guess
            return None

    def open_runtime(self) -> Any:
        """The pipeline's runtime, as its tasks open it (blocking: call it in a thread)."""
        from tridentflow.registry import load_pipeline
        from tridentflow.steps.runtime import Runtime
        from tridentflow_airflow.hooks import TridentflowRedisHook, airflow_connections

        return Runtime.open(
            load_pipeline(self.pipeline),
            redis_url=TridentflowRedisHook(self.redis_conn_id).get_url(),
            home=self.home,
            connections=airflow_connections(),
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        watch = Watch(self.refire_after)
        rt = None
        backoff = self.poll_interval
        while True:
            try:
                if rt is None:
                    rt = await asyncio.to_thread(self.open_runtime)
                now = time.monotonic()
                waiting = await asyncio.to_thread(
                    watch.poll, rt, now, self.run_state, self.active_runs
                )
                backoff = self.poll_interval
            except Exception as exc:  # Redis, the source or a connection out of reach
                log.warning("tridentflow watcher of %s: %s", self.pipeline, one_line(exc))
                rt = None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, OUTAGE_BACKOFF_CAP_S)
                continue
            if waiting is not None:
                log.info("tridentflow watcher of %s fires: %s", self.pipeline, waiting.describe())
                yield TriggerEvent({"pipeline": self.pipeline, **waiting.to_json()})
            await asyncio.sleep(self.poll_interval)


def source_asset(
    pipeline: str,
    name: str,
    redis_conn_id: str = "redis_default",
    home: str | None = None,
    poll_interval: float = POLL_INTERVAL_S,
    dag_id: str | None = None,
) -> Asset:
    """The Asset of a pipeline's uncommitted source data (``pipeline``: a bundled name or
    module:attribute; ``name``: the pipeline's name, as in Redis), watched by a
    ``SourceDataTrigger``: a DAG scheduled on it runs when data arrives
    (``pipeline_dag(..., schedule="on-data")``; ``dag_id``: that DAG, whose runs' states the
    watcher asks)."""
    trigger = SourceDataTrigger(
        pipeline, redis_conn_id, home, poll_interval, REFIRE_AFTER_S, dag_id
    )
    return Asset(
        uri=f"tridentflow://{redis_conn_id}/{name}",
        name=f"tridentflow/{name}",
        group="tridentflow",
        watchers=[AssetWatcher(name=f"tridentflow-source-{name}", trigger=trigger)],
    )
