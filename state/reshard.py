"""Moving a pipeline's state to another shard count, between two txids - what ``tridentflow
reshard`` does (the steps and their fencing: tridentflow.ops.reshard).

The state lives in the slots of one *layout* (``KeySpace.shards`` and ``KeySpace.layout``,
recorded in the ledger): the values, the expiry index and the per-txid written-sets, undo
logs and change logs of every state, each split by ``KeySpace.shard_index``. A reshard copies
every one of those keys, field by field, into a new layout whose hash tags differ from the
old one's (a new layout number), then switches the ledger to it in one write, then deletes
the old layout's keys. What is global to the pipeline (the ledger, the change logs' seals,
the expiry index's built mark, the undo meta) stays where it is.

Every function here is idempotent: the old layout is frozen while it is copied (commits are
refused and fenced), so a copy run again writes the same fields; each key copied whole is
noted in a done-set and skipped by a rerun. Memory is bounded: keys are found by SCAN and
read and written COPY_CHUNK fields at a time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import redis

from tridentflow_state.backing import Fence
from tridentflow_state.evolve import PER_TXID, unlink_all
from tridentflow_state.expiry import CHUNK, PAGE, add_count, chunk_fields
from tridentflow_state.keys import KeySpace
from tridentflow_state.shards import LAYOUT_FIELD, RESHARD_FIELD, SHARDS_FIELD

COPY_CHUNK = 1000
"""Fields (or members) read and written at a time."""
CLOSED_TXID = 2**53 - 1
"""The txid a moved-from shard's fence is closed at: every claim of it is refused."""


@dataclass(frozen=True)
class Plan:
    """A reshard under way, as the ledger records it (RESHARD_FIELD)."""

    from_shards: int
    from_layout: int
    to_shards: int
    to_layout: int
    phase: str
    """``copying``, then ``deleting`` once the ledger names the new layout."""

    def to_json(self) -> str:
        return json.dumps(
            {
                "from": [self.from_shards, self.from_layout],
                "to": [self.to_shards, self.to_layout],
                "phase": self.phase,
            }
        )

    @classmethod
    def from_json(cls, raw: bytes | str) -> Plan:
        data = json.loads(raw)
        return cls(*data["from"], *data["to"], data["phase"])

    def old(self, keyspace: KeySpace) -> KeySpace:
        return KeySpace(keyspace.pipeline, keyspace.namespace, keyspace.prefix,
                        self.from_shards, self.from_layout)  # fmt: skip

    def new(self, keyspace: KeySpace) -> KeySpace:
        return KeySpace(keyspace.pipeline, keyspace.namespace, keyspace.prefix,
                        self.to_shards, self.to_layout)  # fmt: skip


def plan_under_way(client: redis.Redis, keyspace: KeySpace) -> Plan | None:
    raw = client.hget(keyspace.ledger, RESHARD_FIELD)
    return None if raw is None else Plan.from_json(raw)


def record_plan(client: redis.Redis, keyspace: KeySpace, plan: Plan) -> bool:
    """Record ``plan`` unless one is recorded already (HSETNX): True if this call did."""
    return bool(client.hsetnx(keyspace.ledger, RESHARD_FIELD, plan.to_json()))


def _slots(keyspace: KeySpace) -> list[KeySpace]:
    return [keyspace.shard(i) for i in range(keyspace.shards)]


def movable_keys(client: redis.Redis, slot: KeySpace) -> Iterator[tuple[str, str, str, int | None]]:
    """(key, kind, state, txid or None) of every key of a state in ``slot`` (SCAN; a key may
    come twice, as SCAN's rule allows)."""
    shape = re.compile(
        re.escape(slot.base) + r":(state|expiry|written|undo|changes):([^:]+)(?::(\d+))?$"
    )
    for raw in client.scan_iter(match=slot.pattern, count=1000):
        key = raw.decode() if isinstance(raw, bytes) else raw
        found = shape.match(key)
        if found is None:
            continue
        kind, name, txid = found.groups()
        if (txid is None) == (kind in PER_TXID):
            continue
        yield key, kind, name, None if txid is None else int(txid)


