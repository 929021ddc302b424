"""Readers make progress at any commit rate, and every value of one read is as of one txid.

A writer commits as fast as it can (hot keys in every txid, random others, removals whose
tombstones are dropped after the mark), unsharded and over 3 state shards; queries of 10,000
keys run meanwhile. Each must succeed and every value must be the one its committed txid C
implies. (Before: with 3 shards, such queries failed with "kept moving"; unsharded, chunks of
one query could reflect different txids.)"""

from __future__ import annotations

import random
import threading
import time

import pytest

import tridentflow_state.shards
from tridentflow_state.backing import Fence
from tridentflow_state.ledger import Ledger
from tridentflow_state.shards import (
    ShardedRedisBackingMap,
    claim_shards,
    ensure_shards,
    query_state,
    set_shard_generations,
    settle_shards,
)

KEYS = [f'["k{i}"]' for i in range(10_000)]
HOT = KEYS[:10]


def touched(txid: int) -> list[tuple[str, bool]]:
    """(key, removed?) for every key ``txid`` writes: the hot keys and 300 others."""
    rng = random.Random(txid)
    keys = HOT + rng.sample(KEYS[10:], 300)
    return [(k, (txid + i) % 7 == 0) for i, k in enumerate(keys)]


def expected_as_of(committed: int) -> dict[str, int | None]:
    values: dict[str, int | None] = {}
    for txid in range(1, committed + 1):
        for key, removed in touched(txid):
            values[key] = None if removed else (values.get(key) or 0) + 1
    return values


class Writer(threading.Thread):
    """Commits txids 1, 2, ... until stopped, through the state layer's own steps."""

    def __init__(self, client, ledger: Ledger) -> None:
        super().__init__(daemon=True)
        self.client, self.ledger = client, ledger
        self.stop = threading.Event()
        self.committed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        keys, client = self.ledger.keys, self.client
        backing = ShardedRedisBackingMap(client, keys, "s")
        try:
            txid = 0
            while not self.stop.is_set():
                txid += 1
                ticket = self.ledger.begin_commit(txid)
                fence = Fence(txid, ticket.token, ticket.generation)
                claim_shards(client, keys, ["s"], fence)
                writes = touched(txid)
                old = backing.multi_get([k for k, _ in writes])
                new = []
                for (key, removed), stored in zip(writes, old, strict=True):
                    before = None if stored is None or stored[1] is None else stored[1]
                    new.append((key, [txid, None if removed else (before or 0) + 1, before]))
                backing.multi_put(new, fence)
                self.ledger.mark_committed(ticket, {0: txid}, ["s"])
                settle_shards(client, keys, ["s"], txid)
                gone = [k for k, removed in writes if removed]
                backing.drop_tombstones(txid, gone, ticket.generation)
                self.committed = txid
        except BaseException as exc:  # pragma: no cover - reported by the test
            self.error = exc


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("lock_free_tries", [tridentflow_state.shards.READ_TRIES, 0])
def test_queries_of_10000_keys_finish_and_agree_while_commits_run(
    redis_client, monkeypatch, shards, lock_free_tries
):
    """lock_free_tries=0: every read goes straight to holding the next commits back (the
    fallback a starved reader takes) - it must finish, stay exact, and let commits go on."""
    monkeypatch.setattr(tridentflow_state.shards, "READ_TRIES", lock_free_tries)
    ledger = Ledger(redis_client, f"reads-{shards}", shards=shards)
    ensure_shards(redis_client, ledger.keys, shards)
    set_shard_generations(redis_client, ledger.keys, ledger.generation)
    writer = Writer(redis_client, ledger)
    writer.start()
    try:
        while writer.committed < 5:
            time.sleep(0.01)
        started, first = time.monotonic(), writer.committed
        for _ in range(15):
            committed, values = query_state(redis_client, ledger.keys, "s", KEYS)
            want = expected_as_of(committed)
            got = {k: v for k, v in zip(KEYS, values, strict=True) if v is not None}
            assert got == {k: v for k, v in want.items() if v is not None}, committed
        rate = (writer.committed - first) / (time.monotonic() - started)
    finally:
        writer.stop.set()
        writer.join(timeout=30)
    assert writer.error is None, writer.error
    # a hold lets the commit in flight finish and the next one in after it (never starved)
    assert writer.committed - first >= 5, "the commits hardly ran: the reads were not tested"
    print(f"shards={shards}: {rate:.0f} commits/s while reading")
    assert redis_client.exists(ledger.keys.read_hold) == 0  # every hold was released
