"""Trident's update rules, against both backing stores (in-memory and a real Redis)."""

from __future__ import annotations

import pytest

from tridentflow_state.backing import Fence, MemoryBackingMap
from tridentflow_state.codec import encode_key
from tridentflow_state.errors import StaleTxidError
from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import GLOBAL_KEY, StateKind, StoredValue, make_map_state
from tridentflow_state.redis_backing import RedisBackingMap


@pytest.fixture(params=["memory", "redis"])
def backing(request):
    if request.param == "memory":
        return MemoryBackingMap()
    client = request.getfixturevalue("redis_client")
    return RedisBackingMap(client, KeySpace("maps-test"), "s")


def add(n):
    return lambda old: n if old is None else old + n


K = {w: encode_key((w,)) for w in ("man", "dog", "apple", "cat")}


def seed(backing, values):
    backing.multi_put([(K[k], list(v)) for k, v in values.items()])


def arm(backing, txid, token):
    """Make a fence valid: the ledger stands at txid-1 and ``token`` is the newest attempt."""
    if isinstance(backing, RedisBackingMap):
        backing.client.hset(backing.keyspace.ledger, "committed", txid - 1)
        backing.client.hset(backing.keyspace.tx(txid), "commit_token", token)
    return Fence(txid, token)


def stored(state, word):
    (value,) = state.read([K[word]])
    return value


def test_transactional_truth_table_from_seed_000(backing):
    # man=[count 3, txid 1], dog=[4, txid 3], apple=[6, txid 2]; batch txid 3 = [man, man, dog]
    seed(backing, {"man": (1, 3, None), "dog": (3, 4, 3), "apple": (2, 6, None)})
    state = make_map_state(StateKind.TRANSACTIONAL, backing)
    state.begin_commit(3)
    state.multi_update([K["man"], K["dog"]], [add(2), add(1)])
    state.commit()
    assert (stored(state, "man").curr, stored(state, "man").txid) == (5, 3)
    assert (stored(state, "dog").curr, stored(state, "dog").txid) == (4, 3)  # already applied
    assert (stored(state, "apple").curr, stored(state, "apple").txid) == (6, 2)


def test_opaque_truth_table_from_seed_003(backing):
    seed(backing, {"cat": (2, 4, 1)})  # value 4, prev 1, txid 2
    state = make_map_state(StateKind.OPAQUE, backing)
    state.begin_commit(3)
    state.multi_update([K["cat"]], [add(2)])
    assert stored(state, "cat") == StoredValue(3, 6, 4)

    seed(backing, {"cat": (2, 4, 1)})
    state.begin_commit(2)  # a replay of txid 2 recomputes from prev
    state.multi_update([K["cat"]], [add(2)])
    assert stored(state, "cat") == StoredValue(2, 3, 1)


@pytest.mark.parametrize("kind", [StateKind.TRANSACTIONAL, StateKind.OPAQUE])
def test_an_older_txid_is_refused_and_nothing_is_written(backing, kind):
    seed(backing, {"cat": (5, 10, 7), "dog": (1, 1, None)})
    state = make_map_state(kind, backing)
    state.begin_commit(4)
    with pytest.raises(StaleTxidError, match="behind"):
        state.multi_update([K["dog"], K["cat"]], [add(1), add(1)])
    assert stored(state, "cat") == StoredValue(5, 10, 7)
    assert stored(state, "dog") == StoredValue(1, 1, None)


@pytest.mark.parametrize(
    ("kind", "after_replay"),
    [
        (StateKind.TRANSACTIONAL, 5),  # trusts the replay to be identical: skips it
        (StateKind.OPAQUE, 3),  # recomputes from prev (None) with the replay's update
        (StateKind.NON_TRANSACTIONAL, 8),  # applies it again: at-least-once
    ],
)
def test_replay_with_different_updates(backing, kind, after_replay):
    state = make_map_state(kind, backing)
    state.begin_commit(1)
    state.multi_update([K["man"]], [add(5)])
    state.commit()
    state.begin_commit(1)
    state.multi_update([K["man"]], [add(3)])
    assert stored(state, "man").curr == after_replay


