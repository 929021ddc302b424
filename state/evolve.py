"""Every key of one state, found and deleted for good - what ``tridentflow evolve --drop-state``
does once the pipeline's code no longer has the state.

A state's keys live in its pipeline's keyspace and in each of its shards (tridentflow_state.keys):
the values (``state``), the expiry index and its built mark, the change-log seals, and the
per-txid keys - written-sets, undo logs, change logs - found by SCAN with each slot's pattern
(on a Redis Cluster the client scans every master). Idempotent: run again after a kill, it
deletes what is left; a key a straggler of the old code writes meanwhile is deleted by the
next run.
"""

from __future__ import annotations

from collections.abc import Iterator

import redis

from tridentflow_state.keys import KeySpace

DELETE_CHUNK = 500


def state_keys(client: redis.Redis, keyspace: KeySpace, name: str) -> Iterator[str]:
    """Every key of state ``name`` that exists now, each once (read-only)."""
    slots = [keyspace, *(keyspace.shard(i) for i in range(keyspace.shards))]
    seen: set[str] = set()
    for slot in slots:
        fixed = (slot.state(name), slot.expiry(name), slot.expiry_built(name),
                 slot.change_counts(name))  # fmt: skip
        for key in fixed:
            if key not in seen and client.exists(key):
                seen.add(key)
                yield key
        escaped = slot.base.replace("{", "\\{").replace("}", "\\}")
        for per_txid in ("written", "undo", "changes"):
            for raw in client.scan_iter(match=f"{escaped}:{per_txid}:{name}:*", count=1000):
                key = raw.decode() if isinstance(raw, bytes) else raw
                if key not in seen:
                    seen.add(key)
                    yield key


def delete_state_keys(client: redis.Redis, keyspace: KeySpace, name: str) -> int:
    """UNLINK every key of state ``name`` (Redis frees big hashes in the background), in
    chunks of DELETE_CHUNK keys of one slot. Idempotent; returns how many were deleted."""
    deleted = 0
    chunk: list[str] = []
    for key in state_keys(client, keyspace, name):
        chunk.append(key)
        if len(chunk) >= DELETE_CHUNK:
            deleted += _unlink(client, chunk)
            chunk = []
    if chunk:
        deleted += _unlink(client, chunk)
    return deleted


def _unlink(client: redis.Redis, keys: list[str]) -> int:
    """UNLINK ``keys`` one call per key: on a Redis Cluster the keys of a chunk may lie in
    several slots (the per-txid keys of different shards)."""
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.unlink(key)
        return sum(int(n) for n in pipe.execute())
