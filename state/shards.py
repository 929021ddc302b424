"""State shards: one pipeline's map states spread over many Redis Cluster slots.

With ``KeySpace.shards`` = N > 1, every map state is split into N hashes by the CRC-32 of
the encoded key (``KeySpace.shard_index``), each under its own hash tag (``KeySpace.shard``).
The ledger stays in the pipeline's own slot and its mark is still the commit point; what
changes is how writes are fenced, since a Lua script cannot read keys of another slot:

1. ``BEGIN_COMMIT`` in the ledger hands the attempt its token (ordering checked there).
2. ``claim_shards``: the attempt claims every shard (``CLAIM_SHARD``: refused if a newer
   attempt of the txid, or a later txid, holds it), which writes the txid's ``committed``
   predecessor and the token into the shard's fence hash. From then on, in that shard, the
   unchanged fenced scripts (FENCED_HSET, APPLY_NUMERIC, DROP_TOMBSTONES) check the fence hash
   as they would the ledger: a superseded attempt is refused on each shard before the newer
   one writes there. A reset is caught the same way (each shard keeps a copy of the
   generation, set by its first claim and by every reset).
3. Every shard's writes, in parallel if the caller likes (each shard is a slot of its own).
4. ``MARK_COMMITTED`` in the ledger, last and atomic, as without shards.
5. ``settle_shards``: each shard closed to the txid and its written-sets deleted (best effort:
   the next txid's claim deletes what a crash left).

A reader gets a consistent view without a cross-slot snapshot (``query_state``, sharded or
not): values carry ``[txid, curr, prev]``, and each slot's snapshot says what it knew of the
commits, so snapshots taken at different moments resolve to one committed txid C unless a
key was written twice in between; a reader that keeps missing holds the next commits back
for a moment (HOLD_COMMITS) rather than retry forever.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from functools import partial
from itertools import chain
from typing import Any, TypeVar

import redis

from tridentflow_state.backing import Fence
from tridentflow_state.errors import (
    LayoutMovedError,
    ReshardUnderWayError,
    RewindingError,
    StateError,
)
from tridentflow_state.expiry import ShardedExpiryIndex
from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import StoredValue, decode_stored
from tridentflow_state.redis_backing import CHUNK, RedisBackingMap
from tridentflow_state.scripts import GEN_CHECK, LuaScript

QUERY_SNAPSHOT = LuaScript(
    "query_snapshot",
    """
-- Read fields of a map state together with what its slot knows of the commits, as one
-- atomic snapshot (state.shards.query_state combines such snapshots into one committed view).
-- KEYS[1] the slot's ledger hash (the pipeline's ledger, or a state shard's fence)
-- KEYS[2] state hash   KEYS[3] the slot's generation key   ARGV fields (at least one)
-- Returns {committed txid, newest txid whose tombstones were dropped, layout, value1, ...}
-- (a missing field is nil). ``committed`` is the ledger's, or for a shard the txid its fence
-- is closed to (the txid holding it, minus one, until it settles). ``layout``: the shard
-- layout the slot's values belong to (state.reshard: another one once a reshard moved them).
-- Refused (TFREWINDING) while a rewind is under way (state.rewind): the values are going
-- back txid by txid while the ledger still names the txid they leave.
local generation = redis.call('GET', KEYS[3])
if generation and string.sub(generation, 1, 7) == 'rewind:' then
  return redis.error_reply('TFREWINDING the pipeline is being rewound: its state is the' ..
    ' state of no committed txid until the rewind finishes (run the rewind again if it was' ..
    ' cut short); read again then')
end
local head = redis.call('HMGET', KEYS[1], 'committed', 'dropped_txid', 'state_layout')
local out = {tonumber(head[1] or '0'), tonumber(head[2] or '0'), tonumber(head[3] or '0')}
local values = redis.call('HMGET', KEYS[2], unpack(ARGV))
for i = 1, #ARGV do out[i + 3] = values[i] end
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