def _target(space: KeySpace, kind: str, name: str, txid: int | None) -> str:
    if txid is None:
        return getattr(space, kind)(name)
    return getattr(space, kind)(name, txid)


def copy_key(
    client: redis.Redis, new: KeySpace, key: str, kind: str, name: str, txid: int | None
) -> int:
    """Copy one key of the old layout into ``new``, each field (member) into the shard
    ``new.shard_index`` gives it, COPY_CHUNK at a time; an expiry index's chunks are split
    field by field, each part keeping its bucket. Idempotent (a rerun may split an expiry
    bucket into other chunks: a field held twice is allowed there). Returns the fields."""
    copied = 0
    if kind == "expiry":
        items: Iterator[Any] = client.zscan_iter(key, count=COPY_CHUNK)
    elif kind == "written":
        items = ((member, None) for member in client.sscan_iter(key, count=COPY_CHUNK))
    else:
        items = client.hscan_iter(key, count=COPY_CHUNK)
    targets = [_target(new.shard(i), kind, name, txid) for i in range(new.shards)]
    chunk: list[tuple[Any, Any]] = []

    def flush() -> int:
        if kind == "expiry":
            return _copy_chunks(client, new, targets, chunk)
        groups: dict[int, list[tuple[Any, Any]]] = {}
        for field, value in chunk:
            groups.setdefault(new.shard_index(_decoded(field)), []).append((field, value))
        with client.pipeline(transaction=False) as pipe:
            for index, group in groups.items():
                target = targets[index]
                if kind == "written":
                    pipe.sadd(target, *(f for f, _ in group))
                else:
                    pipe.hset(target, mapping=dict(group))
            pipe.execute()
        return len(chunk)

    limit = PAGE if kind == "expiry" else COPY_CHUNK  # an expiry member holds CHUNK fields
    for item in items:
        chunk.append(item)
        if len(chunk) >= limit:
            copied += flush()
            chunk = []
    if chunk:
        copied += flush()
    return copied


def _decoded(field: Any) -> str:
    return field.decode("utf-8", "surrogatepass") if isinstance(field, bytes) else field


def _copy_chunks(
    client: redis.Redis, new: KeySpace, targets: list[str], members: list[tuple[Any, float]]
) -> int:
    """Split an expiry index's chunks (``members``: chunk, bucket) field by field into the
    ``targets`` indexes, each part in its bucket; each target's ``#<n>`` count raised by what
    it got. The fields copied."""
    parts: dict[tuple[int, float], list[str]] = {}
    for member, score in members:
        for field in chunk_fields(member):
            parts.setdefault((new.shard_index(field), score), []).append(field)
    got = [0] * len(targets)
    with client.pipeline(transaction=False) as pipe:
        for (index, score), fields in parts.items():
            got[index] += len(fields)
            for i in range(0, len(fields), CHUNK):
                pipe.zadd(targets[index], {"\n".join(fields[i : i + CHUNK]): score}, gt=True)
        pipe.execute()
    for target, fields in zip(targets, got, strict=True):
        add_count(client, target, fields)
    return sum(got)


def _done_key(keyspace: KeySpace) -> str:
    """Set, in the pipeline's slot: the old layout's keys copied whole so far."""
    return keyspace.reshard_copied


def copy_layout(
    client: redis.Redis,
    keyspace: KeySpace,
    plan: Plan,
    after_key: Callable[[], None] | None = None,
) -> tuple[int, int]:
    """Copy every state key of the plan's old layout into its new one (see ``copy_key``),
    skipping the keys a killed run finished (noted in a done-set); ``after_key`` is called
    after each key copied (a fault point). Returns (keys, fields)."""
    new, done = plan.new(keyspace), _done_key(keyspace)
    keys = fields = 0
    for slot in _slots(plan.old(keyspace)):
        for key, kind, name, txid in movable_keys(client, slot):
            if client.sismember(done, key):
                continue
            fields += copy_key(client, new, key, kind, name, txid)
            client.sadd(done, key)
            keys += 1
            if after_key is not None:
                after_key()
    return keys, fields


