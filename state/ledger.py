"""The per-pipeline txid ledger in Redis.

What it records, and the contract of each operation:

* run id -> txid (``bind_run``): assigned once, atomically; the same run id gets the same txid on
  every retry while it owns it. A txid whose owner stopped (released, or lease expired) is
  adopted by the next run, so a new run never skips an unfinished txid.
* per-txid batch metadata (``store_metadata``): the first writer wins; later calls get the stored
  copy. Metadata must survive a JSON round trip (Storm's STORM-2675).
* per-txid attempt counters (``next_attempt``) for each step, and the newest complete emit
  attempt (``record_staged``).
* the last committed txid and committed source offsets, moved together by ``mark_committed``
  only after every key of the txid was written; ``begin_commit`` hands out fencing tokens and
  refuses txid N unless the ledger stands at N-1.
* the pipeline's generation: a ``Ledger`` pins the generation current when it is first used,
  and every write it makes (every script, every fenced state write) is refused with
  GenerationError once a ``reset`` (or a Redis that lost its data) replaced it. ``reset``
  refuses while a run holds a live lease on a pending txid, unless forced.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any

import redis

from tridentflow_state.changes import start_allowing
from tridentflow_state.errors import (
    CommitsHeldError,
    GenerationError,
    MetadataError,
    RetryError,
    StateError,
)
from tridentflow_state.keys import KeySpace
from tridentflow_state.replication import wait_for_replicas
from tridentflow_state.rewind import REWIND_PREFIX
from tridentflow_state.scripts import (
    BUSY_CHECK,
    COMMITTED_TXID,
    FENCE_CHECK,
    GEN_CHECK,
    NOW_MS,
    LuaScript,
)
from tridentflow_state.shards import set_shard_generations

BIND_RUN = LuaScript(
    "bind_run",
    GEN_CHECK
    + NOW_MS
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
local now = now_ms()
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
    GEN_CHECK
    + NOW_MS
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
local now = now_ms()
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
    GEN_CHECK
    + NOW_MS
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
    FENCE_CHECK
    + NOW_MS
    + """
-- Mark a txid committed, with the source offsets it advanced to. Call only after every key of
-- the txid is written. Atomic: the committed txid and the offsets move together.
-- KEYS[1] ledger hash  KEYS[2] tx hash  KEYS[3] offsets hash  KEYS[4] generation key
-- KEYS[5] tx hash of txid-2 (deleted: RECORD_HISTORY has had two chances at it)
-- KEYS[6] undo meta hash (tridentflow_state.undo)  KEYS[7..] deleted: written-sets of this txid,
-- the quarantine's, and the expiry-built marks of states that do not expire now
-- ARGV[1] txid  ARGV[2] commit token  ARGV[3] generation  ARGV[4] stats JSON (an object)
-- ARGV[5] undo logs retained (0: off)  ARGV[6..] partition, offset, ...
-- With ARGV[5] = R > 0 the offsets right after the txid are kept (``offsets:<txid>``) and
-- ``from`` (the oldest txid whose undo logs are complete) moves to txid - R + 1 at most; the
-- first txid so marked is not trusted (an earlier attempt may have written without undo):
-- ``from`` starts at txid + 1. With R = 0, ``from`` goes (the undo chain is broken).
-- The tx hash keeps the stats, the marking token and the time: RECORD_HISTORY builds the
-- history entry from them. Returns 1 when marked, 0 if already committed (no-op).
local err = gen_check(KEYS[4], ARGV[3])
if err then return redis.error_reply(err) end
local txid = tonumber(ARGV[1])
local committed = tonumber(redis.call('HGET', KEYS[1], 'committed') or '0')
if committed >= txid then return 0 end
err = fence_check(KEYS[1], KEYS[2], txid, ARGV[2])
if err then return redis.error_reply(err) end
local now = now_ms()
redis.call('HSET', KEYS[1], 'committed', txid)
for i = 6, #ARGV, 2 do redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1]) end
local retain = tonumber(ARGV[5])
if retain > 0 then
  local from = tonumber(redis.call('HGET', KEYS[6], 'from') or '0')
  if from == 0 then
    from = txid + 1
    redis.call('HSETNX', KEYS[6], 'purged', txid)
  end
  if txid - retain + 1 > from then from = txid - retain + 1 end
  local after = {}
  local flat = redis.call('HGETALL', KEYS[3])
  for i = 1, #flat, 2 do after[flat[i]] = flat[i + 1] end  -- strings: exact
  redis.call('HSET', KEYS[6], 'from', from, 'offsets:' .. txid, cjson.encode(after))
