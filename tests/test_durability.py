"""Redis durability: SIGKILL the server between any two steps, restart it, resume, audit.

With AOF and ``appendfsync always`` no acknowledged write is lost. Because the ledger, the
offsets and the states live in one Redis, any point-in-time copy (an RDB snapshot, an AOF that
lost its last second) is consistent: resuming from it recomputes exactly.
"""

from __future__ import annotations

import pytest

from tests.helpers import sentences, word_counts
from tridentflow.engines.local import LocalEngine
from tridentflow.faults import FaultPlan, InjectedFaultError
from tridentflow.ops.audit import audit
from tridentflow.registry import load_pipeline
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.driver import run_batches
from tridentflow.steps.emitter import emit
from tridentflow.steps.query import query
from tridentflow.steps.runtime import Runtime, connect

ENGINE = LocalEngine()
BOUNDARIES = ["after-coordinate", "after-emit", "mid-commit", "before-ledger", "after-commit"]


@pytest.fixture
def server(killable_redis):
    return killable_redis


def counts(rt, words):
    persist = rt.pipeline.states["counts"]
    return dict(zip(words, query(rt, persist, [(w,) for w in words])[1], strict=True))


@pytest.mark.parametrize("name", ["wordcount", "wordcount-opaque"])
@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_redis_crash_between_any_two_steps_loses_nothing(server, home, name, boundary):
    rt = Runtime(load_pipeline(name), connect(server.url), home)
    lines = sentences(30)
    rt.source_heads()
    rt.log.append_spread(lines)
    run_batches(rt, ENGINE, max_batches=1, batch_size=2)  # txid 1 committed before the crash
    rt = rt.with_(
        faults=FaultPlan.parse(
            f"{boundary}@2" if boundary in ("mid-commit", "before-ledger") else ""
        )
    )
    coordinate(rt, 2, batch_size=2)
    if boundary != "after-coordinate":
        emit(rt, 2, ENGINE)
        if boundary in ("mid-commit", "before-ledger"):
            with pytest.raises(InjectedFaultError):
                commit(rt, 2)
        elif boundary == "after-commit":
            commit(rt, 2)
    committed = rt.ledger.committed_txid()
    server.restart()  # SIGKILL + start on the same AOF
    assert rt.ledger.committed_txid() == committed
    rt = rt.with_(faults=FaultPlan())
    run_batches(rt, ENGINE, batch_size=2)
    assert audit(rt).ok
    expected = word_counts(lines)
    assert counts(rt, list(expected)) == expected


def test_recovering_an_older_snapshot_recomputes_exactly(server, home):
    rt = Runtime(load_pipeline("wordcount"), connect(server.url), home)
    lines = sentences(40)
    rt.source_heads()
    rt.log.append_spread(lines)
    run_batches(rt, ENGINE, max_batches=2, batch_size=2)
    rt.client.save()  # an RDB snapshot at txid 2
    run_batches(rt, ENGINE, max_batches=2, batch_size=2)
    assert rt.ledger.committed_txid() == 4
    server.kill()
    (server.directory / "appendonlydir").rename(server.directory / "aof.lost")
    server.start(appendonly=False)
    assert rt.ledger.committed_txid() == 2  # txids 3 and 4 were lost with the AOF
    run_batches(rt, ENGINE, batch_size=2)
    assert audit(rt).ok
    expected = word_counts(lines)
    assert counts(rt, list(expected)) == expected
