"""Coordinator, emitter and commit together, on a real Redis, with the local engine."""

from __future__ import annotations

import json

import pytest

from tests.helpers import produce, runtime, sentences, word_counts
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import IncompleteBatchError, NotReadyError, PartitionUnavailableError
from tridentflow.faults import FaultPlan, InjectedFaultError
from tridentflow.ops.audit import audit
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.driver import run_batches
from tridentflow.steps.emitter import emit
from tridentflow.steps.query import query
from tridentflow_state.codec import encode_key

ENGINE = LocalEngine()
POINTS = ["after-coordinate", "in-emit", "mid-commit", "before-ledger"]
MODES = ["wordcount", "wordcount-opaque"]


def counts(rt, words):
    persist = rt.pipeline.states["counts"]
    return dict(zip(words, query(rt, persist, [(w,) for w in words])[1], strict=True))


@pytest.mark.parametrize("name", MODES)
@pytest.mark.parametrize("point", POINTS)
def test_every_fault_point_raised_then_resumed_is_exact(redis_url, redis_client, home, name, point):
    lines = sentences(40)
    rt = runtime(name, redis_url, home, faults=f"{point}@2")
    produce(rt, lines)
    with pytest.raises(InjectedFaultError):
        run_batches(rt, ENGINE, batch_size=3)
    assert rt.ledger.committed_txid() == 1
    run_batches(rt, ENGINE, batch_size=3)  # resume: same txid 2, attempt 2
    report = audit(rt)
    assert (report.lost, report.doubled, report.mismatched) == (0, 0, [])
    expected = word_counts(lines)
    assert counts(rt, list(expected)) == expected
    assert rt.ledger.pending_txids() == []


def test_a_retried_coordinator_reuses_the_stored_metadata(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(10))
    first = coordinate(rt, 1, batch_size=2)
    produce(rt, sentences(10, seed=2))  # the log grows between attempts
    assert coordinate(rt, 1, batch_size=50) == first
    assert rt.ledger.attempts(1, "coordinate") == 2


def test_transactional_source_waits_for_a_dark_partition(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home, faults="dark:1@1")
    produce(rt, sentences(8))
    coordinate(rt, 1)
    with pytest.raises(PartitionUnavailableError, match="partition 1"):
        emit(rt, 1, ENGINE)
    rt = rt.with_(faults=FaultPlan())  # the partition is back
    emit(rt, 1, ENGINE)
    assert commit(rt, 1).records == 8


def test_seed_003_a_dark_partition_lands_in_a_later_txid(redis_url, redis_client, home):
    """16 partitions; partition 3 unreadable during txids 2-4, readable again at txid 5."""
    rt = runtime("partitioned-count", redis_url, home, faults="dark:3@2-4")
    per_partition = 12
    rt.source_heads()
    for p in range(16):
        rt.log.append(p, [f"e{p}-{i}" for i in range(per_partition)])
    results = run_batches(rt, ENGINE, max_batches=6, batch_size=4).results
    assert [r.skipped_partitions for r in results[1:4]] == [(3,), (3,), (3,)]
    assert rt.ledger.committed_offsets()[3] == per_partition  # caught up after txid 5
    assert query(rt, rt.pipeline.states["total"], [])[1] == [16 * per_partition]
    assert audit(rt).ok


def test_opaque_replay_with_a_smaller_batch_rolls_back_the_first_attempt(
    redis_url, redis_client, home
):
    """Attempt 1 of txid 1 commits half its keys and dies; then partition 0 goes dark and the
    replay lacks its records. They must not stay counted: they arrive again in txid 2."""
    rt = runtime("wordcount-opaque", redis_url, home, faults="mid-commit@1")
    rt.source_heads()
    rt.log.append(0, ["alpha beta gamma delta"])
    rt.log.append(1, ["omega"])
    coordinate(rt, 1)
    emit(rt, 1, ENGINE)
    with pytest.raises(InjectedFaultError):
        commit(rt, 1)
    rt = rt.with_(faults=FaultPlan.parse("dark:0@1"))
    emit(rt, 1, ENGINE)  # attempt 2 skips partition 0
    result = commit(rt, 1)
    assert result.rolled_back > 0
    rt = rt.with_(faults=FaultPlan())
    run_batches(rt, ENGINE)
    assert counts(rt, ["alpha", "delta", "omega"]) == {"alpha": 1, "delta": 1, "omega": 1}
    assert audit(rt).ok


