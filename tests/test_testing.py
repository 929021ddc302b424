"""tridentflow.testing: the harness a user tests a pipeline with, no server. It must give what
the real engine and the Redis commit give on the seed pipelines (the same batches, txid by
txid), keep the txid rules under replays and half-done commits, and fail where a pipeline is
not replay-safe - otherwise it proves nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import runtime, sentences
from tridentflow import Count, LogSource, Pipeline, SourceMode, StateKind, StateSpec, Sum
from tridentflow.aggregators import StateUpdater
from tridentflow.engines.local import LocalEngine
from tridentflow.registry import load_pipeline
from tridentflow.steps.driver import run_batches as run_for_real
from tridentflow.steps.query import list_state
from tridentflow.testing import ABORT, CollectSink, TestingError, run_batches

ROOT = Path(__file__).resolve().parents[1]


def _lines(n: int, seed: int) -> list[str]:
    return sentences(n, seed=seed)


SEED_PIPELINES = {  # the seeds' pipelines and records of the shape each reads
    "wordcount": _lines(60, 1),  # seed 000
    "wordcount-opaque": _lines(60, 2),
    "partitioned-count": _lines(80, 3),  # seed 003: a global count over 16 partitions
    "user-scores": [[f"nickt{i % 3 + 1}", i % 5] for i in range(40)],  # seed 002
    "wordcount-batched": _lines(50, 4),
    "wordcount-drpc": [
        {"kind": "query" if i % 4 == 3 else "sentence", "text": line}
        for i, line in enumerate(_lines(40, 5))
    ],
    "mutating": _lines(50, 6),
    "mutating-opaque": _lines(50, 7),
    "wordcount-windowed": _lines(50, 8),
}


def _committed_batches(rt) -> list[dict[int, list]]:
    """Each committed txid's records per partition, from its commit record's ranges."""
    batches = []
    for entry in reversed(rt.ledger.history(1000)):
        ranges = entry["ranges"]
        batches.append({
            int(p): [json.loads(raw) for _o, raw in rt.log.read_raw(int(p), start, end)]
            for p, (start, end) in ranges.items()
        })  # fmt: skip
    return batches


def _real_states(rt) -> dict[str, dict]:
    out = {}
    for name, persist in rt.pipeline.states.items():
        items, page = {}, list_state(rt, persist, 10_000)
        items.update(page.items)
        out[name] = {k[0] if len(k) == 1 else k: v for k, v in items.items()}
    return out


@pytest.mark.parametrize("name", sorted(SEED_PIPELINES))
def test_the_harness_gives_what_the_engine_and_redis_give(name, redis_url, redis_client, home):
    rt = runtime(name, redis_url, home)
    rt.source_heads()
    rt.log.append_spread(SEED_PIPELINES[name])
    run_for_real(rt, LocalEngine(), batch_size=1 if rt.pipeline.source.partitions > 4 else 3)
    batches = _committed_batches(rt)
    assert len(batches) == rt.ledger.committed_txid() > 2
    expected = _real_states(rt)
    got = run_batches(load_pipeline(name), batches)
    assert got == expected
    assert got.committed == len(batches)
    # every txid replayed, every other commit cut half-way: the same, for these states
    replayed = run_batches(
        load_pipeline(name),
        batches,
        replay=range(1, len(batches) + 1),
        crash_mid_commit=range(1, len(batches) + 1, 2),
    )
    assert replayed == expected


def _summing(kind: StateKind, source: SourceMode = SourceMode.OPAQUE) -> Pipeline:
    p = Pipeline("sums", LogSource(fields=("k", "n"), mode=source))
    p.stream.group_by("k").persistent_aggregate(StateSpec("total", kind), Sum(), "n", "total")
    return p


@pytest.mark.parametrize(
    "kind, source",
    [(StateKind.TRANSACTIONAL, SourceMode.TRANSACTIONAL), (StateKind.OPAQUE, SourceMode.OPAQUE)],
)
def test_replays_and_half_done_commits_keep_a_replay_safe_state_exact(kind, source):
    pipeline = _summing(kind, source)
    batches = [[["a", 1], ["b", 2]], [["a", 10]], [["b", 5], ["c", 1]]]
    exact = {"total": {"a": 11, "b": 7, "c": 1}}
    assert run_batches(pipeline, batches) == exact
    assert run_batches(pipeline, batches, replay=[1, 2, 3]) == exact
    assert run_batches(pipeline, batches, crash_mid_commit=[1, 3], replay=[3]) == exact
    assert run_batches(pipeline, [[["a", 1], ABORT, ["b", 2]], *batches[1:]]) == exact


def test_an_opaque_replay_that_reads_other_records_counts_only_the_replay():
    """Trident's opaque rule: the replay's batch replaces the first attempt's."""
    pipeline = _summing(StateKind.OPAQUE)
    got = run_batches(pipeline, [[["a", 1]], [["a", 5], ["b", 1]]], replay={2: [["a", 7]]})
    assert got == {"total": {"a": 8}}  # b was in the first attempt only: rolled back