def prepare_fences(client: redis.Redis, keyspace: KeySpace, plan: Plan, fence: Fence) -> None:
    """Give every shard of the new layout its generation and a fence as the old ones stand
    now: closed to the txid before ``fence``'s (the reshard's own attempt of the next txid),
    held by that attempt - so a claim of an older attempt is refused there as it was on the
    old shards, and the next commit's newer attempt claims it as usual - and the newest
    dropped tombstones' txid, which readers read. Idempotent."""
    new, old = plan.new(keyspace), plan.old(keyspace)
    dropped = max(int(client.hget(slot.ledger, "dropped_txid") or 0) for slot in _slots(old))
    if not new.sharded:
        if dropped:
            client.hset(new.ledger, "dropped_txid", dropped)
        return
    for slot in _slots(new):
        client.set(slot.generation, fence.generation)
        client.hset(
            slot.fence,
            mapping={
                "txid": fence.txid,
                "claim_token": fence.token,
                "commit_token": "",
                "committed": fence.txid - 1,
                "dropped_txid": dropped,
                LAYOUT_FIELD: plan.to_layout,
            },
        )


def switch_layout(client: redis.Redis, keyspace: KeySpace, plan: Plan) -> None:
    """The ledger names the new layout - shard count, layout number and the plan's next
    phase in one HSET, so it moves all at once."""
    deleting = Plan(plan.from_shards, plan.from_layout, plan.to_shards, plan.to_layout,
                    "deleting")  # fmt: skip
    client.hset(
        keyspace.ledger,
        mapping={
            SHARDS_FIELD: plan.to_shards,
            LAYOUT_FIELD: plan.to_layout,
            RESHARD_FIELD: deleting.to_json(),
        },
    )


def close_old_fences(client: redis.Redis, keyspace: KeySpace, plan: Plan) -> None:
    """Close every shard fence of the old layout for good (a claim or fenced write of an
    attempt that still holds the old layout is refused there) and point its readers to the
    new layout (QUERY_SNAPSHOT returns it). Nothing to close for an unsharded old layout:
    the ledger is its fence, and it names the new layout already."""
    old = plan.old(keyspace)
    if not old.sharded:
        return
    for slot in _slots(old):
        client.hset(
            slot.fence,
            mapping={
                "txid": CLOSED_TXID,
                "committed": CLOSED_TXID,
                "claim_token": CLOSED_TXID,
                "commit_token": "",
                LAYOUT_FIELD: plan.to_layout,
            },
        )


def delete_old_layout(
    client: redis.Redis,
    keyspace: KeySpace,
    plan: Plan,
    after_chunk: Callable[[], None] | None = None,
) -> int:
    """UNLINK every state key of the old layout (the closed fences and generations stay:
    two small keys per old shard), in chunks; ``after_chunk`` is called after each (a fault
    point). Idempotent; returns how many went."""
    return sum(
        unlink_all(client, (key for key, *_ in movable_keys(client, slot)), after_chunk)
        for slot in _slots(plan.old(keyspace))
    )


def finish(client: redis.Redis, keyspace: KeySpace) -> None:
    """The reshard is done: its record and its done-set go."""
    client.hdel(keyspace.ledger, RESHARD_FIELD)
    client.delete(_done_key(keyspace))


def next_layout(client: redis.Redis, keyspace: KeySpace) -> int:
    """A layout number no key of the pipeline uses: one past every one recorded so far."""
    used = int(client.hget(keyspace.ledger, LAYOUT_FIELD) or 0)
    return used + 1
