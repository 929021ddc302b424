"""Every path that abandons an emit attempt deletes its staging (issue: staging garbage that
grew without bound): a refused batch whose blocks executors wrote before the checks, the
blocks of killed Spark task attempts, an emit killed part-way, a commit killed after its mark,
a batch the commit refuses, a rewind over pending txids, and a zombie step of a committed txid
(which must not recreate the txid's ledger hash either). Each path, for both staging kinds,
ends with nothing staged: ``staging_left`` is what the chaos harness checks after every
schedule."""

from __future__ import annotations

import time

import pytest

from tests.helpers import produce, sentences
from tests.pipelines import POISON
from tests.test_state_shards import _runtime
from tridentflow.devtools.chaos import staging_left
from tridentflow.engines.base import ComputeResult, ExecContext, Ranges
from tridentflow.engines.blocks import write_state_blocks
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import IncompleteBatchError, TooManyBadRecordsError
from tridentflow.faults import Fault, FaultPlan, SimulatedCrash
from tridentflow.ops.audit import audit
from tridentflow.ops.reset import reset_pipeline
from tridentflow.ops.rewind import rewind_pipeline
from tridentflow.plan import Plan
from tridentflow.redisconn import connect
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.runs import note_task
from tridentflow_state.staged import BlockWriter, WrittenBlocks

KINDS = ("files", "redis")


class ExecutorsStage(LocalEngine):
    """The local engine, staging as Spark's executors do with TRIDENTFLOW_STAGING=redis: each
    state's blocks written by ``write_state_blocks`` (what executors run) before the emit's
    checks, and one more task attempt of each state - killed, or beaten by a speculative
    copy - whose blocks no manifest names."""

    def compute(self, plan: Plan, log_root: str, ranges: Ranges, ctx: ExecContext):
        result = super().compute(plan, log_root, ranges, ctx)
        if ctx.blocks is None:
            return result
        client = connect(ctx.redis_url)
        partials: dict = {}
        names = sorted(result.partials)
        for index, name in enumerate(names):
            pairs = list(result.partials[name])
            killed = BlockWriter(client, ctx.blocks, f"{name}.0.1")  # the lost task attempt
            for key, _value in pairs:
                killed.add(key, "0")
            killed.close()
            refs = dict(
                write_state_blocks(ctx.redis_url, ctx.blocks, names, ((index, p) for p in pairs))
            )
            partials[name] = WrittenBlocks(refs.get(index, []))
        client.close()
        return ComputeResult(result.counts, partials, result.bad, result.stages)


ENGINE = ExecutorsStage()


def _fresh(pipeline: str, kind: str, redis_url: str, tmp_path, monkeypatch, shards: int = 2):
    monkeypatch.setenv("TRIDENTFLOW_STAGING", kind)
    rt = _runtime(pipeline, redis_url, tmp_path / kind, shards, f"clean-{kind}")
    rt.ledger.reset(force=True)
    return rt


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_batch_leaves_nothing_staged(kind, redis_url, tmp_path, monkeypatch):
    """Too many bad records: the executors had written every block before the check."""
    rt = _fresh("tests.pipelines:strict_poison", kind, redis_url, tmp_path, monkeypatch)
    produce(rt, [*sentences(40, seed=3), POISON, f"a {POISON}", "b c"])
    coordinate(rt, 1, batch_size=100)
    with pytest.raises(TooManyBadRecordsError):
        emit(rt, 1, ENGINE)
    assert rt.ledger.attempts(1, "emit") == 1
    assert staging_left(rt) == []


@pytest.mark.parametrize("kind", KINDS)
def test_an_incomplete_batch_leaves_nothing_staged(kind, redis_url, tmp_path, monkeypatch):
    """A tuple lost in an exchange (lose-tuple): refused by the completeness check."""
    rt = _fresh("user-scores", kind, redis_url, tmp_path, monkeypatch)
    produce(rt, [[f"u{i % 7}", i] for i in range(60)])
    rt = rt.with_(faults=FaultPlan.parse("lose-tuple@1"))
    coordinate(rt, 1, batch_size=100)
    with pytest.raises(IncompleteBatchError):
        emit(rt, 1, ENGINE)
    assert staging_left(rt) == []
    emit(rt, 1, ENGINE)
    assert commit(rt, 1).status == "committed"
    assert staging_left(rt) == []