def test_the_harness_runs_the_production_commit_a_change_there_shows_here(monkeypatch):
    """Issue 67: run_batches commits through tridentflow_state.commit.CommitAttempt (and the
    committer's Python apply), not a copy of them: a planted change in the production
    commit - its rollback of the keys only an earlier attempt wrote left out - makes the
    opaque replay above count ``b``, which it must not."""
    from tridentflow_state.commit import CommitAttempt

    pipeline = _summing(StateKind.OPAQUE)
    batches, replay = [[["a", 1]], [["a", 5], ["b", 1]]], {2: [["a", 7]]}
    assert run_batches(pipeline, batches, replay=replay) == {"total": {"a": 8}}
    finish = CommitAttempt.finish_writes

    def without_rollback(self, batch_keys, logged=()):
        for writer in self.writers.values():
            writer.rollback_stray_keys = lambda keys: 0
        return finish(self, batch_keys, logged)

    monkeypatch.setattr(CommitAttempt, "finish_writes", without_rollback)
    assert run_batches(pipeline, batches, replay=replay) == {"total": {"a": 8, "b": 1}}


def test_the_harness_stages_through_production_a_change_there_shows_here(monkeypatch):
    """Issue 67: each emit attempt is staged through production's file staging area and the
    commit applies what it loads back (the JSON lines, the completeness check): a planted
    change in the staging - its state files written one line short - makes the harness refuse
    the batch as production's commit would, and one in what the commit reads back (the staged
    pairs, the last one lost) shows in its states."""
    import tridentflow.steps.staging.in_files as in_files
    from tridentflow.errors import IncompleteBatchError
    from tridentflow.steps.staging.base import StagedBatch

    pipeline = _summing(StateKind.TRANSACTIONAL, SourceMode.TRANSACTIONAL)
    batches = [[["a", 1], ["b", 2]], [["a", 5]]]
    assert run_batches(pipeline, batches) == {"total": {"a": 6, "b": 2}}
    items = StagedBatch.items

    def one_short(self, state):
        return iter(list(items(self, state))[:-1])

    with monkeypatch.context() as m:
        m.setattr(StagedBatch, "items", one_short)
        assert run_batches(pipeline, batches) == {"total": {"a": 1}}
    write_lines = in_files._write_lines

    def torn(path, texts):
        info = write_lines(path, texts)
        if path.name.startswith("state-") and info["lines"]:
            with open(path, "rb+") as fh:
                fh.truncate(fh.seek(0, 2) - 1)  # the last byte lost: a torn write
        return info

    monkeypatch.setattr(in_files, "_write_lines", torn)
    with pytest.raises(IncompleteBatchError, match="different checksum"):
        run_batches(pipeline, batches)


