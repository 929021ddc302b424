"""Numeric map-state updates applied inside Redis (the commit's fast path).

``apply_numeric`` hands a chunk of (field, partial as JSON text) to the APPLY_NUMERIC script,
which applies the same ``[txid, curr, prev]`` rules as ``state.maps`` for a built-in numeric
combiner (count, sum, min, max, mean) in one round trip, fenced like every state write. No
value is decoded in Python. Keys the script cannot apply exactly (not a number, an int beyond
2^53, a stored value it cannot read) are returned untouched, for the caller's Python path.
"""

from __future__ import annotations

from collections.abc import Sequence

import redis

from tridentflow_state.backing import Fence
from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import StateKind
from tridentflow_state.scripts import FENCE_CHECK, RECORD_UNDO, LuaScript

APPLY_NUMERIC = LuaScript(
    "apply_numeric",
    FENCE_CHECK
    + RECORD_UNDO
    + r"""
-- Apply a batch's partials of a built-in numeric combiner to one map state, inside Redis.
-- The same rules as tridentflow_state.maps (stored JSON [txid, curr, prev]) for
-- ARGV[4] kind: 'opaque' | 'transactional' | 'non-transactional', and
-- ARGV[5] op: 'count' | 'sum' (a + b) | 'min' | 'max' (keep the first on ties) |
--             'mean' ([sum, count] added element-wise).
-- KEYS[1] state hash  KEYS[2] ledger hash  KEYS[3] tx hash of ARGV[1]  KEYS[4] written-set
-- KEYS[5] generation key  KEYS[6] the txid's undo hash of the state
-- ARGV[1] txid  ARGV[2] commit token  ARGV[3] generation
-- ARGV[6] the items, one per line: field TAB partial (JSON); neither holds a tab or newline
-- (one string: packing thousands of arguments costs the client more than the script)
-- ARGV[7] '1' = record the written fields' prior values in the undo hash (tridentflow_state.undo)
-- Fenced like FENCED_HSET. Numbers keep their JSON type: an int stays an int (exact below
-- 2^53), a float stays a float (IEEE double, as in Python). A key whose stored value or
-- partial is anything else (not a number, an int beyond 2^53, NaN/inf, a corrupt value) is
-- left untouched and returned for the caller's own (Python) path.
-- Returns {applied count, unhandled field, ...}; TFSTALE if a key is ahead of the txid.
local err = gen_check(KEYS[5], ARGV[3]) or
  fence_check(KEYS[2], KEYS[3], tonumber(ARGV[1]), ARGV[2])
if err then return redis.error_reply(err) end
local txid, kind, op = tonumber(ARGV[1]), ARGV[4], ARGV[5]
local LIMIT = 9007199254740992  -- 2^53: every int below is exact in a double
local find, match, format, huge = string.find, string.match, string.format, math.huge
local opaque, nontx = kind == 'opaque', kind == 'non-transactional'

-- a number token -> value, is_float; nil if not a plain finite number (or an int >= 2^53)
local function num(token)
  if find(token, '^%-?%d+$') then  -- an int: the common case, one check
    local v = tonumber(token)
    if v >= LIMIT or v <= -LIMIT then return nil end
    return v, false
  end
  if not find(token, '^%-?%d[%d%.eE%+%-]*$') then return nil end
  local v = tonumber(token)  -- a number here holds '.', 'e' or 'E': a float
  if v == nil or v ~= v or v == huge or v == -huge then return nil end
  return v, true
end

-- value, is_float -> its JSON token (an integral float keeps '.0'); nil if not exact here
local function fmt(v, f)
  if not f then
    if v >= LIMIT or v <= -LIMIT then return nil end
    return format('%d', v)
  end
  if v ~= v or v == huge or v == -huge then return nil end
  local s = format('%.17g', v)
  if not find(s, '[%.eEn]') then s = s .. '.0' end
  return s
end

-- combine(base token, partial token) -> the new token; nil if this script cannot do it
local function add(a, b)
  local x, fx = num(a)
  if x == nil then return nil end
  local y, fy = num(b)
  if y == nil then return nil end
  return fmt(x + y, fx or fy)
end

local combine
if op == 'count' or op == 'sum' then
  combine = add
elseif op == 'min' or op == 'max' then
  combine = function(a, b)
    local x = num(a)
    if x == nil then return nil end
    local y = num(b)
    if y == nil then return nil end
    if op == 'min' then
      if x <= y then return a end
      return b
    end
    if x >= y then return a end
    return b
  end
else  -- mean: [sum, count]
  combine = function(a, b)
    local s1, c1 = match(a, '^%[([^,]+),([^,]+)%]$')
    local s2, c2 = match(b, '^%[([^,]+),([^,]+)%]$')
    if s1 == nil or s2 == nil or find(c1, '[%.eE]') or find(c2, '[%.eE]') then return nil end
    local s, c = add(s1, s2), add(c1, c2)
    if s == nil or c == nil then return nil end
    return '[' .. s .. ',' .. c .. ']'
  end
end

-- a partial this script can store as it is (checked once, when there is nothing to combine)
local function plain(token)
  if op == 'mean' then
    local s, c = match(token, '^%[([^,]+),([^,]+)%]$')
    return s ~= nil and num(s) ~= nil and num(c) ~= nil and not find(c, '[%.eE]')
  end
  return num(token) ~= nil
end

-- [txid, curr, prev] as this script writes it: the common shapes first (a txid; prev null
-- or a value), then the general one (null txid or curr: non-transactional, Python-written)
local VALUE = (op == 'mean') and '(%[[^,%[%]]*,[^,%[%]]*%])' or '([^,%[%]n]+)'
local SHAPES = {
  '^%[(%d+),' .. VALUE .. ',' .. VALUE .. '%]$',
  '^%[(%d+),' .. VALUE .. ',(null)%]$',
  '^%[(%d*n?u?l?l?),' .. ((op == 'mean') and '(n?u?l?l?%[?[^,%[%]]*,?[^,%[%]]*%]?)'
    or '([^,%[%]]*)') .. ',' .. ((op == 'mean') and '(n?u?l?l?%[?[^,%[%]]*,?[^,%[%]]*%]?)'
    or '([^,%[%]]*)') .. '%]$',
}
local function parse(raw)
  for i = 1, 3 do
    local t, curr, prev = match(raw, SHAPES[i])
    if t then return t, curr, prev end
  end
  return nil
end

local fields, partials = {}, {}
for field, partial in string.gmatch(ARGV[6], '([^\t\n]+)\t([^\n]+)') do
  fields[#fields + 1] = field
  partials[#partials + 1] = partial
end
if #fields == 0 then return {0} end
local stored = {}
for i = 1, #fields, 4000 do  -- unpack() has a stack limit: HMGET in slices
  local part = redis.call('HMGET', KEYS[1], unpack(fields, i, math.min(i + 3999, #fields)))
  for j = 1, #part do stored[#stored + 1] = part[j] end
end
local record = ARGV[7] == '1'
local head = nontx and '[null,' or ('[' .. txid .. ',')
-- the common update - count or sum of ints, stored before this txid - in one pattern and one
-- addition: |curr|, |partial| < 10^15, so the sum is exact (< 2^53); anything else below
local fast = (op == 'count' or op == 'sum') and not nontx
local FAST = '^%[(%d+),(%-?%d+),(%-?[%dnul]+)%]$'
local INT = '^%-?%d+$'

-- one key's update from its partial and its stored value (nil: none) -> value (the new
-- curr's JSON token; false: this transactional txid applied it already; nil: Python's path),
-- keep (the curr it replaces, stored as prev), t (the stored txid token) and ahead (the
-- stored txid, when it is past this txid: the caller refuses with TFSTALE)
local function update(partial, raw)
  local t, curr, prev
  if fast and raw then t, curr, prev = match(raw, FAST) end
  if t and tonumber(t) < txid and #curr < 16 and #partial < 16 and find(partial, INT)
      and (prev == 'null' or find(prev, INT)) then
    return format('%d', tonumber(curr) + tonumber(partial)), curr, t
  end
  if not raw then
    return plain(partial) and partial or nil, 'null', nil
  end
  t, curr, prev = parse(raw)
  local s = t and t ~= 'null' and tonumber(t)
  if t == nil or (t ~= 'null' and not s) then
    return nil, 'null', t  -- not [txid, curr, prev] as this script writes it: Python's path
  elseif not nontx and s and s > txid then
    return nil, 'null', t, s
  elseif s == txid and not nontx and not opaque then
    return false, 'null', t
  end
  local base, keep = curr, curr
  if opaque and s == txid then base, keep = prev, prev end
  if base == 'null' then
    return plain(partial) and partial or nil, keep, t
  end
  return combine(base, partial), keep, t
end

local writes, written, unhandled = {}, {}, {}
local undo_pairs, check, check_priors = {}, {}, {}
local nw, nu, np = 0, 0, 0

-- a written key's prior value, for the undo hash: one this txid did not write before goes in
-- as it is; one it may have (its tag is this txid or none) is checked by record_undo
local function note_prior(field, raw, t)
  local tagged = t and tonumber(t)
  if not nontx and ((not raw) or (tagged ~= nil and tagged < txid)) then
    undo_pairs[np + 1] = field
    undo_pairs[np + 2] = raw or ''
    np = np + 2
  else
    check[#check + 1] = field
    check_priors[#check] = raw or ''
  end
end

for n = 1, #fields do
  local field, raw = fields[n], stored[n]
  local value, keep, t, ahead = update(partials[n], raw)
  if ahead then
    return redis.error_reply('TFSTALE batch txid ' .. txid .. ' is behind key ' .. field ..
      ', stored at txid ' .. ahead .. '; refusing to overwrite')
  end
  if value then
    writes[2 * nw + 1] = field
    writes[2 * nw + 2] = head .. value .. ',' .. (nontx and 'null' or keep) .. ']'
    nw = nw + 1
    written[nw] = field
    if record then note_prior(field, raw, t) end
  elseif value == nil then
    nu = nu + 1
    unhandled[nu] = field
  end
end
-- every key is checked before anything is written (a stale key above writes nothing);
-- then the undo log, and HSET/SADD in slices (unpack() has a stack limit)
if record then record_undo(KEYS[6], undo_pairs, check, check_priors) end
for i = 1, #written, 2000 do
  local last = math.min(i + 1999, #written)
  redis.call('HSET', KEYS[1], unpack(writes, 2 * i - 1, 2 * last))
  if not nontx then
    redis.call('SADD', KEYS[4], unpack(written, i, last))
  end
end
local out = {#written}
for i = 1, #unhandled do out[#out + 1] = unhandled[i] end
return out
""",
)


