"""Trident's three map states over a BackingMap: the txid rules, for every aggregator.

(The built-in numeric combiners' commit fast path applies the same rules inside Redis -
``APPLY_NUMERIC``, tridentflow_state.numeric - kept equal to these by a property test.)

Every stored value has the layout ``[txid, curr, prev]`` (JSON):

* non-transactional: ``[null, value, null]`` - the update is applied every time (at-least-once).
* transactional (Trident's TransactionalMap): for batch txid T and a key stored at txid S,
  S == T (and not written earlier in this same commit) means "already applied": skip;
  otherwise ``curr = update(curr)``. Trident stores only ``[txid, val]``; we also keep ``prev``
  (the value before txid S) so that a query during a pending commit can return the last
  *committed* value, and so a key written by a failed attempt can be rolled back (see below).
* opaque (Trident's OpaqueMap): S < T -> ``[T, update(curr), curr]``; S == T -> recompute from
  ``prev``: ``[T, update(prev), prev]`` (the earlier attempt's batch may have differed).

S > T is refused with StaleTxidError in both transactional and opaque maps.

User code never sees a stored object: every updater is handed a private copy of its base
(``tridentflow_state.codec.private``: free for numbers and strings), so a Combiner that does
``a["n"] += b["n"]; return a`` or a Reducer that appends to its accumulator cannot alias ``curr``
and ``prev`` of one stored value, nor a value cached earlier in the same commit.

Within one commit, a key written earlier in the same commit is "cached" (Trident's
CachedBatchReadsMap): a second update of it in the same commit adds up instead of being skipped.

Beyond Trident: ``rollback_stray_keys`` resets keys that an earlier, failed commit attempt of the
same txid wrote but the current attempt's batch does not contain. Without it, an opaque replay
whose batch lost a record (a partition went dark) would leave that record's contribution in
a key it no longer touches, and the record would be counted again when it arrives in a later txid.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from tridentflow_state.backing import BackingMap, Fence
from tridentflow_state.codec import decode_value, encode_key, private
from tridentflow_state.errors import StaleTxidError, StateError, StoredValueError

GLOBAL_KEY = encode_key(())
"""The key of an ungrouped (global) aggregate: Trident's Snapshottable single value."""


class _Remove:
    """The REMOVE sentinel's type (one instance)."""

    def __repr__(self) -> str:
        return "REMOVE"

    def __reduce__(self) -> str:
        return "REMOVE"  # unpickles as the module's one instance (Spark ships updaters)


REMOVE = _Remove()
"""Returned by an update (a StateUpdater, ``multi_update``), removes the key (Trident's
multiRemove). An absent key and a stored None read the same everywhere (queries, listings,
audit); a removal is written as a tombstone ``[txid, null, prev]`` under the same txid rules
as any write, so a replay of that txid still has ``prev``, and is deleted from the store once
the txid is committed (``MapState.tombstones``, the commit's last step)."""

Updater = Callable[[Any], Any]
BatchKeys = Callable[[], Iterable[str]] | None
"""Lists every key of the current batch (its staged keys) when a check must know them."""


class StateKind(StrEnum):
    NON_TRANSACTIONAL = "non-transactional"
    TRANSACTIONAL = "transactional"
    OPAQUE = "opaque"

    @classmethod
    def parse(cls, value: str | StateKind) -> StateKind:
        try:
            return cls(value)
        except ValueError:
            names = ", ".join(k.value for k in cls)
            raise ValueError(f"unknown state kind {value!r}; expected one of: {names}") from None


@dataclass(frozen=True)
class StoredValue:
    """One stored value: ``txid`` of the batch that last wrote it, ``curr`` and ``prev``."""

    txid: int | None
    curr: Any
    prev: Any = None

    def to_json(self) -> list[Any]:
        return [self.txid, self.curr, self.prev]

    @classmethod
    def from_json(cls, raw: Any, key: str = "?", state: str | None = None) -> StoredValue:
        """The stored value; StoredValueError naming the state, the key and what was found."""
        if not (isinstance(raw, list) and len(raw) == 3):
            raise StoredValueError(
                f"{_where(state, key)}: found {raw!r:.80}, not [txid, curr, prev]; was it "
                "written by something other than tridentflow?"
            )
        txid = raw[0]
        if txid is not None and (not isinstance(txid, int) or isinstance(txid, bool)):
            raise StoredValueError(
                f"{_where(state, key)}: stored txid {txid!r:.40} is not an integer"
            )
        return cls(txid, raw[1], raw[2])

    def committed_view(self, committed_txid: int) -> Any:
        """The value as of the last committed txid: ``prev`` while txid is pending."""
        if self.txid is None or self.txid <= committed_txid:
            return self.curr
        return self.prev


def _where(state: str | None, key: str) -> str:
    return f"state {state}, key {key}" if state else f"key {key}"


