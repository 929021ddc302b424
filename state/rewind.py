"""Rewind: put a pipeline's Redis state back to exactly what it was right after txid N
committed, so the next run recomputes N+1 from N's offsets with the code deployed now.

It reads the undo logs (state.undo) and runs in three steps, each idempotent, so a rewind
cut short (a crash, a kill) is finished by running it again with the same target:

1. ``begin_rewind`` (BEGIN_REWIND, in the ledger's slot): checks the target (committed,
   within what the undo logs retain; refused while a run holds a live lease, unless forced)
   and gives the pipeline - and every state shard - the rewind's own generation
   ``rewind:<token>``. From then on every step of every run is refused (their scripts check
   the generation), and a Ledger refuses to pin it: no run starts while a rewind is under way.
2. ``restore_states``: for each rewound txid, newest first, each state in each shard, every
   field its undo hash recorded goes back to the prior value (RESTORE_UNDO: field by field,
   atomic with forgetting the entry). A pending txid's keys written without an undo entry
   (an attempt that ran with retention off) are rolled back to their ``prev``.
3. ``finish_rewind`` (FINISH_REWIND): ledger (committed = last txid = N), source offsets,
   history, the runs of the rewound txids ('rewound:<txid>:<N>') and a fresh generation in
   one script; then each shard's fence and generation, and what the rewound txids left
   (change logs, quarantine entries, written-sets, tx hashes).

A second rewind to another target is refused while one is under way; a second caller with
the same target takes over (the first one's writes are then refused by the generation).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import redis

from tridentflow_state.changes import drop_changes_after
from tridentflow_state.expiry import expiry_index
from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import StoredValue, decode_stored
from tridentflow_state.scripts import BUSY_CHECK, GEN_CHECK, LuaScript
from tridentflow_state.shards import set_shard_generations

BEGIN_REWIND = LuaScript(
    "begin_rewind",
    BUSY_CHECK
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
    GEN_CHECK
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
    GEN_CHECK
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
    GEN_CHECK
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


REWIND_PREFIX = "rewind:"
"""What a pipeline's generation starts with while a rewind is under way."""

CHUNK = 1000
"""Fields per RESTORE_UNDO call."""

Hook = Callable[[str, int], None]
"""Called at the rewind's fault points: (point, txid) - the chaos harness kills there."""


def _str(value: bytes | str) -> str:
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else value


@dataclass(frozen=True)
class RewindResult:
    """What a rewind did: the pipeline stood at ``committed`` (txids bound up to ``last``)
    and now stands at ``target``."""

    target: int
    committed: int
    last: int
    restored: int
    """Fields put back to their prior value (0 when resumed after they all were)."""
    runs: tuple[str, ...]
    """Runs that were bound to a rewound txid (their next step is refused)."""
    generation: str


def rewinding_to(client: redis.Redis, keyspace: KeySpace) -> int | None:
    """The target of the rewind under way (or cut short), None if there is none."""
    raw = client.hget(keyspace.undo_meta, "rewinding")
    return None if raw is None else int(raw)


def _shards(keyspace: KeySpace) -> list[KeySpace]:
    return [keyspace.shard(i) for i in range(keyspace.shards)]


def begin_rewind(
    client: redis.Redis, keyspace: KeySpace, target: int, force: bool = False
) -> tuple[str, int, int]:
    """Step 1 (see the module doc): (the rewind's generation, committed, last txid as they
    were when the rewind began). RewindError / PipelineBusyError, with nothing changed."""
    raw_committed, raw_last = client.hmget(keyspace.ledger, "committed", "last_txid")
    committed = int(raw_committed or 0)
    last = max(int(raw_last or 0), committed)
    pending = [keyspace.tx(n) for n in range(committed + 1, last + 1)]
    token = REWIND_PREFIX + secrets.token_hex(6)
    keys = [keyspace.generation, keyspace.ledger, keyspace.undo_meta, *pending]
    began, began_last = BEGIN_REWIND(client, keys, [int(target), token, "1" if force else "0"])
    set_shard_generations(client, keyspace, token)
    return token, int(began), int(began_last)


def _roll_back_unlogged(
    client: redis.Redis,
    space: KeySpace,
    written: str,
    state: str,
    txid: int,
    target: int,
    token: str,
) -> int:
    """Keys of pending ``txid`` written by an attempt that kept no undo entry for them: back
    to their ``prev`` (deleted if there was none). Only a pending txid can have such keys."""
    undo = space.undo(state, txid)
    fields = [_str(f) for f in client.smembers(written)]
    n = 0
    for i in range(0, len(fields), CHUNK):
        part = fields[i : i + CHUNK]
        logged = client.hmget(undo, part)
        todo = [f for f, entry in zip(part, logged, strict=True) if entry is None]
        if not todo:
            continue
        pairs: list[str] = []
        for field, raw in zip(todo, client.hmget(space.state(state), todo), strict=True):
            if raw is None:
                continue
            stored = StoredValue.from_json(decode_stored(raw, state, field), field, state)
            if stored.txid is None or stored.txid <= target:
                continue  # non-transactional (nothing to go back to), or not this txid's
            back = (
                ""
                if stored.prev is None
                else json.dumps(
                    StoredValue(target, stored.prev, stored.prev).to_json(), separators=(",", ":")
                )
            )
            pairs += [field, back]
        if pairs:
            n += int(GENERATION_HSET(client, [space.state(state), space.generation],
                                     [token, *pairs]))  # fmt: skip
    return n


