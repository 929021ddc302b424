"""Undo logs (tridentflow_state.undo): state as of an older txid (``query --as-of``), and rewind."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from tests.helpers import runtime, sentences
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import TridentflowError
from tridentflow.faults import FaultPlan, InjectedFaultError, SimulatedCrash
from tridentflow.ops.audit import audit
from tridentflow.ops.reset import reset_pipeline
from tridentflow.ops.rewind import RewindRefusedError, rewind_pipeline
from tridentflow.steps.driver import run_batches
from tridentflow.steps.query import list_state, list_state_as_of, query, query_as_of
from tridentflow.steps.runs import RunNotBoundError, commit_run, coordinate_run, emit_run
from tridentflow.steps.runtime import Runtime
from tridentflow_state.errors import (
    GenerationError,
    PipelineBusyError,
    RewindError,
    RewindingError,
)
from tridentflow_state.rewind import rewinding_to

WORDS = ["ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen"]


def lines_for(txid: int) -> list[str]:
    """A batch's lines: sentences, and set/del ops on a few keys (removals included)."""
    rng = random.Random(txid)
    out = [" ".join(rng.choices(WORDS[: 3 + txid % 6], k=3)) for _ in range(3)]
    out += [f"set k{rng.randrange(5)} {rng.randrange(100)}" for _ in range(2)]
    out.append(f"del k{rng.randrange(5)}")
    return out


def everything(rt: Runtime) -> dict[str, dict[tuple, Any]]:
    """Every state's committed items."""
    out = {}
    for name, persist in rt.pipeline.states.items():
        page = list_state(rt, persist, limit=1000)
        assert page.next is None
        out[name] = dict(page.items)
    return out


def run_one(rt: Runtime, txid: int) -> None:
    """Append txid's lines and commit them as one txid, retried as Airflow retries a task
    when a fault is armed (the retry rewrites keys the failed attempt wrote)."""
    rt.log.append_spread(lines_for(txid))
    for _ in range(3):
        try:
            run_batches(rt, LocalEngine(), max_batches=1, batch_size=100)
            break
        except (InjectedFaultError, SimulatedCrash):
            continue
    assert rt.ledger.committed_txid() == txid


@pytest.mark.parametrize("shards", [1, 3])
def test_state_as_of_every_retained_txid_is_what_it_was(redis_url, home, monkeypatch, shards):
    """After each of 9 txids the whole state is noted; then, for every txid the undo logs
    retain (the last 4, and the committed one), every state as of it - listed whole, and
    key by key - is exactly what was noted then: the numeric Lua path, a Python updater with
    removals, a transactional and a global state, sharded and not. Older txids are refused in
    one line naming the range, and no more than 4 txids of undo logs stay in Redis. Commits
    of txids 6-8 are cut short once (half written, or all but the mark) and retried: the
    retry keeps the values from before the txid."""
    monkeypatch.setenv("TRIDENTFLOW_STATE_SHARDS", str(shards))
    monkeypatch.setenv("TRIDENTFLOW_NAMESPACE", f"asof{shards}")
    faults = "mid-commit@6,mid-commit@7,before-ledger@8"  # retried commit attempts
    rt = runtime("tests.pipelines:kept", redis_url, home, faults)
    rt.source_heads()
    noted = {0: everything(rt)}
    for txid in range(1, 10):
        run_one(rt, txid)
        noted[txid] = everything(rt)
    for as_of in range(5, 10):
        for name, persist in rt.pipeline.states.items():
            page = list_state_as_of(rt, persist, as_of)
            assert (page.committed, dict(page.items)) == (as_of, noted[as_of][name]), (
                name,
                as_of,
            )
            keys = sorted(set(noted[as_of][name]) | set(noted[9][name]) | {("nope",)})
            if not persist.group_fields:
                keys = [()]
            got = query_as_of(rt, persist, keys, as_of)[1]
            zero = persist.aggregator.present(None) if name == "kv" else 0
            want = [noted[as_of][name].get(k, zero) for k in keys]
            assert got == want, (name, as_of)
    with pytest.raises(TridentflowError, match=r"txid 4 is outside what pipeline kept retains "
                       r"\(txids 5\.\.9\)"):  # fmt: skip
        query_as_of(rt, rt.pipeline.states["counts"], [("ant",)], 4)
    with pytest.raises(TridentflowError, match="txid 10 is not committed"):
        query_as_of(rt, rt.pipeline.states["counts"], [("ant",)], 10)
    spaces = [rt.keyspace, *(rt.keyspace.shard(i) for i in range(rt.keyspace.shards))]
    found = {k for space in spaces for k in rt.client.scan_iter(space.pattern)}  # ours only
    undo_keys = {k.decode().rsplit(":", 1)[1] for k in found if b":undo:" in k}
    assert undo_keys <= {"6", "7", "8", "9"}, undo_keys


