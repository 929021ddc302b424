"""Pipelines with state shards on one redis-server: the same values as unsharded, for every
state kind and both commit paths (in Redis and Python), through faults and replays; reads,
listings, status and audit over the shards; the count fixed once state exists."""

from __future__ import annotations

import random

import pytest

from tests.helpers import drain_retrying, produce, sentences
from tridentflow.devtools.chaos import WORDS
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import TridentflowError
from tridentflow.faults import FaultPlan
from tridentflow.ops.audit import audit
from tridentflow.ops.status import status
from tridentflow.registry import load_pipeline
from tridentflow.steps.driver import run_batches
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime, connect
from tridentflow_state.codec import encode_key
from tridentflow_state.errors import StateError
from tridentflow_state.keys import KeySpace

ENGINE = LocalEngine()


def _runtime(name: str, redis_url: str, home, shards: int, namespace: str) -> Runtime:
    return Runtime(
        load_pipeline(name), connect(redis_url), home, namespace=namespace, shards=shards
    )


def _states(rt: Runtime) -> dict[str, dict]:
    """Every state, whole, as listed (a page at a time, across the shards)."""
    out = {}
    for name, persist in rt.pipeline.states.items():
        page = list_state(rt, persist, limit=7)
        items = list(page.items)
        while page.next:
            page = list_state(rt, persist, limit=7, after=page.next)
            items += page.items
        encoded = {encode_key(k): v for k, v in items}  # 0.0 / -0.0, 1 / True: distinct
        assert len(encoded) == len(items)  # each key once
        out[name] = encoded
    return out


@pytest.mark.parametrize(
    "pipeline", ["wordcount", "wordcount-opaque", "mutating-opaque", "wordcount-drpc"]
)
def test_sharded_state_holds_what_unsharded_state_holds(pipeline, redis_url, tmp_path):
    """Count in Redis (transactional, opaque), every aggregator kind through the Python
    path with typed keys (mutating-opaque), a state query from the batch (wordcount-drpc);
    a commit attempt fails half-way and another before the mark, and both replay."""
    lines: list = sentences(120, seed=3)
    if pipeline == "wordcount-drpc":  # sentences, then questions answered from the counts
        lines = [["sentence", s] for s in lines[:80]] + [["query", s] for s in lines[80:]]
    elif pipeline.startswith("mutating"):  # typed keys: 0.0 / -0.0, 1 / 1.0 / true differ
        rng = random.Random(3)
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5))) for _ in lines]
    results = {}
    for shards in (1, 3):
        rt = _runtime(pipeline, redis_url, tmp_path / f"h{shards}", shards, f"s{shards}")
        rt.ledger.reset(force=True)
        produce(rt, lines)
        rt = rt.with_(faults=FaultPlan.parse("mid-commit@2=raise,before-ledger@3=raise"))
        drain_retrying(rt, batch_size=9)
        assert rt.ledger.committed_txid() > 3
        assert audit(rt).ok
        if shards == 3:
            keys = rt.keyspace
            assert keys.shards == 3
            name = next(iter(rt.pipeline.states))
            spread = [rt.client.hlen(keys.shard(i).state(name)) for i in range(3)]
            assert all(spread) and rt.client.hlen(KeySpace(pipeline, "s3").state(name)) == 0
            counted = status(rt)["states"][name]["keys"]
            assert counted == sum(spread)
        results[shards] = _states(rt)
    assert results[3] == results[1]


def test_the_shard_count_is_fixed_once_there_is_state(redis_url, tmp_path):
    rt = _runtime("wordcount", redis_url, tmp_path / "h", 3, "fixed")
    rt.ledger.reset(force=True)
    produce(rt, ["a b c", "c d"])
    run_batches(rt, ENGINE)
    produce(rt, ["a"])
    other = _runtime("wordcount", redis_url, tmp_path / "h", 2, "fixed")
    with pytest.raises(StateError, match=r"stored in 3 shard\(s\) but this run asks for 2"):
        run_batches(other, ENGINE)
    assert other.ledger.pending_txids() == []  # refused before it bound a txid
    # readers follow what is stored, whatever they are configured with
    assert _states(other) == {"counts": {'["a"]': 1, '["b"]': 1, '["c"]': 2, '["d"]': 1}}
    other.ledger.reset(force=True)  # a reset takes the configured count (keeps the source)
    run_batches(other, ENGINE)
    assert other.keyspace.shards == 2
    assert _states(other) == {"counts": {'["a"]': 2, '["b"]': 1, '["c"]': 2, '["d"]': 1}}
    assert sorted(other.client.scan_iter(match=other.keyspace.shard_pattern + "state:*")) == [
        other.keyspace.shard(i).state("counts").encode() for i in range(2)
    ]


def test_a_bad_state_shards_in_the_environment_is_one_clear_error(redis_url, tmp_path, monkeypatch):
    monkeypatch.setenv("TRIDENTFLOW_STATE_SHARDS", "300")
    rt = Runtime(load_pipeline("wordcount"), connect(redis_url), tmp_path / "h")
    with pytest.raises(TridentflowError, match="TRIDENTFLOW_STATE_SHARDS: state shards must be"):
        _ = rt.state_shards
