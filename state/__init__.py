"""Exactly-once state for tridentflow: the txid ledger and Trident's map states.

This package talks to Redis only (no Airflow, no Spark). Layering follows Trident:
``backing`` is a small key/value interface (multi_get / multi_put), ``maps`` writes the
non-transactional / transactional / opaque update rules on top of it (the built-in numeric
combiners' fast path applies the same rules inside Redis: ``numeric``), ``redis_backing``
and ``backing.MemoryBackingMap`` are the two stores, ``ledger`` orders commits per pipeline,
``commit`` is one commit attempt as its protocol (begin, claim, write, mark, settle).
"""

from __future__ import annotations

from tridentflow_state.backing import BackingMap, Fence, MemoryBackingMap
from tridentflow_state.codec import decode_key, encode_key
from tridentflow_state.errors import (
    CommitOrderError,
    FencedError,
    MetadataError,
    StaleTxidError,
    StateError,
)
from tridentflow_state.keys import KeySpace
from tridentflow_state.ledger import Binding, CommitTicket, Ledger
from tridentflow_state.maps import (
    GLOBAL_KEY,
    MapState,
    NonTransactionalMap,
    OpaqueMap,
    StateKind,
    StoredValue,
    TransactionalMap,
    make_map_state,
)
from tridentflow_state.redis_backing import RedisBackingMap
from tridentflow_state.shards import ShardedRedisBackingMap, query_state

__all__ = [
    "GLOBAL_KEY",
    "BackingMap",
    "Binding",
    "CommitOrderError",
    "CommitTicket",
    "Fence",
    "FencedError",
    "KeySpace",
    "Ledger",
    "MapState",
    "MemoryBackingMap",
    "MetadataError",
    "NonTransactionalMap",
    "OpaqueMap",
    "RedisBackingMap",
    "ShardedRedisBackingMap",
    "StaleTxidError",
    "StateError",
    "StateKind",
    "StoredValue",
    "TransactionalMap",
    "decode_key",
    "encode_key",
    "make_map_state",
    "query_state",
]
