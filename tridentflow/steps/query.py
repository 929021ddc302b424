"""State queries (Trident's stateQuery / DRPC): committed values of keys, batched; and
whole-state listings (Trident's TupleCollectionGet), paginated and consistent.

One Redis round trip per CHUNK keys (and state shard): atomic snapshots combined into one
committed view (state.shards.query_state), so a query during a pending commit sees the last
committed value, never a half-applied one, and every value of one query is as of one txid.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tridentflow.aggregators import absent_value
from tridentflow.errors import TridentflowError
from tridentflow.nodes import Persist
from tridentflow.steps.runtime import Runtime
from tridentflow_state.codec import decode_key, encode_key
from tridentflow_state.maps import StoredValue, decode_stored
from tridentflow_state.shards import (
    generation_unless_rewinding,
    query_state,
    read_consistently,
    with_stored_layout,
)
from tridentflow_state.undo import changed_since, priors_as_of, retained, value_as_of


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
    committed, values = query_state(rt.client, rt.keyspace, persist.state.name, encoded)
    agg = persist.aggregator
    zero = absent_value(agg)
    return committed, [agg.present(zero if v is None else v) for v in values]


def check_retained(rt: Runtime, as_of: int) -> None:
    """TridentflowError (one line) unless state can be rebuilt as of txid ``as_of``: the
    committed txid itself, or one the undo logs retain (tridentflow_state.undo)."""
    committed = rt.ledger.committed_txid()
    if as_of == committed:
        return
    if as_of > committed or as_of < 0:
        raise TridentflowError(
            f"txid {as_of} is not committed: pipeline {rt.pipeline.name} stands at txid {committed}"
        )
    kept = retained(rt.client, rt.keyspace)
    if kept is None:
        raise TridentflowError(
            f"pipeline {rt.pipeline.name} keeps no undo logs, so only its committed txid "
            f"{committed} can be read: set Pipeline(retain_txids=R) (or "
            f"TRIDENTFLOW_RETAIN_TXIDS) to keep the last R txids"
        )
    if not kept.covers(as_of):
        raise TridentflowError(
            f"txid {as_of} is outside what pipeline {rt.pipeline.name} retains "
            f"({kept.line()}): a larger retain_txids keeps more, from the next commits on"
        )


def query_as_of(
    rt: Runtime, persist: Persist, keys: Sequence[tuple[Any, ...]], as_of: int
) -> tuple[int, list[Any]]:
    """(``as_of``, each key's value right after txid ``as_of`` committed), as ``query``
    presents values; TridentflowError (one line) outside the retained range. The committed
    values are read first, then the undo logs of the txids after ``as_of`` (the oldest
    entry of a key wins), then the range is checked again (a commit may have trimmed it)."""
    check_retained(rt, as_of)
    if not persist.group_fields:
        keys = [()]
    encoded = [encode_key(k) for k in keys]
    name = persist.state.name
    space = with_stored_layout(rt.client, rt.keyspace)  # this process may predate a reshard
    committed, values = query_state(rt.client, space, name, encoded)
    priors = priors_as_of(rt.client, space, name, encoded, as_of, committed)
    check_retained(rt, as_of)  # nothing read was trimmed meanwhile
    if with_stored_layout(rt.client, space) != space:  # the undo logs moved while read
        raise _moved(name, "while read: query it again")
    agg = persist.aggregator
    zero = absent_value(agg)
    out = []
    for field, value in zip(encoded, values, strict=True):
        if field in priors:
            value = value_as_of(priors[field], field, name, as_of)
        out.append(agg.present(zero if value is None else value))
    return as_of, out


def list_state_as_of(rt: Runtime, persist: Persist, as_of: int) -> StatePage:
    """Every key of a state with its value as of txid ``as_of`` (one page: the whole state;
    ``list_state``'s pages at the committed txid C, corrected by the undo logs of as_of+1..C).
    TridentflowError (one line) outside the retained range."""
    check_retained(rt, as_of)
    name = persist.state.name
    page = list_state(rt, persist, limit=10_000)
    committed, current = page.committed, dict(page.items)
    while page.next is not None:
        page = list_state(rt, persist, limit=10_000, after=page.next)
        current.update(page.items)
    changed = changed_since(rt.client, rt.keyspace, name, as_of, committed)
    check_retained(rt, as_of)
    agg = persist.aggregator
    for field, raw in changed.items():
        key = decode_key(field)
        value = value_as_of(raw, field, name, as_of)
        if value is None:
            current.pop(key, None)
        else:
            current[key] = agg.present(value)
    return StatePage(as_of, sorted(current.items(), key=lambda kv: repr(kv[0])), None)


@dataclass(frozen=True)
class StatePage:
    """One page of a whole-state listing: values as of ``committed``; ``next`` continues it
    (None: the listing is complete)."""

    committed: int
    items: list[tuple[tuple[Any, ...], Any]]
    next: str | None

    def to_json(self, state: str) -> dict[str, Any]:
        return {
            "state": state,
            "committed_txid": self.committed,
            "values": [{"key": list(k), "value": v} for k, v in self.items],
            "next": self.next,
        }


def list_state(
    rt: Runtime, persist: Persist, limit: int = 100, after: str | None = None
) -> StatePage:
    """Every key of a state with its committed value (Trident's TupleCollectionGet), a page
    of at most ``limit`` keys at a time, in HSCAN order (a key present throughout is listed;
    as with HSCAN, a hash resized meanwhile may list a key twice).

    Consistent: the first page fixes the committed txid C the listing reads at, and the cursor
    carries it. A key written since by txid C+1 (pending or committed) shows its ``prev``, the
    value as of C; a key created by C+1 is left out. The first page is read again at a newer
    C while commits move under it (holding them back for a moment if they keep doing so:
    state.shards.read_consistently), so it always comes back. A later page whose keys were
    written by a txid beyond C+1 (the state moved twice since the listing began) is refused:
    list again."""
    if limit < 1:
        raise TridentflowError(f"--limit must be >= 1, got {limit}")
    if after is not None:
        page = _list_page(rt, persist, limit, after)
        if page is None:
            raise TridentflowError(
                f"state {persist.state.name} changed twice since this listing began at txid "
                f"{after.split('-')[0]}: list it again"
            )
        return page
    return read_consistently(
        lambda: _list_page(rt, persist, limit, None),
        rt.client,
        rt.keyspace,
        f"state {persist.state.name}",
    )


def _moved(name: str, then: str = "since this listing began: list it again") -> TridentflowError:
    return TridentflowError(
        f"state {name} moved to another shard layout (`tridentflow reshard`) {then}"
    )


def _read_cursor(after: str, name: str, shards: int, layout: int) -> tuple[int, int, int, int]:
    """(committed txid, shard, HSCAN cursor, entries to skip) a listing's cursor holds;
    TridentflowError (one line) if it is none, or names another shard layout."""
    try:
        parts = [int(part) for part in after.split("-")]
        if len(parts) == 3:  # a cursor of an unsharded listing
            parts.insert(1, 0)
        if len(parts) == 4:  # of the first shard layout
            parts.append(0)
        committed, shard, scan, skip, listed_in = parts
    except ValueError:
        raise TridentflowError(f"--after {after!r} is not a cursor from a listing") from None
    if listed_in != layout:
        raise _moved(name)
    if not 0 <= shard < shards:
        raise TridentflowError(f"--after {after!r} is not a cursor from a listing")
    return committed, shard, scan, skip


def _write_cursor(
    committed: int, shard: int, scan: int, skip: int, shards: int, layout: int
) -> str:
    """The cursor ``_read_cursor`` reads: unsharded, as it always was; after a reshard with
    its layout too, so a cursor never reads another one."""
    parts: tuple[int, ...] = (committed, shard, scan, skip)
    if layout:
        parts = (*parts, layout)
    elif shards == 1:
        parts = (committed, scan, skip)
    return "-".join(map(str, parts))


def _list_page(rt: Runtime, persist: Persist, limit: int, after: str | None) -> StatePage | None:
    """One page (see list_state); None if a key on it is beyond txid C+1, or a tombstone of a
    txid beyond C was dropped meanwhile (a key absent now may have existed as of C)."""
    shards, layout = rt.keyspace.shards, rt.keyspace.layout
    name = persist.state.name
    generation = generation_unless_rewinding(rt.client, rt.keyspace)
    if after is None:
        committed, shard, scan, skip = rt.ledger.committed_txid(), 0, 0, 0
    else:
        committed, shard, scan, skip = _read_cursor(after, name, shards, layout)

    def cursor(shard: int, scan: int, skip: int) -> str:
        return _write_cursor(committed, shard, scan, skip, shards, layout)

    entries: list[tuple[bytes, bytes]] = []
    read_shards = {shard}
    following: str | None = None
    while True:  # fill the page from HSCAN replies, shard after shard
        room = limit - len(entries)
        space = rt.keyspace.shard(shard)
        next_scan, raw = rt.client.hscan(space.state(name), cursor=scan, count=room)
        batch = list(raw.items())[skip:]
        if len(batch) > room:  # HSCAN's COUNT is a hint: page within its reply too
            entries += batch[:room]
            following = cursor(shard, scan, skip + room)
            break
        entries += batch
        if int(next_scan) != 0:
            scan, skip = int(next_scan), 0
        elif shard + 1 < shards:
            shard, scan, skip = shard + 1, 0, 0
            read_shards.add(shard)
        else:
            break  # the listing is complete
        if len(entries) == limit:
            following = cursor(shard, scan, skip)
            break
    heads = [
        rt.client.hmget(rt.keyspace.shard(i).ledger, ["dropped_txid", "state_layout"])
        for i in read_shards
    ]
    if any(int(moved or 0) != layout for _, moved in heads):
        raise _moved(name)  # a reshard moved the state while this page was read
    if generation_unless_rewinding(rt.client, rt.keyspace) != generation:
        return None  # a rewind (or a reset) began or ended while the page was read
    if max(int(dropped or 0) for dropped, _ in heads) > committed:
        return None
    agg = persist.aggregator
    items = []
    for field, value in entries:
        key = field.decode() if isinstance(field, bytes) else field
        stored = StoredValue.from_json(decode_stored(value, name, key), key, name)
        if stored.txid is not None and stored.txid > committed + 1:
            return None
        current = stored.committed_view(committed)
        if current is not None:
            items.append((decode_key(key), agg.present(current)))
    return StatePage(committed, items, following)
