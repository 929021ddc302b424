"""Turns a tridentflow pipeline into an Airflow DAG: coordinate -> emit -> commit (-> export,
for a pipeline with sinks).

Each DAG run is one txid (see tridentflow.steps.runs). Parse-time work is only the pipeline lookup
(no Spark, no Redis).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import DAG, Param

from tridentflow.errors import TridentflowError
from tridentflow.pipeline import Pipeline
from tridentflow.registry import load_pipeline
from tridentflow.settings import env_int, env_seconds
from tridentflow_airflow.assets import commit_alias
from tridentflow_airflow.compat import doubling_backoff
from tridentflow_airflow.operators import (
    CommitOperator,
    CoordinateOperator,
    EmitOperator,
    ExportOperator,
    release_on_failure,
)

RETRIES_ENV = "TRIDENTFLOW_RETRIES"
"""Default retries of tridentflow tasks (6); tests and demos shorten them."""
RETRY_DELAY_ENV = "TRIDENTFLOW_RETRY_DELAY_SECONDS"
"""Default first retry delay of tridentflow tasks (5 s), doubled at each retry."""
MAX_RETRY_DELAY_ENV = "TRIDENTFLOW_MAX_RETRY_DELAY_SECONDS"
"""Default cap on one retry delay (120 s)."""
WATCH_INTERVAL_S = 1.0
"""How often an on-data DAG's watcher asks (tridentflow_airflow.watchers.POLL_INTERVAL_S)."""
ON_DATA = "on-data"
"""``schedule=ON_DATA``: a run whenever the source has records no committed txid covers (an
asset watcher on the source, in Airflow's triggerer: tridentflow_airflow.watchers)."""
DEFAULT_RETRIES = 6
DEFAULT_RETRY_DELAY_S = 5.0
DEFAULT_MAX_RETRY_DELAY_S = 120.0
"""With these, a task's retries wait at least 5 + 10 + 20 + 40 + 80 + 120 s (Airflow's
exponential backoff adds jitter above each): an outage of Redis, Spark or a broker of about
four and a half minutes is ridden out inside one run. Every retry replays the same txid."""

DOC = """
### tridentflow pipeline `{name}`

{description}

Each run is **one txid**. `coordinate` binds the run to its txid in Redis and freezes the batch
metadata; `emit` (spark-submit) stages per-key partial aggregates; `commit` applies them in
txid order, checked inside Redis. Retrying or clearing any task replays the same txid; the
counts do not change. Guarantee: **{guarantee}**.{export}
"""

EXPORT_DOC = """

`export` then brings the pipeline's sinks ({sinks}) up to the run's txid, one atomic step
per txid; it is retried on its own, and a sink that is down shows here while the commits go
on (the next run's export catches it up)."""


def default_dag_id(pipeline_name: str) -> str:
    """The DAG id ``pipeline_dag`` gives a pipeline unless told otherwise."""
    return f"tridentflow_{pipeline_name.replace('-', '_')}"


def check_dag_arguments(
    retries: int,
    max_active_runs: int,
    batch_size: int | None,
    lease: timedelta,
    retry_delay: timedelta,
    watch_interval: float = WATCH_INTERVAL_S,
) -> None:
    """TridentflowError (one line, shown by Airflow as the DAG file's import error) for a
    value a tridentflow DAG cannot run with."""
    problems = [
        (not _whole(retries, 1), f"retries must be a whole number >= 1 (a retry replays the "
                                  f"same txid), got {retries!r}"),
        (not _whole(max_active_runs, 1), f"max_active_runs must be >= 1, got {max_active_runs!r}"),
        (batch_size is not None and not _whole(batch_size, 1),
         f"batch_size must be a whole number >= 1 or None, got {batch_size!r}"),
        (lease <= timedelta(0), f"lease must be positive, got {lease}"),
        (retry_delay < timedelta(0), f"retry_delay must be >= 0, got {retry_delay}"),
        (not (isinstance(watch_interval, (int, float)) and watch_interval > 0),
         f"watch_interval must be > 0 seconds, got {watch_interval!r}"),
    ]  # fmt: skip
    for bad, message in problems:
        if bad:
            raise TridentflowError(f"pipeline_dag: {message}")


