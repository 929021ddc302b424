"""Airflow Assets of tridentflow states.

Each persisted state is an Asset ``tridentflow://CONN_ID/PIPELINE/STATE`` (the Redis connection,
the pipeline, the state). The commit task declares one AssetAlias per pipeline as its outlet and
adds an event for every state of the pipeline, with ``{txid, records, keys, run_id}``, only when
it really committed the txid: a retry or a clear that finds the txid ``already-committed``
emits nothing, so a DAG scheduled on a state runs once per committed txid.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, AssetAlias

DEFAULT_CONN_ID = "redis_default"


def state_asset(pipeline: str, state: str, redis_conn_id: str = DEFAULT_CONN_ID) -> Asset:
    """The Asset of one state (``pipeline`` is the pipeline's name, as in Redis)."""
    return Asset(
        uri=f"tridentflow://{redis_conn_id}/{pipeline}/{state}",
        name=f"tridentflow/{pipeline}/{state}",
        group="tridentflow",
    )


def commit_alias(pipeline: str) -> AssetAlias:
    """The outlet of a pipeline's commit task: resolved to its states' Assets per commit."""
    return AssetAlias(name=f"tridentflow-commit-{pipeline}", group="tridentflow")


def emit_commit_events(
    outlet_events: Any, pipeline: str, states: list[str], redis_conn_id: str, result: dict
) -> int:
    """Add one Asset event per state for a commit ``result``; none unless it committed
    something (a txid that read no record and changed no key changed no state)."""
    if result.get("status") != "committed":
        return 0
    if not result.get("records") and not result.get("keys") and not result.get("quarantined"):
        return 0
    extra = {k: result.get(k) for k in ("txid", "records", "keys", "run_id")}
    alias = outlet_events[commit_alias(pipeline)]
    for state in states:
        alias.add(state_asset(pipeline, state, redis_conn_id), extra=extra)
    return len(states)
