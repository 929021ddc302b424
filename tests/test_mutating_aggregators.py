"""User aggregators that update their arguments in place can never alias stored or staged
values (issue: 3 records counted as {"n": 4} after a replay)."""

from __future__ import annotations

import pytest

from tests.helpers import produce, runtime, sentences
from tridentflow.engines.local import LocalEngine
from tridentflow.examples.mutating import expected_counts
from tridentflow.faults import InjectedFaultError
from tridentflow.ops.audit import audit
from tridentflow.steps.driver import run_batches
from tridentflow.steps.query import query
from tridentflow_state.backing import MemoryBackingMap
from tridentflow_state.maps import StateKind, make_map_state

ENGINE = LocalEngine()
POINTS = ["after-coordinate", "in-emit", "mid-commit", "before-ledger"]


def values(rt, state, keys):
    return query(rt, rt.pipeline.states[state], keys)[1]


@pytest.mark.parametrize("point", POINTS)
def test_in_place_combiner_and_reducer_replay_exactly(redis_url, redis_client, home, point):
    rt = runtime("tests.pipelines:in_place", redis_url, home, faults=f"{point}@2")
    produce(rt, ["a", "b"])
    run_batches(rt, ENGINE, max_batches=1)
    produce(rt, ["a", "a b"])
    with pytest.raises(InjectedFaultError):
        run_batches(rt, ENGINE)
    if point in ("mid-commit", "before-ledger"):
        # a query during the pending commit shows the last committed values
        assert values(rt, "n", [("a",), ("b",)]) == [{"n": 1}, {"n": 1}]
        assert values(rt, "all", [("a",)]) == [["a"]]
        assert values(rt, "total", [()]) == [{"n": 2}]
    run_batches(rt, ENGINE)
    assert values(rt, "n", [("a",), ("b",)]) == [{"n": 3}, {"n": 2}]
    assert values(rt, "all", [("a",), ("b",)]) == [["a", "a", "a"], ["b", "b"]]
    assert values(rt, "total", [()]) == [{"n": 4}]
    report = audit(rt)
    assert (report.lost, report.doubled, report.mismatched) == (0, 0, [])


@pytest.mark.parametrize("kind", list(StateKind))
def test_a_map_state_hands_updaters_a_private_base(kind):
    """Whatever an updater does to its argument, stored curr and prev stay apart."""
    state = make_map_state(kind, MemoryBackingMap(), "s")

    def grow(old):
        old = old if old is not None else {"items": []}
        old["items"].append(len(old["items"]))
        return old

    for txid in (1, 2, 2, 3):  # txid 2 is replayed (a second attempt)
        state.begin_commit(txid)
        state.multi_update(["k", "k"], [grow, grow])  # the key twice in one commit
        state.commit()
    (stored,) = state.read(["k"])
    if kind is StateKind.NON_TRANSACTIONAL:  # at-least-once: the replay is applied again
        assert len(stored.curr["items"]) == 8
        return
    assert stored.curr["items"] == list(range(6))
    assert stored.prev["items"] == list(range(4))
    assert stored.curr is not stored.prev


@pytest.mark.parametrize("name", ["mutating", "mutating-opaque"])
@pytest.mark.parametrize("point", POINTS)
def test_every_in_place_aggregator_kind_is_exact_under_faults(
    redis_url, redis_client, home, name, point
):
    lines = [*sentences(30), "1 1.0 true 0.0 -0.0 0.0 1 -0.0", "ünï 中文 1"]
    rt = runtime(name, redis_url, home, faults=f"{point}@2,{point}@3#2=raise")
    produce(rt, lines)
    for _ in range(3):
        try:
            run_batches(rt, ENGINE, batch_size=3)
            break
        except InjectedFaultError:
            continue
    run_batches(rt, ENGINE, batch_size=3)
    from tridentflow_state.codec import decode_key

    for state, expected in expected_counts(lines).items():
        keys = sorted(expected)
        got = values(rt, state, [decode_key(k) for k in keys])
        assert dict(zip(keys, got, strict=True)) == expected, state
    typed = expected_counts(lines)["typed"]
    assert typed["[0.0]"] == 2 and typed["[-0.0]"] == 2 and typed["[1]"] == 3
    odd = expected_counts(lines)["odd"]
    assert None in odd.values() and True in odd.values()  # keys removed and kept
    stored = {k.decode() for k in redis_client.hkeys(rt.keyspace.state("odd"))}
    assert stored == {k for k, v in odd.items() if v}  # the removed ones are gone, not null
    assert audit(rt).ok
