"""Exactly-once state for tridentflow: the txid ledger and Trident's map states.

This package talks to Redis only (no Airflow, no Spark). Layering follows Trident:
``backing`` is a small key/value interface (multi_get / multi_put), ``maps`` writes the
non-transactional / transactional / opaque update rules once on top of it, ``redis_backing``
and ``memory`` are the two stores, ``ledger`` orders commits per pipeline.
"""

from __future__ import annotations

from state.backing import BackingMap, Fence, MemoryBackingMap
from state.codec import decode_key, encode_key
from state.errors import (
    CommitOrderError,
    FencedError,
    MetadataError,
    StaleTxidError,
    StateError,
)
from state.keys import KeySpace
from state.ledger import Binding, CommitTicket, Ledger
from state.maps import (
    GLOBAL_KEY,
    MapState,
    NonTransactionalMap,
    OpaqueMap,
    StateKind,
    StoredValue,
    TransactionalMap,
    make_map_state,
)
from state.redis_backing import RedisBackingMap
from state.shards import ShardedRedisBackingMap, query_state

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