def decode_stored(raw: str | bytes | None, state: str, key: str) -> Any:
    """A stored value's JSON; StoredValueError naming the state and the key if it is not JSON
    (the name is built only then: this runs once per key on every commit and query)."""
    try:
        return decode_value(raw)
    except StoredValueError as exc:
        raise StoredValueError(f"{_where(state, key)}: {exc}") from None


class MapState(ABC):
    """A map state over a BackingMap. Updates happen only between begin_commit and commit."""

    kind: StateKind

    def __init__(self, backing: BackingMap, name: str = "state") -> None:
        self.backing = backing
        self.name = name
        self._txid: int | None = None
        self._fence: Fence | None = None
        self._written_now: dict[str, StoredValue] = {}
        self._reached_now: dict[str, StoredValue] = {}
        self._in_batch: set[str] = set()
        self._in_batch_elsewhere = 0
        self._written_elsewhere = False  # another path (Redis) updated keys of this batch
        self._tombstones: set[str] = set()

    # -- commit scope -------------------------------------------------------------------------
    def begin_commit(self, txid: int, fence: Fence | None = None) -> None:
        if txid < 1:
            raise StateError(f"state {self.name}: txid must be >= 1, got {txid}")
        self._clear_scope()
        self._txid = int(txid)
        self._fence = fence

    def commit(self) -> None:
        self._clear_scope()

    def _clear_scope(self) -> None:
        self._txid = None
        self._fence = None
        self._written_now = {}
        self._reached_now = {}
        self._in_batch = set()
        self._in_batch_elsewhere = 0
        self._written_elsewhere = False  # another path (Redis) updated keys of this batch
        self._tombstones = set()

    @property
    def current_txid(self) -> int:
        if self._txid is None:
            raise StateError(f"state {self.name}: update outside begin_commit/commit")
        return self._txid

    # -- the rules ----------------------------------------------------------------------------
    @abstractmethod
    def _next(
        self, key: str, stored: StoredValue | None, cached: bool, update: Updater
    ) -> StoredValue | None:
        """New stored value for ``key``, or None to leave it unchanged."""

    def _check_not_behind(self, key: str, stored: StoredValue) -> None:
        if stored.txid is not None and stored.txid > self.current_txid:
            raise StaleTxidError(
                f"state {self.name}: batch txid {self.current_txid} is behind key {key}, "
                f"stored at txid {stored.txid}; refusing to overwrite (is this state shared "
                "by two pipelines, or was the ledger reset without the state?)"
            )

    # -- operations ---------------------------------------------------------------------------
    def multi_update(self, keys: Sequence[str], updaters: Sequence[Updater]) -> list[Any]:
        """Apply ``updaters[i]`` to ``keys[i]`` under the current txid; return the new values.

        One read and one write round trip for the whole call. Each key's write is atomic and
        fenced; repeated keys (in this call or earlier in this commit) add up.
        """
        if len(keys) != len(updaters):
            raise ValueError("multi_update: keys and updaters differ in length")
        self.current_txid  # noqa: B018 - raises outside a commit
        self._in_batch.update(keys)
        to_fetch = [k for k in dict.fromkeys(keys) if k not in self._written_now]
        fetched = dict(zip(to_fetch, self.backing.multi_get(to_fetch), strict=True))
        writes: dict[str, StoredValue] = {}
        results: list[Any] = []
        for key, update in zip(keys, updaters, strict=True):
            if key in self._written_now:
                stored, cached = self._written_now[key], True
            else:
                raw = fetched[key]
                stored = None if raw is None else StoredValue.from_json(raw, key, self.name)
                cached = False
            new = self._next(key, stored, cached, _removing(update))
            if new is not None:
                writes[key] = new
                self._written_now[key] = new
                results.append(new.curr)
                if new.curr is None:
                    self._tombstones.add(key)
                else:
                    self._tombstones.discard(key)
            else:
                results.append(None if stored is None else stored.curr)
                if stored is not None:  # reached, nothing to write (already applied)
                    self._reached_now[key] = stored
        if writes:
            self.backing.multi_put([(k, v.to_json()) for k, v in writes.items()], self._fence)
        return results

    def note_in_batch(self, count: int) -> None:
        """Record ``count`` keys of this batch updated by another path (state.numeric, inside
        Redis) without listing them: ``rollback_stray_keys`` and ``expire`` then ask their
        caller for the batch's keys (``batch_keys``) if they must tell them apart."""
        self.current_txid  # noqa: B018 - raises outside a commit
        self._in_batch_elsewhere += count
        self._written_elsewhere = True

    def multi_put(self, keys: Sequence[str], values: Sequence[Any]) -> None:
        """Overwrite ``keys`` with ``values`` under the current txid (Trident's multiPut)."""
        self.multi_update(keys, [_const(v) for v in values])

    def multi_remove(self, keys: Sequence[str]) -> None:
        """Remove ``keys`` under the current txid (Trident's multiRemove): replay-safe like
        any write (see REMOVE)."""
        self.multi_update(keys, [_const(REMOVE)] * len(keys))

    def multi_get(self, keys: Sequence[str]) -> list[Any]:
        """The values ``keys`` have now, in this commit, for an updater that must read other
        keys than the one it updates: a key this attempt has reached shows what it holds now
        (written by this attempt, or already applied by an earlier one and skipped); any other
        key shows its value before this txid - an earlier attempt's write of it does not count,
        in either kind - so a replay reads exactly what the first attempt read at the same
        point of the batch. None if absent."""
        txid = self.current_txid
        out: list[Any] = []
        reached = self._written_now.keys() | self._reached_now.keys()
        stored_now = self.read([k for k in keys if k not in reached])
        fetched = iter(stored_now)
        for key in keys:
            if key in self._written_now:
                out.append(private(self._written_now[key].curr))
                continue
            if key in self._reached_now:
                out.append(private(self._reached_now[key].curr))
                continue
            stored = next(fetched)
            if stored is None:
                out.append(None)
            elif stored.txid == txid and self.kind is not StateKind.NON_TRANSACTIONAL:
                out.append(private(stored.prev))  # an earlier attempt's write does not count
            else:
                out.append(private(stored.curr))
        return out

    def tombstones(self) -> list[str]:
        """Keys this commit removed (stored as tombstones): the committer drops them from the
        store once the txid is committed (``BackingMap.drop_tombstones``)."""
        return sorted(self._tombstones)

    def rollback_stray_keys(self, batch_keys: BatchKeys = None) -> int:
        """Reset keys written by an earlier attempt of this txid that this batch lacks.

        Call after all of the batch's updates and before marking the txid committed. Returns the
        number of keys reset. Non-transactional maps have nothing to roll back to.
        """
        txid = self.current_txid
        if self.kind is StateKind.NON_TRANSACTIONAL:
            return 0
        # Every key of this batch is in the written-set (written now, or - a transactional
        # skip - by an earlier attempt of this txid), so equal sizes mean no stray: O(1).
        batch_size = len(self._in_batch) + self._in_batch_elsewhere
        if self.backing.count_written_in(txid) == batch_size:
            return 0
        stray = sorted(self.backing.keys_written_in(txid) - self._batch_set(batch_keys))
        if not stray:
            return 0
        raws = self.backing.multi_get(stray)
        resets: list[tuple[str, Any]] = []
        for key, raw in zip(stray, raws, strict=True):
            if raw is None:
                continue
            stored = StoredValue.from_json(raw, key, self.name)
            if stored.txid == txid:
                resets.append((key, StoredValue(txid, stored.prev, stored.prev).to_json()))
        if resets:
            self.backing.multi_put(resets, self._fence)
        return len(resets)

    def compact_expiry(self, through: int) -> int:
        """Let the expiry index drop the keys it holds twice, if it has grown past the state
        (tridentflow_state.expiry); an index of a state that holds nothing yet is built here
        (before any write: a fresh state's, complete as it is). Call after ``begin_commit``
        and before the batch's writes: a key this txid writes is stamped with it, and a key
        stamped with the
        committing txid is one whose last committed update the index alone knows (an earlier
        attempt's), so it is kept where it is. Fenced; the keys dropped."""
        index = self.backing.expiry
        if self.kind is StateKind.NON_TRANSACTIONAL:
            return 0
        if not index.built() and not index.build_if_empty():  # built at a settle, later
            return 0
        index.merge(self.current_txid - 1)  # what a commit of txid-1 cut short left
        return index.compact(through, self._fence)

    def expiry_in_force(self) -> bool:
        """Whether ``expire`` removes anything at this txid: the state's expiry index is built
        (it is not in the txid that turns expiry on). Reads only."""
        return self.kind is not StateKind.NON_TRANSACTIONAL and self.backing.expiry.built()

    def expire(self, through: int, batch_keys: BatchKeys = None) -> list[str]:
        """Remove every key whose last update was at a txid <= ``through`` and which this
        txid does not update, as tombstones under the current txid: fenced, stamped and
        undoable like any removal (tridentflow_state.expiry). Call after the batch's updates
        (before or after ``rollback_stray_keys``: an earlier attempt's write never counts here
        either). Deterministic: every attempt of the txid reads the same
        candidates (the index moves only after a mark) and tells its own batch apart, so a
        retry or a replay of the same batch expires the same keys. The keys expired, sorted."""
        txid = self.current_txid
        if self.kind is StateKind.NON_TRANSACTIONAL:
            raise StateError(
                f"state {self.name}: a non-transactional state keeps no txid to expire by; "
                "make it transactional or opaque, or drop expire_after_txids"
            )
        index = self.backing.expiry
        if not index.built():  # expiry starts with the txid after the one that built it
            return []
        index.merge(txid - 1)  # what a commit of txid-1 cut short after its mark left
        batch: set[str] | None = None
        since: set[str] | None = None  # keys a committed txid after ``through`` wrote
        expired: list[str] = []
        for chunk in index.candidates(through):
            fresh = [k for k in chunk if k not in self._written_now and k not in self._reached_now]
            writes: list[tuple[str, StoredValue]] = []
            for key, stored in zip(fresh, self.read(fresh), strict=True):
                if stored is None:
                    continue  # gone since it was indexed
                if stored.txid == txid:
                    batch = self._batch_set(batch_keys) if batch is None else batch
                    if key in batch:
                        continue  # updated by this txid (another path than Python's)
                    # an earlier attempt's write does not count: was the key's last committed
                    # update after ``through``? Then the index holds it there too.
                    since = index.written_between(through, txid - 1) if since is None else since
                    if key in since:
                        continue
                    committed = stored.prev
                elif stored.txid is not None and stored.txid > through:
                    continue  # written since: due with the later txid's bucket
                else:
                    committed = stored.curr
                if committed is not None:  # a tombstone is gone already
                    writes.append((key, StoredValue(txid, None, committed)))
            if writes:
                self.backing.multi_put([(k, v.to_json()) for k, v in writes], self._fence)
                for key, value in writes:
                    self._in_batch.add(key)
                    self._written_now[key] = value
                    self._tombstones.add(key)
                expired.extend(key for key, _ in writes)
        return sorted(expired)

    def _batch_set(self, batch_keys: BatchKeys) -> set[str]:
        """Every key of this batch: those written here, and - if other paths updated some
        (``note_in_batch``) - those ``batch_keys`` lists (it may list every key of the batch)."""
        batch = set(self._in_batch)
        if self._written_elsewhere:  # even 0 applied: a script may skip keys it had
            if batch_keys is None:
                raise StateError(
                    f"state {self.name}: keys of this batch were updated in Redis "
                    "(note_in_batch); pass batch_keys to tell them from an earlier attempt's"
                )
            batch.update(batch_keys())
        return batch

    def read(self, keys: Sequence[str]) -> list[StoredValue | None]:
        """Raw stored values (for queries use tridentflow_state.shards.query_state)."""
        return [
            None if raw is None else StoredValue.from_json(raw, key, self.name)
            for key, raw in zip(keys, self.backing.multi_get(keys), strict=True)
        ]


