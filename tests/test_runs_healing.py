"""The orchestrator path heals itself and spends Spark only on real work (tridentflow.steps.runs):
a txid held by a run the orchestrator says has finished is adopted at once, a live owner keeps
its txid, a refused commit names what blocks it and what unblocks it, an emit knows when it
has nothing to do, and the ledger counts the orchestrator's tries and task time."""

from __future__ import annotations

import time

import pytest

from tests.helpers import produce, runtime, sentences
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import TridentflowError
from tridentflow.ops.status import describe_commit, step_seconds, step_tries
from tridentflow.steps.runs import (
    LOCAL_EMIT_ENV,
    batch_records,
    commit_run,
    coordinate_run,
    emit_plan,
    emit_run,
    note_task,
    release_finished_owners,
    release_run,
)
from tridentflow_state.errors import CommitOrderError

ENGINE = LocalEngine()


def states(**by_run: str):
    return lambda run_id: by_run.get(run_id.replace("-", "_"))


@pytest.mark.parametrize("finished", ["failed", "success"])
def test_a_txid_held_by_a_finished_run_is_adopted_by_the_next_run_at_once(
    finished, redis_url, redis_client, home
):
    """Redis was down through every retry of run-1 and its failure callback: its 30-minute
    lease is live, but Airflow says run-1 has finished. The next run takes its txid."""
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(8))
    coordinate_run(rt, "run-1", batch_size=1, lease_ms=30 * 60_000)
    bound = coordinate_run(rt, "run-2", batch_size=1, run_state=states(run_1=finished))
    assert (bound["txid"], bound["binding"]) == (1, "adopted")
    assert bound["released"] == [{"txid": 1, "owner": "run-1", "state": finished}]
    emit_run(rt, "run-2", ENGINE)
    assert commit_run(rt, "run-2")["status"] == "committed"


def test_a_live_owner_keeps_its_txid(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(8))
    coordinate_run(rt, "run-1", batch_size=1)
    for state in ("running", "queued", None):  # None: the orchestrator cannot tell
        assert release_finished_owners(rt, "run-2", states(run_1=state)) == []
    assert coordinate_run(rt, "run-2", batch_size=1, run_state=states(run_1="running"))["txid"] == 2


def test_a_refused_commit_names_the_blocking_txid_its_run_and_the_way_out(
    redis_url, redis_client, home
):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(8))
    coordinate_run(rt, "run-1", batch_size=1)
    coordinate_run(rt, "run-2", batch_size=1)
    emit_run(rt, "run-2", ENGINE)
    with pytest.raises(CommitOrderError) as live:
        commit_run(rt, "run-2", run_state=states(run_1="running"))
    line = str(live.value)
    assert "txid 2 cannot commit before txid 1, held by run run-1 (running)" in line
    assert "let it finish, or mark it failed" in line and "\n" not in line
    with pytest.raises(CommitOrderError) as failed:
        commit_run(rt, "run-2", run_state=states(run_1="failed"))
    assert "held by run run-1, which failed (failed) without committing it" in str(failed.value)
    assert "released now, so the next run adopts it" in str(failed.value)
    assert coordinate_run(rt, "run-3", batch_size=1)["txid"] == 1  # adopted, no clear needed
    emit_run(rt, "run-3", ENGINE)
    commit_run(rt, "run-3")
    assert commit_run(rt, "run-2")["status"] == "committed"  # run-2's retry now lands


@pytest.mark.parametrize("name", ["wordcount", "wordcount-opaque"])
def test_an_emit_knows_when_there_is_nothing_to_do(
    name, redis_url, redis_client, home, monkeypatch
):
    # the default limit, whatever another test module's conftest set in this worker
    monkeypatch.delenv(LOCAL_EMIT_ENV, raising=False)
    rt = runtime(name, redis_url, home)
    produce(rt, sentences(4))
    coordinate_run(rt, "run-1")
    assert emit_plan(rt, "run-1", local_limit=0)[1] == "work"
    emit_run(rt, "run-1", ENGINE)
    commit_run(rt, "run-1")
    assert emit_plan(rt, "run-1") == (1, "committed")  # a cleared emit of a committed txid
    coordinate_run(rt, "run-2")  # no new record since
    assert emit_plan(rt, "run-2") == (2, "empty")
    produce(rt, sentences(2, seed=9))
    if name == "wordcount-opaque":  # an opaque batch reads what is there when it emits
        assert emit_plan(rt, "run-2", local_limit=0) == (2, "work")
        assert emit_plan(rt, "run-2") == (2, "small")
    else:  # a transactional batch was frozen empty: records come in the next txid
        assert emit_plan(rt, "run-2") == (2, "empty")


