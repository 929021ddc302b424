"""Lua scripts of the state layer, as named constants (after redis-py's redis/lock.py).

Each script documents its KEYS and ARGV. ``LuaScript`` runs a script by EVALSHA (the SHA is
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
_GEN_CHECK = """
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
_COMMITTED = """
local function committed_already(ledger, txid)
  return tonumber(redis.call('HGET', ledger, 'committed') or '0') >= tonumber(txid)
end
"""

# Shared Lua helper: the server's clock in milliseconds (step timings in the ledger).
_NOW_MS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# Shared Lua helper: the ordering and fencing check every fenced write makes.
_FENCE_CHECK = (
    _GEN_CHECK
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
_RECORD_UNDO = """
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

FENCED_HSET = LuaScript(
    "fenced_hset",
    _FENCE_CHECK
    + _RECORD_UNDO
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

STAGE_CHANGES = LuaScript(
    "stage_changes",
    _FENCE_CHECK
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
    _GEN_CHECK
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

QUERY_SNAPSHOT = LuaScript(
    "query_snapshot",
    """
-- Read fields of a map state together with what its slot knows of the commits, as one
-- atomic snapshot (state.shards.query_state combines such snapshots into one committed view).
-- KEYS[1] the slot's ledger hash (the pipeline's ledger, or a state shard's fence)
-- KEYS[2] state hash   ARGV fields (at least one)
-- Returns {committed txid, newest txid whose tombstones were dropped, value1, value2, ...}
-- (a missing field is nil). ``committed`` is the ledger's, or for a shard the txid its fence
-- is closed to (the txid holding it, minus one, until it settles).
local out = {tonumber(redis.call('HGET', KEYS[1], 'committed') or '0'),
  tonumber(redis.call('HGET', KEYS[1], 'dropped_txid') or '0')}
local values = redis.call('HMGET', KEYS[2], unpack(ARGV))
for i = 1, #ARGV do out[i + 2] = values[i] end
return out
""",
)

HOLD_COMMITS = LuaScript(
    "hold_commits",
    """
-- A reader that kept missing a consistent view asks the next commits to wait: BEGIN_COMMIT
-- refuses (TFHELD) while KEYS[1] exists. The hold expires by itself after ARGV[2] ms. Fair:
-- once a commit waited for a hold (KEYS[2] set by BEGIN_COMMIT), no new hold is taken until
-- that commit has begun, so back-to-back readers cannot starve the commits either.
-- KEYS[1] read-hold key  KEYS[2] waiting-commit key   ARGV[1] reader token
-- ARGV[2] hold in ms (0: release this token's hold)
-- Returns 1 if the caller holds it now, 2 if another reader's hold stands (extended),
-- 0 if refused (a commit is waiting its turn).
if tonumber(ARGV[2]) <= 0 then
  if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
  return 1
end
local holder = redis.call('GET', KEYS[1])
if holder then  -- extended, whoever holds it (commands the ACL rules already grant)
  redis.call('SET', KEYS[1], holder, 'PX', ARGV[2])
  return holder == ARGV[1] and 1 or 2
end
if redis.call('GET', KEYS[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
""",
)

BIND_RUN = LuaScript(
    "bind_run",
    _GEN_CHECK
    + """
-- Bind an orchestrator run to a txid. Idempotent per run id while the run owns its txid.
-- KEYS[1] ledger hash  KEYS[2] runs hash (run id -> txid)  KEYS[3] generation key
-- KEYS[4..] tx hashes of txids committed+1 .. last+1 (every txid the script may read or own)
-- ARGV[1] run id  ARGV[2] lease in ms  ARGV[3] '1' = adopt a pending txid even if its owner's
-- lease is live (a single driver taking over)  ARGV[4] generation  ARGV[5] committed txid and
-- ARGV[6] last txid the caller read to name KEYS[4..]: if the ledger moved since, TFRETRY
-- (the caller reads again and retries).
-- Order of preference: the txid this run already owns (or that it committed); else the lowest
-- pending txid whose owner is gone (released, or lease expired); else a new txid (last + 1).
-- Adopting a txid marks the previous owner's entry 'lost:<txid>:<adopter>', so that run, if
-- cleared later, binds a fresh txid (it never reports a txid another run committed).
-- Returns {txid, how, committed} with how in committed|bound|adopted|new.
local gerr = gen_check(KEYS[3], ARGV[4])
if gerr then return redis.error_reply(gerr) end
local committed = tonumber(redis.call('HGET', KEYS[1], 'committed') or '0')
local last = tonumber(redis.call('HGET', KEYS[1], 'last_txid') or '0')
if last < committed then last = committed end
if committed ~= tonumber(ARGV[5]) or last ~= tonumber(ARGV[6]) then
  return redis.error_reply('TFRETRY the ledger moved while binding')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local run, lease = ARGV[1], tonumber(ARGV[2])
local function txkey(n) return KEYS[3 + n - committed] end
local function own(n, how)
  local previous = redis.call('HGET', txkey(n), 'owner')
  if previous and previous ~= run then
    redis.call('HSET', KEYS[2], previous, 'lost:' .. n .. ':' .. run)
  end
  redis.call('HSET', txkey(n), 'owner', run, 'lease_until', now + lease)
  redis.call('HDEL', txkey(n), 'released')
  redis.call('HSET', KEYS[2], run, n)
  return {n, how, committed}
end
local bound = tonumber(redis.call('HGET', KEYS[2], run) or '')
if bound then
  local n = bound
  if n <= committed then return {n, 'committed', committed} end
  if redis.call('HGET', txkey(n), 'owner') == run then return own(n, 'bound') end
  -- another run adopted this txid after this run stopped: bind this run afresh
end
for n = committed + 1, last do
  local key = txkey(n)
  local owner = redis.call('HGET', key, 'owner')
  local lease_until = tonumber(redis.call('HGET', key, 'lease_until') or '0')
  if (not owner) or lease_until < now or ARGV[3] == '1' then
    return own(n, 'adopted')
  end
end
redis.call('HSET', KEYS[1], 'last_txid', last + 1)
return own(last + 1, 'new')
""",
)

RENEW_LEASE = LuaScript(
    "renew_lease",
    _GEN_CHECK
    + """
-- Extend (ARGV[2] > 0) or release (ARGV[2] = 0) the lease of run ARGV[1] on a txid it owns.
-- KEYS[1] tx hash  KEYS[2] generation key   ARGV[1] run id  ARGV[2] lease in ms
-- ARGV[3] generation (TFGENERATION if the pipeline was reset since)
-- A release is final for that run: 'released' names it, and no renewal of its brings the
-- lease back (a step of a finished run still starting - a spark-submit the orchestrator has
-- not killed yet - must not take back a txid an operator released); only a new bind or claim
-- (which clears 'released') does.
-- Returns 1 if the run owns the txid (and was not released), 0 otherwise (nothing changed).
local gerr = gen_check(KEYS[2], ARGV[3])
if gerr then return redis.error_reply(gerr) end
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then return 0 end
local lease = tonumber(ARGV[2])
if lease > 0 and redis.call('HGET', KEYS[1], 'released') == ARGV[1] then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if lease > 0 then
  lease = now + lease
else
  redis.call('HSET', KEYS[1], 'released', ARGV[1])
end
redis.call('HSET', KEYS[1], 'lease_until', lease)
return 1
""",
)

BEGIN_COMMIT = LuaScript(
    "begin_commit",
    _GEN_CHECK
    + _NOW_MS
    + """
-- Start a commit attempt of a txid: hands out a new fencing token.
-- KEYS[1] ledger hash  KEYS[2] tx hash  KEYS[3] generation key  KEYS[4] read-hold key
-- KEYS[5] waiting-commit key (set while held: no new hold is taken before this one begins)
-- ARGV[1] txid  ARGV[2] generation
-- Returns {0, committed} if the txid is already committed (a re-commit is a no-op),
-- {token, committed} otherwise; refused (TFORDER) unless the ledger stands at txid-1,
-- (TFGENERATION) if the pipeline was reset since the caller started, (TFHELD ms: when to
-- ask again) while a starved reader holds commits back (HOLD_COMMITS).
local gerr = gen_check(KEYS[3], ARGV[2])
if gerr then return redis.error_reply(gerr) end
local txid = tonumber(ARGV[1])
local committed = tonumber(redis.call('HGET', KEYS[1], 'committed') or '0')
if committed >= txid then return {0, committed} end
if redis.call('GET', KEYS[4]) then
  redis.call('SET', KEYS[5], '1', 'PX', 10000)
  return redis.error_reply('TFHELD 5')
end
redis.call('DEL', KEYS[5])
if committed ~= txid - 1 then
  return redis.error_reply('TFORDER txid ' .. txid .. ' cannot commit before txid ' ..
    (committed + 1) .. ' (the ledger stands at ' .. committed .. ')')
end
redis.call('HSET', KEYS[2], 'commit_started_ms', now_ms())
return {redis.call('HINCRBY', KEYS[2], 'commit_token', 1), committed}
""",
)

MARK_COMMITTED = LuaScript(
    "mark_committed",
    _FENCE_CHECK
    + _NOW_MS
    + """
-- Mark a txid committed, with the source offsets it advanced to. Call only after every key of
-- the txid is written. Atomic: the committed txid and the offsets move together.
-- KEYS[1] ledger hash  KEYS[2] tx hash  KEYS[3] offsets hash  KEYS[4] generation key
-- KEYS[5] history list (newest first, the last ARGV[5] commits)
-- KEYS[6] tx hash of txid-1 (deleted: its metadata is no longer needed)
-- KEYS[7] undo meta hash (tridentflow_state.undo)  KEYS[8..] written-sets of this txid (deleted)
-- ARGV[1] txid  ARGV[2] commit token  ARGV[3] generation  ARGV[4] stats JSON (an object)
-- ARGV[5] history length  ARGV[6] undo logs retained (0: off)  ARGV[7..] partition, offset, ...
-- With ARGV[6] = R > 0 the offsets right after the txid are kept (``offsets:<txid>``) and
-- ``from`` (the oldest txid whose undo logs are complete) moves to txid - R + 1 at most; the
-- first txid so marked is not trusted (an earlier attempt may have written without undo):
-- ``from`` starts at txid + 1. With R = 0, ``from`` goes (the undo chain is broken).
-- The history entry is the stats with the txid, the owning run, every step's attempts and
-- start/end times (ms) from the tx hash - and, under an orchestrator, its task's tries,
-- start/end and summed durations (RECORD_TASK) - and the commit time: what a cleared Airflow
-- task's deleted XCom no longer shows. Returns 1 when marked, 0 if already committed (no-op).
local err = gen_check(KEYS[4], ARGV[3])
if err then return redis.error_reply(err) end
local txid = tonumber(ARGV[1])
local committed = tonumber(redis.call('HGET', KEYS[1], 'committed') or '0')
if committed >= txid then return 0 end
err = fence_check(KEYS[1], KEYS[2], txid, ARGV[2])
if err then return redis.error_reply(err) end
local now = now_ms()
redis.call('HSET', KEYS[1], 'committed', txid)
for i = 7, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
local retain = tonumber(ARGV[6])
if retain > 0 then
  local from = tonumber(redis.call('HGET', KEYS[7], 'from') or '0')
  if from == 0 then
    from = txid + 1
    redis.call('HSETNX', KEYS[7], 'purged', txid)
  end
  if txid - retain + 1 > from then from = txid - retain + 1 end
  local after = {}
  local flat = redis.call('HGETALL', KEYS[3])
  for i = 1, #flat, 2 do after[flat[i]] = flat[i + 1] end  -- strings: exact
  redis.call('HSET', KEYS[7], 'from', from, 'offsets:' .. txid, cjson.encode(after))
else
  redis.call('HDEL', KEYS[7], 'from')
end
redis.call('HSET', KEYS[2], 'status', 'committed', 'stats', ARGV[4],
  'committed_at', math.floor(now / 1000))
local entry = cjson.decode(ARGV[4])
entry['txid'] = txid
entry['run_id'] = redis.call('HGET', KEYS[2], 'owner') or cjson.null
local steps = {}
for _, step in ipairs({'coordinate', 'emit', 'commit'}) do
  local started = redis.call('HGET', KEYS[2], step .. '_started_ms')
  local ended = redis.call('HGET', KEYS[2], step .. '_ended_ms')
  if step == 'commit' then ended = now end
  local tries = redis.call('HGET', KEYS[2], step .. '_tries')
  local task_started = redis.call('HGET', KEYS[2], step .. '_task_started_ms')
  local task_ended = redis.call('HGET', KEYS[2], step .. '_task_ended_ms')
  local task_ms = redis.call('HGET', KEYS[2], step .. '_task_ms')
  if step == 'commit' and task_started then
    -- the try marking this commit is running: its time so far counts
    local try_started = tonumber(redis.call('HGET', KEYS[2], 'commit_try_started_ms') or '0')
    if try_started > 0 and try_started > tonumber(task_ended or '0') then
      task_ms = tonumber(task_ms or '0') + math.max(0, now - try_started)
    end
    task_ended = now
  end
  steps[step] = {
    attempts = tonumber(redis.call('HGET', KEYS[2], step .. '_attempts') or '0'),
    started_ms = started and tonumber(started) or cjson.null,
    ended_ms = ended and tonumber(ended) or cjson.null,
    tries = tries and tonumber(tries) or cjson.null,
    task_started_ms = task_started and tonumber(task_started) or cjson.null,
    task_ended_ms = task_ended and tonumber(task_ended) or cjson.null,
    task_ms = task_ms and tonumber(task_ms) or cjson.null,
  }
end
steps['commit']['attempts'] = tonumber(ARGV[2])
entry['steps'] = steps
entry['committed_ms'] = now
redis.call('LPUSH', KEYS[5], cjson.encode(entry))
redis.call('LTRIM', KEYS[5], 0, tonumber(ARGV[5]) - 1)
redis.call('DEL', KEYS[6])
for i = 8, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
""",
)

RECORD_STAGED = LuaScript(
    "record_staged",
    _GEN_CHECK
    + _COMMITTED
    + _NOW_MS
    + """
-- Record that emit attempt ARGV[1] staged complete output, unless a newer attempt already did
-- (the output of an attempt older than the newest seen is ignored, as Trident's workers do).
-- KEYS[1] tx hash  KEYS[2] generation key  KEYS[3] ledger hash
-- ARGV[1] attempt  ARGV[2] generation  ARGV[3] txid
-- Returns the staged attempt now recorded; 0 (nothing written) if the txid is committed.
local gerr = gen_check(KEYS[2], ARGV[2])
if gerr then return redis.error_reply(gerr) end
if committed_already(KEYS[3], ARGV[3]) then return 0 end
local current = tonumber(redis.call('HGET', KEYS[1], 'staged_attempt') or '0')
local attempt = tonumber(ARGV[1])
if attempt > current then
  redis.call('HSET', KEYS[1], 'staged_attempt', attempt, 'emit_ended_ms', now_ms())
  return attempt
end
return current
""",
)

CLAIM_TXID = LuaScript(
    "claim_txid",
    _GEN_CHECK
    + """
-- Claim a specific txid for a run (a single driver pipelining its own txids).
-- KEYS[1] ledger hash  KEYS[2] runs hash  KEYS[3] tx hash of ARGV[1]  KEYS[4] generation key
-- ARGV[1] txid  ARGV[2] run id  ARGV[3] lease in ms  ARGV[4] generation
-- The txid must be pending (committed < txid <= last) or the next new one (last + 1), which
-- then becomes the last. Returns {txid, how} with how in committed|adopted|new; refused
-- (TFORDER) for a txid beyond last + 1 (that would skip one).
local gerr = gen_check(KEYS[4], ARGV[4])
if gerr then return redis.error_reply(gerr) end
local txid = tonumber(ARGV[1])
local committed = tonumber(redis.call('HGET', KEYS[1], 'committed') or '0')
local last = tonumber(redis.call('HGET', KEYS[1], 'last_txid') or '0')
if last < committed then last = committed end
if txid <= committed then return {txid, 'committed'} end
if txid > last + 1 then
  return redis.error_reply('TFORDER txid ' .. txid .. ' would skip txid ' .. (last + 1))
end
local how = 'adopted'
if txid == last + 1 then
  redis.call('HSET', KEYS[1], 'last_txid', txid)
  how = 'new'
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local previous = redis.call('HGET', KEYS[3], 'owner')
if previous and previous ~= ARGV[2] then
  redis.call('HSET', KEYS[2], previous, 'lost:' .. txid .. ':' .. ARGV[2])
end
redis.call('HSET', KEYS[3], 'owner', ARGV[2], 'lease_until', now + tonumber(ARGV[3]))
redis.call('HDEL', KEYS[3], 'released')
redis.call('HSET', KEYS[2], ARGV[2], txid)
return {txid, how}
""",
)

STORE_METADATA = LuaScript(
    "store_metadata",
    _GEN_CHECK
    + _COMMITTED
    + _NOW_MS
    + """
-- Store a txid's batch metadata unless some is stored already (the first writer wins).
-- KEYS[1] tx hash  KEYS[2] generation key  KEYS[3] ledger hash
-- ARGV[1] metadata JSON  ARGV[2] generation  ARGV[3] txid
-- Returns the stored metadata (this call's or the earlier one); nothing is written for a
-- committed txid (its metadata, or nil once the next commit deleted it).
local gerr = gen_check(KEYS[2], ARGV[2])
if gerr then return redis.error_reply(gerr) end
if committed_already(KEYS[3], ARGV[3]) then return redis.call('HGET', KEYS[1], 'meta') end
if redis.call('HSETNX', KEYS[1], 'meta', ARGV[1]) == 1 then
  redis.call('HSET', KEYS[1], 'coordinate_ended_ms', now_ms())
end
return redis.call('HGET', KEYS[1], 'meta')
""",
)

COUNT_ATTEMPT = LuaScript(
    "count_attempt",
    _GEN_CHECK
    + _COMMITTED
    + _NOW_MS
    + """
-- Count one more attempt of a step of a txid, and note when its first attempt started (a
-- step's time runs from its first attempt to its last end: never negative, retries included).
-- KEYS[1] tx hash  KEYS[2] generation key  KEYS[3] ledger hash
-- ARGV[1] step  ARGV[2] generation  ARGV[3] txid
-- Returns the attempt number; 0 (nothing written) if the txid is committed.
local gerr = gen_check(KEYS[2], ARGV[2])
if gerr then return redis.error_reply(gerr) end
if committed_already(KEYS[3], ARGV[3]) then return 0 end
redis.call('HSETNX', KEYS[1], ARGV[1] .. '_started_ms', now_ms())
return redis.call('HINCRBY', KEYS[1], ARGV[1] .. '_attempts', 1)
""",
)

RECORD_TASK = LuaScript(
    "record_task",
    _GEN_CHECK
    + _COMMITTED
    + """
-- What the orchestrator knows of a step's task: its tries (Airflow's try numbers, retries and
-- clears included, which the step's own attempt counter misses when a try failed before it
-- reached Redis), summed over the runs that worked on the txid (an adopted txid's first run
-- and its adopter each count theirs), when the first try started, when the last one ended,
-- and the sum of the tries' durations (each try's end counted once).
-- KEYS[1] tx hash  KEYS[2] generation key  KEYS[3] ledger hash
-- ARGV[1] step  ARGV[2] generation  ARGV[3] try number  ARGV[4] this try's start ms
-- ARGV[5] this try's end ms ('' = running)  ARGV[6] run id  ARGV[7] txid
-- Idempotent; returns 1, or 0 (nothing written) for a committed txid whose tx hash is gone.
-- Fields: <step>_tries@<run> (the run's highest try), <step>_tries (their sum),
-- <step>_task_started_ms, <step>_task_ended_ms, <step>_try_started_ms (the newest try's start),
-- <step>_ended@<run> (the run's highest try whose end is counted), <step>_task_ms (the sum).
local gerr = gen_check(KEYS[2], ARGV[2])
if gerr then return redis.error_reply(gerr) end
if committed_already(KEYS[3], ARGV[7]) and redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local step, try, run = ARGV[1], tonumber(ARGV[3]), ARGV[6]
local had = tonumber(redis.call('HGET', KEYS[1], step .. '_tries@' .. run) or '0')
if try > had then
  redis.call('HSET', KEYS[1], step .. '_tries@' .. run, try)
  redis.call('HINCRBY', KEYS[1], step .. '_tries', try - had)
end
redis.call('HSETNX', KEYS[1], step .. '_task_started_ms', ARGV[4])
if try >= had then redis.call('HSET', KEYS[1], step .. '_try_started_ms', ARGV[4]) end
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], step .. '_task_ended_ms', ARGV[5])
  local counted = tonumber(redis.call('HGET', KEYS[1], step .. '_ended@' .. run) or '0')
  if try > counted then
    redis.call('HSET', KEYS[1], step .. '_ended@' .. run, try)
    local took = math.max(0, tonumber(ARGV[5]) - tonumber(ARGV[4]))
    redis.call('HINCRBY', KEYS[1], step .. '_task_ms', took)
  end
end
return 1
""",
)

RECORD_SETTINGS = LuaScript(
    "record_settings",
    _GEN_CHECK
    + """
-- Record a pipeline's settings with its ledger (tridentflow.steps.recorded_settings): fields
-- ``setting:<name>``, so that a reset, which deletes the ledger, forgets them with the state.
-- KEYS[1] ledger hash  KEYS[2] generation key
-- ARGV[1] generation  ARGV[2..] name, value, ... Idempotent; returns how many changed.
local gerr = gen_check(KEYS[2], ARGV[1])
if gerr then return redis.error_reply(gerr) end
local changed = 0
for i = 2, #ARGV, 2 do
  local field = 'setting:' .. ARGV[i]
  if redis.call('HGET', KEYS[1], field) ~= ARGV[i + 1] then
    redis.call('HSET', KEYS[1], field, ARGV[i + 1])
    changed = changed + 1
  end
end
return changed
""",
)

# Shared Lua helper: the check a reset and a rewind make before they start a generation -
# refused (TFBUSY) while a pending txid's owner holds a live lease. ``first``: the index in
# KEYS of the first pending txid's tx hash; ``how``: what the error suggests to force it.
_BUSY_CHECK = """
local function busy_check(first, how)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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

NEW_GENERATION = LuaScript(
    "new_generation",
    _BUSY_CHECK
    + """
-- Start a new generation of a pipeline (reset): every step of the old one is refused from
-- now on. Refused (TFBUSY) while a pending txid has an owner whose lease is live, unless forced.
-- KEYS[1] generation key  KEYS[2] ledger hash  KEYS[3..] tx hashes of the pending txids
-- ARGV[1] the new generation  ARGV[2] '1' = force
-- Returns the new generation.
if ARGV[2] ~= '1' then
  local err = busy_check(3, 'reset --force')
  if err then return redis.error_reply(err) end
end
redis.call('SET', KEYS[1], ARGV[1])
return ARGV[1]
""",
)

BEGIN_REWIND = LuaScript(
    "begin_rewind",
    _BUSY_CHECK
    + """
-- Start (or resume) a rewind of a pipeline to txid ARGV[1] (state.rewind): from this call
-- on the pipeline's generation is the rewind's own token ARGV[2] ('rewind:...'), so every
-- step of every run is refused until FINISH_REWIND hands out a fresh generation.
-- KEYS[1] generation key  KEYS[2] ledger hash  KEYS[3] undo meta hash
-- KEYS[4..] tx hashes of the pending txids
-- ARGV[1] target txid N  ARGV[2] the rewind's generation  ARGV[3] '1' = force
-- Refused (TFREWIND) if another rewind (to another txid) is under way, if N is not
-- committed, or if the undo logs do not reach back to N (``from`` - 1 <= N; N = committed is
-- always possible: it drops the pending txids); (TFBUSY) while a pending txid's owner holds
-- a live lease, unless forced. A rewind to the same N resumes (the newest caller wins: an
-- older one's writes are refused by the generation). Returns {committed, last txid}, as they
-- were when the rewind began.
local target = tonumber(ARGV[1])
local rewinding = redis.call('HGET', KEYS[3], 'rewinding')
if rewinding and tonumber(rewinding) ~= target then
  return redis.error_reply('TFREWIND a rewind to txid ' .. rewinding .. ' is under way: ' ..
    'finish it first (rewind --to ' .. rewinding .. ')')
end
if not rewinding then
  local committed = tonumber(redis.call('HGET', KEYS[2], 'committed') or '0')
  local last = tonumber(redis.call('HGET', KEYS[2], 'last_txid') or '0')
  if last < committed then last = committed end
  if target > committed then
    return redis.error_reply('TFREWIND txid ' .. target .. ' is not committed (the ' ..
      'pipeline stands at txid ' .. committed .. ')')
  end
  local from = tonumber(redis.call('HGET', KEYS[3], 'from') or '0')
  if target < committed and (from == 0 or target < from - 1) then
    local kept = from == 0 and 'no undo logs (retain_txids is 0)' or
      ('txids ' .. (from - 1) .. '..' .. committed)
    return redis.error_reply('TFREWIND txid ' .. target .. ' is outside what the undo ' ..
      'logs retain (' .. kept .. ')')
  end
  if ARGV[3] ~= '1' then
    local err = busy_check(4, 'rewind --force')
    if err then return redis.error_reply(err) end
  end
  redis.call('HSET', KEYS[3], 'rewinding', target, 'rewinding_committed', committed,
    'rewinding_last', last, 'rewinding_generation', redis.call('GET', KEYS[1]) or '')
end
redis.call('SET', KEYS[1], ARGV[2])
return {tonumber(redis.call('HGET', KEYS[3], 'rewinding_committed')),
  tonumber(redis.call('HGET', KEYS[3], 'rewinding_last'))}
""",
)

RESTORE_UNDO = LuaScript(
    "restore_undo",
    _GEN_CHECK
    + """
-- Put fields of one map state back to what one txid's undo hash recorded (a rewind), and
-- forget each entry in the same step: atomic and idempotent per field, so a rewind cut
-- short resumes where it stopped. Rewinding txids newest first leaves each field as it was
-- before the oldest rewound txid that wrote it.
-- KEYS[1] state hash  KEYS[2] undo hash of the txid  KEYS[3] generation key (of this slot)
-- ARGV[1] the rewind's generation (TFGENERATION if another rewind took over)  ARGV[2..] fields
-- An entry '' (the field did not exist) deletes the field. Returns the fields restored.
local err = gen_check(KEYS[3], ARGV[1])
if err then return redis.error_reply(err) end
local n = 0
for i = 2, #ARGV do
  local prior = redis.call('HGET', KEYS[2], ARGV[i])
  if prior then
    if prior == '' then
      redis.call('HDEL', KEYS[1], ARGV[i])
    else
      redis.call('HSET', KEYS[1], ARGV[i], prior)
    end
    redis.call('HDEL', KEYS[2], ARGV[i])
    n = n + 1
  end
end
return n
""",
)

GENERATION_HSET = LuaScript(
    "generation_hset",
    _GEN_CHECK
    + """
-- Set (or, for an empty value, delete) fields of a hash if the pipeline is in generation
-- ARGV[1] (a rewind's own writes: refused once another rewind took over).
-- KEYS[1] the hash  KEYS[2] generation key  ARGV[2..] field, value, ...  Returns the count.
local err = gen_check(KEYS[2], ARGV[1])
if err then return redis.error_reply(err) end
local n = 0
for i = 2, #ARGV, 2 do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[1], ARGV[i])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
  n = n + 1
end
return n
""",
)

FINISH_REWIND = LuaScript(
    "finish_rewind",
    _GEN_CHECK
    + """
-- Finish a rewind to txid ARGV[2], once every state is restored: the ledger stands at N
-- again (committed = last txid = N), the source offsets are those kept right after N, the
-- history forgets the rewound txids, the runs bound to them are marked 'rewound:<txid>:<N>'
-- (their next step is refused in one line; cleared, such a run binds afresh), and the
-- pipeline gets a fresh generation ARGV[3].
-- KEYS[1] generation key  KEYS[2] ledger hash  KEYS[3] undo meta hash  KEYS[4] offsets hash
-- KEYS[5] history list  KEYS[6] runs hash  KEYS[7] rewinds list (newest first)
-- KEYS[8] lineage key (set to the generation before the rewind, if not set: sinks that
-- cannot take anything back go on across a rewind, but not across a reset)
-- KEYS[9..] tx hashes of the rewound txids (deleted)
-- ARGV[1] the rewind's generation  ARGV[2] N  ARGV[3] the new generation  ARGV[4] now (ms)
-- ARGV[5..] run id, txid, ... of the runs bound to rewound txids
-- Returns the number of history entries removed.
local err = gen_check(KEYS[1], ARGV[1])
if err then return redis.error_reply(err) end
local target = tonumber(ARGV[2])
local committed = tonumber(redis.call('HGET', KEYS[3], 'rewinding_committed') or '0')
local last = tonumber(redis.call('HGET', KEYS[3], 'rewinding_last') or '0')
local before = redis.call('HGET', KEYS[3], 'rewinding_generation') or ''
local offsets = redis.call('HGET', KEYS[3], 'offsets:' .. target)
if target < committed and not offsets then
  return redis.error_reply('TFREWIND the offsets right after txid ' .. target ..
    ' are not kept: the undo logs no longer reach back to it')
end
if offsets then
  redis.call('DEL', KEYS[4])
  local flat = {}
  for p, o in pairs(cjson.decode(offsets)) do
    flat[#flat + 1] = p
    flat[#flat + 1] = tostring(o)
  end
  if #flat > 0 then redis.call('HSET', KEYS[4], unpack(flat)) end
end
redis.call('HSET', KEYS[2], 'committed', target, 'last_txid', target)
local dropped = tonumber(redis.call('HGET', KEYS[2], 'dropped_txid') or '0')
if dropped > target then redis.call('HSET', KEYS[2], 'dropped_txid', target) end
local gone = {}
for _, field in ipairs(redis.call('HKEYS', KEYS[3])) do
  local t = tonumber(string.match(field, '^offsets:(%d+)$') or '')
  if t and t > target then gone[#gone + 1] = field end
end
gone[#gone + 1] = 'rewinding'
gone[#gone + 1] = 'rewinding_committed'
gone[#gone + 1] = 'rewinding_last'
gone[#gone + 1] = 'rewinding_generation'
redis.call('HDEL', KEYS[3], unpack(gone))
local kept = {}
local removed = 0
for _, raw in ipairs(redis.call('LRANGE', KEYS[5], 0, -1)) do
  if tonumber(cjson.decode(raw)['txid']) <= target then
    kept[#kept + 1] = raw
  else
    removed = removed + 1
  end
end
redis.call('DEL', KEYS[5])
for i = 1, #kept, 1000 do
  redis.call('RPUSH', KEYS[5], unpack(kept, i, math.min(i + 999, #kept)))
end
for i = 5, #ARGV, 2 do
  redis.call('HSET', KEYS[6], ARGV[i], 'rewound:' .. ARGV[i + 1] .. ':' .. target)
end
redis.call('LPUSH', KEYS[7], cjson.encode({to = target, committed = committed,
  last = last, at_ms = tonumber(ARGV[4])}))
redis.call('LTRIM', KEYS[7], 0, 99)
if before ~= '' then redis.call('SET', KEYS[8], before, 'NX') end
for i = 9, #KEYS do redis.call('DEL', KEYS[i]) end
redis.call('SET', KEYS[1], ARGV[3])
return removed
""",
)

APPLY_NUMERIC = LuaScript(
    "apply_numeric",
    _FENCE_CHECK
    + _RECORD_UNDO
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
local writes, written, unhandled = {}, {}, {}
local undo_pairs, check, check_priors = {}, {}, {}
local nw, nu, np = 0, 0, 0
local record = ARGV[7] == '1'
local head = nontx and '[null,' or ('[' .. txid .. ',')
-- the common update - count or sum of ints, stored before this txid - in one pattern and one
-- addition: |curr|, |partial| < 10^15, so the sum is exact (< 2^53); anything else below
local fast = (op == 'count' or op == 'sum') and not nontx
local FAST = '^%[(%d+),(%-?%d+),(%-?[%dnul]+)%]$'
local INT = '^%-?%d+$'
for n = 1, #fields do
  local field, partial, raw = fields[n], partials[n], stored[n]
  local value, keep = nil, 'null'
  local t, curr, prev
  if fast and raw then t, curr, prev = match(raw, FAST) end
  if t and tonumber(t) < txid and #curr < 16 and #partial < 16 and find(partial, INT)
      and (prev == 'null' or find(prev, INT)) then
    value, keep = format('%d', tonumber(curr) + tonumber(partial)), curr
  elseif not raw then
    if plain(partial) then value = partial end
  else
    t, curr, prev = parse(raw)
    local s = t and t ~= 'null' and tonumber(t)
    if t == nil or (t ~= 'null' and not s) then
      value = nil  -- not [txid, curr, prev] as this script writes it: Python's path
    elseif not nontx and s and s > txid then
      return redis.error_reply('TFSTALE batch txid ' .. txid .. ' is behind key ' .. field ..
        ', stored at txid ' .. s .. '; refusing to overwrite')
    elseif s == txid and not nontx and not opaque then
      value = false  -- transactional: already applied by an earlier attempt of this txid
    else
      local base = curr
      keep = curr
      if opaque and s == txid then base, keep = prev, prev end
      if base == 'null' then
        if plain(partial) then value = partial end
      else
        value = combine(base, partial)
      end
    end
  end
  if value then
    writes[2 * nw + 1] = field
    writes[2 * nw + 2] = head .. value .. ',' .. (nontx and 'null' or keep) .. ']'
    nw = nw + 1
    written[nw] = field
    if record then
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


DROP_TOMBSTONES = LuaScript(
    "drop_tombstones",
    _GEN_CHECK
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


CLAIM_SHARD = LuaScript(
    "claim_shard",
    _GEN_CHECK
    + """
-- Claim one state shard for commit attempt ARGV[2] of txid ARGV[1] (called by that attempt
-- after BEGIN_COMMIT handed it the token, before it writes anything in the shard). From then
-- on the shard's fenced writes (which check the fence hash as if it were the ledger and the
-- tx hash) accept this attempt only: every older attempt of the txid, every attempt of an
-- older txid and any attempt of a txid already settled here is refused (TFFENCED).
-- KEYS[1] shard fence hash  KEYS[2] shard generation key
-- KEYS[3..] written-sets of txid-1 in this shard (deleted: left by a crash after its mark)
-- ARGV[1] txid  ARGV[2] commit token  ARGV[3] generation
-- A shard without a generation (its first claim) takes ARGV[3]; a reset sets every shard's.
-- Idempotent for the same attempt. Returns 1.
if ARGV[3] ~= '' then redis.call('SET', KEYS[2], ARGV[3], 'NX') end
local err = gen_check(KEYS[2], ARGV[3])
if err then return redis.error_reply(err) end
local txid, token = tonumber(ARGV[1]), tonumber(ARGV[2])
local held = tonumber(redis.call('HGET', KEYS[1], 'txid') or '0')
local held_token = tonumber(redis.call('HGET', KEYS[1], 'claim_token') or '0')
local settled = tonumber(redis.call('HGET', KEYS[1], 'committed') or '-1')
if held > txid or (held == txid and (held_token > token or settled >= txid)) then
  return redis.error_reply('TFFENCED commit attempt ' .. token .. ' of txid ' .. txid ..
    ' was superseded: state shard ' .. KEYS[1] .. ' is held by attempt ' .. held_token ..
    ' of txid ' .. held .. (settled >= held and ' (committed)' or ''))
end
redis.call('HSET', KEYS[1], 'txid', txid, 'claim_token', token, 'commit_token', token,
  'committed', txid - 1)
for i = 3, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
""",
)

SETTLE_SHARD = LuaScript(
    "settle_shard",
    """
-- After the ledger marked txid ARGV[1] committed: close the shard to every attempt of it
-- (its fence reads committed = txid, no token) and delete its written-sets.
-- KEYS[1] shard fence hash  KEYS[2..] written-sets of txid ARGV[1] in this shard
-- ARGV[1] txid
-- A no-op (0) unless the shard is still held for that txid (a later txid may hold it now).
local txid = tonumber(ARGV[1])
if tonumber(redis.call('HGET', KEYS[1], 'txid') or '0') ~= txid
    or tonumber(redis.call('HGET', KEYS[1], 'committed') or '-1') ~= txid - 1 then
  return 0
end
redis.call('HSET', KEYS[1], 'committed', txid, 'commit_token', '')
for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
""",
)


_BLOCK_CHECK = r"""
-- a staged block as its manifest names it, else nil and why (tridentflow_state.staged)
local function staged_block(key, sha1, lines)
  local text = redis.call('GET', key)
  if not text then
    return nil, 'TFBLOCK staged block ' .. key .. ' is missing (expired, or deleted by a' ..
      ' reset or another commit): this batch must not commit; emit it again'
  end
  local n = 0
  if #text > 0 then
    n = 1
    for _ in string.gmatch(text, '\n') do n = n + 1 end
  end
  if n ~= tonumber(lines) or redis.sha1hex(text) ~= sha1 then
    return nil, 'TFBLOCK staged block ' .. key .. ' holds ' .. n .. ' lines (manifest: ' ..
      lines .. ') or another checksum: it was torn or overwritten; emit the batch again'
  end
  return text
end
"""

VERIFY_BLOCKS = LuaScript(
    "verify_blocks",
    _BLOCK_CHECK
    + r"""
-- Check staged blocks of one slot against their manifest entries, reading nothing back.
-- KEYS[i] block  ARGV[2i-1] its SHA-1 (hex)  ARGV[2i] its line count
-- Returns #KEYS; TFBLOCK naming the first block that is missing or differs.
for i = 1, #KEYS do
  local text, err = staged_block(KEYS[i], ARGV[2 * i - 1], ARGV[2 * i])
  if not text then return redis.error_reply(err) end
end
return #KEYS
""",
)

_LINES_ARG = "string.gmatch(ARGV[6], "
assert APPLY_NUMERIC.source.count(_LINES_ARG) == 1
_FENCE_LINE = "if err then return redis.error_reply(err) end\n"

APPLY_STAGED_NUMERIC = LuaScript(
    "apply_staged_numeric",
    _BLOCK_CHECK
    + APPLY_NUMERIC.source.replace(
        _FENCE_LINE,
        _FENCE_LINE
        + r"""-- APPLY_NUMERIC over a staged block instead of ARGV[6]: KEYS[7] the block (in the
-- state's slot), ARGV[6] its SHA-1, ARGV[8] its line count (TFBLOCK if it differs: nothing
-- written). The partials never leave Redis.
local LINES, block_err = staged_block(KEYS[7], ARGV[6], ARGV[8])
if not LINES then return redis.error_reply(block_err) end
""",
        1,
    ).replace(_LINES_ARG, "string.gmatch(LINES, "),
)