def test_blocks_of_killed_task_attempts_go_once_the_attempt_stages(
    redis_url, tmp_path, monkeypatch
):
    rt = _fresh("wordcount", "redis", redis_url, tmp_path, monkeypatch, shards=3)
    produce(rt, sentences(200, seed=4))
    coordinate(rt, 1, batch_size=1000)
    staged = emit(rt, 1, ENGINE)
    listed = {staged.space.key(r) for name in rt.pipeline.states for r in staged.blocks(name)}
    left = {k for k in staging_left(rt) if ":block:" in k}
    assert left == listed and listed  # the killed attempt's blocks are gone, the kept ones not
    assert commit(rt, 1).status == "committed"
    assert staging_left(rt) == []


@pytest.mark.parametrize("kind", KINDS)
def test_an_emit_killed_part_way_is_cleaned_by_the_next_attempt(
    kind, redis_url, tmp_path, monkeypatch
):
    """Killed after its blocks and files, before its manifest: nothing can delete them then;
    the txid's next emit attempt does (all attempts but the recorded one)."""
    rt = _fresh("wordcount", kind, redis_url, tmp_path, monkeypatch)
    produce(rt, sentences(100, seed=6))
    rt = rt.with_(faults=FaultPlan((Fault("in-emit", 1, 1, "crash"),)))
    coordinate(rt, 1, batch_size=1000)
    with pytest.raises(SimulatedCrash):
        emit(rt, 1, ENGINE)
    assert staging_left(rt)  # what the killed attempt wrote
    staged = emit(rt, 1, ENGINE)
    assert staged.attempt == 2
    assert all(f":{1}:2:" in k or "attempt-2" in k or k.endswith(":blocks") or k.endswith(":1")
               for k in staging_left(rt)), staging_left(rt)  # fmt: skip
    assert commit(rt, 1).status == "committed"
    assert staging_left(rt) == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_commit_killed_after_its_mark_leaves_nothing_once_retried(
    kind, redis_url, tmp_path, monkeypatch
):
    rt = _fresh("wordcount", kind, redis_url, tmp_path, monkeypatch)
    produce(rt, sentences(60, seed=7))
    rt = rt.with_(
        faults=FaultPlan((Fault("after-mark", 1, 1, "crash"), Fault("after-mark", 2, 1, "crash")))
    )
    coordinate(rt, 1, batch_size=20)
    emit(rt, 1, ENGINE)
    with pytest.raises(SimulatedCrash):
        commit(rt, 1)
    assert rt.ledger.committed_txid() == 1 and staging_left(rt)
    assert commit(rt, 1).status == "already-committed"  # the task's retry
    assert staging_left(rt) == []
    # never retried: the next txid's commit deletes it
    coordinate(rt, 2, batch_size=20)
    emit(rt, 2, ENGINE)
    with pytest.raises(SimulatedCrash):
        commit(rt, 2)
    coordinate(rt, 3, batch_size=20)
    emit(rt, 3, ENGINE)
    assert commit(rt, 3).status == "committed"
    assert staging_left(rt) == []


