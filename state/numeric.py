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
from tridentflow_state.scripts import APPLY_NUMERIC

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
