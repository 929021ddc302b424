"""Redis BackingMap: one Redis hash per map state, field = encoded group key.

Reads are one HMGET per call; writes are one FENCED_HSET script call per chunk, so each key's
write is atomic and refused if the commit attempt was superseded or the ledger is not ready.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import redis

from tridentflow_state.backing import Fence
from tridentflow_state.codec import encode_value
from tridentflow_state.errors import KeyEncodingError
from tridentflow_state.expiry import RedisExpiryIndex
from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import decode_stored
from tridentflow_state.scripts import FENCE_CHECK, GEN_CHECK, RECORD_UNDO, LuaScript

FENCED_HSET = LuaScript(
    "fenced_hset",
    FENCE_CHECK
    + RECORD_UNDO
    + """
-- Write fields of one map state, atomically, if the writer holds the newest commit attempt.
-- KEYS[1] state hash  KEYS[2] ledger hash  KEYS[3] tx hash of ARGV[1]  KEYS[4] written-set
-- KEYS[5] generation key  KEYS[6] the txid's undo hash of the state
-- ARGV[1] txid ('' = unfenced write)  ARGV[2] commit token  ARGV[3] generation
-- ARGV[4] '1' = record the fields' prior values in the undo hash first (fenced writes only)
-- ARGV[5..] field, value, ...
-- Fenced: refused (TFGENERATION) unless the pipeline is still in generation ARGV[3], (TFORDER)
-- unless the ledger's committed txid is ARGV[1]-1, (TFFENCED) unless ARGV[2] is the txid's
-- newest commit token; the fields are also added to the written-set. Returns the number of
-- fields written.
local fenced = ARGV[1] ~= ''
if fenced then
  local err = gen_check(KEYS[5], ARGV[3]) or
    fence_check(KEYS[2], KEYS[3], tonumber(ARGV[1]), ARGV[2])
  if err then return redis.error_reply(err) end
  if ARGV[4] == '1' and #ARGV >= 5 then
    local fields = {}
    for i = 5, #ARGV, 2 do fields[#fields + 1] = ARGV[i] end
    local pairs, check, check_priors, txid = {}, {}, {}, tonumber(ARGV[1])
    for i = 1, #fields, 2000 do
      local part = redis.call('HMGET', KEYS[1], unpack(fields, i, math.min(i + 1999, #fields)))
      for j = 1, #part do
        if first_write(part[j], txid) then
          pairs[#pairs + 1] = fields[i + j - 1]
          pairs[#pairs + 1] = part[j] or ''
        else
          check[#check + 1] = fields[i + j - 1]
          check_priors[#check] = part[j] or ''
        end
      end
    end
    record_undo(KEYS[6], pairs, check, check_priors)
  end
end
local n = 0
for i = 5, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  if fenced then redis.call('SADD', KEYS[4], ARGV[i]) end
  n = n + 1
end
return n
""",
)


DROP_TOMBSTONES = LuaScript(
    "drop_tombstones",
    GEN_CHECK
    + r"""
-- Delete keys a committed txid removed: each field of KEYS[1] whose value still starts with
-- '[' .. ARGV[2] .. ',null,' (a tombstone written by that txid, not rewritten since).
-- KEYS[1] state hash  KEYS[2] ledger hash  KEYS[3] generation key
-- ARGV[1] generation  ARGV[2] txid ('null' for a non-transactional state)  ARGV[3..] fields
-- Does nothing unless the pipeline is still in generation ARGV[1] and, for a txid, the
-- ledger's committed txid is at least ARGV[2] (a pending txid's tombstone keeps its prev).
-- The ledger's ``dropped_txid`` becomes at least ARGV[2] when a field is deleted (a reader
-- then knows a key absent now may have existed as of an older txid: QUERY_SNAPSHOT).
-- Returns the number of fields deleted.
local err = gen_check(KEYS[3], ARGV[1])
if err then return redis.error_reply(err) end
if ARGV[2] ~= 'null' then
  local committed = tonumber(redis.call('HGET', KEYS[2], 'committed') or '0')
  if committed < tonumber(ARGV[2]) then return 0 end
end
local prefix = '[' .. ARGV[2] .. ',null,'
local n = 0
for i = 3, #ARGV do
  local v = redis.call('HGET', KEYS[1], ARGV[i])
  if v and string.sub(v, 1, #prefix) == prefix then
    redis.call('HDEL', KEYS[1], ARGV[i])
    n = n + 1
  end
end
if n > 0 and ARGV[2] ~= 'null' then
  local before = tonumber(redis.call('HGET', KEYS[2], 'dropped_txid') or '0')
  if tonumber(ARGV[2]) > before then redis.call('HSET', KEYS[2], 'dropped_txid', ARGV[2]) end
end
return n
""",
)


CHUNK = 1000
"""Fields per round trip (keeps Lua's unpack() and a single script's run time small)."""


class RedisBackingMap:
    def __init__(self, client: redis.Redis, keyspace: KeySpace, state_name: str) -> None:
        self.client = client
        self.keyspace = keyspace
        self.state_name = state_name
        self.key = keyspace.state(state_name)

    def multi_get(self, keys: Sequence[str]) -> list[Any | None]:
        out: list[Any | None] = []
        for i in range(0, len(keys), CHUNK):
            chunk = keys[i : i + CHUNK]
            raws = self.client.hmget(self.key, chunk)
            name = self.state_name
            out.extend(decode_stored(raw, name, key) for key, raw in zip(chunk, raws, strict=True))
        return out

    def multi_put(self, items: Sequence[tuple[str, Any]], fence: Fence | None = None) -> None:
        txid = 0 if fence is None else fence.txid
        written = self.keyspace.written(self.state_name, txid)
        undo = self.keyspace.undo(self.state_name, txid)
        fenced_hset(self.client, self.keyspace, self.key, written, items, fence, undo)

    def keys_written_in(self, txid: int) -> set[str]:
        members = self.client.smembers(self.keyspace.written(self.state_name, txid))
        return {m.decode() if isinstance(m, bytes) else m for m in members}

    def count_written_in(self, txid: int) -> int:
        return int(self.client.scard(self.keyspace.written(self.state_name, txid)))

    def drop_tombstones(self, txid: int | None, keys: Sequence[str], generation: str = "") -> int:
        dropped = 0
        for i in range(0, len(keys), CHUNK):
            chunk = list(keys[i : i + CHUNK])
            args = [generation, "null" if txid is None else int(txid), *chunk]
            scriptkeys = [self.key, self.keyspace.ledger, self.keyspace.generation]
            dropped += int(DROP_TOMBSTONES(self.client, scriptkeys, args))
        return dropped

    def scan_items(self) -> Iterator[tuple[str, Any]]:
        for field, raw in self.client.hscan_iter(self.key, count=1000):
            key = field.decode() if isinstance(field, bytes) else field
            yield key, decode_stored(raw, self.state_name, key)

    def count(self) -> int:
        return int(self.client.hlen(self.key))

    @property
    def expiry(self) -> RedisExpiryIndex:
        """The state's expiry index (tridentflow_state.expiry)."""
        return RedisExpiryIndex(self.client, self.keyspace, self.state_name)


def fenced_hset(
    client: redis.Redis,
    keyspace: KeySpace,
    hash_key: str,
    written_key: str,
    items: Sequence[tuple[str, Any]],
    fence: Fence | None,
    undo_key: str | None = None,
) -> None:
    """HSET JSON values into ``hash_key`` in chunks, each chunk atomic and fenced (FENCED_HSET);
    with ``undo_key`` and a fence asking for it (``fence.undo``), the fields' prior values are
    recorded there by the same script call."""
    txid = 0 if fence is None else fence.txid
    undo = bool(undo_key and fence is not None and fence.undo)
    script_keys = [
        hash_key,
        keyspace.ledger,
        keyspace.tx(txid),
        written_key,
        keyspace.generation,
        undo_key or hash_key,
    ]
    head = ["", "", ""] if fence is None else [str(fence.txid), str(fence.token), fence.generation]
    head.append("1" if undo else "")
    for i in range(0, len(items), CHUNK):
        args: list[str] = list(head)
        for key, value in items[i : i + CHUNK]:
            try:
                encoded = encode_value(value)
            except KeyEncodingError as exc:  # before the chunk's write: nothing of it lands
                raise KeyEncodingError(f"key {key}: {exc}") from exc
            args += (key, encoded)
        FENCED_HSET(client, script_keys, args)