@pytest.mark.parametrize("kind", KINDS)
def test_commits_cut_after_their_marks_in_a_row_leave_nothing_after_the_next(
    kind, redis_url, tmp_path, monkeypatch
):
    """Txids 1 and 2 each cut short after the mark and never retried (Redis paused across
    the retries' cleanup too - the chaos harness's every-family soak found it): txid 3's
    commit deletes what both left in files, not only txid 2's; in Redis, txid 1's is left to
    its TTL (finding it would take a SCAN), never without one."""
    rt = _fresh("wordcount", kind, redis_url, tmp_path, monkeypatch)
    produce(rt, sentences(60, seed=8))
    rt = rt.with_(faults=FaultPlan(tuple(Fault("after-mark", t, 1, "crash") for t in (1, 2))))
    for txid in (1, 2):
        coordinate(rt, txid, batch_size=20)
        emit(rt, txid, ENGINE)
        with pytest.raises(SimulatedCrash):
            commit(rt, txid)
    coordinate(rt, 3, batch_size=20)
    emit(rt, 3, ENGINE)
    assert commit(rt, 3).status == "committed"
    left = staging_left(rt)
    if kind == "redis":
        generation = rt.ledger.generation
        assert left and all(f"{generation}:1" in k and rt.client.ttl(k) > 0 for k in left)
    else:
        assert left == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_the_commit_refuses_is_deleted(kind, redis_url, tmp_path, monkeypatch):
    """Staged from offsets the ledger does not stand at (here moved by hand, as a replayed
    txid before it would move them): it can never commit, and goes when refused."""
    rt = _fresh("wordcount-opaque", kind, redis_url, tmp_path, monkeypatch)
    produce(rt, sentences(30, seed=8))
    coordinate(rt, 1, batch_size=5)
    staged = emit(rt, 1, ENGINE)
    partition = min(staged.ranges)
    rt.client.hset(rt.keyspace.offsets, partition, 1)
    with pytest.raises(IncompleteBatchError, match="emit it again"):
        commit(rt, 1)
    assert staging_left(rt) == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_rewind_deletes_what_pending_txids_staged(kind, redis_url, tmp_path, monkeypatch):
    rt = _fresh("wordcount", kind, redis_url, tmp_path, monkeypatch)
    rt = rt.with_(retain=5)
    produce(rt, sentences(60, seed=9))
    for txid in (1, 2):
        coordinate(rt, txid, batch_size=10)
        emit(rt, txid, ENGINE)
        assert commit(rt, txid).status == "committed"
    rt.ledger.claim(3, "run-3")
    coordinate(rt, 3, batch_size=10)
    emit(rt, 3, ENGINE)  # pending: staged, never committed
    assert staging_left(rt)
    rewind_pipeline(rt, 1, force=True)
    assert staging_left(rt) == []


@pytest.mark.parametrize("kind", KINDS)
def test_zombie_steps_of_a_committed_txid_recreate_nothing(kind, redis_url, tmp_path, monkeypatch):
    """A late emit, a cleared coordinator and a task's try record for txid 1 after txid 2
    committed (which deleted txid 1's ledger hash): nothing is written, nothing staged."""
    rt = _fresh("wordcount", kind, redis_url, tmp_path, monkeypatch)
    produce(rt, sentences(40, seed=10))
    for txid in (1, 2):
        coordinate(rt, txid, batch_size=10)
        emit(rt, txid, ENGINE)
        commit(rt, txid)
    assert not rt.client.exists(rt.keyspace.tx(1))
    assert emit(rt, 1, ENGINE) is None
    assert coordinate(rt, 1, batch_size=10) == {"txid": 1, "already_committed": True}
    note_task(rt, 1, "emit", 3, 1, True, "late-run")
    assert rt.ledger.next_attempt(1, "emit") == 0
    assert rt.ledger.record_staged(1, 7) == 0
    assert rt.ledger.store_metadata(1, {"mode": "transactional"}) is None
    assert not rt.client.exists(rt.keyspace.tx(1))
    assert staging_left(rt) == []


def test_a_zombie_emit_that_stages_after_the_commit_deletes_its_attempt(
    redis_url, tmp_path, monkeypatch
):
    """The emit passed its committed check, then the txid committed (another attempt) while
    it computed: its manifest is written, the ledger refuses to record it, it deletes it."""
    rt = _fresh("wordcount", "redis", redis_url, tmp_path, monkeypatch)
    produce(rt, sentences(40, seed=11))
    coordinate(rt, 1, batch_size=100)
    emit(rt, 1, ENGINE)
    zombie_rt = _runtime("wordcount", redis_url, tmp_path / "redis", 2, "clean-redis")

    class CommitsMeanwhile(ExecutorsStage):
        def compute(self, plan, log_root, ranges, ctx):
            assert commit(rt, 1).status == "committed"
            return super().compute(plan, log_root, ranges, ctx)

    assert emit(zombie_rt, 1, CommitsMeanwhile()) is None
    assert staging_left(rt) == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_zombie_emit_whose_staging_the_commit_deleted_under_it_finds_the_txid_committed(
    kind, redis_url, tmp_path, monkeypatch
):
    """The family 'a stalled holder' (the chaos harness's paused family found it): an emit
    stops between its blocks and its manifest - its process paused - past its lease, while
    another attempt of the txid commits and deletes every attempt's staging, the directory
    it was writing into included; when it goes on, it answers as any emit of a committed
    txid does (None), not with the error of the missing directory, and leaves nothing."""
    import tridentflow.faults

    rt = _fresh("wordcount", kind, redis_url, tmp_path, monkeypatch)
    produce(rt, sentences(40, seed=12))
    coordinate(rt, 1, batch_size=100)
    emit(rt, 1, ENGINE)  # attempt 1: the one the commit applies
    stalled = rt.with_(faults=FaultPlan((Fault("in-emit", 1, 2, "stall"),)))
    monkeypatch.setattr(
        tridentflow.faults,
        "STALL_HOOK",
        lambda fault: commit(rt, 1),  # meanwhile
    )
    assert emit(stalled, 1, ENGINE) is None
    assert rt.ledger.committed_txid() == 1
    assert staging_left(rt) == []


