"""Listing a whole state (Trident's TupleCollectionGet): paginated, consistent with one
committed txid across pages, refused when the state moved twice meanwhile."""

from __future__ import annotations

import json

import pytest

from tests.helpers import produce, runtime, sentences, word_counts
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import TridentflowError
from tridentflow.faults import FaultPlan, InjectedFaultError
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.driver import run_batches
from tridentflow.steps.emitter import emit
from tridentflow.steps.query import list_state

ENGINE = LocalEngine()


def everything(rt, state="counts", limit=3):
    persist = rt.pipeline.states[state]
    page = list_state(rt, persist, limit)
    pages, items = 1, list(page.items)
    while page.next:
        page = list_state(rt, persist, limit, page.next)
        items += page.items
        pages += 1
    return dict((k[0], v) for k, v in items), pages


def test_pages_cover_the_whole_state_exactly_once(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    lines = sentences(60)
    produce(rt, lines)
    run_batches(rt, ENGINE, batch_size=7)
    listed, pages = everything(rt, limit=3)
    assert listed == word_counts(lines)
    assert pages > 1


def test_a_listing_during_a_commit_shows_the_last_committed_values(redis_url, redis_client, home):
    rt = runtime("wordcount-opaque", redis_url, home)
    first = ["a b", "b c"]
    produce(rt, first)
    run_batches(rt, ENGINE)
    produce(rt, ["a a d"])
    rt = rt.with_(faults=FaultPlan.parse("before-ledger@2"))
    coordinate(rt, 2)
    emit(rt, 2, ENGINE)
    with pytest.raises(InjectedFaultError):
        commit(rt, 2)  # every key of txid 2 written, the txid not yet committed
    listed, _pages = everything(rt, limit=1)
    assert listed == word_counts(first)  # 'd' (created by the pending txid) is left out


def test_a_cursor_is_refused_once_the_state_moved_twice(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, ["a b c d e f g h"])
    run_batches(rt, ENGINE)
    persist = rt.pipeline.states["counts"]
    page = list_state(rt, persist, 1)
    assert page.next is not None
    for _ in range(2):
        produce(rt, ["a b c d e f g h"])
        run_batches(rt, ENGINE)
    with pytest.raises(TridentflowError, match="changed twice since this listing began"):
        while page.next:
            page = list_state(rt, persist, 1, page.next)
    with pytest.raises(TridentflowError, match="not a cursor"):
        list_state(rt, persist, 1, "nonsense")


def test_query_all_through_the_cli(tf):
    assert tf("produce", "wordcount", "-", input="x y y\nz\n").returncode == 0
    assert tf("run", "wordcount", "--engine", "local").returncode == 0
    out = tf("query", "wordcount", "--all", "--limit", "1000")
    assert sorted(out.stdout.splitlines()) == ["x\t1", "y\t2", "z\t1"]
    page = json.loads(tf("query", "wordcount", "--all", "--json").stdout)
    assert page["committed_txid"] == 1 and page["next"] is None
    assert sorted((v["key"][0], v["value"]) for v in page["values"]) == [
        ("x", 1),
        ("y", 2),
        ("z", 1),
    ]
    refused = tf("query", "wordcount", "--all", "x")
    assert refused.returncode == 1 and "give no keys" in refused.stderr


def test_a_large_state_pages_through_several_scan_replies(redis_url, redis_client, home):
    rt = runtime("wordcount-opaque", redis_url, home)
    lines = [" ".join(f"w{i}-{j}" for j in range(10)) for i in range(60)]  # 600 keys
    produce(rt, lines)
    run_batches(rt, ENGINE)
    listed, pages = everything(rt, limit=50)
    assert listed == word_counts(lines) and len(listed) == 600
    assert pages >= 12
