"""The backing-store interface the map states are written against (Trident's IBackingMap).

A backing map stores one JSON-able value per encoded key. It knows nothing of txids except the
``Fence`` it is handed on writes: a store that can (Redis) checks the fence atomically with the
write, so that a write from a superseded commit attempt, or from a txid the ledger is not ready
for, never lands. ``MemoryBackingMap`` has the same contract, for fast unit tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tridentflow_state.codec import decode_value, encode_value, live_stamp


@dataclass(frozen=True)
class Fence:
    """Proof that a writer holds commit attempt ``token`` of ``txid`` in ``generation``.

    Writes carrying a fence are refused unless the pipeline is still in ``generation`` (no
    reset since), the ledger stands at ``txid - 1`` and ``token`` is the newest commit token
    of ``txid``. With ``undo``, every fenced state write also records the prior values.
    """

    txid: int
    token: int
    generation: str = ""
    undo: bool = False
    """Record each written field's prior stored value in the txid's undo log (state.undo)."""


class ExpiryIndex(Protocol):
    """The index expiry reads its candidates from: every live key of one state under the txid
    that last wrote it (tridentflow_state.expiry has the rules and the Redis one)."""

    def merge(self, txid: int) -> int:
        """Index every field committed ``txid`` wrote; idempotent."""
        ...

    def forget(self, through: int) -> int:
        """Drop what the index holds at or below ``through`` (after the mark of the txid that
        expired by it); idempotent."""
        ...

    def compact(self, through: int, fence: Fence | None) -> int:
        """Drop, if the index has grown past the state, what it holds above ``through`` for
        keys written since; fenced by ``fence``. Never changes what ``candidates`` and
        ``written_between`` say of a live key."""
        ...

    def candidates(self, through: int) -> Iterator[list[str]]:
        """In chunks, every live key last written at or before ``through`` (and maybe keys
        written since: each is checked against its stamp)."""
        ...

    def written_between(self, after: int, through: int) -> set[str]:
        """The keys a committed txid in (``after``, ``through``] wrote, as far as the index
        holds them (every live one)."""
        ...

    def built(self) -> bool:
        """Whether the index is complete and has followed every commit since it was built."""
        ...

    def rebuild(self) -> int:
        """Make the index again from the stored values, and mark it built."""
        ...


class BackingMap(Protocol):
    """Key/value store under one map state. Keys are encoded group keys (see state.codec)."""

    def multi_get(self, keys: Sequence[str]) -> list[Any | None]:
        """Values of ``keys`` in order; None for a missing key. One round trip."""
        ...

    def multi_put(self, items: Sequence[tuple[str, Any]], fence: Fence | None = None) -> None:
        """Write all ``items`` atomically (one round trip), checking ``fence`` first.

        With a fence, the written keys are also remembered as written by ``fence.txid``
        (see keys_written_in) in the same atomic step.
        """
        ...

    def keys_written_in(self, txid: int) -> set[str]:
        """Keys written under a fence of ``txid`` by any commit attempt, not yet forgotten."""
        ...

    def count_written_in(self, txid: int) -> int:
        """len(keys_written_in(txid)), without transferring the keys."""
        ...

    def scan_items(self) -> Iterator[tuple[str, Any]]:
        """Every (key, value) pair, in no particular order."""
        ...

    def drop_tombstones(self, txid: int | None, keys: Sequence[str], generation: str = "") -> int:
        """Delete those of ``keys`` whose value is still a tombstone ``[txid, null, ...]``
        (a key removed by that txid), atomically per key; only once ``txid`` is committed (a
        pending txid needs the tombstone's ``prev``) and, if given, while the pipeline is in
        ``generation``. Returns how many were deleted."""
        ...

    @property
    def expiry(self) -> ExpiryIndex:
        """The state's expiry index (tridentflow_state.expiry): its candidates, merged after
        each mark; used only for a state with ``expire_after_txids``."""
        ...


class MemoryBackingMap:
    """In-process BackingMap with the Redis store's semantics (values round-trip through JSON).

    ``guard`` is called with the fence before every fenced write and may raise (the Redis store
    does this check inside its Lua script instead).
    """

    def __init__(self, guard: Callable[[Fence], None] | None = None) -> None:
        self._data: dict[str, str] = {}
        self._written: dict[int, set[str]] = {}
        self._guard = guard
        self.round_trips = 0
        self._expiry: MemoryExpiryIndex | None = None

    @property
    def expiry(self) -> MemoryExpiryIndex:
        """The map's expiry index, made on first use."""
        if self._expiry is None:
            self._expiry = MemoryExpiryIndex(self)
        return self._expiry

    def multi_get(self, keys: Sequence[str]) -> list[Any | None]:
        self.round_trips += 1
        return [decode_value(self._data.get(k)) for k in keys]

    def multi_put(self, items: Sequence[tuple[str, Any]], fence: Fence | None = None) -> None:
        self.round_trips += 1
        if fence is not None and self._guard is not None:
            self._guard(fence)
        encoded = [(k, encode_value(v)) for k, v in items]
        for key, value in encoded:
            self._data[key] = value
        if fence is not None:
            self._written.setdefault(fence.txid, set()).update(k for k, _ in items)

    def keys_written_in(self, txid: int) -> set[str]:
        return set(self._written.get(txid, set()))

    def count(self) -> int:
        """The fields the state holds (tombstones included, as Redis's HLEN)."""
        return len(self._data)

    def count_written_in(self, txid: int) -> int:
        return len(self._written.get(txid, ()))

    def forget_txid(self, txid: int) -> None:
        self._written.pop(txid, None)

    def scan_items(self) -> Iterator[tuple[str, Any]]:
        for key, value in list(self._data.items()):
            yield key, decode_value(value)

    def drop_tombstones(self, txid: int | None, keys: Sequence[str], generation: str = "") -> int:
        dropped = 0
        for key in keys:
            value = decode_value(self._data.get(key))
            if isinstance(value, list) and value[:2] == [txid, None]:
                del self._data[key]
                dropped += 1
        return dropped


class MemoryExpiryIndex:
    """The expiry index of a MemoryBackingMap (tridentflow.testing): the Redis index's rules
    over a dict of each key's last committed write (exact: it holds no key twice)."""

    def __init__(self, backing: MemoryBackingMap) -> None:
        self.backing = backing
        self.scores: dict[str, int] = {}
        self.is_built = False

    def built(self) -> bool:
        return self.is_built

    def merge(self, txid: int) -> int:
        written = sorted(self.backing._written.pop(txid, set()))
        for field in written:
            self.scores[field] = max(txid, self.scores.get(field, txid))
        return len(written)

    def forget(self, through: int) -> int:
        gone = [field for field, score in self.scores.items() if score <= through]
        for field in gone:
            del self.scores[field]
        return len(gone)

    def compact(self, through: int, fence: Fence | None) -> int:
        return 0  # it holds each key once

    def candidates(self, through: int) -> Iterator[list[str]]:
        due = sorted(f for f, score in self.scores.items() if score <= through)
        for i in range(0, len(due), 1000):
            yield due[i : i + 1000]

    def written_between(self, after: int, through: int) -> set[str]:
        return {f for f, score in self.scores.items() if after < score <= through}

    def count(self) -> int:
        """The fields the index holds (each once)."""
        return len(self.scores)

    def build_if_empty(self) -> bool:
        """As RedisExpiryIndex.build_if_empty: built now if the state holds nothing."""
        if self.backing._data:
            return False
        self.is_built = True
        return True

    def rebuild(self) -> int:
        self.is_built = True
        self.scores = {}
        for field, raw in self.backing._data.items():
            stamp = live_stamp(raw)
            if stamp is not None:
                self.scores[field] = stamp
        return len(self.scores)
