"""How the state layer runs Lua (after redis-py's redis/lock.py), and the Lua fragments its
scripts share (the generation and fence checks, the undo record, Redis's clock).

Each script is a named constant beside the Python that builds its KEYS and ARGV (the ledger's
in ``ledger``, the shards' in ``shards``, APPLY_NUMERIC in ``numeric``, ...), and documents its
KEYS and ARGV. ``LuaScript`` runs a script by EVALSHA (the SHA is
computed locally, so nothing is sent until the first call) and loads it on NOSCRIPT - after a
server restart or SCRIPT FLUSH - then retries once. Errors raised on purpose by a script start
with a TF* prefix and are turned into the matching tridentflow_state.errors exception.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import NoScriptError, ResponseError

from tridentflow_state.errors import from_lua_error


@dataclass(frozen=True)
class LuaScript:
    name: str
    source: str
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())

    def __call__(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Any]) -> Any:
        try:
            try:
                return client.evalsha(self.sha, len(keys), *keys, *args)
            except NoScriptError:
                client.script_load(self.source)
                return client.evalsha(self.sha, len(keys), *keys, *args)
        except ResponseError as exc:
            mapped = from_lua_error(str(exc))
            if mapped is not None:
                raise mapped from None
            raise


# Shared Lua helper: the generation check every writing script makes. A pipeline's generation
# is a random token in its generation key, replaced by every reset (and gone if Redis lost its
# data): a step that started in another generation is refused, so nothing of a run that was in
# flight during a reset can land in the fresh pipeline. '' = unchecked (unfenced writes).
GEN_CHECK = """
local function gen_check(genkey, expected)
  if expected == '' then return nil end
  local current = redis.call('GET', genkey)
  if current ~= expected then
    if current and string.sub(current, 1, 7) == 'rewind:' then
      return 'TFGENERATION this step belongs to generation ' .. expected ..
        ' of the pipeline, which is being rewound: it must not touch it; start a new run' ..
        ' once the rewind is done'
    end
    local now = current and ('generation ' .. current) or 'no generation: Redis lost its data?'
    return 'TFGENERATION this step belongs to generation ' .. expected ..
      ' of the pipeline, which was reset or rewound since (' .. now .. '); it must not' ..
      ' touch the new pipeline: start a new run'
  end
  return nil
end
"""

# Shared Lua helper: whether a txid is committed already. A step of a committed txid - a late
# zombie, a task cleared long after - must not write its tx hash: the commit of the next txid
# deleted it, and a write would recreate it with nothing to ever delete it again.
COMMITTED_TXID = """
local function committed_already(ledger, txid)
  return tonumber(redis.call('HGET', ledger, 'committed') or '0') >= tonumber(txid)
end
"""

# Shared Lua helper: the server's clock in milliseconds (step timings in the ledger).
NOW_MS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# Shared Lua helper: the ordering and fencing check every fenced write makes.
FENCE_CHECK = (
    GEN_CHECK
    + """
local function fence_check(ledger, txkey, txid, token)
  local committed = tonumber(redis.call('HGET', ledger, 'committed') or '0')
  if committed ~= txid - 1 then
    return 'TFORDER txid ' .. txid .. ' cannot write: the ledger stands at ' .. committed
  end
  local current = redis.call('HGET', txkey, 'commit_token')
  if current ~= token then
    return 'TFFENCED commit attempt ' .. token .. ' of txid ' .. txid ..
      ' was superseded by attempt ' .. tostring(current)
  end
  return nil
end
"""
)

# Shared Lua helper: the undo log (state.undo). Before a txid writes fields of a state, the
# values they hold are recorded in the txid's undo hash ('' = absent) - only the first write of
# a field in the txid: a retried attempt (or a rollback of an earlier attempt's write) finds
# the value from before the txid already there and keeps it. ``first[i]`` true says field i's
# stored value proves this is its first write in the txid (absent, or tagged with an older
# txid: every write of a txid tags the value with it, and nothing deletes one before the txid
# is committed), so its entry is set without looking; the others are looked up first.
RECORD_UNDO = """
-- ``pairs``: field, prior, ... of fields known to be written for the first time in the txid
-- (set as they are); ``check``/``check_priors``: the others, set only where the undo hash
-- has no entry yet.
local function record_undo(undo, pairs, check, check_priors)
  local n = #pairs
  for i = 1, #check, 2000 do  -- unpack() has a stack limit: slices
    local last = math.min(i + 1999, #check)
    local seen = redis.call('HMGET', undo, unpack(check, i, last))
    for j = 1, #seen do
      if not seen[j] then
        pairs[n + 1] = check[i + j - 1]
        pairs[n + 2] = check_priors[i + j - 1]
        n = n + 2
      end
    end
  end
  for i = 1, n, 4000 do
    redis.call('HSET', undo, unpack(pairs, i, math.min(i + 3999, n)))
  end
end

-- Whether a stored value (or false: absent) proves that txid has not written it yet.
local function first_write(raw, txid)
  if not raw then return true end
  local t = string.match(raw, '^%[(%d+),')
  return t ~= nil and tonumber(t) < txid
end
"""

# Shared Lua helper: the check a reset and a rewind make before they start a generation -
# refused (TFBUSY) while a pending txid's owner holds a live lease. ``first``: the index in
# KEYS of the first pending txid's tx hash; ``how``: what the error suggests to force it.
BUSY_CHECK = (
    NOW_MS
    + """
local function busy_check(first, how)
  local now = now_ms()
  for i = first, #KEYS do
    local owner = redis.call('HGET', KEYS[i], 'owner')
    local lease_until = tonumber(redis.call('HGET', KEYS[i], 'lease_until') or '0')
    if owner and lease_until > now then
      return 'TFBUSY run ' .. owner .. ' holds a pending txid (lease ' ..
        math.ceil((lease_until - now) / 1000) .. ' s left): stop it first, or ' .. how
    end
  end
  return nil
end
"""
)