def test_a_torn_staged_batch_fails_instead_of_committing(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    rt = rt.with_(staging_kind="files")  # a torn file (Redis blocks: tests/test_redis_staging.py)
    produce(rt, sentences(12))
    coordinate(rt, 1)
    staged = emit(rt, 1, ENGINE)
    path = staged.directory / staged.manifest["states"]["counts"]["file"]
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(IncompleteBatchError, match="lines"):
        commit(rt, 1)
    emit(rt, 1, ENGINE)  # a new attempt restages it
    assert commit(rt, 1).status == "committed"
    assert audit(rt).ok


def test_a_batch_whose_counts_disagree_with_its_ranges_fails(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    rt = rt.with_(staging_kind="files")  # the manifest doctored on disk
    produce(rt, sentences(12))
    coordinate(rt, 1)
    staged = emit(rt, 1, ENGINE)
    manifest = json.loads((staged.directory / "MANIFEST.json").read_text())
    manifest["counts"]["0"][0] -= 1  # an executor's output went missing
    (staged.directory / "MANIFEST.json").write_text(json.dumps(manifest))
    with pytest.raises(IncompleteBatchError, match="should hold"):
        commit(rt, 1)
    assert rt.ledger.committed_txid() == 0


def test_an_empty_batch_commits_without_state_writes(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    coordinate(rt, 1)
    emit(rt, 1, ENGINE)
    assert commit(rt, 1).keys == 0
    assert rt.ledger.committed_txid() == 1
    assert redis_client.exists(rt.keyspace.state("counts")) == 0


def test_commit_before_emit_and_out_of_order_steps_are_refused(redis_url, redis_client, home):
    rt = runtime("wordcount-opaque", redis_url, home)
    produce(rt, sentences(5))
    with pytest.raises(NotReadyError, match="metadata"):
        emit(rt, 1, ENGINE)
    coordinate(rt, 1)
    with pytest.raises(NotReadyError, match="no staged output"):
        commit(rt, 1)
    coordinate(rt, 2)
    with pytest.raises(NotReadyError, match="emit txid 1 first"):
        emit(rt, 2, ENGINE)
    emit(rt, 1, ENGINE)
    assert commit(rt, 1).status == "committed"
    assert commit(rt, 1).status == "already-committed"
    assert emit(rt, 1, ENGINE) is None


def test_two_commit_attempts_racing_only_one_lands(redis_url, redis_client, home):
    import threading

    rt = runtime("wordcount-opaque", redis_url, home)
    lines = sentences(30)
    produce(rt, lines)
    coordinate(rt, 1)
    emit(rt, 1, ENGINE)
    outcomes: list[str] = []

    def attempt():
        try:
            outcomes.append(commit(runtime("wordcount-opaque", redis_url, home), 1).status)
        except Exception as exc:  # the fenced-out zombie
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=attempt) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("committed") == 1
    assert audit(rt).ok
    assert counts(rt, ["man"])["man"] == word_counts(lines).get("man", 0)


def test_keys_are_namespaced_per_pipeline(redis_url, redis_client, home):
    a, b = runtime("wordcount", redis_url, home), runtime("wordcount-opaque", redis_url, home)
    produce(a, ["x y"])
    produce(b, ["x"])
    run_batches(a, ENGINE)
    run_batches(b, ENGINE)
    assert counts(a, ["x"]) == {"x": 1} and counts(b, ["x"]) == {"x": 1}
    assert redis_client.hget(a.keyspace.state("counts"), encode_key(("y",))) is not None


def test_a_later_txid_that_finished_emitting_first_waits_and_commits_after(
    redis_url, redis_client, home
):
    import threading
    import time

    rt = runtime("wordcount", redis_url, home)
    lines = sentences(40)
    produce(rt, lines)
    coordinate(rt, 1, batch_size=4)
    coordinate(rt, 2, batch_size=4)
    emit(rt, 2, ENGINE)  # txid 2 is ready first
    finished: dict[int, float] = {}

    def commit_two():
        commit(runtime("wordcount", redis_url, home), 2, wait=30)
        finished[2] = time.monotonic()

    waiter = threading.Thread(target=commit_two)
    waiter.start()
    time.sleep(0.5)
    assert rt.ledger.committed_txid() == 0 and 2 not in finished  # it waits
    emit(rt, 1, ENGINE)
    commit(rt, 1)
    finished[1] = time.monotonic()
    waiter.join(timeout=30)
    assert finished[1] < finished[2]
    assert rt.ledger.committed_txid() == 2
    run_batches(rt, ENGINE)
    assert audit(rt).ok


def test_opaque_pipelining_and_a_stale_base_is_re_emitted(redis_url, redis_client, home):
    rt = runtime("wordcount-opaque", redis_url, home)
    lines = sentences(20)
    produce(rt, lines[:10])
    for txid in (1, 2):
        coordinate(rt, txid, batch_size=1)
    emit(rt, 1, ENGINE)
    emit(rt, 2, ENGINE)  # starts where txid 1's staged attempt stops
    produce(rt, lines[10:])
    emit(rt, 1, ENGINE)  # txid 1 replayed: same start, so same base for txid 2 here
    assert commit(rt, 1).status == "committed"
    assert commit(rt, 2).status == "committed"
    coordinate(rt, 3, batch_size=1)
    coordinate(rt, 4, batch_size=1)
    emit(rt, 3, ENGINE)
    emit(rt, 4, ENGINE)
    rt = rt.with_(faults=FaultPlan.parse("dark:0@3"))
    emit(rt, 3, ENGINE)  # txid 3 replayed without partition 0: txid 4's base is now stale
    rt = rt.with_(faults=FaultPlan())
    commit(rt, 3)
    with pytest.raises(IncompleteBatchError, match="emit it again"):
        commit(rt, 4)
    emit(rt, 4, ENGINE)
    assert commit(rt, 4).status == "committed"
    run_batches(rt, ENGINE)
    assert audit(rt).ok
    expected = word_counts(lines)
    assert counts(rt, list(expected)) == expected
