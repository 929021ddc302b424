"""A reset starts a new generation: nothing of a run in flight lands in the fresh pipeline
(issue: the old batch committed into the reset pipeline, audit lost=10 doubled=10)."""

from __future__ import annotations

import shutil

import pytest

from tests.helpers import produce, runtime, sentences, word_counts
from tridentflow.engines.local import LocalEngine
from tridentflow.ops.audit import audit
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.driver import run_batches
from tridentflow.steps.emitter import emit
from tridentflow.steps.query import query
from tridentflow.steps.runs import coordinate_run, emit_run
from tridentflow_state.backing import Fence
from tridentflow_state.errors import GenerationError, PipelineBusyError
from tridentflow_state.redis_backing import fenced_hset

ENGINE = LocalEngine()


def counts(rt, words):
    return dict(
        zip(words, query(rt, rt.pipeline.states["counts"], [(w,) for w in words])[1], strict=True)
    )


def operator_reset(rt, force=True):
    """What `tridentflow reset PIPELINE --yes --source [--force]` does, from another process."""
    other = runtime(rt.pipeline.name, rt.redis_url, rt.home)
    other.ledger.reset(force=force)
    shutil.rmtree(other.staging_root, ignore_errors=True)
    shutil.rmtree(other.log.root, ignore_errors=True)
    return other


@pytest.mark.parametrize("name", ["wordcount", "wordcount-opaque"])
@pytest.mark.parametrize("stage", ["coordinated", "emitted", "mid-commit"])
def test_a_step_in_flight_during_a_reset_is_refused_and_counts_stay_exact(
    redis_url, redis_client, home, name, stage
):
    old_lines = ["old words here"] * 5
    rt = runtime(name, redis_url, home, faults="mid-commit@1" if stage == "mid-commit" else "")
    produce(rt, old_lines)
    txid = rt.ledger.bind_run("in-flight").txid
    coordinate(rt, txid)
    if stage != "coordinated":
        emit(rt, txid, ENGINE)
    if stage == "mid-commit":
        with pytest.raises(Exception, match="injected"):
            commit(rt, txid)
    fresh = operator_reset(rt)
    new_lines = sentences(10)
    produce(fresh, new_lines)

    with pytest.raises(GenerationError, match="reset or rewound since"):
        if stage == "coordinated":
            emit(rt, txid, ENGINE)
        else:  # the same process: its commit's second attempt (the fault armed only the first)
            commit(rt, txid)
    with pytest.raises(GenerationError):
        rt.ledger.bind_run("in-flight-2")

    run_batches(fresh, ENGINE, batch_size=3)
    expected = word_counts(new_lines)
    assert counts(fresh, [*expected, "old", "here"]) == {**expected, "old": 0, "here": 0}
    report = audit(fresh)
    assert (report.lost, report.doubled, report.mismatched) == (0, 0, [])


def test_reset_refuses_while_a_run_holds_a_live_lease_unless_forced(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(4))
    coordinate_run(rt, "airflow-run-1", lease_ms=60_000)
    other = runtime("wordcount", redis_url, home)
    with pytest.raises(PipelineBusyError, match="airflow-run-1 holds a pending txid"):
        other.ledger.reset()
    assert rt.ledger.committed_txid() == 0 and rt.ledger.txid_of_run("airflow-run-1") == 1
    other.ledger.reset(force=True)
    with pytest.raises(GenerationError):  # the run's next task is refused, loudly
        emit_run(rt, "airflow-run-1", ENGINE)


def test_a_released_txid_does_not_block_a_reset(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(4))
    coordinate_run(rt, "gave-up", lease_ms=60_000)
    with pytest.raises(PipelineBusyError):  # a live lease holds a reset back...
        runtime("wordcount", redis_url, home).ledger.reset()
    rt.ledger.release(1, "gave-up")
    before = rt.ledger.current_generation()
    assert runtime("wordcount", redis_url, home).ledger.reset() > 0  # ...a released one not
    assert rt.ledger.current_generation() != before
    assert rt.ledger.committed_txid() == 0 and rt.ledger.pending_txids() == []


def test_a_fenced_write_of_an_old_generation_is_refused_inside_redis(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(4))
    coordinate(rt, 1)
    ticket = rt.ledger.begin_commit(1)
    operator_reset(rt)
    keys = rt.keyspace
    fence = Fence(1, ticket.token, ticket.generation)
    state_key = keys.state("counts")
    with pytest.raises(GenerationError):
        fenced_hset(rt.client, keys, state_key, keys.written("counts", 1), [("k", 1)], fence)
    assert not redis_client.exists(state_key)
    # the fresh pipeline's own commit attempt 1 has token 1 too: the generation tells them apart
    fresh = runtime("wordcount", redis_url, home)
    produce(fresh, sentences(2))
    coordinate(fresh, 1)
    assert fresh.ledger.begin_commit(1).token == ticket.token
    with pytest.raises(GenerationError):
        fenced_hset(rt.client, keys, state_key, keys.written("counts", 1), [("k", 1)], fence)


def test_redis_losing_its_data_mid_run_refuses_the_run(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(6))
    coordinate(rt, rt.ledger.bind_run("r").txid)
    redis_client.flushdb()  # a restart of a Redis that keeps nothing
    with pytest.raises(GenerationError, match="Redis lost its data"):
        emit(rt, 1, ENGINE)


def test_reset_through_the_cli_refuses_a_live_run_with_one_line(tf, redis_url, home):
    assert tf("produce", "wordcount", "-", input="a b\nc d\n").returncode == 0
    rt = runtime("wordcount", redis_url, home)
    coordinate_run(rt, "manual__2026", lease_ms=600_000)
    refused = tf("reset", "wordcount", "--yes")
    assert refused.returncode == 1
    assert refused.stderr.count("\n") == 1 and "reset --force" in refused.stderr
    forced = tf("reset", "wordcount", "--yes", "--force", "--source")
    assert forced.returncode == 0, forced.stderr
    assert tf("produce", "wordcount", "-", input="x y\n").returncode == 0
    assert tf("run", "wordcount", "--engine", "local").returncode == 0
    assert tf("audit", "wordcount").stdout.strip() == "lost=0 doubled=0"