def test_a_zombie_emit_whose_staging_was_deleted_under_it_into_a_paused_redis_fails_in_one_line(
    redis_url, tmp_path, monkeypatch
):
    """The same stalled emit, going on into a paused Redis (the paused family's
    ``stalled-into-pause``): its manifest's directory is gone and Redis cannot say whether the
    txid committed. It fails in one line a retry helps (IncompleteBatchError), not with the
    missing directory's FileNotFoundError (which ended the harness); its retry finds the txid
    committed and leaves nothing."""
    import redis

    import tridentflow.faults
    from tridentflow_state.ledger import Ledger

    rt = _fresh("wordcount", "files", redis_url, tmp_path, monkeypatch)
    produce(rt, sentences(40, seed=12))
    coordinate(rt, 1, batch_size=100)
    emit(rt, 1, ENGINE)
    stalled = rt.with_(faults=FaultPlan((Fault("in-emit", 1, 2, "stall"),)))
    committed_txid = Ledger.committed_txid
    paused = []

    def unanswered(self):
        if paused:
            raise redis.TimeoutError("Timeout reading from socket")
        return committed_txid(self)

    def meanwhile(fault):
        commit(rt, 1)
        paused.append(True)  # Redis stops as the stale emit goes on

    monkeypatch.setattr(tridentflow.faults, "STALL_HOOK", meanwhile)
    monkeypatch.setattr(Ledger, "committed_txid", unanswered)
    with pytest.raises(IncompleteBatchError, match="deleted while it was written") as caught:
        emit(stalled, 1, ENGINE)
    assert "\n" not in str(caught.value)
    paused.clear()
    assert emit(rt, 1, ENGINE) is None  # the retry
    assert staging_left(rt) == []


def test_a_commit_whose_staged_files_vanish_under_it_fails_in_one_line(
    redis_url, tmp_path, monkeypatch
):
    """The family 'staging deleted under a zombie' on the commit's side (the every-family
    soak, seed 7103: a stale attempt of txid 6 read its files while the commit of txid 7
    deleted them): half-way through, the txid's staging goes; the commit fails with one
    line naming the file and marks nothing, not with the missing file's error."""
    import tridentflow.faults

    rt = _fresh("partitioned-count", "files", redis_url, tmp_path, monkeypatch)
    produce(rt, sentences(40, seed=13))
    coordinate(rt, 1, batch_size=100)
    emit(rt, 1, ENGINE)
    stalled = rt.with_(faults=FaultPlan((Fault("mid-commit", 1, 1, "stall"),)))
    monkeypatch.setattr(tridentflow.faults, "STALL_HOOK", lambda fault: rt.discard_staged(1))
    with pytest.raises(IncompleteBatchError, match=r"staged file .* is gone .*: retry"):
        commit(stalled, 1)
    assert rt.ledger.committed_txid() == 0


@pytest.mark.parametrize("kind", KINDS)
def test_a_runtime_that_reset_its_pipeline_stages_in_the_new_generation(
    kind, redis_url, tmp_path, monkeypatch
):
    """The family 'an operator acting mid-run' through the operator's own process: after
    ``reset_pipeline(rt)`` the same runtime's emits stage under the new generation (they
    staged under the old one, whose keys nothing deletes)."""
    rt = _fresh("wordcount", kind, redis_url, tmp_path, monkeypatch)
    produce(rt, sentences(20, seed=12))
    coordinate(rt, 1, batch_size=100)
    emit(rt, 1, ENGINE)
    reset_pipeline(rt, force=True)
    generation = rt.ledger.current_generation()
    produce(rt, sentences(20, seed=13))
    coordinate(rt, 1, batch_size=100)
    emit(rt, 1, ENGINE)
    assert staging_left(rt) and all(generation in k for k in staging_left(rt))
    assert commit(rt, 1).status == "committed"
    assert staging_left(rt) == []


