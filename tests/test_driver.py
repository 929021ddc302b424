"""The pipelined driver (Trident's max.spout.pending): emits overlap, commits stay ordered."""

from __future__ import annotations

import pytest

from tests.helpers import produce, runtime, sentences, word_counts
from tridentflow.engines.local import LocalEngine
from tridentflow.faults import FaultPlan, InjectedFaultError
from tridentflow.ops.audit import audit
from tridentflow.steps.driver import run_pipelined
from tridentflow.steps.query import query

ENGINE = LocalEngine()


def counts(rt, words):
    persist = rt.pipeline.states["counts"]
    return dict(zip(words, query(rt, persist, [(w,) for w in words])[1], strict=True))


@pytest.mark.parametrize("name", ["wordcount", "wordcount-opaque"])
def test_pipelined_runs_are_exact_and_ordered(redis_url, redis_client, home, name):
    rt = runtime(name, redis_url, home)
    lines = sentences(60)
    produce(rt, lines)
    summary = run_pipelined(rt, ENGINE, depth=3, batch_size=2)
    txids = [r.txid for r in summary.results]
    assert txids == sorted(txids) and len(txids) >= 5
    assert audit(rt).ok
    expected = word_counts(lines)
    assert counts(rt, list(expected)) == expected


@pytest.mark.parametrize("name", ["wordcount", "wordcount-opaque"])
def test_a_failed_txid_blocks_later_commits_until_it_succeeds(redis_url, redis_client, home, name):
    rt = runtime(name, redis_url, home, faults="in-emit@2")
    lines = sentences(60)
    produce(rt, lines)
    with pytest.raises(InjectedFaultError):
        run_pipelined(rt, ENGINE, depth=3, batch_size=2)
    assert rt.ledger.committed_txid() == 1  # 3 and 4 may be staged: they never commit ahead
    rt = rt.with_(faults=FaultPlan())
    run_pipelined(rt, ENGINE, depth=3, batch_size=2)
    assert audit(rt).ok
    expected = word_counts(lines)
    assert counts(rt, list(expected)) == expected


def test_an_opaque_emit_whose_base_commits_meanwhile_starts_from_the_commit(
    redis_url, redis_client, home
):
    """Pipelined: txid 2 starts where txid 1's staged attempt stops, but txid 1 commits (and its
    staging is discarded) between the emit's ledger check and its read of that manifest."""
    from tridentflow.steps.committer import commit
    from tridentflow.steps.coordinator import coordinate
    from tridentflow.steps.emitter import emit

    rt = runtime("wordcount-opaque", redis_url, home)
    lines = sentences(30)
    produce(rt, lines)
    coordinate(rt, 1, batch_size=2)
    emit(rt, 1, ENGINE)
    coordinate(rt, 2, batch_size=2)
    read_manifest = rt.staging.manifest

    def commit_first(txid, attempt):
        rt.staging.manifest = read_manifest
        commit(rt, 1)  # discards txid 1's staging
        return read_manifest(txid, attempt)

    rt.staging.manifest = commit_first
    staged = emit(rt, 2, ENGINE)
    assert staged is not None and rt.ledger.committed_txid() == 1
    assert commit(rt, 2).status == "committed"
    run_pipelined(rt, ENGINE, depth=2, batch_size=2)
    assert counts(rt, ["man", "dog"]) == {w: word_counts(lines).get(w, 0) for w in ["man", "dog"]}
