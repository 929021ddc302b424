"""Expiry in txids: a state with ``expire_after_txids = N`` loses, at the commit of txid T,
every key whose last update was at a txid <= T - N and which T does not update.

The rule is decided from an *index*, one sorted set per state (per shard): each live field
scored by the txid that last wrote it. The index only moves after a txid is committed, so
every attempt of txid T - a retry, a replay, a zombie fenced out - reads the same candidates;
what T updates is told apart by the attempt itself (``MapState.expire``). An expired key is
written as a tombstone under txid T like any removal: fenced, stamped, in the undo log (a
rewind brings it back) and in the change log (every sink deletes its row).

How the index follows the state:

* **merge** (after the mark of T, and again by T+1 before it reads candidates if a crash cut
  T's short): every field T's attempts wrote (its written-set, kept for this) is scored by its
  stamp if it is live, removed if it is not (absent, or a tombstone); then the written-set
  goes. Atomic per chunk, scores only ever raised (``ZADD GT``): a merge that lags behind a
  later txid's never takes a key back.
* **refresh** (a candidate found absent or a tombstone): the same per-field rule, at once.
* **build** (after the mark of the first txid committed with expiry on, and after a rewind,
  which moves stamps back): the index made from the hash, then marked built. Until it is built
  nothing expires: expiry starts with the txid after the one that turned it on, the same for
  every attempt of a txid. A commit that does not keep the index (expiry off) drops the mark,
  so an index that stopped following is never trusted again.

Work per commit is proportional to the keys the txid wrote plus the candidates - never to
the state's size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import redis

from tridentflow_state.codec import live_stamp
from tridentflow_state.keys import KeySpace
from tridentflow_state.scripts import LuaScript

CHUNK = 1000
"""Fields per script call and candidates per read (bounded memory, short scripts)."""

_FOLLOW = r"""
local function follow(state, index, fields)
  -- score each live field by its stamp (raised only), drop absent fields and tombstones
  local values = redis.call('HMGET', state, unpack(fields))
  local add, gone = {}, {}
  for i = 1, #fields do
    local v = values[i]
    local stamp = v and string.match(v, '^%[(%d+),')
    if not v or (stamp and string.sub(v, #stamp + 3, #stamp + 7) == 'null,') then
      gone[#gone + 1] = fields[i]
    elseif stamp then
      add[#add + 1] = tonumber(stamp)
      add[#add + 1] = fields[i]
    end
  end
  if #add > 0 then redis.call('ZADD', index, 'GT', unpack(add)) end
  if #gone > 0 then return redis.call('ZREM', index, unpack(gone)) end
  return 0
end
"""

FOLLOW_FIELDS = LuaScript(
    "expiry_follow_fields",
    _FOLLOW
    + r"""
-- Make the expiry index follow the named fields of one state, atomically: a live field is
-- scored by its stamp (raised only: ZADD GT), an absent field or a tombstone
-- ([txid,null,...]) is removed. A value without a txid stamp is left alone.
-- KEYS[1] state hash  KEYS[2] expiry index (sorted set)
-- ARGV[1..] fields
-- Returns the number of fields removed from the index.
if #ARGV == 0 then return 0 end
return follow(KEYS[1], KEYS[2], ARGV)
""",
)

MERGE_WRITTEN = LuaScript(
    "expiry_merge_written",
    _FOLLOW
    + r"""
-- Take up to ARGV[1] fields out of a committed txid's written-set and make the index follow
-- them (as FOLLOW_FIELDS), atomically: a crash between calls leaves the rest in the set.
-- KEYS[1] state hash  KEYS[2] expiry index  KEYS[3] the txid's written-set of the state
-- Returns the number of fields taken (fewer than ARGV[1]: the set is empty now).
local fields = redis.call('SPOP', KEYS[3], tonumber(ARGV[1]))
if #fields > 0 then follow(KEYS[1], KEYS[2], fields) end
return #fields
""",
)


class RedisExpiryIndex:
    """The expiry index of one state in one keyspace (a shard's, or the pipeline's)."""

    def __init__(self, client: redis.Redis, keyspace: KeySpace, state_name: str) -> None:
        self.client = client
        self.keyspace = keyspace
        self.state_name = state_name
        self.key = keyspace.expiry(state_name)

    def follow(self, fields: Sequence[str]) -> int:
        """Score ``fields`` by their stamps, or drop them if not live (FOLLOW_FIELDS).
        Idempotent, atomic per chunk; the fields dropped."""
        state = self.keyspace.state(self.state_name)
        return sum(
            int(FOLLOW_FIELDS(self.client, [state, self.key], list(fields[i : i + CHUNK])))
            for i in range(0, len(fields), CHUNK)
        )

    def merge(self, txid: int) -> int:
        """Follow every field committed ``txid`` wrote, taking it out of the txid's
        written-set (MERGE_WRITTEN, a chunk a call: no field travels to this process).
        Idempotent: nothing to do once the set is empty; the fields followed."""
        keys = [
            self.keyspace.state(self.state_name),
            self.key,
            self.keyspace.written(self.state_name, txid),
        ]
        followed = 0
        while True:
            taken = int(MERGE_WRITTEN(self.client, keys, [CHUNK]))
            followed += taken
            if taken < CHUNK:
                return followed

    def candidates(self, through: int) -> Iterator[list[str]]:
        """The fields scored at or below ``through``, in chunks. The index does not move
        during a commit (only merges after marks move it), so paging by rank is stable."""
        start = 0
        while True:
            chunk = self.client.zrangebyscore(self.key, "-inf", through, start=start, num=CHUNK)
            if not chunk:
                return
            yield [f.decode() if isinstance(f, bytes) else f for f in chunk]
            start += len(chunk)

    def built(self) -> bool:
        return bool(self.client.exists(self.keyspace.expiry_built(self.state_name)))

    def rebuild(self) -> int:
        """Make the index from the state hash and mark it built (BUILT below); the fields
        indexed."""
        indexed = self.rebuild_shard()
        self.client.set(self.keyspace.expiry_built(self.state_name), 1)
        return indexed

    def rebuild_shard(self) -> int:
        """Make this keyspace's index again from its state hash: every live field scored by
        its stamp. Built aside, then renamed over the index (readers see the old or the new
        one). The fields indexed."""
        aside = f"{self.key}:rebuild"
        self.client.delete(aside)
        state = self.keyspace.state(self.state_name)
        indexed = 0
        for fields in _chunks(self.client.hscan_iter(state, count=CHUNK)):
            scores = {}
            for field, raw in fields:
                stamp = live_stamp(raw)
                if stamp is not None:
                    scores[field] = stamp
            if scores:
                self.client.zadd(aside, scores)
                indexed += len(scores)
        if indexed:
            self.client.rename(aside, self.key)
        else:
            self.client.delete(self.key)
        return indexed


def _chunks(items: Iterator[tuple[bytes, bytes]]) -> Iterator[list[tuple[str, str]]]:
    batch: list[tuple[str, str]] = []
    for field, raw in items:
        batch.append((_text(field), _text(raw)))
        if len(batch) >= CHUNK:
            yield batch
            batch = []
    if batch:
        yield batch


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class ShardedExpiryIndex:
    """The expiry indexes of one state's shards, as one (each shard's in its own slot)."""

    def __init__(self, keyspace: KeySpace, shards: Sequence[RedisExpiryIndex]) -> None:
        self.keyspace = keyspace
        self.shards = list(shards)
        self.client = self.shards[0].client
        self.state_name = self.shards[0].state_name

    def follow(self, fields: Sequence[str]) -> int:
        groups: list[list[str]] = [[] for _ in self.shards]
        for field in fields:
            groups[self.keyspace.shard_index(field)].append(field)
        pairs = zip(self.shards, groups, strict=True)
        return sum(index.follow(group) for index, group in pairs if group)

    def merge(self, txid: int) -> int:
        return sum(index.merge(txid) for index in self.shards)

    def candidates(self, through: int) -> Iterator[list[str]]:
        for index in self.shards:
            yield from index.candidates(through)

    def built(self) -> bool:
        return bool(self.client.exists(self.keyspace.expiry_built(self.state_name)))

    def rebuild(self) -> int:
        indexed = sum(index.rebuild_shard() for index in self.shards)
        self.client.set(self.keyspace.expiry_built(self.state_name), 1)
        return indexed


def expiry_index(
    client: redis.Redis, keyspace: KeySpace, state_name: str
) -> RedisExpiryIndex | ShardedExpiryIndex:
    """State ``state_name``'s expiry index in ``keyspace``: its own, or its shards' as one."""
    if not keyspace.sharded:
        return RedisExpiryIndex(client, keyspace, state_name)
    shards = [RedisExpiryIndex(client, keyspace.shard(i), state_name)
              for i in range(keyspace.shards)]  # fmt: skip
    return ShardedExpiryIndex(keyspace, shards)
