"""Every key of one state, found, deleted for good or moved to another state's names - what
``tridentflow evolve --drop-state`` / ``--rename-state`` do.

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


PER_TXID = ("written", "undo", "changes")
"""The kinds of key a state has one of per txid (written-sets, undo logs, change logs)."""


def state_keys(client: redis.Redis, keyspace: KeySpace, name: str) -> Iterator[str]:
    """Every key of state ``name`` that exists now, each once (read-only)."""
    for key, _same in _keys_of(client, keyspace, name, name):
        yield key


def _keys_of(
    client: redis.Redis, keyspace: KeySpace, name: str, other: str
) -> Iterator[tuple[str, str]]:
    """(each existing key of state ``name``, the same key of state ``other``): in the same
    slot - a state's name is not in its hash tag - so RENAME works on a Redis Cluster."""
    slots = [keyspace, *(keyspace.shard(i) for i in range(keyspace.shards))]
    seen: set[str] = set()
    for slot in slots:
        fixed = [
            (slot.state(name), slot.state(other)),
            (slot.expiry(name), slot.expiry(other)),
            (slot.expiry_built(name), slot.expiry_built(other)),
            (slot.change_counts(name), slot.change_counts(other)),
        ]
        for key, same in fixed:
            if key not in seen and client.exists(key):
                seen.add(key)
                yield key, same
        escaped = slot.base.replace("{", "\\{").replace("}", "\\}")
        for kind in PER_TXID:
            for raw in client.scan_iter(match=f"{escaped}:{kind}:{name}:*", count=1000):
                key = raw.decode() if isinstance(raw, bytes) else raw
                if key not in seen:
                    seen.add(key)
                    txid = int(key.rsplit(":", 1)[1])
                    yield key, getattr(slot, kind)(other, txid)


def rename_state_keys(client: redis.Redis, keyspace: KeySpace, old: str, new: str) -> int:
    """RENAME every key of state ``old`` to the same key of state ``new`` (overwriting it),
    one key at a time, each within its slot. Idempotent: a key already moved is no longer
    found. Returns how many moved."""
    moved = 0
    for key, target in _keys_of(client, keyspace, old, new):
        client.rename(key, target)
        moved += 1
    return moved


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