def stored_txids(rt: Runtime) -> set[int]:
    """The txid of every value stored in every state (shards included), as Redis holds it."""
    found = {0}
    for name in rt.pipeline.states:
        for index in range(rt.keyspace.shards):
            for _field, raw in rt.client.hscan_iter(rt.keyspace.shard(index).state(name)):
                txid = json.loads(raw)[0]
                if txid is not None:
                    found.add(txid)
    return found


def runs_through(rt: Runtime, txids: range) -> None:
    for txid in txids:
        run_one(rt, txid)


@pytest.mark.parametrize("shards", [1, 3])
def test_a_rewind_and_a_replay_with_fixed_code_equal_a_recompute(
    redis_url, home, monkeypatch, shards
):
    """Txids 1-5 run the good code, 6-9 a bad deploy (sizes counted once, not twice).
    ``rewind --to 5`` puts every state, the committed txid and the offsets back to exactly
    what they were right after 5 (opaque and transactional, numeric Lua path and a Python
    updater with removals, a global count; sharded and not); a mid-rewind crash is finished
    by running the rewind again; the drain that follows with the fixed code leaves every
    state equal to the audit's recompute of the whole source with that code, and to a
    pipeline that ran the fixed code from the start over the same batches."""
    monkeypatch.setenv("TRIDENTFLOW_STATE_SHARDS", str(shards))
    monkeypatch.setenv("TRIDENTFLOW_NAMESPACE", f"rewind{shards}")
    good = runtime("tests.pipelines:kept_fixed", redis_url, home, "mid-rewind@8=raise")
    good.source_heads()
    runs_through(good, range(1, 6))
    noted, offsets = everything(good), good.ledger.committed_offsets()
    bad = runtime("tests.pipelines:kept", redis_url, home, "mid-commit@7,before-ledger@8")
    runs_through(bad, range(6, 10))
    assert everything(bad) != noted

    with pytest.raises(InjectedFaultError):
        rewind_pipeline(good, 5)
    assert rewinding_to(good.client, good.keyspace) == 5
    with pytest.raises(GenerationError, match=r"being rewound to txid 5: .*rewind kept --to 5"):
        runtime("tests.pipelines:kept_fixed", redis_url, home).ledger.check_generation()
    with pytest.raises(RewindError, match="a rewind to txid 5 is under way"):
        rewind_pipeline(runtime("tests.pipelines:kept", redis_url, home), 4)
    reader = runtime("tests.pipelines:kept_fixed", redis_url, home)  # half restored: no txid's
    for persist in reader.pipeline.states.values():
        with pytest.raises(RewindingError, match=r"is being rewound: .* read again then"):
            list_state(reader, persist, limit=10_000)
        with pytest.raises(RewindingError, match=r"is being rewound: .* read again then"):
            query(reader, persist, [("a",)] if persist.group_fields else [()])
    good = good.with_(faults=FaultPlan())
    report = rewind_pipeline(good, 5)
    assert (report.result.target, report.result.committed) == (5, 9)
    assert good.ledger.committed_txid() == good.ledger.last_txid() == 5
    assert good.ledger.committed_offsets() == offsets
    assert everything(good) == noted
    assert max(stored_txids(good)) <= 5  # no value of a rewound txid is left, even as prev
    assert [h["txid"] for h in good.ledger.history(20)] == [5, 4, 3, 2, 1]
    assert not list(good.client.scan_iter(f"tf:rewind{shards}:*:undo:*:[6-9]"))

    run_batches(good, LocalEngine(), batch_size=3)  # 3 records a partition: as before
    assert good.ledger.committed_txid() == 9
    report = audit(good)
    assert report.ok, report.line()
    assert report.unaudited == ["kv"]  # the last op of a batch wins: batch-dependent
    monkeypatch.setenv("TRIDENTFLOW_NAMESPACE", f"rewind{shards}-reference")
    reference = runtime("tests.pipelines:kept_fixed", redis_url, home)  # the same source
    run_batches(reference, LocalEngine(), batch_size=3)
    assert reference.ledger.committed_txid() == 9
    assert everything(good) == everything(reference)


