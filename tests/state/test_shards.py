"""State shards: the key layout, per-shard fencing, resets and consistent reads, against a
real redis-server."""

from __future__ import annotations

import threading

import pytest
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from tridentflow_state.backing import Fence
from tridentflow_state.errors import CommitOrderError, FencedError, GenerationError, StateError
from tridentflow_state.keys import KeySpace
from tridentflow_state.ledger import CommitTicket, Ledger
from tridentflow_state.maps import StateKind
from tridentflow_state.numeric import apply_numeric
from tridentflow_state.shards import (
    ShardedRedisBackingMap,
    claim_shards,
    ensure_shards,
    query_state,
    set_shard_generations,
    settle_shards,
    stored_shards,
)


def test_shards_fall_in_evenly_spaced_slot_ranges():
    for shards in (2, 3, 7, 16):
        keys = KeySpace("wordcount", shards=shards)
        slots = [key_slot(keys.shard(i).state("counts").encode()) for i in range(shards)]
        ranges = [slot * shards // REDIS_CLUSTER_HASH_SLOTS for slot in slots]
        assert ranges == list(range(shards))
        for i in range(shards):  # every key of a shard shares its slot
            space = keys.shard(i)
            names = (space.fence, space.generation, space.written("counts", 9))
            assert {key_slot(k.encode()) for k in names} == {slots[i]}
    assert KeySpace("wordcount").shard(0) == KeySpace("wordcount")  # unsharded: itself


def test_a_key_always_lands_in_the_same_shard():
    keys = KeySpace("p", shards=3)
    spread = [keys.shard_index(f'["w{i}"]') for i in range(3000)]
    assert spread[:6] == [keys.shard_index(f'["w{i}"]') for i in range(6)]
    assert all(800 < spread.count(s) < 1200 for s in range(3))
    assert keys.shard_index('["\\ud800"]') in range(3)  # a lone surrogate, escaped: fine


@pytest.mark.parametrize("bad", [0, 257, 2.0, True])
def test_a_bad_shard_count_is_one_clear_error(bad):
    with pytest.raises(ValueError, match="state shards must be a whole number from 1 to 256"):
        KeySpace("p", shards=bad)


def test_the_scan_pattern_finds_the_shards_of_one_pipeline_only(redis_client):
    mine, other = KeySpace("scan-p", shards=3), KeySpace("scan-p2", shards=3)
    for keys in (mine, other):
        for i in range(3):
            redis_client.set(keys.shard(i).generation, "g")
    found = set(redis_client.scan_iter(match=mine.shard_pattern))
    assert found == {mine.shard(i).generation.encode() for i in range(3)}


def _write(client, keys: KeySpace, fence: Fence, items: dict[str, int]) -> None:
    ShardedRedisBackingMap(client, keys, "s").multi_put(list(items.items()), fence)


def _ticket(fence: Fence) -> CommitTicket:
    return CommitTicket(fence.txid, fence.token, fence.generation)


def _begin(ledger: Ledger, txid: int) -> Fence:
    ticket = ledger.begin_commit(txid)
    return Fence(txid, ticket.token, ticket.generation)


@pytest.fixture
def sharded(redis_client):
    ledger = Ledger(redis_client, "shard-test", shards=3)
    ensure_shards(redis_client, ledger.keys, 3)
    set_shard_generations(redis_client, ledger.keys, ledger.generation)  # as a first claim
    ledger.bind_run("r1")
    return ledger


# keys in every shard (checked below), so each write touches all three
ITEMS = {f'["k{i}"]': [1, i, None] for i in range(12)}


def test_every_shard_holds_some_of_the_items():
    keys = KeySpace("shard-test", shards=3)
    assert {keys.shard_index(k) for k in ITEMS} == {0, 1, 2}


def test_a_write_before_the_shards_are_claimed_is_refused(sharded, redis_client):
    fence = _begin(sharded, 1)
    with pytest.raises((FencedError, CommitOrderError)):
        _write(redis_client, sharded.keys, fence, ITEMS)
    assert ShardedRedisBackingMap(redis_client, sharded.keys, "s").count() == 0


def test_a_superseded_attempt_is_refused_on_every_shard(sharded, redis_client):
    keys = sharded.keys
    old = _begin(sharded, 1)
    claim_shards(redis_client, keys, ["s"], old)
    _write(redis_client, keys, old, ITEMS)  # the old attempt writes, then stalls
    new = _begin(sharded, 1)
    claim_shards(redis_client, keys, ["s"], new)
    for key, value in ITEMS.items():  # on each shard, one key at a time: all refused
        with pytest.raises(FencedError):
            _write(redis_client, keys, old, {key: value})
        with pytest.raises(FencedError):
            apply_numeric(redis_client, keys.shard(keys.shard_index(key)), "s",
                          StateKind.OPAQUE, "count", old, f"{key}\t1")  # fmt: skip
    with pytest.raises(FencedError, match="superseded"):  # nor can it claim back
        claim_shards(redis_client, keys, ["s"], old)
    _write(redis_client, keys, new, ITEMS)
    assert sharded.mark_committed(_ticket(new), {0: 1}, ["s"])


def test_after_the_mark_no_attempt_of_the_txid_writes_again(sharded, redis_client):
    keys = sharded.keys
    fence = _begin(sharded, 1)
    claim_shards(redis_client, keys, ["s"], fence)
    _write(redis_client, keys, fence, ITEMS)
    backing = ShardedRedisBackingMap(redis_client, keys, "s")
    assert backing.count_written_in(1) == len(ITEMS)
    assert sharded.mark_committed(_ticket(fence), {0: 1}, ["s"])
    settle_shards(redis_client, keys, ["s"], 1)
    assert backing.count_written_in(1) == 0  # settled: the written-sets are gone
    with pytest.raises(FencedError, match="committed"):
        claim_shards(redis_client, keys, ["s"], fence)
    with pytest.raises((FencedError, CommitOrderError)):
        _write(redis_client, keys, fence, ITEMS)
    # txid 2 claims; a zombie of txid 1 is refused there, with the newer txid named
    sharded.bind_run("r2")
    second = _begin(sharded, 2)
    claim_shards(redis_client, keys, ["s"], second)
    with pytest.raises(FencedError, match="of txid 2"):
        claim_shards(redis_client, keys, ["s"], fence)


def test_a_reset_refuses_the_old_generation_on_every_shard(sharded, redis_client):
    keys = sharded.keys
    fence = _begin(sharded, 1)
    claim_shards(redis_client, keys, ["s"], fence)
    _write(redis_client, keys, fence, ITEMS)
    Ledger(redis_client, "shard-test", shards=3).reset(force=True)
    assert ShardedRedisBackingMap(redis_client, keys, "s").count() == 0
    for i in range(3):  # the shard's generation is the new one, kept by the reset
        assert redis_client.get(keys.shard(i).generation) is not None
    with pytest.raises(GenerationError):
        claim_shards(redis_client, keys, ["s"], fence)
    with pytest.raises(GenerationError):
        _write(redis_client, keys, fence, ITEMS)


def test_the_stored_count_wins_and_a_different_one_is_refused(sharded, redis_client):
    assert stored_shards(redis_client, sharded.keys) == 3
    with pytest.raises(StateError, match=r"stored in 3 shard.* asks for 2.*tridentflow reshard"):
        ensure_shards(redis_client, KeySpace("shard-test", shards=2), 2)
    with pytest.raises(StateError, match="moved to 3 shard"):  # a keyspace read before a reset
        ensure_shards(redis_client, KeySpace("shard-test", shards=2), 3)
    # a pipeline committed before shards existed reads as one shard
    old = Ledger(redis_client, "pre-shards")
    old.bind_run("r")
    old.mark_committed(old.begin_commit(1), {0: 1}, [])
    assert stored_shards(redis_client, old.keys) == 1


def test_reads_agree_with_one_committed_txid_while_commits_run(sharded, redis_client):
    """Each txid sets every key to its own number, shard by shard, then marks: a query of
    all keys must never mix two txids' values, whatever shard it reads first."""
    keys = sharded.keys
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for txid in range(1, 40):
                if txid > 1:
                    sharded.bind_run(f"r{txid}")
                fence = _begin(sharded, txid)
                claim_shards(redis_client, keys, ["s"], fence)
                backing = ShardedRedisBackingMap(redis_client, keys, "s")
                current = backing.multi_get(list(ITEMS))
                new = {
                    k: [txid, txid, None if old is None else old[1]]
                    for k, old in zip(ITEMS, current, strict=True)
                }
                _write(redis_client, keys, fence, new)
                ticket = _ticket(fence)
                sharded.mark_committed(ticket, {0: txid}, ["s"])
                settle_shards(redis_client, keys, ["s"], txid)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            stop.set()

    thread = threading.Thread(target=writer)
    thread.start()
    views = 0
    while not stop.is_set():
        committed, values = query_state(redis_client, keys, "s", list(ITEMS))
        if committed:
            assert set(values) == {committed}, (committed, values)
            views += 1
    thread.join()
    assert not errors
    assert views > 0
    assert query_state(redis_client, keys, "s", list(ITEMS)) == (39, [39] * len(ITEMS))