def test_a_crash_mid_commit_dies_where_production_fires_it(monkeypatch):
    """The harness's crash is the production hook ``half_written``: half of the batch's keys
    over all its states are in, the rest is not, and the retry finishes exactly."""
    import tridentflow.testing as testing

    seen = []
    died = testing._DiesAt.half_written

    def noting(self, attempt):
        seen.append((attempt.txid, attempt.expected, attempt._written))
        died(self, attempt)

    monkeypatch.setattr(testing._DiesAt, "half_written", noting)
    pipeline = _summing(StateKind.TRANSACTIONAL, SourceMode.TRANSACTIONAL)
    batch = [[k, 1] for k in "abcdefgh"]
    assert run_batches(pipeline, [batch], crash_mid_commit=[1]) == {
        "total": dict.fromkeys("abcdefgh", 1)
    }
    assert seen[0] == (1, 8, 4)  # the first attempt: 4 of 8 keys in when it died


def test_a_non_transactional_state_counts_a_replay_twice():
    """At-least-once, as the guarantee table says: the harness shows it."""
    source = LogSource(fields=("line",), mode=SourceMode.TRANSACTIONAL)
    p = Pipeline("nt", source, allow_at_least_once=True)
    p.stream.group_by("line").persistent_aggregate(
        StateSpec("seen", StateKind.NON_TRANSACTIONAL), Count(), out_field="n"
    )
    assert run_batches(p, [["x"], ["x"]]) == {"seen": {"x": 2}}
    assert run_batches(p, [["x"], ["x"]], replay=[2]) == {"seen": {"x": 3}}


class LastSeen(StateUpdater):
    """Not replay-safe: it reads a module-level counter, so a replay writes another value."""

    calls = 0

    def update(self, current, tuples):
        LastSeen.calls += 1
        return LastSeen.calls


def test_the_harness_exposes_an_updater_that_is_not_replay_safe():
    p = Pipeline("bad", LogSource(fields=("line",), mode=SourceMode.TRANSACTIONAL))
    p.stream.partition_persist(StateSpec("last", StateKind.OPAQUE), LastSeen(), "line", [])
    LastSeen.calls = 0
    once = run_batches(p, [["x"]])
    LastSeen.calls = 0
    assert run_batches(p, [["x"]], replay=[1]) != once


def test_a_collect_sink_gets_each_txids_new_values_and_removals():
    from tests.pipelines import apply_ops, parse_op

    sink = CollectSink()
    p = Pipeline("kv", LogSource(fields=("line",), mode=SourceMode.TRANSACTIONAL))
    kv = p.stream.each("line", parse_op, ["op", "key", "value"]).partition_persist(
        StateSpec("kv", StateKind.OPAQUE), apply_ops, "key", ["op", "value"]
    )
    kv.new_values_stream().sink(sink)
    states = run_batches(p, [["set a 1", "set b 2"], ["del a"], ["set b 3"]], replay=[2])
    assert states == {"kv": {"b": 3}}
    assert sink.batches == {1: [("a", 1), ("b", 2)], 2: [("a", None)], 3: [("b", 3)]}
    assert sink.latest() == {"a": ("a", None), "b": ("b", 3)}


def test_a_global_aggregate_has_the_key_of_no_fields():
    p = Pipeline("g", LogSource(fields=("n",), mode=SourceMode.TRANSACTIONAL))
    p.stream.persistent_aggregate(StateSpec("sum", StateKind.OPAQUE), Sum(), "n", "s")
    assert run_batches(p, [[1, 2], [3]], replay=[2]) == {"sum": {(): 6}}


