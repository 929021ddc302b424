"""Redis BackingMap: one Redis hash per map state, field = encoded group key.

Reads are one HMGET per call; writes are one FENCED_HSET script call per chunk, so each key's
write is atomic and refused if the commit attempt was superseded or the ledger is not ready.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import redis

from tridentflow_state.backing import Fence
from tridentflow_state.codec import encode_value
from tridentflow_state.errors import KeyEncodingError
from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import decode_stored
from tridentflow_state.scripts import DROP_TOMBSTONES, FENCED_HSET

CHUNK = 1000
"""Fields per round trip (keeps Lua's unpack() and a single script's run time small)."""


class RedisBackingMap:
    def __init__(self, client: redis.Redis, keyspace: KeySpace, state_name: str) -> None:
        self.client = client
        self.keyspace = keyspace
        self.state_name = state_name
        self.key = keyspace.state(state_name)

    def multi_get(self, keys: Sequence[str]) -> list[Any | None]:
        out: list[Any | None] = []
        for i in range(0, len(keys), CHUNK):
            chunk = keys[i : i + CHUNK]
            raws = self.client.hmget(self.key, chunk)
            name = self.state_name
            out.extend(decode_stored(raw, name, key) for key, raw in zip(chunk, raws, strict=True))
        return out

    def multi_put(self, items: Sequence[tuple[str, Any]], fence: Fence | None = None) -> None:
        txid = 0 if fence is None else fence.txid
        written = self.keyspace.written(self.state_name, txid)
        undo = self.keyspace.undo(self.state_name, txid)
        fenced_hset(self.client, self.keyspace, self.key, written, items, fence, undo)

    def keys_written_in(self, txid: int) -> set[str]:
        members = self.client.smembers(self.keyspace.written(self.state_name, txid))
        return {m.decode() if isinstance(m, bytes) else m for m in members}

    def count_written_in(self, txid: int) -> int:
        return int(self.client.scard(self.keyspace.written(self.state_name, txid)))

    def drop_tombstones(self, txid: int | None, keys: Sequence[str], generation: str = "") -> int:
        dropped = 0
        for i in range(0, len(keys), CHUNK):
            chunk = list(keys[i : i + CHUNK])
            args = [generation, "null" if txid is None else int(txid), *chunk]
            scriptkeys = [self.key, self.keyspace.ledger, self.keyspace.generation]
            dropped += int(DROP_TOMBSTONES(self.client, scriptkeys, args))
        return dropped

    def scan_items(self) -> Iterator[tuple[str, Any]]:
        for field, raw in self.client.hscan_iter(self.key, count=1000):
            key = field.decode() if isinstance(field, bytes) else field
            yield key, decode_stored(raw, self.state_name, key)

    def count(self) -> int:
        return int(self.client.hlen(self.key))


def fenced_hset(
    client: redis.Redis,
    keyspace: KeySpace,
    hash_key: str,
    written_key: str,
    items: Sequence[tuple[str, Any]],
    fence: Fence | None,
    undo_key: str | None = None,
) -> None:
    """HSET JSON values into ``hash_key`` in chunks, each chunk atomic and fenced (FENCED_HSET);
    with ``undo_key`` and a fence asking for it (``fence.undo``), the fields' prior values are
    recorded there by the same script call."""
    txid = 0 if fence is None else fence.txid
    undo = bool(undo_key and fence is not None and fence.undo)
    script_keys = [
        hash_key,
        keyspace.ledger,
        keyspace.tx(txid),
        written_key,
        keyspace.generation,
        undo_key or hash_key,
    ]
    head = ["", "", ""] if fence is None else [str(fence.txid), str(fence.token), fence.generation]
    head.append("1" if undo else "")
    for i in range(0, len(items), CHUNK):
        args: list[str] = list(head)
        for key, value in items[i : i + CHUNK]:
            try:
                encoded = encode_value(value)
            except KeyEncodingError as exc:  # before the chunk's write: nothing of it lands
                raise KeyEncodingError(f"key {key}: {exc}") from exc
            args += (key, encoded)
        FENCED_HSET(client, script_keys, args)
