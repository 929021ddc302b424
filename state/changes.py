"""The change log: for each committed txid, the keys it changed in a state and their values
right after it - what Trident's ``newValuesStream`` carries, and what sinks export.

Written by the commit, before the ledger's mark, only for states something reads it from
(``record_changes``): the batch's stored values are copied inside Redis, as stored
(``[txid, curr, prev]``, ``curr`` null for a removed key), into one hash per (state, txid),
with STAGE_CHANGES - fenced, so a superseded commit attempt writes nothing, and sealed with
the count last, so a reader tells a complete change log from one a crash cut short (the txid
is not committed then: its retry writes it again). After the mark nothing writes it again:
every reader of txid T sees the same tuples, however late.

On a sharded state, each shard keeps its part of the change log in its own slot (the copy is
one script per chunk of keys, inside the shard's slot); the seal is in the pipeline's slot.

A change log is kept until every sink of its state has exported it (``drop_changes``), and at
most ``limit`` txids (``trim_changes``, after each commit): a sink further behind finds it gone
(``change_count`` None) and either reloads the whole state or fails with one line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any

import redis

from tridentflow_state.backing import Fence
from tridentflow_state.keys import KeySpace
from tridentflow_state.scripts import FENCE_CHECK, GEN_CHECK, LuaScript
from tridentflow_state.shards import split_by_shard

STAGE_CHANGES = LuaScript(
    "stage_changes",
    FENCE_CHECK
    + """