def test_bad_input_and_bad_records_are_one_line():
    p = load_pipeline("user-scores")
    with pytest.raises(TestingError, match=r"name txid\(s\) \[3\], but the batches are txids 1..2"):
        run_batches(p, [[], []], replay=[3])
    with pytest.raises(TestingError, match=r"partition\(s\) \[5\] out of the source's 0..1"):
        run_batches(p, [{5: [["u", 1]]}])
    with pytest.raises(TestingError, match="a batch is a list of records"):
        run_batches(p, ["not a list"])
    with pytest.raises(TestingError, match="needs an opaque source"):
        run_batches(load_pipeline("wordcount"), [["a"]], replay={1: ["b"]})
    with pytest.raises(TestingError, match=r"record .* failed: .*on_bad='quarantine'"):
        run_batches(p, [[["u", "not a number"]]])
    states = run_batches(p, [[["u", "not a number"], ["u", 2]]], on_bad="quarantine")
    assert states["score_sum"] == {"u": 2} and len(states.quarantined) == 1
    assert states.quarantined[0]["txid"] == 1


def test_a_users_pytest_file_runs_with_no_redis_and_no_java(tmp_path):
    """The docs' example (docs/pipelines.md shows this file) under pytest, with Redis's URL at
    a closed port and no java on PATH."""
    example = ROOT / "docs" / "examples" / "test_my_pipeline.py"
    assert example.read_text() in (ROOT / "docs" / "pipelines.md").read_text()
    bin_dir = Path(sys.executable).parent
    env = {
        **os.environ,
        "TRIDENTFLOW_REDIS_URL": "redis://127.0.0.1:1/0",
        "PATH": str(bin_dir),  # the venv only: no java
        "JAVA_HOME": str(tmp_path / "no-java"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(example)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout, done.stdout


def test_an_updater_reading_other_keys_sees_what_production_shows_it(redis_url, tmp_path):
    """The harness commits each state's partials in the staged order and the committer's
    chunks, as production does: an updater that reads another key during the commit (the
    bundled SeenWithThe reads "the") stores the same values under run_batches as on the local
    engine with Redis - never what a sorted order would show it."""
    from tests.helpers import sentences
    from tests.test_trident_surface import reading
    from tridentflow.engines.local import LocalEngine
    from tridentflow.faults import FaultPlan
    from tridentflow.steps.driver import run_one
    from tridentflow.steps.query import list_state
    from tridentflow.steps.runtime import Runtime, connect
    from tridentflow.testing import run_batches

    lines = [f"the {s}" if i % 3 else s for i, s in enumerate(sentences(60, seed=7))]
    batches = [lines[:20], lines[20:40], lines[40:]]
    harness = run_batches(reading(), batches)
    rt = Runtime(reading(), connect(redis_url), tmp_path, FaultPlan.parse(""), namespace="seen")
    rt.ledger.reset(force=True)
    rt.log.ensure(rt.pipeline.source.partitions)
    for batch in batches:
        rt.log.append(0, batch)
        run_one(rt, LocalEngine(), batch_size=len(batch))
    for kind in ("transactional", "opaque"):
        stored = list_state(rt, rt.pipeline.states[kind], limit=10_000).items
        production = {key[0]: value for key, value in stored}
        assert harness[kind] == production, kind
        assert {v[1] for v in production.values()} - {None}, "it read the key"


def _collecting(pipeline: Pipeline) -> tuple[Pipeline, dict[str, CollectSink]]:
    """``pipeline`` with a CollectSink on every state's new-values stream."""
    sinks = {}
    for name in sorted(pipeline.states):
        sinks[name] = CollectSink(name=f"collect-{name}")
        pipeline.state(name).new_values_stream().sink(sinks[name])
    return pipeline, sinks


def _exported(sinks: dict[str, CollectSink]) -> dict[str, dict[int, list[str]]]:
    """Each sink's rows per txid, order within a txid aside (the export's order is the change
    log's; no sink's contract orders the rows of one txid)."""
    return {
        name: {txid: sorted(map(repr, rows)) for txid, rows in sink.batches.items()}
        for name, sink in sinks.items()
    }


def _records(name: str) -> list:
    """``name``'s records; for ``NAME+expiry`` words that come and go, so keys expire."""
    if name.endswith("+expiry"):
        return [f"w{i // 6 % 9} w{i % 4} w{(i // 12) % 5 + 20}" for i in range(72)]
    return SEED_PIPELINES[name]


def _loaded(name: str) -> Pipeline:
    """A seed pipeline; ``NAME+expiry``: its stamped states expire keys 2 txids unwritten (the
    chaos harness's expiry family)."""
    from dataclasses import replace

    base, _, expiry = name.partition("+")
    pipeline = load_pipeline(base)
    if expiry:
        for index, persist in enumerate(pipeline.persists):
            if persist.state.kind is not StateKind.NON_TRANSACTIONAL:
                state = replace(persist.state, expire_after_txids=2)
                pipeline.persists[index] = replace(persist, state=state)
    return pipeline


@pytest.mark.parametrize("name", [*sorted(SEED_PIPELINES), "wordcount+expiry", "mutating+expiry"])
def test_every_txid_and_its_exported_rows_are_what_production_gives(
    name, redis_url, redis_client, home
):
    """Issue 67's 'one commit': the seed pipelines (the chaos harness's among them) run txid
    by txid on the engine with Redis, each commit exported through a CollectSink per state;
    the harness on the same batches must give every txid's states (not only the last ones)
    and every txid's exported rows - new values and removals - exactly."""
    from tridentflow.faults import FaultPlan
    from tridentflow.steps.export import export
    from tridentflow.steps.runtime import Runtime

    pipeline, production_sinks = _collecting(_loaded(name))
    rt = Runtime.open(pipeline, redis_url, home, FaultPlan.parse(""))
    rt.source_heads()
    rt.log.append_spread(_records(name))
    after_each: list[dict] = []

    def exported_and_seen(_result) -> None:
        export(rt)
        after_each.append(_real_states(rt))

    batch_size = 1 if rt.pipeline.source.partitions > 4 else 3
    run_for_real(rt, LocalEngine(), batch_size=batch_size, on_commit=exported_and_seen)
    batches = _committed_batches(rt)
    assert len(batches) == len(after_each) == rt.ledger.committed_txid() > 2
    for txid in range(1, len(batches) + 1):
        assert run_batches(_loaded(name), batches[:txid]) == after_each[txid - 1], txid
    harness, harness_sinks = _collecting(_loaded(name))
    run_batches(harness, batches, replay=[1, len(batches)], crash_mid_commit=[2])
    assert _exported(harness_sinks) == _exported(production_sinks)
    assert any(rows for sink in production_sinks.values() for rows in sink.batches.values())


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_a_file_source_pipeline_runs_on_batches_of_files_as_production_reads_them(
    redis_url, tmp_path, fmt
):
    """A batch of files (pathlib.Path): their rows, read as the FileSource reads them, and a
    corrupt file one quarantined record naming it - the states equal production's over the
    same files (the FileSource, its manifest in Redis, the local engine)."""
    from tests.test_file_source import batch, pipeline, runtime_of, state, write
    from tridentflow.steps.driver import run_batches as run_production

    landing = tmp_path / "landing"
    files = [write(landing, f"f{i}.{fmt}", batch(i, n=6), fmt) for i in range(4)]
    broken = landing / f"z.{fmt}"
    broken.write_bytes(b"PAR1 not parquet" if fmt != "json" else b'{"user": "u1", "amo\n')
    built = pipeline(landing, fmt)
    states = run_batches(built, [files[:2], [*files[2:], broken]], on_bad="quarantine")
    rt = runtime_of(built, redis_url, tmp_path / "h")
    run_production(rt, LocalEngine())
    assert states["rows"] == state(rt, "rows") and states["totals"] == state(rt, "totals")
    assert sum(states["rows"].values()) == 24
    (bad,) = states.quarantined  # the file (Parquet, CSV), or its one broken line (JSON)
    assert fmt == "json" or str(broken) in json.dumps(bad), bad
    with pytest.raises(TestingError, match="needs a FileSource pipeline and only files"):
        run_batches(built, [[files[0], {"user": "u", "amount": 1}]])