@pytest.mark.parametrize("name", ["wordcount", "wordcount-opaque"])
def test_a_small_batch_is_told_by_the_records_it_reads(
    name, redis_url, redis_client, home, monkeypatch
):
    """``emit_plan`` says "small" exactly while the batch reads at most the limit: the frozen
    ranges of a transactional txid, the heads beyond the committed positions capped by the
    batch size for the next opaque txid (a pending one before it: unknown, so "work"); the
    limit comes from TRIDENTFLOW_LOCAL_EMIT_MAX_RECORDS, 0 turns it off, a bad one is a line."""
    rt = runtime(name, redis_url, home)
    partitions = rt.pipeline.source.partitions
    produce(rt, sentences(6 * partitions))  # 6 records in each partition
    coordinate_run(rt, "run-1", batch_size=4)
    assert batch_records(rt, 1) == 4 * partitions  # the frozen ranges, or capped by size 4
    assert emit_plan(rt, "run-1", local_limit=4 * partitions) == (1, "small")
    assert emit_plan(rt, "run-1", local_limit=4 * partitions - 1) == (1, "work")
    monkeypatch.setenv(LOCAL_EMIT_ENV, "0")
    assert emit_plan(rt, "run-1") == (1, "work")
    monkeypatch.setenv(LOCAL_EMIT_ENV, "few")
    with pytest.raises(TridentflowError, match="TRIDENTFLOW_LOCAL_EMIT_MAX_RECORDS must be"):
        emit_plan(rt, "run-1")
    monkeypatch.delenv(LOCAL_EMIT_ENV)
    assert emit_plan(rt, "run-1") == (1, "small")  # the default, 10,000
    emit_run(rt, "run-1", ENGINE)
    coordinate_run(rt, "run-2", batch_size=4)
    if name == "wordcount-opaque":  # starts where txid 1's staged attempt stops
        assert batch_records(rt, 2) is None and emit_plan(rt, "run-2")[1] == "work"
    else:
        assert batch_records(rt, 2) == 2 * partitions
    commit_run(rt, "run-1")
    assert batch_records(rt, 2) == 2 * partitions


def test_the_ledger_counts_the_orchestrators_tries_and_task_time(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(4))
    started = 1_700_000_000_000
    result = coordinate_run(rt, "run-1")
    note_task(rt, 1, "coordinate", 1, started, done=True, run_id="run-1")
    emit_run(rt, "run-1", ENGINE)
    # try 3: tries 1-2 never got here; its start and end are recorded twice (idempotent)
    for _ in range(2):
        note_task(rt, 1, "emit", 3, started + 1_000, done=False, run_id="run-1")
    rt.ledger.record_task(1, "emit", 3, started + 1_000, started + 5_000, "run-1")
    rt.ledger.record_task(1, "emit", 3, started + 1_000, started + 5_000, "run-1")
    note_task(rt, 1, "commit", 1, int(time.time() * 1000) - 2_000, done=False, run_id="run-1")
    commit_run(rt, "run-1")
    entry = rt.ledger.history(1)[0]
    emit = entry["steps"]["emit"]
    assert step_tries(emit) == 3 and emit["attempts"] == 1  # Airflow's count wins
    assert emit["task_started_ms"] == started + 1_000  # the first try that reached Redis
    assert emit["task_ms"] == 4_000 and step_seconds(emit) == 4.0  # counted once
    assert 2.0 <= step_seconds(entry["steps"]["commit"]) < 60  # its running try, so far
    assert "emit 4.0s x3" in describe_commit(entry)
    assert result["txid"] == 1


def test_an_adopted_txid_sums_the_tries_and_durations_of_every_run(redis_url, redis_client, home):
    """Was: "1 tries" and the span from the first run's first try to the adopter's end (147 s
    where the tries took 38 s): the adopting run's try 1 was taken for the txid's only one."""
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(4))
    s = 1_700_000_000_000
    coordinate_run(rt, "run-1")
    note_task(rt, 1, "coordinate", 1, s, done=False, run_id="run-1")
    rt.ledger.record_task(1, "coordinate", 1, s, s + 1_000, "run-1")
    for n in (1, 2, 3):  # three emit tries that failed (each recorded its end)
        rt.ledger.record_task(1, "emit", n, s + n * 40_000, s + n * 40_000 + 2_000, "run-1")
    release_run(rt, "run-1")
    coordinate_run(rt, "run-2")
    rt.ledger.record_task(1, "coordinate", 1, s + 150_000, s + 150_500, "run-2")
    emit_run(rt, "run-2", ENGINE)
    rt.ledger.record_task(1, "emit", 1, s + 151_000, s + 159_000, "run-2")
    commit_run(rt, "run-2")
    steps = rt.ledger.history(1)[0]["steps"]
    assert (step_tries(steps["emit"]), steps["emit"]["task_ms"]) == (4, 14_000)
    assert (step_tries(steps["coordinate"]), steps["coordinate"]["task_ms"]) == (2, 1_500)