def _whole(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def pipeline_dag(
    pipeline: str,
    *,
    dag_id: str | None = None,
    schedule: str | None = None,
    start_date: datetime = datetime(2026, 1, 1),
    max_active_runs: int = 1,
    retries: int | None = None,
    retry_delay: timedelta | None = None,
    max_retry_delay: timedelta | None = None,
    batch_size: int | None = None,
    redis_conn_id: str = "redis_default",
    spark_conn_id: str = "spark_default",
    home: str | None = None,
    lease: timedelta = timedelta(minutes=30),
    paused: bool | None = None,
    tags: Sequence[str] = (),
    watch_interval: float = WATCH_INTERVAL_S,
    catchup: bool = False,
    queues: Mapping[str, str] | None = None,
) -> DAG:
    """A DAG for ``pipeline`` (a bundled name or module:attribute).

    Retries back off exponentially: ``retries`` (TRIDENTFLOW_RETRIES, 6) from ``retry_delay``
    (TRIDENTFLOW_RETRY_DELAY_SECONDS, 5 s) doubling up to ``max_retry_delay``
    (TRIDENTFLOW_MAX_RETRY_DELAY_SECONDS, 120 s): a few minutes' outage is ridden out inside
    the run, each retry replaying the same txid. ``schedule`` may be
    a cron expression, a preset, ``@continuous`` (back-to-back runs), ``"on-data"`` (a run
    when records arrive: an asset watcher polls the source every ``watch_interval`` seconds in
    Airflow's triggerer; tridentflow_airflow.watchers) or None (manual triggers).
    ``max_active_runs`` stays 1 by default: commits are ordered in Redis anyway, and later
    txids would only wait for earlier ones. ``catchup`` (off by default) creates a run for
    every missed interval of a time-based schedule; runs with a logical date - those, and a
    backfill's - bind their txids in date order (tridentflow_airflow.dated_order).
    ``queues``: the executor queue of a step's task (``{"emit": "spark"}``: the emit on the
    Celery workers that run Spark); the others go to the default queue. Steps share nothing
    but Redis (staging in Redis, the default), so any step may run on any worker.
    """
    retry_args = _retry_args(retries, retry_delay, max_retry_delay)
    check_dag_arguments(
        retry_args["retries"],
        max_active_runs,
        batch_size,
        lease,
        retry_args["retry_delay"],
        watch_interval,
    )
    on = _step_queues(queues)
    definition = load_pipeline(pipeline)
    common = {"pipeline": pipeline, "redis_conn_id": redis_conn_id, "home": home, "lease": lease}
    dag_id = dag_id or default_dag_id(definition.name)
    timetable: object = schedule
    if schedule == ON_DATA:  # imported here: only such a DAG needs the triggerer's classes
        from tridentflow_airflow.watchers import source_asset

        timetable = [
            source_asset(pipeline, definition.name, redis_conn_id, home, watch_interval, dag_id)
        ]
    with DAG(
        dag_id,
        schedule=timetable,
        start_date=start_date,
        catchup=catchup,
        max_active_runs=max_active_runs,
        is_paused_upon_creation=paused,
        params={
            "batch_size": Param(
                batch_size,
                type=["null", "integer"],
                minimum=1,
                description="records per partition per txid (first attempt only)",
            )
        },
        default_args={**retry_args, "on_failure_callback": release_on_failure},
        tags=["tridentflow", *tags],
        description=f"{definition.description or definition.name} ({definition.guarantee.value})",
        doc_md=_dag_doc(definition),
    ) as dag:
        _add_steps(definition, common, on, spark_conn_id)
    return dag


def _retry_args(
    retries: int | None, retry_delay: timedelta | None, max_retry_delay: timedelta | None
) -> dict[str, Any]:
    """Every task's retry arguments: those given, else the settings' (doubling back-off)."""
    if retries is None:
        retries = env_int(RETRIES_ENV, DEFAULT_RETRIES)
    if retry_delay is None:
        retry_delay = timedelta(
            seconds=env_seconds(RETRY_DELAY_ENV, DEFAULT_RETRY_DELAY_S, allow_zero=True)
        )
    if max_retry_delay is None:
        max_retry_delay = timedelta(
            seconds=env_seconds(MAX_RETRY_DELAY_ENV, DEFAULT_MAX_RETRY_DELAY_S, allow_zero=True)
        )
    return {
        "retries": retries,
        "retry_delay": retry_delay,
        "retry_exponential_backoff": doubling_backoff(),
        "max_retry_delay": max_retry_delay,
    }


def _step_queues(queues: Mapping[str, str] | None) -> dict[str, dict[str, str]]:
    """Step -> its operator's ``queue`` argument; one line for a step that is not one."""
    queues = dict(queues or {})
    unknown = sorted(set(queues) - {"coordinate", "emit", "commit", "export"})
    if unknown:
        raise TridentflowError(
            f"pipeline_dag: queues names no step {unknown}: use coordinate, emit, commit, export"
        )
    return {step: {"queue": queue} for step, queue in queues.items()}


def _dag_doc(definition: Pipeline) -> str:
    """The DAG's page text: the pipeline, its guarantee, its sinks."""
    sinks = ", ".join(f.name for f in definition.feeds)
    return DOC.format(
        name=definition.name,
        description=definition.description,
        guarantee=definition.guarantee.value,
        export=EXPORT_DOC.format(sinks=sinks) if definition.feeds else "",
    )


def _add_steps(
    definition: Pipeline, common: dict[str, Any], on: dict[str, dict[str, str]], spark_conn_id: str
) -> None:
    """coordinate >> emit >> commit (>> export, with sinks), in the DAG being defined."""
    coordinate = CoordinateOperator(
        task_id="coordinate",
        batch_size="{{ params.batch_size }}",
        **common,
        **on.get("coordinate", {}),
    )
    emit = EmitOperator(task_id="emit", conn_id=spark_conn_id, **common, **on.get("emit", {}))
    commit = CommitOperator(
        task_id="commit",
        outlets=[commit_alias(definition.name)],
        **common,
        **on.get("commit", {}),
    )
    coordinate >> emit >> commit
    if definition.feeds:  # the sinks follow the commits: their own task, their own retries
        commit >> ExportOperator(task_id="export", **common, **on.get("export", {}))
