"""Airflow Assets of tridentflow states.

Each persisted state is an Asset ``tridentflow://CONN_ID/PIPELINE/STATE`` (the Redis connection,
the pipeline, the state). The commit task declares one AssetAlias per pipeline as its outlet and
adds an event for every state of the pipeline, with ``{txid, records, keys, run_id}``, only when
it really committed the txid: a retry or a clear that finds the txid ``already-committed``
emits nothing, so a DAG scheduled on a state runs once per committed txid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult

from airflow.sdk import Asset, AssetAlias

from tridentflow_state.keys import check_name

if TYPE_CHECKING:
    from airflow.providers.common.compat.openlineage.facet import Dataset

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


def normalize_uri(uri: SplitResult) -> SplitResult:
    """Airflow's normalizer of ``tridentflow://`` URIs (the provider's ``asset-uris``):
    ``tridentflow://CONN_ID/PIPELINE[/STATE]``, each part a valid name; ValueError (one
    line) otherwise. The scheme and the connection id are case-folded as Airflow does for
    hosts; a trailing slash goes."""
    parts = [p for p in uri.path.split("/") if p]
    if not uri.netloc or not 1 <= len(parts) <= 2:
        raise ValueError(
            f"a tridentflow asset URI is tridentflow://CONN_ID/PIPELINE[/STATE], got "
            f"{uri.geturl()!r}"
        )
    check_name("pipeline", parts[0])
    if len(parts) == 2:
        check_name("state", parts[1])
    return uri._replace(scheme=uri.scheme.lower(), path="/" + "/".join(parts), query="",
                        fragment="")  # fmt: skip


def to_openlineage(asset: Asset, lineage_context: Any = None) -> Dataset:
    """The OpenLineage dataset of a ``tridentflow://`` asset, as the tasks name it in their
    own events: a state's Redis hash (the connection's ``redis://host:port``, the state's
    key); a pipeline's source asset, or a connection that cannot be read here, as
    ``tridentflow://CONN_ID`` with the asset's path."""
    from urllib.parse import urlsplit

    from airflow.providers.common.compat.openlineage.facet import Dataset

    parsed = urlsplit(asset.uri)
    parts = [p for p in parsed.path.split("/") if p]
    if len(parts) == 2:
        try:
            from tridentflow.datasets import redis_namespace
            from tridentflow.steps.runtime import resolve_namespace
            from tridentflow_airflow.hooks import TridentflowRedisHook
            from tridentflow_state.keys import KeySpace

            url = TridentflowRedisHook(parsed.netloc).get_url()
            key = KeySpace(parts[0], resolve_namespace()).state(parts[1])
            return Dataset(namespace=redis_namespace(url), name=key)
        except Exception:  # no connection here: name it by the asset itself
            pass
    return Dataset(namespace=f"tridentflow://{parsed.netloc}", name="/".join(parts))
