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
from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import StoredValue, decode_stored
from tridentflow_state.scripts import BEGIN_REWIND, FINISH_REWIND, GENERATION_HSET, RESTORE_UNDO
from tridentflow_state.shards import set_shard_generations

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
) -> RewindResult:
    """Rewind the pipeline to ``target`` (the three steps; see the module doc). Run it again
    with the same target to finish one that was cut short."""
    token, committed, last = begin_rewind(client, keyspace, target, force)
    if hook is not None:
        hook("after-begin-rewind", target)
    restored = restore_states(client, keyspace, states, target, committed, last, token, hook)
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
