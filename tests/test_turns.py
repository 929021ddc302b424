"""Parallel runs take turns (tridentflow.steps.runs.wait_turn): a backfill's runs under
Airflow wait in their tasks for the txid before them - an opaque source's emit for it to be
staged, a commit for it to commit - while the run holding it is live, and not a moment longer
once it is not. On real Redis, with the steps the Airflow tasks call."""

from __future__ import annotations

import threading
import time

from tests.helpers import produce, runtime, sentences
from tridentflow.engines.local import LocalEngine
from tridentflow.steps.runs import (
    commit_run,
    coordinate_run,
    emit_run,
    ready_to_emit,
    wait_emit_turn,
)


def two_runs(rt) -> None:
    produce(rt, sentences(30, seed=1))
    coordinate_run(rt, "run-a")
    coordinate_run(rt, "run-b")


def test_an_opaque_emit_waits_for_the_txid_before_it_to_be_staged(redis_url, redis_client, home):
    rt = runtime("wordcount-opaque", redis_url, home)
    two_runs(rt)
    assert not ready_to_emit(rt, 2)  # it starts where txid 1 stops
    later = threading.Timer(0.5, lambda: emit_run(rt, "run-a", LocalEngine()))
    started = time.monotonic()
    later.start()
    assert wait_emit_turn(rt, 2, lambda run: "running", timeout=30)
    waited = time.monotonic() - started
    assert 0.4 < waited < 10, waited
    emit_run(rt, "run-b", LocalEngine())  # reads on from txid 1's staged end


def test_a_commit_waits_for_the_txid_before_it_while_its_run_is_live(redis_url, redis_client, home):
    rt = runtime("wordcount-opaque", redis_url, home)
    two_runs(rt)
    emit_run(rt, "run-a", LocalEngine())
    emit_run(rt, "run-b", LocalEngine())
    later = threading.Timer(0.5, lambda: commit_run(rt, "run-a"))
    started = time.monotonic()
    later.start()
    result = commit_run(rt, "run-b", run_state=lambda run: "running", turn_wait=30)
    assert result["status"] == "committed" and result["txid"] == 2
    assert time.monotonic() - started > 0.4


def test_no_wait_for_a_run_that_finished_or_whose_lease_ran_out(redis_url, redis_client, home):
    """A holder Airflow says finished, or (Airflow cannot tell) whose lease ran out, is not
    waited for: the step's own one-line refusal comes at once."""
    rt = runtime("wordcount-opaque", redis_url, home)
    produce(rt, sentences(30, seed=2))
    coordinate_run(rt, "run-a")
    coordinate_run(rt, "run-b")
    assert rt.ledger.release(1, "run-a")  # its lease is over (as a run that gave up)
    for run_state in (lambda run: "failed", None):
        started = time.monotonic()
        assert not wait_emit_turn(rt, 2, run_state, timeout=30)
        assert time.monotonic() - started < 2
    # a transactional txid's ranges are its own: nothing to wait for
    tx = runtime("wordcount", redis_url, home)
    produce(tx, sentences(30, seed=3))
    coordinate_run(tx, "tx-a")
    coordinate_run(tx, "tx-b")
    assert ready_to_emit(tx, 2) and not wait_emit_turn(tx, 2, None, timeout=30)


def test_a_live_holder_is_waited_for_no_longer_than_the_timeout(redis_url, redis_client, home):
    rt = runtime("wordcount-opaque", redis_url, home)
    two_runs(rt)
    started = time.monotonic()
    assert not wait_emit_turn(rt, 2, lambda run: "running", timeout=0.5)
    assert 0.4 < time.monotonic() - started < 5