else
  redis.call('HDEL', KEYS[6], 'from')
end
redis.call('HSET', KEYS[2], 'status', 'committed', 'stats', ARGV[4],
  'committed_at', math.floor(now / 1000), 'committed_ms', now, 'marked_by', ARGV[2])
redis.call('DEL', KEYS[5])
for i = 7, #KEYS do redis.call('DEL', KEYS[i]) end
return 1
""",
)

RECORD_HISTORY = LuaScript(
    "record_history",
    """
-- Record the history entries of txid-1 and txid (in that order: newest first), each once,
-- from their tx hashes, then delete txid-1's. Idempotent: the attempt that marked calls it,
-- a retry answered ``already-committed`` calls it again, and the next txid's call catches up
-- an entry a crash right after the mark left out (only two crashes in a row, neither retried,
-- lose one: MARK_COMMITTED of txid+1 deletes txid-1's tx hash).
-- KEYS[1] tx hash of txid-1  KEYS[2] tx hash of txid  KEYS[3] history list (newest first)
-- ARGV[1] txid  ARGV[2] history length
-- An entry is the stats with the txid, the owning run, every step's attempts and start/end
-- times (ms) - and, under an orchestrator, its task's tries, start/end and summed durations
-- (RECORD_TASK) - and the commit time: what a cleared Airflow task's deleted XCom no longer
-- shows. Returns the entries recorded now.
local function entry_of(tx, txid)
  local now = tonumber(redis.call('HGET', tx, 'committed_ms'))
  local entry = cjson.decode(redis.call('HGET', tx, 'stats') or '{}')
  entry['txid'] = txid
  entry['run_id'] = redis.call('HGET', tx, 'owner') or cjson.null
  local steps = {}
  for _, step in ipairs({'coordinate', 'emit', 'commit'}) do
    local started = redis.call('HGET', tx, step .. '_started_ms')
    local ended = redis.call('HGET', tx, step .. '_ended_ms')
    if step == 'commit' then ended = now end
    local tries = redis.call('HGET', tx, step .. '_tries')
    local task_started = redis.call('HGET', tx, step .. '_task_started_ms')
    local task_ended = redis.call('HGET', tx, step .. '_task_ended_ms')
    local task_ms = redis.call('HGET', tx, step .. '_task_ms')
    if step == 'commit' and task_started then
      -- the try that marked this commit was running: its time until the mark counts
      local try_started = tonumber(redis.call('HGET', tx, 'commit_try_started_ms') or '0')
      if try_started > 0 and try_started > tonumber(task_ended or '0') then
        task_ms = tonumber(task_ms or '0') + math.max(0, now - try_started)
      end
      task_ended = now
    end
    steps[step] = {
      attempts = tonumber(redis.call('HGET', tx, step .. '_attempts') or '0'),
      started_ms = started and tonumber(started) or cjson.null,
      ended_ms = ended and tonumber(ended) or cjson.null,
      tries = tries and tonumber(tries) or cjson.null,
      task_started_ms = task_started and tonumber(task_started) or cjson.null,
      task_ended_ms = task_ended and tonumber(task_ended) or cjson.null,
      task_ms = task_ms and tonumber(task_ms) or cjson.null,
    }
  end
  steps['commit']['attempts'] = tonumber(redis.call('HGET', tx, 'marked_by'))
  entry['steps'] = steps
  entry['committed_ms'] = now
  return entry
end
local txid = tonumber(ARGV[1])
local recorded = 0
for i = 1, 2 do
  local tx = KEYS[i]
  if redis.call('HGET', tx, 'status') == 'committed' and redis.call('HGET', tx, 'committed_ms')
      and not redis.call('HGET', tx, 'in_history') then
    redis.call('LPUSH', KEYS[3], cjson.encode(entry_of(tx, txid - 2 + i)))
    redis.call('HSET', tx, 'in_history', 1)
    recorded = recorded + 1
  end
end
if recorded > 0 then redis.call('LTRIM', KEYS[3], 0, tonumber(ARGV[2]) - 1) end
redis.call('DEL', KEYS[1])
return recorded
""",
)

RECORD_STAGED = LuaScript(
    "record_staged",
    GEN_CHECK
    + COMMITTED_TXID
    + NOW_MS
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
    GEN_CHECK
    + NOW_MS
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
local now = now_ms()
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
    GEN_CHECK
    + COMMITTED_TXID
    + NOW_MS
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
    GEN_CHECK
    + COMMITTED_TXID
    + NOW_MS
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
    GEN_CHECK
    + COMMITTED_TXID
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
    GEN_CHECK
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

NEW_GENERATION = LuaScript(
    "new_generation",
    BUSY_CHECK
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


DEFAULT_LEASE_MS = 15 * 60 * 1000
HISTORY_LENGTH = 1000
"""Commits kept in the ledger's history (newest first)."""


@dataclass(frozen=True)
class Binding:
    """The txid a run is bound to. ``how``: committed | bound | adopted | new."""

    txid: int
    how: str
    committed: int

    @property
    def already_committed(self) -> bool:
        return self.txid <= self.committed


@dataclass(frozen=True)
class CommitTicket:
    """A commit attempt: ``token`` fences out older attempts of the same txid, ``generation``
    any attempt started before a reset."""

    txid: int
    token: int
    generation: str = ""


def _s(value: bytes | str | None) -> str | None:
    if value is None:
        return None
    return value.decode() if isinstance(value, bytes) else value


def check_json_round_trip(what: str, value: Any) -> str:
    """Encode ``value`` as JSON and refuse it unless it decodes back to an equal value."""
    try:
        encoded = json.dumps(value, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise MetadataError(f"{what} is not JSON-serialisable: {exc}") from exc
    if json.loads(encoded) != value:
        raise MetadataError(
            f"{what} does not survive a JSON round trip (tuples, non-string dict keys?): {value!r}"
        )
    return encoded


def _new_generation() -> str:
    return secrets.token_hex(6)


class Ledger:
    def __init__(
        self,
        client: redis.Redis,
        pipeline: str,
        generation: str | None = None,
        namespace: str = "",
        shards: int = 1,
        reset_shards: int | None = None,
        layout: int = 0,
    ) -> None:
        """``shards`` and ``layout``: the state shards the pipeline's state is stored in;
        ``reset_shards``: the count it is laid out in after a ``reset`` (default: the same;
        its layout 0)."""
        self.client = client
        self.keys = KeySpace(pipeline, namespace, shards=shards, layout=layout)
        self.reset_shards = reset_shards or shards
        self.pipeline = pipeline
        self._generation = generation

    @property
    def generation(self) -> str:
        """The generation this ledger works in: pinned on first use (created if the pipeline
        has none yet). Every write is refused once the pipeline's generation differs."""
        if self._generation is None:
            key = self.keys.generation
            if self.client.set(key, _new_generation(), nx=True):  # a new pipeline
                start_allowing(self.client, self.keys)
            current = _s(self.client.get(key)) or ""
            if current.startswith(REWIND_PREFIX):
                raise GenerationError(self._rewinding_message())
            self._generation = current
        return self._generation

    def _rewinding_message(self) -> str:
        target = _s(self.client.hget(self.keys.undo_meta, "rewinding")) or "?"
        return (
            f"pipeline {self.pipeline} is being rewound to txid {target}: no step runs until "
            f"the rewind is done (if it was cut short, finish it: tridentflow rewind "
            f"{self.pipeline} --to {target})"
        )

    def lineage(self) -> str:
        """The generation this pipeline's lineage began with (state.keys.KeySpace.lineage):
        a reset changes it, a rewind does not."""
        return _s(self.client.get(self.keys.lineage)) or self.generation

    def current_generation(self) -> str | None:
        """The pipeline's generation in Redis now (None if it has none)."""
        return _s(self.client.get(self.keys.generation))

    def check_generation(self) -> None:
        """GenerationError if the pipeline was reset (or rewound) since this ledger pinned its
        generation, or is being rewound now.
        A step calls it first, for a clear error; the scripts check again, atomically."""
        pinned, current = self.generation, self.current_generation()
        if current is not None and current.startswith(REWIND_PREFIX):
            raise GenerationError(self._rewinding_message())
        if current != pinned:
            now = f"generation {current}" if current else "no generation: Redis lost its data?"
            raise GenerationError(
                f"this step belongs to generation {pinned} of pipeline {self.pipeline}, which "
                f"was reset or rewound since ({now}); it must not touch the new pipeline: start "
                "a new run"
            )

    # -- reads ------------------------------------------------------------------------------
    def committed_txid(self) -> int:
        return int(self.client.hget(self.keys.ledger, "committed") or 0)

    def last_txid(self) -> int:
        return max(int(self.client.hget(self.keys.ledger, "last_txid") or 0), self.committed_txid())

    def committed_offsets(self) -> dict[int, int]:
        raw = self.client.hgetall(self.keys.offsets)
        return {int(k): int(v) for k, v in raw.items()}

    def base_offsets(self) -> dict[int, int]:
        """Where this generation started reading, per partition (0 where not recorded)."""
        raw = self.client.hgetall(self.keys.base_offsets)
        return {int(k): int(v) for k, v in raw.items()}

    def start_at(self, offsets: Mapping[int, int]) -> None:
        """A fresh generation (right after ``reset``) starts reading at ``offsets``: they are
        its committed offsets and its base offsets. Only before anything is committed."""
        if not offsets:
            return
        if self.committed_txid() != 0:
            raise StateError(f"pipeline {self.pipeline} has committed txids: reset it first")
        mapping = {int(p): int(o) for p, o in offsets.items()}
        self.client.hset(self.keys.offsets, mapping=mapping)
        self.client.hset(self.keys.base_offsets, mapping=mapping)

    def tx_info(self, txid: int) -> dict[str, str]:
        raw = self.client.hgetall(self.keys.tx(txid))
        return {_s(k): _s(v) for k, v in raw.items()}  # type: ignore[misc]

    def txid_of_run(self, run_id: str) -> int | None:
        """The txid ``run_id`` is bound to; None if none, or if another run adopted it."""
        raw = _s(self.client.hget(self.keys.runs, run_id))
        return None if raw is None or not raw.isdigit() else int(raw)

    def rewound_txid(self, run_id: str) -> tuple[int, int] | None:
        """(txid, the txid the pipeline was rewound to) if ``run_id`` was bound to a txid a
        rewind took back (tridentflow_state.rewind)."""
        raw = _s(self.client.hget(self.keys.runs, run_id))
        if raw is None or not raw.startswith("rewound:"):
            return None
        _rewound, txid, target = raw.split(":", 2)
        return int(txid), int(target)

    def rewinds(self, limit: int = 20) -> list[dict[str, Any]]:
        """The last rewinds, newest first: {to, committed, last, at_ms}."""
        return [json.loads(r) for r in self.client.lrange(self.keys.rewinds, 0, limit - 1)]

    def runs_of_txid(self, txid: int) -> dict[str, str | None]:
        """Every run bound to ``txid`` that the ledger remembers: run id -> None for the run
        bound to it now, or the run that adopted it from this one. Read-only; scans the runs
        hash (one entry per run bound since the last reset)."""
        found: dict[str, str | None] = {}
        for raw_run, raw in self.client.hscan_iter(self.keys.runs, count=1000):
            run_id, value = _s(raw_run), _s(raw)
            if value == str(txid):
                found[run_id] = None
            elif value.startswith(f"lost:{txid}:"):
                found[run_id] = value.split(":", 2)[2]
        return found

    def runs_by_txid(self) -> dict[int, list[str]]:
        """txid -> every run bound to it that the ledger remembers (the runs it was adopted
        from included), sorted; one scan of the runs hash. Read-only."""
        found: dict[int, list[str]] = {}
        for raw_run, raw in self.client.hscan_iter(self.keys.runs, count=1000):
            run_id, value = _s(raw_run), _s(raw)
            txid = value.split(":", 2)[1] if value.startswith("lost:") else value
            if txid.isdigit():
                found.setdefault(int(txid), []).append(run_id)
        return {txid: sorted(runs) for txid, runs in found.items()}

    def lost_txid(self, run_id: str) -> tuple[int, str] | None:
        """(txid, adopting run) if another run adopted the txid ``run_id`` was bound to."""
        raw = _s(self.client.hget(self.keys.runs, run_id))
        if raw is None or not raw.startswith("lost:"):
            return None
        _lost, txid, adopter = raw.split(":", 2)
        return int(txid), adopter

    # -- runs -------------------------------------------------------------------------------
    def bind_run(
        self, run_id: str, lease_ms: int = DEFAULT_LEASE_MS, adopt_live: bool = False
    ) -> Binding:
        """Bind ``run_id`` to a txid (see module doc). Atomic; idempotent per run id."""
        if not run_id:
            raise ValueError("run id must be a non-empty string")
        generation = self.generation
        while True:
            raw_committed, raw_last = self.client.hmget(self.keys.ledger, "committed", "last_txid")
            committed = int(raw_committed or 0)
            last = max(int(raw_last or 0), committed)
            keys = [self.keys.ledger, self.keys.runs, self.keys.generation]
            keys += [self.keys.tx(n) for n in range(committed + 1, last + 2)]
            args = [run_id, int(lease_ms), "1" if adopt_live else "0", generation]
            try:
                txid, how, committed = BIND_RUN(self.client, keys, [*args, committed, last])
            except RetryError:
                continue  # another run committed or bound meanwhile
            return Binding(int(txid), _s(how) or "", int(committed))

    def claim(self, txid: int, run_id: str, lease_ms: int = DEFAULT_LEASE_MS) -> Binding:
        """Bind ``run_id`` to this exact ``txid`` (pending, or the next new one). Atomic."""
        got, how = CLAIM_TXID(
            self.client,
            [self.keys.ledger, self.keys.runs, self.keys.tx(txid), self.keys.generation],
            [int(txid), run_id, int(lease_ms), self.generation],
        )
        return Binding(int(got), _s(how) or "", self.committed_txid())

    def renew_lease(self, txid: int, run_id: str, lease_ms: int = DEFAULT_LEASE_MS) -> bool:
        keys = [self.keys.tx(txid), self.keys.generation]
        return bool(RENEW_LEASE(self.client, keys, [run_id, int(lease_ms), self.generation]))

    def release(self, txid: int, run_id: str) -> bool:
        """Give up ``run_id``'s claim on ``txid`` so the next run adopts it at once."""
        keys = [self.keys.tx(txid), self.keys.generation]
        return bool(RENEW_LEASE(self.client, keys, [run_id, 0, self.generation]))

    # -- metadata and attempts ----------------------------------------------------------------
    def store_metadata(self, txid: int, meta: Mapping[str, Any]) -> dict[str, Any] | None:
        """Store ``meta`` for ``txid`` unless some is stored already; return what is stored
        (None: the txid was committed meanwhile and its metadata is gone - nothing written)."""
        encoded = check_json_round_trip(f"metadata of txid {txid}", dict(meta))
        keys = [self.keys.tx(txid), self.keys.generation, self.keys.ledger]
        STORE_METADATA(self.client, keys, [encoded, self.generation, int(txid)])
        return self.metadata(txid)

    def metadata(self, txid: int) -> dict[str, Any] | None:
        raw = self.client.hget(self.keys.tx(txid), "meta")
        if raw is None:
            return None
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise MetadataError(f"metadata of txid {txid} is not JSON: {raw!r}") from exc
        if not isinstance(value, dict):
            raise MetadataError(f"metadata of txid {txid} is not an object: {value!r}")
        return value

    def next_attempt(self, txid: int, step: str) -> int:
        """Count one more attempt of ``step`` (coordinate/emit/...) for ``txid``; return it -
        0 for a committed txid (nothing counted: its tx hash is never recreated)."""
        keys = [self.keys.tx(txid), self.keys.generation, self.keys.ledger]
        return int(COUNT_ATTEMPT(self.client, keys, [step, self.generation, int(txid)]))

    def record_task(
        self,
        txid: int,
        step: str,
        try_number: int,
        started_ms: int,
        ended_ms: int | None = None,
        run_id: str = "",
    ) -> None:
        """What the orchestrator knows of ``step``'s task for ``txid`` (RECORD_TASK): try
        ``try_number`` of run ``run_id`` started at ``started_ms`` (and ended at ``ended_ms``).
        Tries are summed over runs, durations over tries. Idempotent per (run, try)."""
        keys = [self.keys.tx(txid), self.keys.generation, self.keys.ledger]
        args = [step, self.generation, int(try_number), int(started_ms)]
        ended = "" if ended_ms is None else int(ended_ms)
        RECORD_TASK(self.client, keys, [*args, ended, run_id, int(txid)])

    def settings(self) -> dict[str, str]:
        """The pipeline's recorded settings (RECORD_SETTINGS): name -> value. Read-only."""
        raw = self.client.hgetall(self.keys.ledger)
        prefix = "setting:"
        return {_s(k)[len(prefix) :]: _s(v) for k, v in raw.items() if _s(k).startswith(prefix)}

    def record_settings(self, values: Mapping[str, str]) -> int:
        """Record ``values`` as the pipeline's settings (fenced by the generation: a step of
        a reset pipeline records nothing). Idempotent; returns how many changed."""
        flat = [item for pair in sorted(values.items()) for item in pair]
        keys = [self.keys.ledger, self.keys.generation]
        return int(RECORD_SETTINGS(self.client, keys, [self.generation, *flat]))

    def attempts(self, txid: int, step: str) -> int:
        return int(self.client.hget(self.keys.tx(txid), f"{step}_attempts") or 0)

    def record_staged(self, txid: int, attempt: int) -> int:
        """Record that emit ``attempt`` of ``txid`` staged complete output; the newest attempt
        wins (a zombie's older attempt finishing late is ignored). Returns the recorded one,
        0 if ``txid`` is committed (nothing recorded: no commit will read the attempt)."""
        keys = [self.keys.tx(txid), self.keys.generation, self.keys.ledger]
        args = [int(attempt), self.generation, int(txid)]
        return int(RECORD_STAGED(self.client, keys, args))

    def staged_attempt(self, txid: int) -> int | None:
        raw = self.client.hget(self.keys.tx(txid), "staged_attempt")
        return None if raw is None else int(raw)

    # -- commit -----------------------------------------------------------------------------
    def begin_commit(self, txid: int) -> CommitTicket | None:
        """New fencing token for a commit of ``txid``; None if it is already committed.

        Raises CommitOrderError unless the ledger stands at txid-1. While a starved reader
        holds commits back (a few ms to seconds, expiring by itself), waits for it.
        """
        generation = self.generation
        keys = [self.keys.ledger, self.keys.tx(txid), self.keys.generation]
        keys += [self.keys.read_hold, self.keys.commit_waiting]
        while True:
            try:
                token, _committed = BEGIN_COMMIT(self.client, keys, [txid, generation])
                break
            except CommitsHeldError as held:
                time.sleep(min(max(held.ms, 1), 5) / 1000)
        token = int(token)
        return None if token == 0 else CommitTicket(txid, token, generation)

    def mark_committed(
        self,
        ticket: CommitTicket,
        offsets: Mapping[int, int],
        state_names: Iterable[str],
        stats: Mapping[str, Any] | None = None,
        retain_txids: int = 0,
        unbuilt: Iterable[str] = (),
    ) -> bool:
        """Atomically set committed=txid and the new offsets. False if already committed.
        With ``retain_txids`` > 0, the undo logs' retained range moves with it (state.undo).
        The states in ``unbuilt`` lose their expiry index's built mark (they do not expire
        now: their index stops following; tridentflow_state.expiry).

        Raises FencedError if ``ticket`` was superseded, CommitOrderError if out of order.
        """
        txid = ticket.txid
        keys = [self.keys.ledger, self.keys.tx(txid), self.keys.offsets, self.keys.generation]
        keys += [self.keys.tx(txid - 2), self.keys.undo_meta]
        if not self.keys.sharded:  # a shard's written-sets go when it settles
            keys += [self.keys.written(name, txid) for name in state_names]
        keys.append(self.keys.quarantine_written(txid))
        keys += [self.keys.expiry_built(name) for name in unbuilt]
        stats_json = json.dumps(dict(stats or {}), sort_keys=True)
        args: list[Any] = [txid, ticket.token, ticket.generation, stats_json]
        args.append(max(0, int(retain_txids)))
        for partition, offset in sorted(offsets.items()):
            args += [int(partition), int(offset)]
        return bool(MARK_COMMITTED(self.client, keys, args))

    def record_history(self, txid: int) -> int:
        """Add the history entries of committed ``txid`` - and of txid-1 if a crash right after
        its mark left it out - each once. Idempotent; the entries recorded now."""
        keys = [self.keys.tx(txid - 1), self.keys.tx(txid), self.keys.history]
        return int(RECORD_HISTORY(self.client, keys, [txid, HISTORY_LENGTH]))

    def wait_replicated(self, replicas: int, timeout_ms: int) -> int:
        """Block until at least ``replicas`` replicas of the master holding this pipeline's
        ledger have everything it executed so far (the commit mark included), or
        ``timeout_ms`` passes; the number that acknowledged (tridentflow_state.replication)."""
        return wait_for_replicas(self.client, self.keys.ledger, replicas, timeout_ms)

    # -- maintenance ------------------------------------------------------------------------
    def quarantined(self) -> int:
        return int(self.client.hlen(self.keys.quarantine))

    def history(self, limit: int = 20, start: int = 0) -> list[dict[str, Any]]:
        """The last commits, newest first: txid, run, records, keys, rolled back, quarantined,
        skipped partitions, attempts and start/end times (ms) of each step. Kept in Redis, so
        clearing an Airflow task (which deletes its XCom) never loses what was committed."""
        raw = self.client.lrange(self.keys.history, start, start + max(0, limit) - 1)
        entries = [json.loads(entry) for entry in raw]
        for entry in entries:  # Lua's cjson writes an empty list as {}
            entry["skipped"] = list(entry.get("skipped") or [])
        return entries

    def pending_txids(self) -> list[int]:
        return list(range(self.committed_txid() + 1, self.last_txid() + 1))

    def reset(self, force: bool = False) -> int:
        """Start a new generation and delete every other key of this pipeline (ledger and
        states). Returns the number deleted.

        The new generation is set first, atomically with the check that no run holds a live
        lease on a pending txid (PipelineBusyError unless ``force``): from that moment every
        step of a run still in flight is refused (GenerationError), so none of it can land in
        the fresh pipeline. This ledger moves to the new generation."""
        committed = self.committed_txid()
        pending = [self.keys.tx(n) for n in range(committed + 1, self.last_txid() + 1)]
        generation = _new_generation()
        NEW_GENERATION(
            self.client,
            [self.keys.generation, self.keys.ledger, *pending],
            [generation, "1" if force else "0"],
        )
        self._generation = generation
        self.keys = replace(self.keys, shards=self.reset_shards, layout=0)
        set_shard_generations(self.client, self.keys, generation)
        keep = {self.keys.generation}
        keep.update(self.keys.shard(i).generation for i in range(self.keys.shards))
        keep.update([k.encode() for k in keep])
        n = 0
        batch: list[bytes] = []
        scans = chain(
            self.client.scan_iter(match=self.keys.pattern, count=1000),
            self.client.scan_iter(match=self.keys.shard_pattern, count=1000),
        )
        for key in scans:
            if key in keep:
                continue
            batch.append(key)
            if len(batch) >= 500:
                n += int(self.client.delete(*batch))
                batch = []
        if batch:
            n += int(self.client.delete(*batch))
        start_allowing(self.client, self.keys)
        return n