OPS = ("count", "sum", "min", "max", "mean")


def apply_numeric(
    client: redis.Redis,
    keyspace: KeySpace,
    state_name: str,
    kind: StateKind,
    op: str,
    fence: Fence,
    items: str | Sequence[tuple[str, str]],
) -> tuple[int, list[str]]:
    """Apply ``items`` of one chunk atomically: (encoded key, partial JSON) pairs, or the same
    as one string of ``key TAB partial`` lines (as staged: no per-key work here). Returns
    (keys written, keys left for the Python path). Raises StaleTxidError, FencedError,
    CommitOrderError, GenerationError like any fenced write; nothing of the chunk is written
    then."""
    if isinstance(items, str):
        lines = items
    else:
        lines = "\n".join(f"{field}\t{partial}" for field, partial in items)
    keys = script_keys(keyspace, state_name, op, fence)
    args = [fence.txid, fence.token, fence.generation, kind.value, op, lines, undo_flag(fence)]
    return applied_and_left(APPLY_NUMERIC(client, keys, args))


def script_keys(keyspace: KeySpace, state_name: str, op: str, fence: Fence) -> list[str]:
    """KEYS[1..6] of APPLY_NUMERIC (and APPLY_STAGED_NUMERIC) for one state in ``keyspace``
    (a shard's, when sharded); ValueError for an op the script does not know."""
    if op not in OPS:
        raise ValueError(f"unknown numeric op {op!r}; expected one of {OPS}")
    return [
        keyspace.state(state_name),
        keyspace.ledger,
        keyspace.tx(fence.txid),
        keyspace.written(state_name, fence.txid),
        keyspace.generation,
        keyspace.undo(state_name, fence.txid),
    ]


def undo_flag(fence: Fence) -> str:
    """ARGV[7]: '1' = record the written fields' prior values in the undo hash."""
    return "1" if fence.undo else ""


def applied_and_left(reply: list) -> tuple[int, list[str]]:
    """The script's reply: (keys written, keys left for the Python path)."""
    unhandled = [f.decode() if isinstance(f, bytes) else f for f in reply[1:]]
    return int(reply[0]), unhandled
