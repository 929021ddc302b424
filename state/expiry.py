"""Expiry in txids: a state with ``expire_after_txids = N`` loses, at the commit of txid T,
every key whose last update was at a txid <= T - N and which T does not update.

The rule is decided from an *index* of per-txid buckets, one sorted set per state (per
shard): each member is a *chunk* - up to CHUNK fields joined by newlines - scored by the txid
that wrote them (about 13 bytes a field, where a member per field cost ~110). The buckets
only move after a txid is committed, so every attempt of txid T - a retry, a replay, a zombie
fenced out - reads the same candidates; what T updates is told apart by the attempt itself
(``MapState.expire``). An expired key is written as a tombstone under txid T like any
removal: fenced, stamped, in the undo log (a rewind brings it back) and in the change log
(every sink deletes its row).

The invariant: every live key sits in the bucket of the txid that last wrote it (and maybe
in older buckets too: a key written again is not taken out of its older bucket, so each
candidate is checked against its stamp - one of a later txid is skipped, it is due with its
own bucket). How the index follows the state:

* **merge** (after the mark of T, and again by T+1 before it reads candidates if a crash cut
  T's short): the fields T's attempts wrote (its written-set, kept for this) become chunks
  of bucket T, SPOPed a chunk per script call - O(1) per field, the state not read.
* **forget** (after the mark of T): the buckets at or below T - N go - T dealt with every
  live key there (expired it, or wrote it: it is in bucket T now).
* **compact** (in T's commit, before its candidates are read, only once the index holds
  more than twice the state's fields): the buckets in (T - N, T) keep only the fields whose
  stamp is still theirs - what keeps a state whose keys are written every txid from holding
  N copies of each. Fenced like any write of T, so no attempt but T's newest moves a bucket.
* **build** (after the mark of the first txid committed with expiry on, and after a rewind,
  which moves stamps back): the index made from the hash, then marked built. Until it is built
  nothing expires: expiry starts with the txid after the one that turned it on, the same for
  every attempt of a txid. A commit that does not keep the index (expiry off) drops the mark,
  so an index that stopped following is never trusted again.

A bucket of txid B may also sit at score B - 0.5 (a compaction moves it there and back): every
query bounds its scores by whole txids, so B - 0.5 reads as B everywhere. The index also holds
one member ``#<n>`` at +inf: about how many fields its chunks hold (what ``compact`` compares
with the state's size; never read as a chunk). Work per commit is proportional to the keys
the txid wrote plus the candidates (and, amortised, the compactions) - never to the state's
size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import redis

from tridentflow_state.backing import Fence
from tridentflow_state.codec import live_stamp
from tridentflow_state.keys import KeySpace
from tridentflow_state.scripts import FENCE_CHECK, LuaScript

CHUNK = 1000
"""Fields per chunk (and per script call): bounded memory, short scripts."""

PAGE = 16
"""Chunks per read of the index."""

COMPACT_RATIO = 2
COMPACT_SLACK = CHUNK
"""An index compacts once it holds more than COMPACT_RATIO x its state's fields + this."""


@contextmanager
def compacting_eagerly() -> Iterator[None]:
    """Within: every index compacts at every claim of a commit (tests and the chaos harness;
    not thread-safe: module settings)."""
    global COMPACT_RATIO, COMPACT_SLACK
    saved = COMPACT_RATIO, COMPACT_SLACK
    COMPACT_RATIO, COMPACT_SLACK = 0, 0
    try:
        yield
    finally:
        COMPACT_RATIO, COMPACT_SLACK = saved


_COUNT = r"""
-- The index's member '#<n>' at +inf: about how many fields its chunks hold.
local function count_of(index)
  local head = redis.call('ZRANGEBYSCORE', index, '+inf', '+inf', 'LIMIT', 0, 1)[1]
  return head, (head and tonumber(string.sub(head, 2)) or 0)
end
local function add_count(index, n)
  if n == 0 then return end
  local head, count = count_of(index)
  if head then redis.call('ZREM', index, head) end
  redis.call('ZADD', index, '+inf', '#' .. math.max(0, count + n))
end
local function fields_of(chunk)
  local out = {}
  for field in string.gmatch(chunk, '[^\n]+') do out[#out + 1] = field end
  return out
end
"""

MERGE_WRITTEN = LuaScript(
    "expiry_merge_written",
    _COUNT
    + r"""
-- Take up to ARGV[1] fields out of a committed txid's written-set and add them to the index
-- as one chunk of bucket ARGV[2] (its score: raised only, ZADD GT), atomically: a crash
-- between calls leaves the rest in the set.
-- KEYS[1] expiry index  KEYS[2] the txid's written-set of the state
-- Returns the number of fields taken (fewer than ARGV[1]: the set is empty now).
local fields = redis.call('SPOP', KEYS[2], tonumber(ARGV[1]))
if #fields > 0 then
  if redis.call('ZADD', KEYS[1], 'GT', ARGV[2], table.concat(fields, '\n')) == 1 then
    add_count(KEYS[1], #fields)
  end
end
return #fields
""",
)

