"""Turns a tridentflow pipeline into an Airflow DAG: coordinate -> emit -> commit.

Each DAG run is one txid (see tridentflow.runs). Parse-time work is only the pipeline lookup
(no Spark, no Redis).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from tridentflow.registry import load_pipeline
from tridentflow_airflow.assets import commit_alias
from tridentflow_airflow.operators import (
    CommitOperator,
    CoordinateOperator,
    EmitOperator,
    release_on_failure,
)

RETRY_DELAY_ENV = "TRIDENTFLOW_RETRY_DELAY_SECONDS"
"""Default retry delay of tridentflow tasks (10 s); tests and demos shorten it."""

DOC = """
### tridentflow pipeline `{name}`

{description}

Each run is **one txid**. `coordinate` binds the run to its txid in Redis and freezes the batch
metadata; `emit` (spark-submit) stages per-key partial aggregates; `commit` applies them in
txid order, checked inside Redis. Retrying or clearing any task replays the same txid; the
counts do not change. Guarantee: **{guarantee}**.
"""


def default_dag_id(pipeline_name: str) -> str:
    """The DAG id ``pipeline_dag`` gives a pipeline unless told otherwise."""
    return f"tridentflow_{pipeline_name.replace('-', '_')}"


def pipeline_dag(
    pipeline: str,
    *,
    dag_id: str | None = None,
    schedule: str | None = None,
    start_date: datetime = datetime(2026, 1, 1),
    max_active_runs: int = 1,
    retries: int = 2,
    retry_delay: timedelta | None = None,
    batch_size: int | None = None,
    redis_conn_id: str = "redis_default",
    spark_conn_id: str = "spark_default",
    home: str | None = None,
    lease: timedelta = timedelta(minutes=30),
    paused: bool | None = None,
    tags: Sequence[str] = (),
) -> DAG:
    """A DAG for ``pipeline`` (a bundled name or module:attribute).

    ``retry_delay`` defaults to TRIDENTFLOW_RETRY_DELAY_SECONDS (10 s). ``schedule`` may be
    a cron expression, a preset, ``@continuous`` (back-to-back runs) or
    None (manual triggers). ``max_active_runs`` stays 1 by default: commits are ordered in Redis
    anyway, and later txids would only wait for earlier ones.
    """
    if retry_delay is None:
        retry_delay = timedelta(seconds=float(os.environ.get(RETRY_DELAY_ENV, "10")))
    if retries < 1:
        raise ValueError("tridentflow DAGs need retries >= 1 (a retry replays the same txid)")
    definition = load_pipeline(pipeline)
    common = {"pipeline": pipeline, "redis_conn_id": redis_conn_id, "home": home, "lease": lease}
    with DAG(
        dag_id or default_dag_id(definition.name),
        schedule=schedule,
        start_date=start_date,
        catchup=False,
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
        default_args={
            "retries": retries,
            "retry_delay": retry_delay,
            "on_failure_callback": release_on_failure,
        },
        tags=["tridentflow", *tags],
        description=f"{definition.description or definition.name} ({definition.guarantee.value})",
        doc_md=DOC.format(
            name=definition.name,
            description=definition.description,
            guarantee=definition.guarantee.value,
        ),
    ) as dag:
        coordinate = CoordinateOperator(
            task_id="coordinate", batch_size="{{ params.batch_size }}", **common
        )
        emit = EmitOperator(task_id="emit", conn_id=spark_conn_id, **common)
        commit = CommitOperator(task_id="commit", outlets=[commit_alias(definition.name)], **common)
        coordinate >> emit >> commit
    return dag