def test_runs_of_rewound_txids_are_refused_and_rebind_when_cleared(redis_url, home):
    """Runs bound to the txids a rewind took back (committed or pending) are refused at their
    next step in one line naming the rewind; their coordinator, cleared, binds a fresh txid.
    A rewind past the committed txid, or while a run holds a live lease (unless forced),
    changes nothing."""
    rt = runtime("tests.pipelines:kept", redis_url, home)
    rt.source_heads()
    for txid in range(1, 4):
        rt.log.append_spread(lines_for(txid))
        coordinate_run(rt, f"run-{txid}", batch_size=100)
        emit_run(rt, f"run-{txid}", LocalEngine())
        commit_run(rt, f"run-{txid}")
    rt.log.append_spread(lines_for(4))
    coordinate_run(rt, "run-4", batch_size=100)  # pending, its owner alive
    with pytest.raises(RewindError, match=r"txid 7 is not committed"):
        rewind_pipeline(rt, 7)
    with pytest.raises(PipelineBusyError, match=r"run run-4 holds .* or rewind --force$"):
        rewind_pipeline(rt, 1)
    assert rt.ledger.committed_txid() == 3
    report = rewind_pipeline(rt, 1, force=True)
    assert sorted(report.result.runs) == ["run-2", "run-3", "run-4"]
    for run in ("run-2", "run-4"):
        with pytest.raises(RunNotBoundError, match=rf"txid \d of run {run} was rewound"):
            emit_run(rt, run, LocalEngine())
    again = coordinate_run(rt, "run-3", batch_size=100)
    assert (again["txid"], again["binding"]) == (2, "new")
    emit_run(rt, "run-3", LocalEngine())
    commit_run(rt, "run-3")
    assert audit(rt).ok
    assert commit_run(rt, "run-1")["txid"] == 1  # a run before the rewind stands