FORGET = LuaScript(
    "expiry_forget",
    _COUNT
    + r"""
-- Drop up to ARGV[2] chunks of the buckets at or below txid ARGV[1], atomically per call.
-- KEYS[1] expiry index
-- Returns the number of chunks dropped (fewer than ARGV[2]: none is left there).
local chunks = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0,
  tonumber(ARGV[2]))
local fields = 0
for i = 1, #chunks do
  local _, lines = string.gsub(chunks[i], '\n', '\n')
  fields = fields + lines + 1
end
if #chunks > 0 then
  redis.call('ZREM', KEYS[1], unpack(chunks))
  add_count(KEYS[1], -fields)
end
return #chunks
""",
)

RELOCATE = LuaScript(
    "expiry_relocate",
    r"""
-- Move up to ARGV[3] chunks from score ARGV[1] to score ARGV[2] (both the same bucket),
-- unchanged. KEYS[1] expiry index
-- Returns the number moved (fewer than ARGV[3]: none is left at ARGV[1]).
local chunks = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[1], 'LIMIT', 0,
  tonumber(ARGV[3]))
for i = 1, #chunks do redis.call('ZADD', KEYS[1], ARGV[2], chunks[i]) end
return #chunks
""",
)

COMPACT = LuaScript(
    "expiry_compact",
    FENCE_CHECK
    + _COUNT
    + r"""
-- Rewrite up to ARGV[7] chunks of bucket ARGV[6] found at score ARGV[4], each keeping only
-- the fields still due by that bucket, at score ARGV[5] (the same bucket), atomically per
-- call. Fenced like a write of txid ARGV[1] (generation, order, newest commit token).
-- A field is kept if it has no txid stamp, is stamped ARGV[1] (an attempt of the committing
-- txid wrote it: its last committed stamp is unknown here), or is live and stamped at or
-- before the bucket; dropped if absent, a tombstone, or stamped by a later committed txid
-- (that txid's bucket holds it).
-- KEYS[1] state hash  KEYS[2] expiry index  KEYS[3] ledger (a shard's fence)
-- KEYS[4] tx hash of ARGV[1] (a shard's fence)  KEYS[5] generation key
-- ARGV[1] txid  ARGV[2] commit token  ARGV[3] generation  ARGV[4] score read
-- ARGV[5] score written  ARGV[6] the bucket's txid  ARGV[7] chunks per call
-- Returns {chunks rewritten, fields dropped}.
local err = gen_check(KEYS[5], ARGV[3]) or
  fence_check(KEYS[3], KEYS[4], tonumber(ARGV[1]), ARGV[2])
if err then return redis.error_reply(err) end
local txid, bucket = tonumber(ARGV[1]), tonumber(ARGV[6])
local chunks = redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[4], ARGV[4], 'LIMIT', 0,
  tonumber(ARGV[7]))
local dropped = 0
for i = 1, #chunks do
  local fields = fields_of(chunks[i])
  local values = redis.call('HMGET', KEYS[1], unpack(fields))
  local kept = {}
  for j = 1, #fields do
    local v = values[j]
    local keep = false
    if v then
      local stamp = string.match(v, '^%[(%d+),')
      if not stamp then
        keep = true
      else
        local t = tonumber(stamp)
        local tomb = string.sub(v, #stamp + 3, #stamp + 7) == 'null,'
        keep = t == txid or (t <= bucket and not tomb)
      end
    end
    if keep then kept[#kept + 1] = fields[j] end
  end
  redis.call('ZREM', KEYS[2], chunks[i])
  if #kept > 0 then redis.call('ZADD', KEYS[2], ARGV[5], table.concat(kept, '\n')) end
  dropped = dropped + #fields - #kept
end
add_count(KEYS[2], -dropped)
return {#chunks, dropped}
""",
)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _score(value: float) -> str:
    """A score as Redis reads it back exactly (whole txids, or a half below one)."""
    return str(int(value)) if value == int(value) else repr(value)