CLAIM_SHARD = LuaScript(
    "claim_shard",
    GEN_CHECK
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


SHARDS_FIELD = "state_shards"
"""Ledger field recording the pipeline's shard count (absent: 1, or nothing committed yet)."""
LAYOUT_FIELD = "state_layout"
"""Ledger field: the layout number of the shards' hash tags (KeySpace.layout; absent: 0)."""
RESHARD_FIELD = "resharding"
"""Ledger field, JSON, while ``tridentflow reshard`` moves the state (state.reshard)."""

T = TypeVar("T")


def split_by_shard(
    keyspace: KeySpace, items: Sequence[T], key: Callable[[T], str]
) -> list[list[T]]:
    """``items`` grouped by the shard of ``key(item)``, in their order within each group."""
    groups: list[list[T]] = [[] for _ in range(keyspace.shards)]
    if not keyspace.sharded:
        groups[0] = list(items)
        return groups
    index = keyspace.shard_index
    for item in items:
        groups[index(key(item))].append(item)
    return groups


class ShardedRedisBackingMap:
    """BackingMap over the N shard hashes of one state. Each shard's write is fenced by the
    shard's fence (claimed first, see ``claim_shards``); a multi_put is atomic per shard and
    chunk, not across shards: the ledger mark is what makes a commit visible."""

    def __init__(self, client: redis.Redis, keyspace: KeySpace, state_name: str) -> None:
        self.client = client
        self.keyspace = keyspace
        self.state_name = state_name
        self.shards = [
            RedisBackingMap(client, keyspace.shard(i), state_name) for i in range(keyspace.shards)
        ]

    def multi_get(self, keys: Sequence[str]) -> list[Any | None]:
        positions = split_by_shard(self.keyspace, range(len(keys)), lambda i: keys[i])
        out: list[Any | None] = [None] * len(keys)
        for shard, where in zip(self.shards, positions, strict=True):
            if where:
                for i, value in zip(where, shard.multi_get([keys[i] for i in where]), strict=True):
                    out[i] = value
        return out

    def multi_put(self, items: Sequence[tuple[str, Any]], fence: Fence | None = None) -> None:
        groups = split_by_shard(self.keyspace, items, lambda item: item[0])
        for shard, group in zip(self.shards, groups, strict=True):
            if group:
                shard.multi_put(group, fence)

    def keys_written_in(self, txid: int) -> set[str]:
        return set().union(*(shard.keys_written_in(txid) for shard in self.shards))

    def count_written_in(self, txid: int) -> int:
        return sum(shard.count_written_in(txid) for shard in self.shards)

    def scan_items(self) -> Iterator[tuple[str, Any]]:
        return chain.from_iterable(shard.scan_items() for shard in self.shards)

    def drop_tombstones(self, txid: int | None, keys: Sequence[str], generation: str = "") -> int:
        groups = split_by_shard(self.keyspace, keys, lambda key: key)
        return sum(
            shard.drop_tombstones(txid, group, generation)
            for shard, group in zip(self.shards, groups, strict=True)
            if group
        )

    def count(self) -> int:
        return sum(shard.count() for shard in self.shards)

    @property
    def expiry(self) -> ShardedExpiryIndex:
        """The state's expiry index: each shard's (tridentflow_state.expiry)."""
        return ShardedExpiryIndex(self.keyspace, [shard.expiry for shard in self.shards])


def _ledger_layout(
    client: redis.Redis, keyspace: KeySpace
) -> tuple[tuple[int, int] | None, bytes | None]:
    """(the stored (shard count, layout number), None while nothing says yet; the reshard
    plan under way, None if none) - one HMGET of the ledger."""
    raw, layout, committed, moving = client.hmget(
        keyspace.ledger, [SHARDS_FIELD, LAYOUT_FIELD, "committed", RESHARD_FIELD]
    )
    if raw is not None:
        return (int(raw), int(layout or 0)), moving
    if int(committed or 0) > 0:  # committed before shards existed: one
        return (1, int(layout or 0)), moving
    return None, moving


def stored_layout(client: redis.Redis, keyspace: KeySpace) -> tuple[int, int] | None:
    """(shard count, layout number) the pipeline's state is stored with (None: nothing says
    yet). One read of the ledger."""
    return _ledger_layout(client, keyspace)[0]


def stored_shards(client: redis.Redis, keyspace: KeySpace) -> int | None:
    """The shard count the pipeline's state was written with (None: nothing says yet)."""
    stored = stored_layout(client, keyspace)
    return None if stored is None else stored[0]


def with_stored_layout(client: redis.Redis, keyspace: KeySpace) -> KeySpace:
    """``keyspace`` with the shard count and layout its pipeline's state is stored with
    (readers must use this one: a wrong one would read empty hashes, silently)."""
    shards, layout = stored_layout(client, keyspace) or (keyspace.shards, keyspace.layout)
    if (shards, layout) == (keyspace.shards, keyspace.layout):
        return keyspace
    return replace(keyspace, shards=shards, layout=layout)


def check_layout(client: redis.Redis, keyspace: KeySpace, configured: int | None) -> int:
    """The stored shard count (``configured`` if none yet); StateError (one line) if the
    pipeline's state is stored with another count than ``configured`` (None: the run asks
    for none, the stored one wins). Reads only."""
    return _checked_count(keyspace, stored_shards(client, keyspace), configured)


def _checked_count(keyspace: KeySpace, stored: int | None, configured: int | None) -> int:
    count = stored or configured or keyspace.shards
    if configured is not None and count != configured:
        raise StateError(
            f"pipeline {keyspace.pipeline}'s state is stored in {count} shard(s) but this run "
            f"asks for {configured} (state_shards / TRIDENTFLOW_STATE_SHARDS): set {count}, "
            f"or move the state with `tridentflow reshard {keyspace.pipeline} --shards "
            f"{configured} --yes`"
        )
    return count


def ensure_shards(client: redis.Redis, keyspace: KeySpace, configured: int | None) -> None:
    """Before a commit writes with ``keyspace``: record the shard count on first use
    (``configured``, else the keyspace's); StateError (one line) if the state is stored with
    another count than ``configured``, or if ``keyspace`` was read before a reset or a
    reshard moved it; ReshardUnderWayError (retry later) while a reshard runs. Idempotent; one
    read of the ledger (two and a write the first time)."""
    stored, moving = _ledger_layout(client, keyspace)
    if stored is None:
        client.hsetnx(keyspace.ledger, SHARDS_FIELD, configured or keyspace.shards)
        stored, moving = _ledger_layout(client, keyspace)
    if moving is not None:
        plan = json.loads(moving)
        raise ReshardUnderWayError(
            f"pipeline {keyspace.pipeline}'s state is moving to {plan['to'][0]} shard(s) "
            "(`tridentflow reshard`): this commit writes nothing; retry once it is done"
        )
    assert stored is not None  # recorded just now, if by nobody before
    count = _checked_count(keyspace, stored[0], configured)
    if (keyspace.shards, keyspace.layout) != stored:
        raise StateError(
            f"pipeline {keyspace.pipeline}'s state moved to {count} shard(s) (a reset or a "
            f"reshard) since this step read {keyspace.shards}: run the step again"
        )


def set_shard_generations(client: redis.Redis, keyspace: KeySpace, generation: str) -> None:
    """Give every shard ``generation`` (a reset: from now on a step of the old one is refused
    on every shard too)."""
    for i in range(keyspace.shards if keyspace.sharded else 0):
        client.set(keyspace.shard(i).generation, generation)


def claim_shards(
    client: redis.Redis, keyspace: KeySpace, state_names: Iterable[str], fence: Fence
) -> None:
    """Claim every shard for the commit attempt ``fence`` (CLAIM_SHARD), before it writes in
    any: FencedError if a newer attempt (or txid) holds one, GenerationError after a reset."""
    names = list(state_names)
    for i in range(keyspace.shards if keyspace.sharded else 0):
        space = keyspace.shard(i)
        stale = [space.written(name, fence.txid - 1) for name in names]
        keys = [space.fence, space.generation, *stale]
        CLAIM_SHARD(client, keys, [fence.txid, fence.token, fence.generation])


def settle_shards(
    client: redis.Redis, keyspace: KeySpace, state_names: Iterable[str], txid: int
) -> None:
    """After the mark: close every shard to ``txid`` and drop its written-sets."""
    names = list(state_names)
    for i in range(keyspace.shards if keyspace.sharded else 0):
        space = keyspace.shard(i)
        keys = [space.fence, *(space.written(name, txid) for name in names)]
        SETTLE_SHARD(client, keys, [txid])


READ_TRIES = 4
"""Lock-free attempts at a consistent view before a reader holds the next commits back."""
LAYOUT_TRIES = 3
"""Reads of a state that a reshard moved under them before a reader gives up (each rereads
the stored layout)."""
READ_HOLD_MS = 5000
"""How long one hold keeps new commits waiting (renewed while the reader still waits)."""
READ_WAIT_S = 60.0
"""How long a reader waits, holding commits back, for the commit in flight to finish."""


def generation_unless_rewinding(client: redis.Redis, keyspace: KeySpace) -> str | None:
    """The pipeline's generation; RewindingError (one line) while a rewind is under way. A
    reader that reads it before and after a view knows no rewind began or ended between."""
    raw = client.get(keyspace.generation)
    generation = raw.decode() if isinstance(raw, bytes) else raw
    if generation is not None and generation.startswith("rewind:"):
        raise RewindingError(
            f"pipeline {keyspace.pipeline}: the pipeline is being rewound: its state is no "
            "committed txid's until the rewind finishes (run the rewind again if it was cut "
            "short); read again then"
        )
    return generation


def _snapshots(
    client: redis.Redis, keyspace: KeySpace, state_name: str, keys: Sequence[str]
) -> list[tuple[int, int, list[int], list[Any]]]:
    """Atomic snapshots (QUERY_SNAPSHOT) of ``keys``, CHUNK keys per shard and call: for
    each, (what its slot says is committed, the newest dropped tombstones' txid, the
    positions of its keys in ``keys``, their raw values)."""
    positions = split_by_shard(keyspace, range(len(keys)), lambda i: keys[i])
    out = []
    for index, where in enumerate(positions):
        space = keyspace.shard(index)
        for i in range(0, len(where), CHUNK):
            part = where[i : i + CHUNK]
            try:
                reply = QUERY_SNAPSHOT(
                    client,
                    [space.ledger, space.state(state_name), space.generation],
                    [keys[j] for j in part],
                )
            except RewindingError as exc:
                raise RewindingError(f"pipeline {keyspace.pipeline}: {exc}") from None
            if int(reply[2]) != keyspace.layout:
                raise LayoutMovedError(keyspace.pipeline)
            out.append((int(reply[0]), int(reply[1]), part, reply[3:]))
    return out


def _consistent_view(
    client: redis.Redis, keyspace: KeySpace, state_name: str, keys: Sequence[str]
) -> tuple[int, list[Any]] | None:
    """One attempt: (C, every value as of committed txid C), or None if the snapshots share
    no C. Each snapshot, taken at some moment t, tells the value of its keys as of any C from
    ``low`` (one below the newest txid a value carries, and no older than the newest dropped
    tombstones: a key absent at t may have existed before those) up to ``high`` (what was
    committed at t: its slot's own count, or the ledger's read before it, whichever is
    higher - a shard's fence lags its settle). C is the lowest ``high``."""
    before = int(client.hget(keyspace.ledger, "committed") or 0) if keyspace.sharded else 0
    snapshots = _snapshots(client, keyspace, state_name, keys)
    if not snapshots:
        return int(client.hget(keyspace.ledger, "committed") or 0), []
    stored: list[StoredValue | None] = [None] * len(keys)
    low, high = 0, None
    for committed, dropped, part, raws in snapshots:
        newest = dropped
        for j, raw in zip(part, raws, strict=True):
            if raw is not None:
                value = StoredValue.from_json(
                    decode_stored(raw, state_name, keys[j]), keys[j], state_name
                )
                stored[j] = value
                if value.txid is not None:
                    newest = max(newest, value.txid - 1)
        low = max(low, newest)
        high = max(committed, before) if high is None else min(high, max(committed, before))
    assert high is not None
    if low > high:
        return None
    return high, [None if v is None else v.committed_view(high) for v in stored]


def query_state(
    client: redis.Redis, keyspace: KeySpace, state_name: str, keys: Sequence[str]
) -> tuple[int, list[Any]]:
    """Committed values of ``keys`` (None where absent) and the committed txid C they all
    reflect, sharded or not (``keyspace`` must have the stored layout: ``with_stored_layout``).

    Readers take no lock: values carry ``[txid, curr, prev]``, so snapshots taken while
    commits go on resolve to one C unless a key was written twice meanwhile. After
    READ_TRIES such misses (commits outpacing the read), the reader holds the next commits
    back (HOLD_COMMITS: BEGIN_COMMIT waits, the commit in flight finishes) and reads again:
    a reader makes progress at any commit rate, and delays commits only when it must."""
    space = keyspace
    for _ in range(LAYOUT_TRIES):
        try:
            return read_consistently(
                partial(_consistent_view, client, space, state_name, keys),
                client,
                space,
                f"state {state_name}",
            )
        except LayoutMovedError:  # a reshard moved the state since the layout was read
            space = with_stored_layout(client, space)
    raise StateError(
        f"state {state_name} of pipeline {keyspace.pipeline} kept moving between shard "
        "layouts while read: read again"
    )


T_View = TypeVar("T_View")


def read_consistently(
    attempt: Callable[[], T_View | None], client: redis.Redis, keyspace: KeySpace, what: str
) -> T_View:
    """``attempt()`` until it returns a view (None: commits moved under it): READ_TRIES times
    lock-free, then holding the next commits back (HOLD_COMMITS) while the one in flight
    finishes. StateError (one line) if that commit does not finish within READ_WAIT_S."""
    for _ in range(READ_TRIES):
        view = attempt()
        if view is not None:
            return view
    token = secrets.token_hex(8)
    holds = [keyspace.read_hold, keyspace.commit_waiting]
    deadline = time.monotonic() + READ_WAIT_S
    try:
        while True:
            HOLD_COMMITS(client, holds, [token, READ_HOLD_MS])  # 0: a commit goes first
            view = attempt()
            if view is not None:
                return view
            if time.monotonic() > deadline:
                raise StateError(
                    f"{what} of pipeline {keyspace.pipeline}: the commit in flight did not "
                    f"finish within {READ_WAIT_S:.0f}s while this read held the next ones "
                    "back; read again"
                )
            time.sleep(0.002)
    finally:
        HOLD_COMMITS(client, holds, [token, 0])


__all__ = [
    "SHARDS_FIELD",
    "ShardedRedisBackingMap",
    "check_layout",
    "claim_shards",
    "ensure_shards",
    "generation_unless_rewinding",
    "query_state",
    "read_consistently",
    "set_shard_generations",
    "settle_shards",
    "split_by_shard",
    "stored_layout",
    "stored_shards",
    "with_stored_layout",
]
