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
    if op not in OPS:
        raise ValueError(f"unknown numeric op {op!r}; expected one of {OPS}")
    keys = [
        keyspace.state(state_name),
        keyspace.ledger,
        keyspace.tx(fence.txid),
        keyspace.written(state_name, fence.txid),
        keyspace.generation,
        keyspace.undo(state_name, fence.txid),
    ]
    if isinstance(items, str):
        lines = items
    else:
        lines = "\n".join(f"{field}\t{partial}" for field, partial in items)
    undo = "1" if fence.undo else ""
    args = [fence.txid, fence.token, fence.generation, kind.value, op, lines, undo]
    reply = APPLY_NUMERIC(client, keys, args)
    unhandled = [f.decode() if isinstance(f, bytes) else f for f in reply[1:]]
    return int(reply[0]), unhandled
