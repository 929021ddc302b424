"""The undo log: for each of the last R committed txids, the value every key it wrote held
right before it - what ``query --as-of`` and ``rewind`` read.

Written by the state writes themselves (FENCED_HSET, APPLY_NUMERIC with a fence asking for
it), in the same script call as the write: a key is never written without its prior value
kept. Only the first write of a key in a txid is recorded, so a retried commit attempt, or
the rollback of an earlier attempt's stray write, keeps the value from before the txid. One
hash per (state, txid) in each state shard's slot: field -> the stored JSON as it was
(``[txid, curr, prev]``), '' for a key that did not exist.

The undo meta hash (``KeySpace.undo_meta``, the ledger's slot) says what is retained, moved
by the commit mark itself (MARK_COMMITTED): ``from``, the oldest txid whose undo logs are
complete (absent: nothing is); ``offsets:T``, the source offsets right after T. State as of
txid N can be rebuilt for ``from - 1 <= N <= committed``. ``trim_undo`` (after each commit,
best effort: a crash leaves more, never less) deletes what fell out of the range, below
``purged``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import StoredValue, decode_stored
from tridentflow_state.shards import split_by_shard

ABSENT = b""
"""An undo entry for a key that did not exist before the txid."""


def _str(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


@dataclass(frozen=True)
class Retained:
    """The txids state can be rebuilt as of: ``oldest`` .. ``newest`` (the committed txid)."""

    oldest: int
    newest: int

    def covers(self, txid: int) -> bool:
        return self.oldest <= txid <= self.newest

    def line(self) -> str:
        return f"txids {self.oldest}..{self.newest}"


def retained(client: redis.Redis, keyspace: KeySpace) -> Retained | None:
    """The retained range, None when no undo log is kept (retention off, or just turned on:
    the range opens with the next commit)."""
    raw_from, committed = (
        client.hget(keyspace.undo_meta, "from"),
        client.hget(keyspace.ledger, "committed"),
    )
    if raw_from is None:
        return None
    newest = int(committed or 0)
    oldest = int(raw_from) - 1
    return Retained(oldest, newest) if oldest <= newest else None


def offsets_after(client: redis.Redis, keyspace: KeySpace, txid: int) -> dict[int, int] | None:
    """The source offsets right after ``txid`` committed; None if not retained."""
    raw = client.hget(keyspace.undo_meta, f"offsets:{int(txid)}")
    if raw is None:
        return None
    return {int(p): int(o) for p, o in json.loads(raw).items()}


def _shards(keyspace: KeySpace) -> Iterator[KeySpace]:
    for index in range(keyspace.shards):
        yield keyspace.shard(index)


def trim_undo(client: redis.Redis, keyspace: KeySpace, states: Iterable[str]) -> int:
    """Delete the undo logs (and kept offsets) the retained range no longer covers: every
    txid below ``from`` (everything, with retention off). Idempotent; resumes what a crash
    cut short (``purged`` moves last). Returns the number of txids dropped."""
    meta = keyspace.undo_meta
    purged_raw, from_raw = client.hmget(meta, ["purged", "from"])
    if purged_raw is None:
        return 0
    purged = int(purged_raw)
    if from_raw is None:
        upto = int(client.hget(keyspace.ledger, "committed") or 0) + 1
    else:
        upto = int(from_raw)
    if upto <= purged:
        return 0
    names = list(states)
    for txid in range(purged, upto):  # UNLINK: Redis frees the hashes in the background
        client.unlink(*(s.undo(name, txid) for s in _shards(keyspace) for name in names))
    stale = [f"offsets:{t}" for t in range(max(0, purged - 1), upto - 1)]
    if stale:
        client.hdel(meta, *stale)
    if from_raw is None:
        offsets = [f for f in client.hkeys(meta) if _str(f).startswith("offsets:")]
        client.hdel(meta, "purged", *offsets)
    else:
        client.hset(meta, "purged", upto)
    return upto - purged


def undo_entries(
    client: redis.Redis, keyspace: KeySpace, state: str, txid: int, count: int = 10_000
) -> Iterator[tuple[bytes, bytes]]:
    """(encoded key, prior stored JSON or ABSENT) of every key ``txid`` wrote in ``state``,
    shard after shard."""
    for space in _shards(keyspace):
        yield from client.hscan_iter(space.undo(state, txid), count=count)


def priors_as_of(
    client: redis.Redis,
    keyspace: KeySpace,
    state: str,
    fields: Sequence[str],
    as_of: int,
    committed: int,
) -> dict[str, bytes]:
    """For each of ``fields`` that a txid in ``as_of + 1 .. committed`` wrote: its stored
    value right before the first such txid (the value as of ``as_of``), ABSENT if it did not
    exist then. The undo logs of those txids must be retained (``retained``)."""
    found: dict[str, bytes] = {}
    groups = split_by_shard(keyspace, list(fields), lambda f: f)
    for txid in range(as_of + 1, committed + 1):
        for index, group in enumerate(groups):
            todo = [f for f in group if f not in found]
            if not todo:
                continue
            undo = keyspace.shard(index).undo(state, txid)
            for i in range(0, len(todo), 1000):
                part = todo[i : i + 1000]
                for field, raw in zip(part, client.hmget(undo, part), strict=True):
                    if raw is not None:
                        found[field] = raw
    return found


def changed_since(
    client: redis.Redis, keyspace: KeySpace, state: str, as_of: int, committed: int
) -> dict[str, bytes]:
    """Every key a txid in ``as_of + 1 .. committed`` wrote, with its stored value as of
    ``as_of`` (ABSENT: it did not exist then): ``priors_as_of`` of every such key."""
    found: dict[str, bytes] = {}
    for txid in range(as_of + 1, committed + 1):
        for field, raw in undo_entries(client, keyspace, state, txid):
            found.setdefault(_str(field), raw)
    return found


def value_as_of(raw: bytes, field: str, state: str, as_of: int) -> Any | None:
    """The committed value a prior stored value holds as of ``as_of`` (None: absent)."""
    if raw == ABSENT or raw == "":
        return None
    stored = StoredValue.from_json(decode_stored(raw, state, field), field, state)
    return stored.committed_view(as_of)


__all__ = [
    "ABSENT",
    "Retained",
    "changed_since",
    "offsets_after",
    "priors_as_of",
    "retained",
    "trim_undo",
    "undo_entries",
    "value_as_of",
]
