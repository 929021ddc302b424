"""The in-Redis numeric commit (APPLY_NUMERIC) stores exactly what the Python map states
store: same rules, same values, same JSON types (1 vs 1.0), through replays and fallbacks."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tridentflow.aggregators import Count, Max, Mean, Min, Sum, apply_staged
from tridentflow_state.backing import Fence
from tridentflow_state.codec import decode_value
from tridentflow_state.errors import KeyEncodingError, StaleTxidError
from tridentflow_state.keys import KeySpace
from tridentflow_state.ledger import Ledger
from tridentflow_state.maps import StateKind, make_map_state
from tridentflow_state.numeric import apply_numeric
from tridentflow_state.redis_backing import RedisBackingMap

COMBINERS = {"count": Count(), "sum": Sum(), "min": Min(), "max": Max(), "mean": Mean()}

ints = st.integers(min_value=-(2**60), max_value=2**60)  # some beyond 2^53: Python's path
floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
# small ints take the script's one-pattern path; 15 digits are its edge (10^15 is not in it)
edges = [0, 0.0, -0.0, 1, 1.0, 2**53, 2**53 - 1, 10**15 - 1, 10**15, -(10**15 - 1), -(10**15)]
numbers = st.one_of(ints, st.integers(-1000, 1000), floats, st.sampled_from(edges))


def partial_for(op):
    if op == "count":
        return st.one_of(st.integers(1, 1000), st.integers(min_value=1, max_value=2**54))
    if op == "mean":
        return st.tuples(numbers, st.integers(min_value=1, max_value=1000)).map(list)
    return numbers


@st.composite
def histories(draw):
    """Commits of one state: (txid, {key: partial}); a txid may be replayed with other
    partials (an opaque replay) or the same ones."""
    op = draw(st.sampled_from(sorted(COMBINERS)))
    kind = draw(st.sampled_from(list(StateKind)))
    keys = [f'["k{i}"]' for i in range(draw(st.integers(1, 4)))]
    commits, txid = [], 0
    for _ in range(draw(st.integers(1, 5))):
        if not commits or draw(st.booleans()) or kind is not StateKind.OPAQUE:
            txid += 1
        chosen = draw(st.lists(st.sampled_from(keys), min_size=1, unique=True))
        commits.append((txid, {k: draw(partial_for(op)) for k in chosen}))
        if kind is StateKind.TRANSACTIONAL and draw(st.booleans()):
            commits.append(commits[-1])  # a transactional replay is identical
    return op, kind, commits


def snapshot(client, key):
    return {k.decode(): v.decode() for k, v in client.hgetall(key).items()}


def by_python(client, keys, name, kind, op, commits):
    state = make_map_state(kind, RedisBackingMap(client, keys, name), name)
    for txid, partials in commits:
        state.begin_commit(txid)
        items = sorted(partials.items())
        state.multi_update(
            [k for k, _ in items],
            [lambda old, p=p: apply_staged(COMBINERS[op], old, p) for _, p in items],
        )
        state.commit()


def by_redis(client, keys, name, kind, op, commits):
    state = make_map_state(kind, RedisBackingMap(client, keys, name), name)
    for txid, partials in commits:
        state.begin_commit(txid)
        items = [(k, json.dumps(p)) for k, p in sorted(partials.items())]
        _n, unhandled = apply_numeric(client, keys, name, kind, op, Fence(txid, 0, ""), items)
        rest = [(k, p) for k, p in sorted(partials.items()) if k in set(unhandled)]
        state.multi_update(
            [k for k, _ in rest],
            [lambda old, p=p: apply_staged(COMBINERS[op], old, p) for _, p in rest],
        )
        state.commit()


@pytest.fixture
def keyspace(redis_client):
    return KeySpace("numeric")


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(histories())
def test_in_redis_and_python_paths_store_the_same_values(redis_client, keyspace, history):
    op, kind, commits = history
    redis_client.flushdb()
    results = []
    for name, apply in (("py", by_python), ("lua", by_redis)):
        try:
            _ledger_at(redis_client, keyspace, commits, apply, name, kind, op)
        except KeyEncodingError as exc:  # a float sum beyond the range: never stored
            assert "NaN or an infinity" in str(exc)
            results.append("refused")
            continue
        results.append(snapshot(redis_client, keyspace.state(name)))
    python, lua = results
    assert (python == "refused") == (lua == "refused"), results
    if python == "refused":
        return
    assert python.keys() == lua.keys()
    for key in python:
        assert _typed(decode_value(lua[key])) == _typed(decode_value(python[key])), key


def _ledger_at(client, keys, commits, apply, name, kind, op):
    """Run ``apply`` with the ledger standing at txid-1 for each commit (fences pass)."""
    for txid, partials in commits:
        client.hset(keys.ledger, "committed", txid - 1)
        client.hset(keys.tx(txid), "commit_token", 0)
        apply(client, keys, name, kind, op, [(txid, partials)])


def _typed(value):
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, value)


def test_a_stale_txid_is_refused_inside_redis(redis_client, keyspace):
    redis_client.hset(keyspace.state("s"), '["a"]', "[5,3,2]")
    redis_client.hset(keyspace.ledger, "committed", 3)
    redis_client.hset(keyspace.tx(4), "commit_token", 0)
    with pytest.raises(StaleTxidError, match='key \\["a"\\]'):
        apply_numeric(
            redis_client,
            keyspace,
            "s",
            StateKind.OPAQUE,
            "count",
            Fence(4, 0, ""),
            [('["a"]', "1")],
        )
    assert redis_client.hget(keyspace.state("s"), '["a"]') == b"[5,3,2]"


def test_a_generation_from_before_a_reset_is_refused(redis_client, keyspace):
    ledger = Ledger(redis_client, "numeric")
    old = ledger.generation
    ledger.reset(force=True)
    redis_client.hset(keyspace.tx(1), "commit_token", 1)
    from tridentflow_state.errors import GenerationError

    with pytest.raises(GenerationError):
        fence = Fence(1, 1, old)
        apply_numeric(redis_client, keyspace, "s", StateKind.OPAQUE, "sum", fence, [('["a"]', "1")])
    assert not redis_client.exists(keyspace.state("s"))


@pytest.mark.parametrize(
    ("kind", "op", "stored", "partial", "expected"),
    [
        (StateKind.OPAQUE, "count", None, "3", "[2,3,null]"),
        (StateKind.OPAQUE, "count", "[1,4,null]", "3", "[2,7,4]"),
        (StateKind.OPAQUE, "count", "[2,7,4]", "5", "[2,9,4]"),  # a replay: from prev
        (StateKind.TRANSACTIONAL, "sum", "[2,7,4]", "5", "[2,7,4]"),  # already applied
        (StateKind.TRANSACTIONAL, "sum", "[1,1.5,null]", "2", "[2,3.5,1.5]"),
        (StateKind.OPAQUE, "sum", "[1,1.5,null]", "1.5", "[2,3.0,1.5]"),  # a float stays one
        (StateKind.OPAQUE, "sum", "[1,0.1,null]", "0.2", "[2,0.30000000000000004,0.1]"),
        (StateKind.NON_TRANSACTIONAL, "sum", "[null,4,null]", "-4", "[null,0,null]"),
        (StateKind.OPAQUE, "min", "[1,3,null]", "3.0", "[2,3,3]"),  # ties keep the stored
        (StateKind.OPAQUE, "max", "[1,3,null]", "3.5", "[2,3.5,3]"),
        (StateKind.OPAQUE, "mean", "[1,[10,4],null]", "[2.5,1]", "[2,[12.5,5],[10,4]]"),
    ],
)
def test_the_script_applies_ordinary_numbers_itself(
    redis_client, keyspace, kind, op, stored, partial, expected
):
    state = keyspace.state("s")
    if stored is not None:
        redis_client.hset(state, '["a"]', stored)
    redis_client.hset(keyspace.ledger, "committed", 1)
    redis_client.hset(keyspace.tx(2), "commit_token", 1)
    applied, unhandled = apply_numeric(
        redis_client, keyspace, "s", kind, op, Fence(2, 1, ""), [('["a"]', partial)]
    )
    assert (applied, unhandled) == (0 if expected == stored else 1, [])
    assert redis_client.hget(state, '["a"]').decode() == expected
    assert decode_value(expected) == json.loads(expected)


@pytest.mark.parametrize(
    ("op", "stored", "partial"),
    [
        ("sum", "[1,9007199254740993,null]", "1"),  # beyond 2^53: exact only in Python
        ("min", '[1,"b",null]', '"a"'),  # strings compare in Python
        ("sum", "not json", "1"),  # Python's path names the corrupt value
        ("sum", "[1,Infinity,null]", "1"),
    ],
)
def test_what_the_script_cannot_do_exactly_is_left_to_python(
    redis_client, keyspace, op, stored, partial
):
    state = keyspace.state("s")
    redis_client.hset(state, '["a"]', stored)
    redis_client.hset(keyspace.ledger, "committed", 1)
    redis_client.hset(keyspace.tx(2), "commit_token", 1)
    applied, unhandled = apply_numeric(
        redis_client, keyspace, "s", StateKind.OPAQUE, op, Fence(2, 1, ""), [('["a"]', partial)]
    )
    assert (applied, unhandled) == (0, ['["a"]'])
    assert redis_client.hget(state, '["a"]').decode() == stored
