"""Every key of one state, found, deleted for good, moved to another state's names or its
values rewritten by a function - what ``tridentflow evolve --drop-state`` / ``--rename-state`` /
``--migrate`` do.

A state's keys live in its pipeline's keyspace and in each of its shards (tridentflow_state.keys):
the values (``state``), the expiry index and its built mark, the change-log seals, and the
per-txid keys - written-sets, undo logs, change logs - found by SCAN with each slot's pattern
(on a Redis Cluster the client scans every master). Idempotent: run again after a kill, it
deletes what is left; a key a straggler of the old code writes meanwhile is deleted by the
next run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

import redis

from tridentflow_state.codec import encode_value
from tridentflow_state.errors import StateError
from tridentflow_state.keys import KeySpace
from tridentflow_state.scripts import LuaScript

DELETE_CHUNK = 500


PER_TXID = ("written", "undo", "changes")
"""The kinds of key a state has one of per txid (written-sets, undo logs, change logs)."""


def _slots(keyspace: KeySpace) -> list[KeySpace]:
    """The pipeline's own slot and each of its state shards' (an unsharded one: itself)."""
    return [keyspace, *(keyspace.shard(i) for i in range(keyspace.shards))]


def _per_txid(client: redis.Redis, slot: KeySpace, kind: str, name: str) -> Iterator[str]:
    """The existing keys of state ``name`` of one per-txid ``kind`` in ``slot`` (SCAN)."""
    escaped = slot.base.replace("{", "\\{").replace("}", "\\}")
    for raw in client.scan_iter(match=f"{escaped}:{kind}:{name}:*", count=1000):
        yield _text(raw)


def state_keys(client: redis.Redis, keyspace: KeySpace, name: str) -> Iterator[str]:
    """Every key of state ``name`` that exists now, each once (read-only)."""
    for key, _same in _keys_of(client, keyspace, name, name):
        yield key


def _keys_of(
    client: redis.Redis, keyspace: KeySpace, name: str, other: str
) -> Iterator[tuple[str, str]]:
    """(each existing key of state ``name``, the same key of state ``other``): in the same
    slot - a state's name is not in its hash tag - so RENAME works on a Redis Cluster."""
    seen: set[str] = set()
    for slot in _slots(keyspace):
        fixed = [
            (slot.state(name), slot.state(other)),
            (_copy_key(slot, name), _copy_key(slot, other)),
            (_done_key(slot, name), _done_key(slot, other)),
            (slot.expiry(name), slot.expiry(other)),
            (slot.expiry_built(name), slot.expiry_built(other)),
            (slot.change_counts(name), slot.change_counts(other)),
        ]
        for key, same in fixed:
            if key not in seen and client.exists(key):
                seen.add(key)
                yield key, same
        for kind in PER_TXID:
            for key in _per_txid(client, slot, kind, name):
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
    chunks of DELETE_CHUNK keys. Idempotent; returns how many were deleted."""
    return unlink_all(client, state_keys(client, keyspace, name))


def unlink_all(
    client: redis.Redis, keys: Iterable[str], after_chunk: Callable[[], None] | None = None
) -> int:
    """UNLINK ``keys`` DELETE_CHUNK at a time, one call per key (``_unlink``: on a Redis
    Cluster a chunk's keys may lie in several slots); ``after_chunk`` is called after each
    chunk. Returns how many existed."""
    deleted, keys = 0, iter(keys)
    while chunk := list(islice(keys, DELETE_CHUNK)):
        deleted += _unlink(client, chunk)
        if after_chunk is not None:
            after_chunk()
    return deleted


def _unlink(client: redis.Redis, keys: list[str]) -> int:
    with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.unlink(key)
        return sum(int(n) for n in pipe.execute())


MIGRATE_CHUNK = 1000
"""Fields read (HSCAN) and written (HSET) at a time: a migration holds one chunk in memory."""
VALUE_KINDS = ("undo", "changes")
"""The per-txid keys that hold stored values (undo logs, change logs) - migrated too."""

SWAP_MIGRATED = LuaScript(
    "swap_migrated",
    """
-- Put a key's migrated copy in its place and note the key done, atomically: a migration killed
-- at any point transforms no key twice (a copy not swapped in is made again from the key).
-- KEYS[1] the migrated copy  KEYS[2] the key it replaces  KEYS[3] the set of keys done (all
-- three in one slot)
-- ARGV[1] the name of KEYS[2] (the member noted)
-- Returns 1 if swapped now, 0 if the key was done already.
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('RENAME', KEYS[1], KEYS[2])
else
  redis.call('DEL', KEYS[2])
end
redis.call('SADD', KEYS[3], ARGV[1])
return 1
""",
)


def _copy_key(slot: KeySpace, name: str) -> str:
    """Where a migration builds the copy of one key of state ``name`` in ``slot``."""
    return slot.migrate_copy(name)


def _done_key(slot: KeySpace, name: str) -> str:
    """Set: the keys of state ``name`` in ``slot`` a migration has swapped in."""
    return slot.migrated(name)


def migrate_state_keys(
    client: redis.Redis, keyspace: KeySpace, name: str, function: Callable[[Any], Any]
) -> int:
    """Apply ``function`` to every stored value of state ``name`` - the committed value and
    the one before it, in the state and in its undo and change logs (None stays None, an undo
    log's "absent" stays) - one key at a time: a copy is built in chunks, then swapped in and
    noted done in one script (SWAP_MIGRATED). Resumable: a key done is skipped; a copy cut
    short is made again. StateError (one line) if the function fails on a value or returns
    one that cannot be stored; the key it failed on is left as it was. Returns the keys
    swapped in now; ``finish_migration`` clears the notes once every key is done."""
    swapped = 0
    for slot, key in _value_keys(client, keyspace, name):
        done, copy = _done_key(slot, name), _copy_key(slot, name)
        if client.sismember(done, key):
            continue
        client.delete(copy)
        chunk: dict[str, str] = {}
        for field, raw in client.hscan_iter(key, count=MIGRATE_CHUNK):
            chunk[_text(field)] = _migrated(name, _text(field), _text(raw), function)
            if len(chunk) >= MIGRATE_CHUNK:
                client.hset(copy, mapping=chunk)
                chunk = {}
        if chunk:
            client.hset(copy, mapping=chunk)
        swapped += int(SWAP_MIGRATED(client, [copy, key, done], [key]))
    return swapped


def finish_migration(client: redis.Redis, keyspace: KeySpace, name: str) -> None:
    """Forget a finished migration's notes (every slot's done-set and copy). Idempotent."""
    for slot in _slots(keyspace):
        client.delete(_done_key(slot, name), _copy_key(slot, name))


def _value_keys(
    client: redis.Redis, keyspace: KeySpace, name: str
) -> Iterator[tuple[KeySpace, str]]:
    """(slot, key) of every key of state ``name`` that holds stored values."""
    seen: set[str] = set()
    for slot in _slots(keyspace):
        keys = [slot.state(name)]
        for kind in VALUE_KINDS:
            keys += list(_per_txid(client, slot, kind, name))
        for key in keys:
            if key not in seen and client.exists(key):
                seen.add(key)
                yield slot, key


def _migrated(name: str, field: str, raw: str, function: Callable[[Any], Any]) -> str:
    """One stored value ``[txid, curr, prev]`` with ``function`` applied to curr and prev
    (an undo log's "absent", '', as it is)."""
    if raw == "":
        return raw
    stored = json.loads(raw)
    try:
        txid, curr, prev = stored
        out = [txid, *(None if v is None else function(v) for v in (curr, prev))]
        return encode_value(out)
    except Exception as exc:
        raise StateError(
            f"state {name}, key {field}: the migration failed on {stored!r:.60} "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); fix "
            "the function and run the migration again (the keys done stay done)"
        ) from None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
