"""The ledger and the fenced Redis writes, against a real redis-server."""

from __future__ import annotations

import threading
import time

import pytest

from tridentflow_state.backing import Fence
from tridentflow_state.codec import encode_key
from tridentflow_state.errors import CommitOrderError, FencedError, MetadataError
from tridentflow_state.keys import KeySpace
from tridentflow_state.ledger import Ledger
from tridentflow_state.maps import StateKind, make_map_state
from tridentflow_state.redis_backing import RedisBackingMap
from tridentflow_state.shards import query_state


@pytest.fixture
def ledger(redis_client):
    return Ledger(redis_client, "ledger-test")


def test_bind_run_is_idempotent_and_assigns_consecutive_txids(ledger):
    a = ledger.bind_run("run-a")
    assert (a.txid, a.how) == (1, "new")
    assert ledger.bind_run("run-a").txid == 1  # retry of any task of run-a
    assert ledger.bind_run("run-b").txid == 2  # run-a still owns 1: pipelined, not skipped
    assert ledger.txid_of_run("run-b") == 2


def test_a_stopped_runs_txid_is_adopted_and_the_old_run_gets_a_fresh_one(ledger):
    assert ledger.bind_run("run-a").txid == 1
    assert ledger.release(1, "run-a")
    b = ledger.bind_run("run-b")
    assert (b.txid, b.how) == (1, "adopted")
    again = ledger.bind_run("run-a")  # run-a cleared later: never deadlocks on txid 1
    assert (again.txid, again.how) == (2, "new")


def test_an_expired_lease_is_adopted(ledger):
    ledger.bind_run("run-a", lease_ms=50)
    time.sleep(0.1)
    assert ledger.bind_run("run-b").how == "adopted"


def test_a_committed_run_stays_bound_to_its_txid(ledger):
    ledger.bind_run("run-a")
    ticket = ledger.begin_commit(1)
    ledger.mark_committed(ticket, {0: 5}, [])
    binding = ledger.bind_run("run-a")
    assert (binding.txid, binding.how, binding.already_committed) == (1, "committed", True)


def test_concurrent_binds_never_share_a_txid(ledger):
    got: list[int] = []
    threads = [
        threading.Thread(target=lambda i=i: got.append(ledger.bind_run(f"r{i}").txid))
        for i in range(20)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 21))


def test_metadata_first_writer_wins(ledger):
    assert ledger.store_metadata(1, {"ranges": {"0": [0, 5]}}) == {"ranges": {"0": [0, 5]}}
    assert ledger.store_metadata(1, {"ranges": {"0": [0, 9]}}) == {"ranges": {"0": [0, 5]}}


@pytest.mark.parametrize("bad", [{"r": (0, 5)}, {"r": {1: 2}}, {"r": object()}])
def test_metadata_that_does_not_survive_json_is_refused(ledger, bad):
    with pytest.raises(MetadataError):
        ledger.store_metadata(1, bad)
    assert ledger.metadata(1) is None


def test_commits_are_ordered_inside_redis(ledger):
    with pytest.raises(CommitOrderError, match="cannot commit before txid 1"):
        ledger.begin_commit(2)
    ticket = ledger.begin_commit(1)
    assert ledger.mark_committed(ticket, {0: 3, 1: 4}, [])
    assert ledger.committed_txid() == 1
    assert ledger.committed_offsets() == {0: 3, 1: 4}
    assert ledger.begin_commit(1) is None  # re-committing a finished txid is a no-op
    assert not ledger.mark_committed(ticket, {0: 99}, [])
    assert ledger.committed_offsets() == {0: 3, 1: 4}


def test_a_superseded_commit_attempt_is_fenced_out(ledger, redis_client):
    old = ledger.begin_commit(1)
    new = ledger.begin_commit(1)
    backing = RedisBackingMap(redis_client, ledger.keys, "s")
    with pytest.raises(FencedError):
        backing.multi_put([("k", [1, 1, None])], Fence(1, old.token))
    with pytest.raises(FencedError):
        ledger.mark_committed(old, {0: 1}, ["s"])
    assert backing.multi_get(["k"]) == [None]
    backing.multi_put([("k", [1, 2, None])], Fence(1, new.token))
    assert ledger.mark_committed(new, {0: 1}, ["s"])
    assert backing.multi_get(["k"]) == [[1, 2, None]]
    assert backing.keys_written_in(1) == set()  # forgotten at commit