-- Write one txid's change log of one map state (state.changes), fenced like every write of
-- the commit, before the txid's mark. The values are copied inside Redis: only keys travel.
-- KEYS[1] change hash of (state, txid) in this slot  KEYS[2] the slot's ledger hash (a state
-- shard's fence)  KEYS[3] tx hash of ARGV[1] (a shard's fence)  KEYS[4] the slot's generation
-- key  KEYS[5] the state's change-count hash (txid -> changed keys; the ledger's slot)
-- (only read by unseal and seal: the other modes may pass KEYS[1] again, for a state shard
-- whose slot is not the ledger's)  KEYS[6] the state hash (this slot)
-- ARGV[1] txid  ARGV[2] commit token  ARGV[3] generation
-- ARGV[4] 'begin' (drop what an earlier attempt wrote here), 'copy' (ARGV[5]: fields, one per
-- line - one string: packing thousands of arguments costs the client more than the script -
-- their stored values into the change hash; an absent one as [null,null,null]), 'unseal' or
-- 'seal' (ARGV[5]: the count; the change log is complete)
-- Refused like FENCED_HSET (TFGENERATION, TFORDER, TFFENCED). Returns the change hash's size.
local err = gen_check(KEYS[4], ARGV[3]) or
  fence_check(KEYS[2], KEYS[3], tonumber(ARGV[1]), ARGV[2])
if err then return redis.error_reply(err) end
local mode = ARGV[4]
if mode == 'begin' then
  redis.call('DEL', KEYS[1])
  return 0
elseif mode == 'copy' then
  local fields = {}
  for field in string.gmatch(ARGV[5], '[^\\n]+') do fields[#fields + 1] = field end
  for i = 1, #fields, 2000 do  -- unpack() has a stack limit (8000): slices
    local last = math.min(i + 1999, #fields)
    local values = redis.call('HMGET', KEYS[6], unpack(fields, i, last))
    local pairs = {}
    for j = 1, #values do
      pairs[#pairs + 1] = fields[i + j - 1]
      pairs[#pairs + 1] = values[j] or '[null,null,null]'
    end
    redis.call('HSET', KEYS[1], unpack(pairs))
  end
  return redis.call('HLEN', KEYS[1])
elseif mode == 'unseal' then
  redis.call('HDEL', KEYS[5], ARGV[1])
  return 0
end
redis.call('HSET', KEYS[5], ARGV[1], ARGV[5])
return tonumber(ARGV[5])
""",
)

NOTE_SINK_POSITION = LuaScript(
    "note_sink_position",
    GEN_CHECK
    + """
-- Record a sink's position (the last txid it applied) in the pipeline's sinks hash: a mirror
-- of what the sink's own store records, read by status, metrics and change-log retention.
-- KEYS[1] sinks hash  KEYS[2] generation key
-- ARGV[1] sink name  ARGV[2] txid  ARGV[3] entry JSON (holding "txid")  ARGV[4] generation
-- Only forward: an older txid (a slower exporter) leaves it. Refused (TFGENERATION) if the
-- pipeline was reset since the export began. Returns 1 if moved.
local err = gen_check(KEYS[2], ARGV[4])
if err then return redis.error_reply(err) end
local current = redis.call('HGET', KEYS[1], ARGV[1])
if current then
  local at = cjson.decode(current)['txid']
  if at and tonumber(at) > tonumber(ARGV[2]) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
""",
)


CHANGE_CHUNK = 10_000
"""Keys per STAGE_CHANGES copy (one Redis call holds the server ~10 ms)."""


def _str(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


def _stage(
    client: redis.Redis,
    keyspace: KeySpace,
    slot: KeySpace,
    state: str,
    fence: Fence,
    args: list,
) -> int:
    """One STAGE_CHANGES call in ``slot`` (the pipeline's own keyspace, or a state shard's)."""
    sealing = args[0] in ("seal", "unseal")  # the seal lives in the pipeline's own slot
    keys = [
        slot.changes(state, fence.txid),
        slot.ledger,
        slot.tx(fence.txid),
        slot.generation,
        keyspace.change_counts(state) if sealing else slot.changes(state, fence.txid),
        slot.state(state),
    ]
    head = [fence.txid, fence.token, fence.generation]
    return int(STAGE_CHANGES(client, keys, [*head, *args]))


def record_changes(
    client: redis.Redis, keyspace: KeySpace, state: str, fence: Fence, fields: Sequence[str]
) -> int:
    """Copy the stored values of ``fields`` (the keys txid changed in ``state``, every one
    written by now) into the txid's change log - one hash per state shard, filled inside
    Redis - and seal it with the count. Idempotent per commit attempt; refused
    (FencedError, CommitOrderError, GenerationError) for a superseded one. Returns the number
    of keys recorded."""
    _stage(client, keyspace, keyspace, state, fence, ["unseal"])
    groups = split_by_shard(keyspace, fields, lambda f: f)
    total = 0
    for index, group in enumerate(groups):
        slot = keyspace.shard(index)
        _stage(client, keyspace, slot, state, fence, ["begin"])
        for i in range(0, len(group), CHANGE_CHUNK):
            lines = "\n".join(group[i : i + CHANGE_CHUNK])  # encoded keys hold no newline
            _stage(client, keyspace, slot, state, fence, ["copy", lines])
        total += len(group)
    return _stage(client, keyspace, keyspace, state, fence, ["seal", total])


def change_count(client: redis.Redis, keyspace: KeySpace, state: str, txid: int) -> int | None:
    """How many keys ``txid`` changed in ``state``; None if there is no complete change log
    for it (never written, or dropped)."""
    raw = client.hget(keyspace.change_counts(state), str(int(txid)))
    return None if raw is None else int(raw)


def read_change_pages(
    client: redis.Redis, keyspace: KeySpace, state: str, txid: int, count: int = 10_000
) -> Iterator[dict[bytes, bytes]]:
    """{encoded key: stored value JSON}, as bytes, of every key ``txid`` changed in
    ``state``, a page (one HSCAN reply, about ``count`` entries) at a time, shard after shard,
    in no particular order; a page may repeat an entry of an earlier one (HSCAN's rule), so
    check the total against ``change_count`` (a dropped change log reads as empty)."""
    for index in range(keyspace.shards):
        key = keyspace.shard(index).changes(state, txid)
        cursor = None
        while cursor != 0:
            cursor, page = client.hscan(key, cursor or 0, count=count)
            if page:
                yield page


def logged_txids(client: redis.Redis, keyspace: KeySpace, state: str) -> list[int]:
    """The txids whose change log of ``state`` is complete, ascending."""
    return sorted(int(_str(t)) for t in client.hkeys(keyspace.change_counts(state)))


def drop_changes(client: redis.Redis, keyspace: KeySpace, state: str, upto: int) -> int:
    """Delete the change logs of ``state`` for txids <= ``upto`` (every reader has them).
    Idempotent; the seal goes first, so a log being deleted reads as absent, never short."""
    gone = [t for t in logged_txids(client, keyspace, state) if t <= upto]
    for txid in gone:
        client.hdel(keyspace.change_counts(state), str(txid))
        for index in range(keyspace.shards):
            client.delete(keyspace.shard(index).changes(state, txid))
    return len(gone)


def drop_changes_after(
    client: redis.Redis, keyspace: KeySpace, state: str, txid: int, last: int
) -> int:
    """Delete the change logs of ``state`` for txids ``txid + 1 .. last`` (a rewind took them
    back), sealed or not; the seals go first. Idempotent. Returns the txids dropped."""
    counts = keyspace.change_counts(state)
    gone = [t for t in (int(_str(f)) for f in client.hkeys(counts)) if t > txid]
    if gone:
        client.hdel(counts, *(str(t) for t in gone))
    for index in range(keyspace.shards):
        space = keyspace.shard(index)
        doomed = [space.changes(state, t) for t in range(txid + 1, last + 1)]
        for i in range(0, len(doomed), 500):
            client.delete(*doomed[i : i + 500])
    return len(gone)


def trim_changes(
    client: redis.Redis, keyspace: KeySpace, state: str, newest: int, limit: int
) -> int:
    """Keep at most the ``limit`` newest change logs of ``state`` (up to txid ``newest``)."""
    return drop_changes(client, keyspace, state, newest - limit)


ALLOW_SINK = LuaScript(
    "allow_sink",
    GEN_CHECK
    + """
-- Allow a sink to apply txids up to ARGV[2]: recorded before it applies them, so a sink whose
-- own store stands past the allowed txid proves Redis lost acknowledged writes since.
-- KEYS[1] allowed sorted set  KEYS[2] generation key
-- ARGV[1] sink name  ARGV[2] txid  ARGV[3] generation
-- Only forward (ZADD GT). Refused (TFGENERATION) if the pipeline was reset since.
local err = gen_check(KEYS[2], ARGV[3])
if err then return redis.error_reply(err) end
redis.call('ZADD', KEYS[1], 'GT', ARGV[2], ARGV[1])
return 1
""",
)


def allow_sink(
    client: redis.Redis, keyspace: KeySpace, sink: str, txid: int, generation: str
) -> None:
    """Record that ``sink`` may apply txids up to ``txid`` - before it does (forward only)."""
    ALLOW_SINK(client, [keyspace.sinks_allowed, keyspace.generation], [sink, int(txid), generation])


ALLOWED_SINCE = ""
"""The member a pipeline's generation starts the allowed set with: a sink absent from a set
holding it was allowed nothing yet (0), not "from before the record" (None)."""


def start_allowing(client: redis.Redis, keyspace: KeySpace) -> None:
    """A new generation records what its sinks may apply from the start (idempotent)."""
    client.zadd(keyspace.sinks_allowed, {ALLOWED_SINCE: 0}, nx=True)


def sink_allowed(client: redis.Redis, keyspace: KeySpace, sink: str) -> int | None:
    """The highest txid ``sink`` was allowed to apply: 0 if none yet in a generation that
    records it from its start; None if unknown (a pipeline from before this record)."""
    with client.pipeline(transaction=False) as pipe:
        pipe.zscore(keyspace.sinks_allowed, sink)
        pipe.zscore(keyspace.sinks_allowed, ALLOWED_SINCE)
        score, since = pipe.execute()
    if score is not None:
        return int(score)
    return None if since is None else 0


def note_sink_position(
    client: redis.Redis,
    keyspace: KeySpace,
    sink: str,
    state: str,
    txid: int,
    generation: str,
    **extra: Any,
) -> bool:
    """Record that ``sink`` (exporting ``state``) applied every txid up to ``txid`` (forward
    only; GenerationError if the pipeline was reset meanwhile)."""
    entry = {"txid": int(txid), "state": state, "at_ms": int(time.time() * 1000), **extra}
    args = [sink, int(txid), json.dumps(entry, sort_keys=True), generation]
    return bool(NOTE_SINK_POSITION(client, [keyspace.sinks, keyspace.generation], args))


def sink_positions(client: redis.Redis, keyspace: KeySpace) -> dict[str, dict[str, Any]]:
    """Every sink's recorded position: name -> {"txid", "state", "at_ms", ...}."""
    return {_str(k): json.loads(v) for k, v in client.hgetall(keyspace.sinks).items()}
