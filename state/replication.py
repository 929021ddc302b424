"""Waiting for Redis replicas: what a commit must see acknowledged before it reports success.

Redis's WAIT counts the writes of its own connection, and a master replicates in execution
order. So one connection to the master that holds ``key`` makes a small write beside it (a
probe counter in the hash ``key``) and then WAITs: when the replicas have the probe, they
have everything that master executed before it - from every client. On a Redis Cluster each
master is asked on its own: the ledger's acknowledgement says nothing of a state shard's
master (state.shards), which can fail over with its replica behind while the ledger's does
not.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

PROBE_FIELD = "replication_probes"


def node_of(client: redis.Redis, key: str) -> str:
    """The node (``host:port``) serving ``key``: the one server, or the slot's master."""
    if hasattr(client, "get_node_from_key"):  # a RedisCluster
        return client.get_node_from_key(key).name
    kw = client.connection_pool.connection_kwargs
    return kw.get("path") or f"{kw.get('host', '127.0.0.1')}:{kw.get('port', 6379)}"


def wait_for_replicas(client: redis.Redis, key: str, replicas: int, timeout_ms: int) -> int:
    """Block until ``replicas`` replicas of the master serving ``key`` (a hash) have
    everything it executed so far, or ``timeout_ms`` passes; how many acknowledged."""
    node_client = client
    if hasattr(client, "get_node_from_key"):
        node_client = client.get_node_from_key(key).redis_connection
    pipe = node_client.pipeline(transaction=False)
    pipe.hincrby(key, PROBE_FIELD, 1)
    pipe.execute_command("WAIT", int(replicas), int(timeout_ms))
    return int(pipe.execute()[-1])


def wait_for_replicas_of(
    client: redis.Redis, keys: Iterable[str], replicas: int, timeout_ms: int, skip: str = ""
) -> list[tuple[str, str, int]]:
    """``wait_for_replicas`` once per master serving one of ``keys`` (hashes), except the node
    ``skip``: (node, the key asked with, replicas that acknowledged) for each."""
    by_node: dict[str, str] = {}
    for key in keys:
        node = node_of(client, key)
        if node != skip:
            by_node.setdefault(node, key)
    return [
        (node, key, wait_for_replicas(client, key, replicas, timeout_ms))
        for node, key in by_node.items()
    ]


__all__ = ["PROBE_FIELD", "node_of", "wait_for_replicas", "wait_for_replicas_of"]
