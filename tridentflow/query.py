"""State queries (Trident's stateQuery / DRPC): committed values of keys, batched.

One Redis round trip per CHUNK keys; each chunk is an atomic snapshot of the committed view,
so a query during a pending commit sees the last committed value, never a half-applied one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from state.codec import encode_key
from state.redis_backing import query_committed
from tridentflow.aggregators import absent_value
from tridentflow.errors import TridentflowError
from tridentflow.pipeline import Persist
from tridentflow.runtime import Runtime


def pick_state(rt: Runtime, name: str | None) -> Persist:
    states = rt.pipeline.states
    if name is None:
        if len(states) != 1:
            raise TridentflowError(
                f"pipeline {rt.pipeline.name} has states {sorted(states)}: choose one with --state"
            )
        return next(iter(states.values()))
    if name not in states:
        raise TridentflowError(
            f"pipeline {rt.pipeline.name} has no state {name!r} (states: {sorted(states)})"
        )
    return states[name]


def parse_key(text: str, persist: Persist) -> tuple[Any, ...]:
    """A CLI key: a JSON array for compound/non-string keys, else the one string field."""
    width = len(persist.group_fields)
    if text.startswith("["):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise TridentflowError(f"key {text!r} is not a JSON array: {exc}") from None
        key = tuple(value)
    else:
        key = (text,)
    if len(key) != width:
        raise TridentflowError(
            f"state {persist.state.name} is grouped by {list(persist.group_fields)}: key {text!r}"
            f" has {len(key)} value(s); give a JSON array of {width}"
            if width
            else f"state {persist.state.name} is a global value: query it without keys"
        )
    return key


def query(rt: Runtime, persist: Persist, keys: Sequence[tuple[Any, ...]]) -> tuple[int, list[Any]]:
    """(committed txid, committed value per key, as the aggregator presents it); an unknown key
    gives the aggregator's zero() (Combiner), init() (Reducer) or None (StateUpdater)."""
    if not persist.group_fields:
        keys = [()]
    encoded = [encode_key(k) for k in keys]
    committed, values = query_committed(rt.client, rt.keyspace, persist.state.name, encoded)
    agg = persist.aggregator
    zero = absent_value(agg)
    return committed, [agg.present(zero if v is None else v) for v in values]