def _const(value: Any) -> Updater:
    return lambda _old: value


def _removing(update: Updater) -> Updater:
    """``update`` with REMOVE stored as None (a tombstone)."""

    def apply(base: Any) -> Any:
        new = update(base)
        return None if new is REMOVE else new

    return apply


class NonTransactionalMap(MapState):
    """Applies every update it is given: a replayed batch is applied again (at-least-once)."""

    kind = StateKind.NON_TRANSACTIONAL

    def _next(self, key, stored, cached, update):
        return StoredValue(None, update(None if stored is None else private(stored.curr)), None)


class TransactionalMap(MapState):
    """Trident's TransactionalMap: skip a key already written by this txid."""

    kind = StateKind.TRANSACTIONAL

    def _next(self, key, stored, cached, update):
        txid = self.current_txid
        if stored is None:
            return StoredValue(txid, update(None), None)
        self._check_not_behind(key, stored)
        if stored.txid == txid:
            if not cached:
                return None  # already applied by an earlier attempt of this txid
            return StoredValue(txid, update(private(stored.curr)), stored.prev)
        return StoredValue(txid, update(private(stored.curr)), stored.curr)


class OpaqueMap(MapState):
    """Trident's OpaqueMap: a replayed txid is recomputed from ``prev``."""

    kind = StateKind.OPAQUE

    def _next(self, key, stored, cached, update):
        txid = self.current_txid
        if stored is None:
            return StoredValue(txid, update(None), None)
        self._check_not_behind(key, stored)
        if stored.txid == txid:
            base = stored.curr if cached else stored.prev
            return StoredValue(txid, update(private(base)), stored.prev)
        return StoredValue(txid, update(private(stored.curr)), stored.curr)


_MAPS: dict[StateKind, type[MapState]] = {
    StateKind.NON_TRANSACTIONAL: NonTransactionalMap,
    StateKind.TRANSACTIONAL: TransactionalMap,
    StateKind.OPAQUE: OpaqueMap,
}


def make_map_state(kind: StateKind | str, backing: BackingMap, name: str = "state") -> MapState:
    return _MAPS[StateKind.parse(kind)](backing, name)