def test_the_cli_reads_as_of_and_rewinds(tf):
    """The commands as a user types them: ``run --retain-txids``, ``status`` (the rewindable
    range, then the rewind), ``query --as-of``, ``rewind`` (refused without --yes and outside
    the range, one line each), and a ``run`` that recomputes to a clean audit."""
    lines = "how are you\nnice to meet you\nwhat a good day\nyou you you\n" * 4  # 4 txids
    assert tf("produce", "wordcount", "-", input=lines).returncode == 0
    ran = tf("run", "wordcount", "--engine", "local", "--batch-size", "1", "--retain-txids", "3")
    assert ran.returncode == 0, ran.stderr
    status = tf("status", "wordcount").stdout
    assert "rewindable     txids 1..4 (query --as-of, rewind --to)" in status, status
    as_of = tf("query", "wordcount", "you", "--as-of", "2", "--json")
    assert as_of.returncode == 0, as_of.stderr
    assert json.loads(as_of.stdout)["committed_txid"] == 2
    no = tf("rewind", "wordcount", "--to", "2")
    assert no.returncode == 1 and no.stderr.strip().endswith("add --yes"), no.stderr
    far = tf("rewind", "wordcount", "--to", "0", "--yes")
    assert far.stderr.strip() == (
        "tridentflow: error: txid 0 is outside what the undo logs retain (txids 1..4)"
    ), far.stderr
    done = tf("rewind", "wordcount", "--to", "2", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("rewound wordcount to txid 2: 2 txid(s) taken back"), done.stdout
    assert "rewound        to txid 2 at " in tf("status", "wordcount").stdout
    want = json.loads(as_of.stdout)["values"]
    assert json.loads(tf("query", "wordcount", "you", "--json").stdout)["values"] == want
    again = tf("run", "wordcount", "--engine", "local", "--batch-size", "1")
    assert again.returncode == 0, again.stderr
    assert tf("audit", "wordcount").stdout.strip() == "lost=0 doubled=0"


@pytest.mark.parametrize("name", ["wordcount-windowed", "user-scores"])
def test_windows_and_batch_operations_go_back_and_replay_the_same(
    redis_url, home, monkeypatch, name
):
    """Count windows (tumbling and sliding, an opaque source) and seed 002's batch operations
    (a partitioned full Aggregator, a global merge, ``partition_persist`` keyed by txid): a
    rewind to txid 3 of 6 gives back every state as noted then, and replaying the same
    batches gives back every state as noted after 6."""
    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", "4")
    rt = runtime(name, redis_url, home)
    rt.source_heads()
    rng = random.Random(5)
    per_partition = 8 // rt.pipeline.source.partitions
    noted = {}
    for txid in range(1, 7):
        if name == "user-scores":
            rt.log.append_spread([[f"u{rng.randrange(4)}", rng.randrange(10)] for _ in range(8)])
        else:
            rt.log.append_spread(sentences(8, seed=txid))
        run_batches(rt, LocalEngine(), max_batches=1, batch_size=per_partition)
        noted[txid] = everything(rt)
    assert rt.ledger.committed_txid() == 6 and noted[3] != noted[6]
    rewind_pipeline(rt, 3)
    assert everything(rt) == noted[3]
    run_batches(rt, LocalEngine(), batch_size=per_partition)
    assert rt.ledger.committed_txid() == 6
    assert everything(rt) == noted[6]


def test_a_rewind_that_would_lose_trimmed_records_is_refused(redis_url, home, monkeypatch):
    """Redis Streams: entries trimmed once every reader had them cannot be read again, so a
    rewind to before them is refused in one line naming the partition and the records, with
    nothing changed; a rewind to after them goes on."""
    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", "5")
    monkeypatch.setenv("TRIDENTFLOW_NAMESPACE", "trimmed")
    rt = runtime("wordcount-stream", redis_url, home)
    reset_pipeline(rt, force=True, source=True)
    for txid in range(1, 5):
        rt.log.append_spread(sentences(8, seed=txid))
        run_batches(rt, LocalEngine(), max_batches=1, batch_size=100)
    committed = rt.ledger.committed_offsets()
    before = everything(rt)
    rt.log.trim(rt.ledger.committed_offsets())  # every entry read so far goes
    with pytest.raises(RewindRefusedError, match=r"^cannot rewind wordcount-stream to txid 2: "
                       r"partition \d's records \d+\.\.\d+, read by txids 3\.\.4, cannot be "
                       r"read again"):  # fmt: skip
        rewind_pipeline(rt, 2)
    assert rt.ledger.committed_txid() == 4 and everything(rt) == before
    assert rt.ledger.committed_offsets() == committed
    rewind_pipeline(rt, 4)  # the committed txid: nothing to read again
    assert everything(rt) == before
