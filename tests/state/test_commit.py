"""One commit attempt as its protocol (tridentflow_state.commit), against a real redis-server:
the phases in order with each hook once, the half reached where the writes say, a superseded
attempt fenced out, a committed txid's retry a no-op, and settling after the mark."""

from __future__ import annotations

import pytest

from tridentflow_state.codec import encode_key
from tridentflow_state.commit import CommitAttempt, PhaseHooks
from tridentflow_state.errors import FencedError
from tridentflow_state.ledger import Ledger
from tridentflow_state.maps import StateKind
from tridentflow_state.redis_backing import RedisBackingMap


class Recorder(PhaseHooks):
    """Each hook's call, with the committed txid the ledger shows at that moment."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.seen: list[tuple[str, int]] = []

    def half_written(self, attempt: CommitAttempt) -> None:
        self.seen.append(("half", self.ledger.committed_txid()))

    def written(self, attempt: CommitAttempt) -> None:
        self.seen.append(("written", self.ledger.committed_txid()))

    def marked(self, attempt: CommitAttempt) -> None:
        self.seen.append(("marked", self.ledger.committed_txid()))


@pytest.fixture
def ledger(redis_client) -> Ledger:
    return Ledger(redis_client, "commit-test")


def states(ledger: Ledger) -> dict:
    backing = RedisBackingMap(ledger.client, ledger.keys, "counts")
    return {"counts": (StateKind.OPAQUE, backing)}


def attempt_of(ledger: Ledger, txid: int, hooks: PhaseHooks | None = None) -> CommitAttempt:
    attempt = CommitAttempt.begin(ledger, ledger.client, ledger.keys, txid, hooks=hooks)
    assert attempt is not None
    return attempt


def write(attempt: CommitAttempt, words: list[str]) -> None:
    """One key at a time, each reported as written."""
    (writer,) = attempt.writers.values()
    for word in words:
        writer.multi_put([encode_key((word,))], [1])
        attempt.wrote(1)


def test_the_phases_run_in_order_each_hook_once(ledger, redis_client):
    hooks = Recorder(ledger)
    attempt = attempt_of(ledger, 1, hooks)
    attempt.claim(states(ledger), shards=1)
    attempt.expect(4)
    (writer,) = attempt.writers.values()
    for n, word in enumerate(["a", "b", "c", "d"], start=1):
        writer.multi_put([encode_key((word,))], [1])
        attempt.wrote(1)
        assert [name for name, _ in hooks.seen] == (["half"] if n >= 2 else [])  # at the half
    assert attempt.finish_writes(lambda name: ()) == 0
    assert attempt.mark({0: 4}, {"records": 4}) and attempt.marked
    assert hooks.seen == [("half", 0), ("written", 0), ("marked", 1)]  # the mark between them
    attempt.settle()
    assert ledger.committed_txid() == 1 and ledger.committed_offsets() == {0: 4}
    stored = redis_client.hkeys(ledger.keys.state("counts"))
    assert sorted(stored) == sorted(encode_key((w,)).encode() for w in "abcd")
    assert CommitAttempt.begin(ledger, redis_client, ledger.keys, 1) is None  # committed: no-op


def test_an_empty_batch_is_half_written_at_once_and_the_half_is_where_a_chunk_ends(ledger):
    hooks = Recorder(ledger)
    empty = attempt_of(ledger, 1, hooks)
    empty.claim(states(ledger), shards=1)
    empty.expect(0)
    assert hooks.seen == [("half", 0)]
    empty.finish_writes(lambda name: ())
    empty.mark({}, {})
    empty.settle()

    counted = attempt_of(ledger, 2, Recorder(ledger))
    counted.claim(states(ledger), shards=1)
    counted.expect(10)
    assert counted.keys_to_half() == 5 and not counted.reaches_half(4)
    counted.wrote(4)
    assert counted.keys_to_half() == 1 and counted.reaches_half(1)
    counted.wrote(1)
    counted.wrote(5)
    assert counted.hooks.seen == [("half", 1)]  # once, at 5 of 10
    assert counted.keys_to_half() == 0 and not counted.reaches_half(5)


def test_a_superseded_attempt_is_fenced_out_of_writes_and_the_mark(ledger):
    old = attempt_of(ledger, 1)
    old.claim(states(ledger), shards=1)
    old.expect(2)
    write(old, ["a"])
    new = attempt_of(ledger, 1)  # a retry of the same txid, while the old one still runs
    new.claim(states(ledger), shards=1)
    new.expect(2)
    write(new, ["a", "b"])
    with pytest.raises(FencedError):
        write(old, ["b"])
    new.finish_writes(lambda name: ())
    assert new.mark({0: 2}, {})
    new.settle()
    assert not old.mark({0: 2}, {})  # the txid is committed: the old attempt marks nothing
    assert not old.marked and old.settle() == 0  # and settles nothing but its own scopes
    assert ledger.committed_txid() == 1 and ledger.committed_offsets() == {0: 2}


def test_a_retry_after_the_mark_settles_nothing_twice(ledger, redis_client):
    first = attempt_of(ledger, 1)
    first.claim(states(ledger), shards=1)
    first.expect(1)
    write(first, ["a"])
    first.finish_writes(lambda name: ())
    first.mark({0: 1}, {})  # and the process dies before settling
    assert CommitAttempt.begin(ledger, redis_client, ledger.keys, 1) is None
    first.settle()  # what a later commit or the retry's own path does: idempotent
    first.settle()
    assert ledger.committed_txid() == 1
    assert [e["txid"] for e in ledger.history(5)] == [1]