class RedisExpiryIndex:
    """The expiry index of one state in one keyspace (a shard's, or the pipeline's)."""

    def __init__(self, client: redis.Redis, keyspace: KeySpace, state_name: str) -> None:
        self.client = client
        self.keyspace = keyspace
        self.state_name = state_name
        self.key = keyspace.expiry(state_name)

    # -- following the commits ----------------------------------------------------------------
    def merge(self, txid: int) -> int:
        """Add every field committed ``txid`` wrote to bucket ``txid``, taking it out of the
        txid's written-set (MERGE_WRITTEN, a chunk a call: no field travels to this process).
        Idempotent: nothing to do once the set is empty; the fields merged."""
        keys = [self.key, self.keyspace.written(self.state_name, txid)]
        merged = 0
        while True:
            taken = int(MERGE_WRITTEN(self.client, keys, [CHUNK, int(txid)]))
            merged += taken
            if taken < CHUNK:
                return merged

    def forget(self, through: int) -> int:
        """Drop the buckets at or below ``through`` (FORGET; after the mark of the txid whose
        expiry read them). Idempotent; the chunks dropped."""
        dropped = 0
        while True:
            taken = int(FORGET(self.client, [self.key], [int(through), PAGE]))
            dropped += taken
            if taken < PAGE:
                return dropped

    def compact(self, through: int, fence: Fence | None) -> int:
        """If the index holds more than COMPACT_RATIO x its state's fields + COMPACT_SLACK, keep
        in each bucket in (``through``, the fence's txid) only the fields still due by it
        (COMPACT, fenced by ``fence``: a stale attempt is refused). Call in the commit before
        reading candidates at ``through``: the candidates and ``written_between`` read the
        same. The fields dropped."""
        if fence is None or fence.txid - 1 <= through:
            return 0
        state = self.keyspace.state(self.state_name)
        if self.count() <= COMPACT_RATIO * int(self.client.hlen(state)) + COMPACT_SLACK:
            return 0
        keys = [state, self.key, self.keyspace.ledger, self.keyspace.tx(fence.txid),
                self.keyspace.generation]  # fmt: skip
        head = [fence.txid, fence.token, fence.generation]
        dropped = 0
        for bucket in self._buckets(through, fence.txid - 1):
            whole, half = str(bucket), f"{bucket - 1}.5"
            while int(RELOCATE(self.client, [self.key], [half, whole, PAGE])) == PAGE:
                pass  # an earlier compaction's half of the bucket joins it, unchanged
            while True:
                rewritten, lost = COMPACT(self.client, keys, [*head, whole, half, bucket, PAGE])
                dropped += int(lost)
                if int(rewritten) < PAGE:
                    break
        return dropped

    # -- reading ------------------------------------------------------------------------------
    def candidates(self, through: int) -> Iterator[list[str]]:
        """The chunks of the buckets at or below ``through``: every live key last written at
        or before it is among them (with keys written since, to be checked by their stamps).
        Read a score at a time, so a bucket dropped meanwhile (a late ``forget`` of the txid
        before) moves no other bucket's page."""
        for score in self._scores("-inf", through):
            for chunk in self._chunks_at(score):
                yield chunk_fields(chunk)

    def written_between(self, after: int, through: int) -> set[str]:
        """The fields of the buckets in (``after``, ``through``]: those a committed txid in
        that range wrote (a candidate among them was written since it came due)."""
        fields: set[str] = set()
        if through <= after:
            return fields
        for score in self._scores(f"({after}", through):
            for chunk in self._chunks_at(score):
                fields.update(chunk_fields(chunk))
        return fields

    def count(self) -> int:
        """About how many fields the index's chunks hold (the ``#<n>`` member)."""
        head = self.client.zrangebyscore(self.key, "+inf", "+inf", start=0, num=1)
        return int(_text(head[0])[1:]) if head else 0

    def _chunks_at(self, score: str) -> Iterator[bytes | str]:
        """The chunks at exactly ``score``, PAGE a read (the index does not move meanwhile:
        see ``candidates``)."""
        start = 0
        while True:
            page = self.client.zrangebyscore(self.key, score, score, start=start, num=PAGE)
            yield from page
            if len(page) < PAGE:
                return
            start += len(page)

    def _scores(self, low: str, through: int) -> Iterator[str]:
        """The distinct scores in [``low``, ``through``], lowest first, one read each."""
        while True:
            head = self.client.zrangebyscore(
                self.key, low, through, start=0, num=1, withscores=True
            )
            if not head:
                return
            score = _score(head[0][1])
            yield score
            low = f"({score}"

    def _buckets(self, after: int, through: int) -> Iterator[int]:
        """The txids of the buckets in (``after``, ``through``] (either score of a bucket)."""
        seen = None
        for score in self._scores(f"({after}", through):
            bucket = int(float(score) + 0.5)
            if bucket != seen:
                seen = bucket
                yield bucket

    # -- building -----------------------------------------------------------------------------
    def built(self) -> bool:
        return bool(self.client.exists(self.keyspace.expiry_built(self.state_name)))

    def build_if_empty(self) -> bool:
        """Mark the index built if its state holds no field at all (a fresh state: the empty
        index is complete), so that expiry follows from the first txid even when the settles
        that would build it are cut short. One HLEN; True if it is built now."""
        if self.client.hlen(self.keyspace.state(self.state_name)):
            return False
        self.client.set(self.keyspace.expiry_built(self.state_name), 1)
        return True

    def rebuild(self) -> int:
        """Make the index from the state hash and mark it built (BUILT below); the fields
        indexed."""
        indexed = self.rebuild_shard()
        self.client.set(self.keyspace.expiry_built(self.state_name), 1)
        return indexed

    def rebuild_shard(self) -> int:
        """Make this keyspace's index again from its state hash: every live field in the bucket
        of its stamp. Built aside, then renamed over the index (readers see the old or the new
        one). The fields indexed."""
        aside = f"{self.key}:rebuild"
        self.client.delete(aside)
        state = self.keyspace.state(self.state_name)
        pending: dict[int, list[str]] = {}  # stamp -> fields not written yet
        held = indexed = 0
        for field, raw in self.client.hscan_iter(state, count=CHUNK):
            stamp = live_stamp(_text(raw))
            if stamp is None:
                continue
            fields = pending.setdefault(stamp, [])
            fields.append(_text(field))
            held += 1
            indexed += 1
            if len(fields) >= CHUNK:  # a whole chunk of one stamp
                held -= add_chunks(self.client, aside, {stamp: fields})
            elif held >= 20 * CHUNK:  # many stamps, none with a whole chunk: bounded memory
                held -= add_chunks(self.client, aside, pending)
        add_chunks(self.client, aside, pending)
        if indexed:
            self.client.zadd(aside, {f"#{indexed}": "+inf"})
            self.client.rename(aside, self.key)
        else:
            self.client.delete(self.key)
        return indexed