@pytest.mark.parametrize("kind", KINDS)
def test_a_zombie_run_whose_txid_was_adopted_and_committed_deletes_what_it_staged(
    kind, redis_url, tmp_path, monkeypatch
):
    """The family 'a zombie's step fails after its txid was adopted and committed': run A's
    emit computes past its lease while run B adopts the txid and commits it; A then stages
    (after B's commit deleted the txid's staging) and its emit fails before the ledger
    answers (Redis paused at that moment, say). Its retry is refused - the txid is B's - but
    first deletes what A staged for the committed txid: nothing waits for the next txid's
    commit. (The every-family soak's seed 7216 left such an attempt of the last txid once.)"""
    import redis

    from tridentflow.steps.runs import RunNotBoundError, commit_run, coordinate_run, emit_run
    from tridentflow_state.ledger import Ledger

    rt = _fresh("wordcount", kind, redis_url, tmp_path, monkeypatch)
    produce(rt, sentences(40, seed=13))
    coordinate_run(rt, "run-a", batch_size=100, lease_ms=200)
    failures = []
    record_staged = Ledger.record_staged

    def unanswered(self, txid, attempt):
        if failures:  # A's: Redis gives no answer (it ran nothing)
            raise redis.TimeoutError("Timeout reading from socket")
        return record_staged(self, txid, attempt)

    class AdoptedMeanwhile(ExecutorsStage):
        def compute(self, plan, log_root, ranges, ctx):
            if not failures:  # run A, past its lease: B adopts and commits
                time.sleep(0.3)
                other = _runtime("wordcount", redis_url, tmp_path / kind, 2, f"clean-{kind}")
                coordinate_run(other, "run-b", batch_size=100)
                emit_run(other, "run-b", ENGINE)
                assert commit_run(other, "run-b")["status"] == "committed"
                assert staging_left(rt) == []
                failures.append("run-a")
            return super().compute(plan, log_root, ranges, ctx)

    monkeypatch.setattr(Ledger, "record_staged", unanswered)
    with pytest.raises(redis.TimeoutError):
        emit_run(rt, "run-a", AdoptedMeanwhile(), lease_ms=200)
    assert staging_left(rt) == []  # A's attempt, staged after B's commit, went with its failure
    monkeypatch.setattr(Ledger, "record_staged", record_staged)
    with pytest.raises(RunNotBoundError, match="adopted by run run-b"):
        emit_run(rt, "run-a", ENGINE, lease_ms=200)  # its task's retry
    assert staging_left(rt) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("ran", [False, True], ids=["not-run", "ran-late"])
def test_an_attempt_whose_record_goes_unanswered_deletes_its_staging_before_it_fails(
    kind, ran, redis_url, tmp_path, monkeypatch
):
    """The family 'a step's last ledger write goes unanswered and the step is never retried'
    (its retries spent; a zombie nobody retries; the every-family soak's seed 8421 left txid
    5's attempt 1 in files): the emit stages, ``record_staged`` times out - ``ran``: Redis
    ran it late, so the ledger names the attempt - and the emit deletes what it staged before
    it fails. A commit that then finds the recorded attempt gone fails in one line; emitted
    again, the txid commits exactly."""
    import redis

    from tridentflow_state.ledger import Ledger

    rt = _fresh("wordcount", kind, redis_url, tmp_path, monkeypatch)
    produce(rt, sentences(40, seed=21))
    coordinate(rt, 1, batch_size=100)
    record_staged = Ledger.record_staged

    def unanswered(self, txid, attempt):
        if ran:
            record_staged(self, txid, attempt)
        raise redis.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(Ledger, "record_staged", unanswered)
    with pytest.raises(redis.TimeoutError):
        emit(rt, 1, ENGINE)
    assert staging_left(rt) == []
    monkeypatch.setattr(Ledger, "record_staged", record_staged)
    if ran:
        with pytest.raises(IncompleteBatchError):
            commit(rt, 1)
    emit(rt, 1, ENGINE)
    assert commit(rt, 1).status == "committed"
    assert staging_left(rt) == []
    report = audit(rt)
    assert report.ok and report.records == 40, report.line()