def test_adopting_a_txid_never_gives_a_step_a_negative_time(redis_url, redis_client, home):
    """Was: an adopting run's coordinate recorded -182 s (its start overwrote the first)."""
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(4))
    coordinate_run(rt, "run-1")
    time.sleep(0.05)  # the adopting run coordinates later
    coordinate_run(rt, "run-2", run_state=states(run_1="failed"))
    emit_run(rt, "run-2", ENGINE)
    commit_run(rt, "run-2")
    for info in rt.ledger.history(1)[0]["steps"].values():
        assert info["started_ms"] is not None and info["ended_ms"] >= info["started_ms"], info


def test_blocked_says_which_txid_which_run_since_when_and_what_to_do(redis_url, redis_client, home):
    """Nothing pending, or a live owner: not blocked. A finished owner (its lease still live)
    or no owner at all: blocked, in one line with the action; read-only (releases nothing)."""
    from tridentflow.steps.runs import blocked

    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(8))
    assert blocked(rt, states()) is None  # nothing pending
    coordinate_run(rt, "run-1", batch_size=1, lease_ms=30 * 60_000)
    assert blocked(rt, states(run_1="running")) is None
    assert blocked(rt, states()) is None  # unknown state: a live lease is not second-guessed
    held = blocked(rt, states(run_1="failed"))
    assert (held["txid"], held["owner"], held["owner_state"]) == (1, "run-1", "failed")
    assert held["since_ms"] and abs(held["since_ms"] - rt.redis_now_ms()) < 60_000
    assert "\n" not in held["line"] and "run run-1, which failed" in held["line"]
    assert "Release" in held["line"]
    assert rt.ledger.tx_info(1)["owner"] == "run-1"  # read-only
    rt.ledger.release(1, "run-1")
    free = blocked(rt, states(run_1="failed"))
    assert free["owner"] is None and "no run holds it" in free["line"]


def test_an_operator_releases_only_a_txid_whose_owner_has_finished(redis_url, redis_client, home):
    from tridentflow.errors import TridentflowError
    from tridentflow.steps.runs import release_finished_owner

    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(8))
    coordinate_run(rt, "run-1", batch_size=1, lease_ms=30 * 60_000)
    for state, refusal in [
        ("running", "run run-1 is running and keeps txid 1"),
        (None, "run run-1 is in an unknown state and keeps txid 1"),
    ]:
        with pytest.raises(TridentflowError, match=refusal):
            release_finished_owner(rt, 1, states(run_1=state) if state else states())
    released = release_finished_owner(rt, 1, states(run_1="failed"))
    assert released == {"txid": 1, "released": True, "owner": "run-1", "owner_state": "failed"}
    with pytest.raises(TridentflowError, match="no run holds txid 1: nothing to release"):
        release_finished_owner(rt, 1, states(run_1="failed"))  # twice: nothing left to release
    with pytest.raises(TridentflowError, match="txid 5 is not known yet"):
        release_finished_owner(rt, 5, states())
    adopted = coordinate_run(rt, "run-2", batch_size=1)
    assert (adopted["txid"], adopted["binding"]) == (1, "adopted")
    emit_run(rt, "run-2", ENGINE)
    commit_run(rt, "run-2")
    with pytest.raises(TridentflowError, match="txid 1 is committed: there is nothing to release"):
        release_finished_owner(rt, 1, states())


def test_a_released_txid_stays_released_for_its_finished_runs_late_steps(
    redis_url, redis_client, home
):
    """The family: an operator acting mid-run. A run is marked failed while its emit is still
    starting (the orchestrator kills it a moment later); the operator releases its txid. The
    late emit's lease renewal must not take the txid back (it did: the view's Release was
    undone a second later, and the pipeline stayed blocked): it is refused in one line, the
    next run adopts the txid, and clearing the released run's coordinator binds it afresh."""
    from tridentflow.steps.runs import RunNotBoundError, release_finished_owner

    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(8))
    coordinate_run(rt, "run-1", batch_size=1, lease_ms=30 * 60_000)
    release_finished_owner(rt, 1, states(run_1="failed"))
    assert not rt.ledger.renew_lease(1, "run-1")  # a release is final for that run
    with pytest.raises(RunNotBoundError, match="txid 1 of run run-1 was released") as refused:
        emit_run(rt, "run-1", ENGINE)  # the late step of the finished run
    assert "\n" not in str(refused.value)
    assert rt.ledger.tx_info(1).get("owner") == "run-1"  # unchanged: still free to adopt
    again = coordinate_run(rt, "run-1", batch_size=1)  # its coordinator cleared: binds again
    assert (again["txid"], again["binding"]) == (1, "bound")
    assert rt.ledger.renew_lease(1, "run-1")  # a new bind clears the release
    rt.ledger.release(1, "run-1")
    adopted = coordinate_run(rt, "run-2", batch_size=1)
    assert (adopted["txid"], adopted["binding"]) == (1, "adopted")
    emit_run(rt, "run-2", ENGINE)
    assert commit_run(rt, "run-2")["status"] == "committed"