@pytest.mark.parametrize("kind", list(StateKind))
def test_several_updates_of_one_key_in_one_commit_add_up(backing, kind):
    seed(backing, {"man": (1, 10, None)} if kind is not StateKind.NON_TRANSACTIONAL else {})
    state = make_map_state(kind, backing)
    state.begin_commit(2)
    assert state.multi_update([K["man"], K["man"]], [add(1), add(2)])[-1] in (13, 3)
    state.multi_update([K["man"]], [add(4)])  # a second call in the same commit
    expected = 17 if kind is not StateKind.NON_TRANSACTIONAL else 7
    assert stored(state, "man").curr == expected


@pytest.mark.parametrize("kind", list(StateKind))
def test_first_write_of_a_key(backing, kind):
    state = make_map_state(kind, backing)
    state.begin_commit(1)
    assert state.multi_update([K["dog"]], [add(7)]) == [7]
    txid = None if kind is StateKind.NON_TRANSACTIONAL else 1
    assert stored(state, "dog") == StoredValue(txid, 7, None)


def test_global_value_is_one_key(backing):
    state = make_map_state(StateKind.OPAQUE, backing)
    for txid, n in ((1, 3), (2, 4), (2, 5)):
        state.begin_commit(txid)
        state.multi_update([GLOBAL_KEY], [add(n)])
        state.commit()
    assert state.read([GLOBAL_KEY]) == [StoredValue(2, 8, 3)]


def test_committed_view_hides_a_pending_txid():
    assert StoredValue(4, 10, 7).committed_view(3) == 7
    assert StoredValue(4, 10, 7).committed_view(4) == 10
    assert StoredValue(None, 10, None).committed_view(0) == 10


@pytest.mark.parametrize("kind", [StateKind.TRANSACTIONAL, StateKind.OPAQUE])
def test_stray_keys_of_an_earlier_attempt_are_rolled_back(backing, kind):
    """Attempt 1 of txid 2 wrote man and dog; attempt 2's batch has only man."""
    seed(backing, {"man": (1, 10, None), "dog": (1, 20, None)})
    first = make_map_state(kind, backing)
    first.begin_commit(2, arm(backing, 2, 1))
    first.multi_update([K["man"], K["dog"]], [add(1), add(1)])  # then it crashed
    second = make_map_state(kind, backing)
    second.begin_commit(2, arm(backing, 2, 2))
    second.multi_update([K["man"]], [add(1)])
    assert second.rollback_stray_keys() == 1
    assert stored(second, "dog") == StoredValue(2, 20, 20)
    assert stored(second, "man").curr == 11


@pytest.mark.parametrize("kind", [StateKind.TRANSACTIONAL, StateKind.OPAQUE])
def test_a_removal_is_a_replay_safe_tombstone_dropped_once_committed(backing, kind):
    """multi_remove (Trident's multiRemove) and REMOVE from an update: a tombstone
    [txid, null, prev] while the txid is pending (a query still sees prev; an opaque replay
    recomputes from prev), deleted from the store once the txid is committed."""
    from tridentflow_state.maps import REMOVE

    seed(backing, {"man": (1, 3, None), "dog": (1, 5, None)})
    state = make_map_state(kind, backing)
    state.begin_commit(2, arm(backing, 2, 1))
    state.multi_remove([K["man"]])
    state.multi_update([K["dog"]], [lambda old: REMOVE if old == 5 else old])
    assert state.multi_get([K["man"], K["dog"], K["cat"]]) == [None, None, None]
    assert state.tombstones() == sorted([K["man"], K["dog"]])
    assert stored(state, "man") == StoredValue(2, None, 3)
    assert stored(state, "man").committed_view(1) == 3  # pending: the last committed value
    if kind is StateKind.OPAQUE:  # the replay of txid 2 does not remove dog after all
        state.begin_commit(2, arm(backing, 2, 2))
        assert state.multi_get([K["dog"]]) == [5]  # the earlier attempt's write does not count
        state.multi_update([K["dog"]], [add(1)])
        assert stored(state, "dog") == StoredValue(2, 6, 5)
    if isinstance(backing, RedisBackingMap):  # not before the txid is committed
        assert backing.drop_tombstones(2, [K["man"]]) == 0
        backing.client.hset(backing.keyspace.ledger, "committed", 2)
    dropped = 1 if kind is StateKind.OPAQUE else 2  # opaque: the replay kept dog
    assert backing.drop_tombstones(2, [K["man"], K["dog"], K["cat"]]) == dropped
    assert stored(state, "man") is None
    if kind is StateKind.OPAQUE:
        assert stored(state, "dog").curr == 6
    else:
        assert stored(state, "dog") is None