def add_chunks(client: redis.Redis, key: str, buckets: dict[int, list[str]]) -> int:
    """Add each bucket's fields (txid -> fields) to the index ``key`` as chunks of CHUNK, and
    empty the lists; the fields added (the ``#<n>`` count is the caller's)."""
    added = 0
    with client.pipeline(transaction=False) as pipe:
        for txid, fields in buckets.items():
            for i in range(0, len(fields), CHUNK):
                pipe.zadd(key, {"\n".join(fields[i : i + CHUNK]): txid}, gt=True)
            added += len(fields)
            fields.clear()
        pipe.execute()
    return added


def chunk_fields(chunk: bytes | str) -> list[str]:
    """The fields of one member of an index ([] for its ``#<n>`` count)."""
    text = _text(chunk)
    return [] if text.startswith("#") else text.split("\n")


ADD_COUNT = LuaScript(
    "expiry_add_count",
    _COUNT
    + r"""
-- Raise (or lower) an index's '#<n>' count by ARGV[1] fields. KEYS[1] expiry index
return add_count(KEYS[1], tonumber(ARGV[1]))
""",
)


def add_count(client: redis.Redis, key: str, fields: int) -> None:
    """Raise the ``#<n>`` count of the index ``key`` by ``fields`` (ADD_COUNT)."""
    if fields:
        ADD_COUNT(client, [key], [int(fields)])


class ShardedExpiryIndex:
    """The expiry indexes of one state's shards, as one (each shard's in its own slot)."""

    def __init__(self, keyspace: KeySpace, shards: Sequence[RedisExpiryIndex]) -> None:
        self.keyspace = keyspace
        self.shards = list(shards)
        self.client = self.shards[0].client
        self.state_name = self.shards[0].state_name

    def merge(self, txid: int) -> int:
        return sum(index.merge(txid) for index in self.shards)

    def forget(self, through: int) -> int:
        return sum(index.forget(through) for index in self.shards)

    def compact(self, through: int, fence: Fence | None) -> int:
        return sum(index.compact(through, fence) for index in self.shards)

    def candidates(self, through: int) -> Iterator[list[str]]:
        for index in self.shards:
            yield from index.candidates(through)

    def written_between(self, after: int, through: int) -> set[str]:
        return set().union(*(index.written_between(after, through) for index in self.shards))

    def count(self) -> int:
        return sum(index.count() for index in self.shards)

    def built(self) -> bool:
        return bool(self.client.exists(self.keyspace.expiry_built(self.state_name)))

    def build_if_empty(self) -> bool:
        """As RedisExpiryIndex.build_if_empty, over every shard's state."""
        if any(self.client.hlen(i.keyspace.state(self.state_name)) for i in self.shards):
            return False
        self.client.set(self.keyspace.expiry_built(self.state_name), 1)
        return True

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