def test_scripts_survive_a_script_flush(ledger, redis_client):
    ledger.bind_run("a")
    redis_client.script_flush()
    assert ledger.bind_run("b").txid == 2


def test_a_query_during_a_pending_commit_sees_the_committed_value(ledger, redis_client):
    backing = RedisBackingMap(redis_client, ledger.keys, "counts")
    state = make_map_state(StateKind.OPAQUE, backing, "counts")
    key = encode_key(("man",))
    for txid, n in ((1, 3), (2, 4)):
        ticket = ledger.begin_commit(txid)
        state.begin_commit(txid, Fence(txid, ticket.token))
        state.multi_update([key], [lambda old, n=n: (old or 0) + n])
        if txid == 1:
            ledger.mark_committed(ticket, {}, ["counts"])
    # txid 2 wrote the key but is not marked committed
    assert query_state(redis_client, ledger.keys, "counts", [key]) == (1, [3])


def test_two_pipelines_share_a_redis_without_collisions(redis_client):
    a, b = KeySpace("alpha"), KeySpace("beta")
    RedisBackingMap(redis_client, a, "counts").multi_put([("k", [None, 1, None])])
    RedisBackingMap(redis_client, b, "counts").multi_put([("k", [None, 2, None])])
    assert RedisBackingMap(redis_client, a, "counts").multi_get(["k"]) == [[None, 1, None]]
    assert Ledger(redis_client, "alpha").reset() == 1
    assert RedisBackingMap(redis_client, b, "counts").multi_get(["k"]) == [[None, 2, None]]


def _commit(ledger: Ledger, txid: int, run: str) -> None:
    ledger.bind_run(run)
    assert ledger.mark_committed(ledger.begin_commit(txid), {0: txid}, [], {"records": txid})


def test_the_history_is_recorded_once_by_its_own_script_and_caught_up_after_a_crash(ledger):
    """The mark does not build the history entry; record_history does, once per txid. A crash
    between the two (txid 2 here: marked, never recorded) is caught up by the next txid's call,
    in order, and nothing is recorded twice however often it is called."""
    _commit(ledger, 1, "run-1")
    assert ledger.history() == []  # marked, not yet recorded
    assert ledger.record_history(1) == 1
    _commit(ledger, 2, "run-2")  # ... and the process dies here
    _commit(ledger, 3, "run-3")
    assert ledger.record_history(3) == 2  # txid 2's entry, then txid 3's
    assert ledger.record_history(3) == 0
    assert ledger.record_history(2) == 0  # a late retry of txid 2 answered already-committed
    entries = ledger.history()
    assert [e["txid"] for e in entries] == [3, 2, 1]
    assert [e["run_id"] for e in entries] == ["run-3", "run-2", "run-1"]
    assert [e["records"] for e in entries] == [3, 2, 1]
    assert all(e["steps"]["commit"]["attempts"] == 1 for e in entries)
    assert all(e["committed_ms"] > 0 for e in entries)
    client = ledger.client
    assert not client.exists(ledger.keys.tx(1)) and not client.exists(ledger.keys.tx(2))
    assert client.exists(ledger.keys.tx(3))  # the newest stays: its status is read


def test_no_tx_hash_is_left_behind_when_every_record_crashed(ledger):
    """Two crashes in a row after the mark, never retried: the mark of the txid after deletes
    the tx hash two back, so tx hashes never pile up (one history entry is what is lost)."""
    for txid in range(1, 6):
        _commit(ledger, txid, f"run-{txid}")
    tx_hashes = [t for t in range(1, 6) if ledger.client.exists(ledger.keys.tx(t))]
    assert tx_hashes == [4, 5]