def restore_states(
    client: redis.Redis,
    keyspace: KeySpace,
    states: Sequence[str],
    target: int,
    committed: int,
    last: int,
    token: str,
    hook: Hook | None = None,
) -> int:
    """Step 2: every state back to its values right after ``target`` (see the module doc).
    Returns the fields restored. GenerationError if another rewind took over."""
    restored = 0
    for txid in range(last, target, -1):
        for space in _shards(keyspace):
            for name in states:
                if txid == committed + 1:
                    written = space.written(name, txid)
                    restored += _roll_back_unlogged(
                        client, space, written, name, txid, target, token
                    )
                undo = space.undo(name, txid)
                keys = [space.state(name), undo, space.generation]
                while client.exists(undo):  # deleting while scanning: scan again till empty
                    for fields in _chunks(client.hscan_iter(undo, count=CHUNK)):
                        restored += int(RESTORE_UNDO(client, keys, [token, *fields]))
                        if hook is not None:
                            hook("mid-rewind", txid)
                client.delete(undo)
    return restored


def _chunks(entries: Iterable[tuple[bytes, bytes]]) -> Iterator[list[str]]:
    """The fields of a hash scan, CHUNK at a time."""
    chunk: list[str] = []
    for field, _value in entries:
        chunk.append(_str(field))
        if len(chunk) >= CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _runs_of(client: redis.Redis, keyspace: KeySpace, target: int, last: int) -> list[str]:
    """run id, txid, ... of every run bound to a txid in ``target + 1 .. last``."""
    flat: list[str] = []
    for raw_run, raw in client.hscan_iter(keyspace.runs, count=1000):
        value = _str(raw)
        if value.isdigit() and target < int(value) <= last:
            flat += [_str(raw_run), value]
    return flat


def finish_rewind(
    client: redis.Redis,
    keyspace: KeySpace,
    states: Iterable[str],
    target: int,
    committed: int,
    last: int,
    token: str,
) -> tuple[str, tuple[str, ...]]:
    """Step 3: (the new generation, the runs marked rewound). See the module doc."""
    names = list(states)
    runs = _runs_of(client, keyspace, target, last)
    generation = secrets.token_hex(6)
    keys = [
        keyspace.generation,
        keyspace.ledger,
        keyspace.undo_meta,
        keyspace.offsets,
        keyspace.history,
        keyspace.runs,
        keyspace.rewinds,
        keyspace.lineage,
        *(keyspace.tx(n) for n in range(target + 1, last + 1)),
    ]
    now_ms = int(time.time() * 1000)
    FINISH_REWIND(client, keys, [token, int(target), generation, now_ms, *runs])
    for space in _shards(keyspace) if keyspace.sharded else []:
        fence = space.fence
        dropped = int(client.hget(fence, "dropped_txid") or 0)
        client.hset(
            fence,
            mapping={
                "txid": target,
                "committed": target,
                "claim_token": 0,
                "commit_token": "",
                "dropped_txid": min(dropped, target),
            },
        )
    set_shard_generations(client, keyspace, generation)
    _clear_after(client, keyspace, names, target, last)
    return generation, tuple(runs[0::2])


def _clear_after(
    client: redis.Redis, keyspace: KeySpace, states: Sequence[str], target: int, last: int
) -> None:
    """What the rewound txids left besides the state: change logs, quarantined records
    (their records are read again), written-sets. Idempotent."""
    for name in states:
        drop_changes_after(client, keyspace, name, target, last)
    doomed: list[str] = []
    for txid in range(target + 1, last + 1):
        doomed.append(keyspace.quarantine_written(txid))
        for space in _shards(keyspace):
            doomed += [space.written(name, txid) for name in states]
    for i in range(0, len(doomed), 500):
        client.delete(*doomed[i : i + 500])
    stale = [
        field
        for field, raw in client.hscan_iter(keyspace.quarantine, count=1000)
        if int(json.loads(raw).get("txid") or 0) > target
    ]
    for i in range(0, len(stale), 500):
        client.hdel(keyspace.quarantine, *stale[i : i + 500])


def rewind(
    client: redis.Redis,
    keyspace: KeySpace,
    states: Sequence[str],
    target: int,
    force: bool = False,
    hook: Hook | None = None,
    expiring: Sequence[str] = (),
) -> RewindResult:
    """Rewind the pipeline to ``target`` (the three steps; see the module doc), the expiry
    indexes of the ``expiring`` states made again from the restored values before any commit
    may follow. Run it again with the same target to finish one that was cut short."""
    token, committed, last = begin_rewind(client, keyspace, target, force)
    if hook is not None:
        hook("after-begin-rewind", target)
    restored = restore_states(client, keyspace, states, target, committed, last, token, hook)
    for name in expiring:  # stamps went back; expired keys came back
        expiry_index(client, keyspace, name).rebuild()
    generation, runs = finish_rewind(client, keyspace, states, target, committed, last, token)
    return RewindResult(target, committed, last, restored, runs, generation)


__all__ = [
    "REWIND_PREFIX",
    "RewindResult",
    "begin_rewind",
    "finish_rewind",
    "restore_states",
    "rewind",
    "rewinding_to",
]
