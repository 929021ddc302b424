"""`tridentflow reshard PIPELINE --shards M --yes` (issue 54, goal 2): a pipeline with committed
state moves to another shard count between two txids - its values, expiry index, undo logs and
change logs - and goes on exactly. Each run is compared with a twin pipeline fed the same
records in the same batches and never resharded: every state, every retained `query --as-of`
and every sink's rows must be the same; kills at each of the reshard's fault points are
finished by running it again; an attempt under way is fenced; a batch staged before the
reshard commits after it; a reader that read the old layout reads the new one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import produce
from tests.test_lost_commits import FileSink
from tridentflow import Count, LogSource, Pipeline, SourceMode, StateKind, StateSpec, Sum
from tridentflow.engines.local import LocalEngine
from tridentflow.faults import FaultPlan, InjectedFaultError
from tridentflow.ops.audit import audit
from tridentflow.ops.reshard import ReshardRefusedError, reshard
from tridentflow.ops.status import status
from tridentflow.steps.driver import run_batches
from tridentflow.steps.export import export
from tridentflow.steps.query import list_state, query_as_of
from tridentflow.steps.runtime import Runtime
from tridentflow_state.backing import Fence
from tridentflow_state.errors import FencedError, ReshardUnderWayError, StateError
from tridentflow_state.keys import KeySpace
from tridentflow_state.shards import claim_shards, query_state

LINES = [
    "the quick brown fox", "jumps over the lazy dog", "a b c d e f g", "the end of the line",
    "fox and dog and fox", "one two three four five", "b c d e", "lazy lazy lazy",
]  # fmt: skip


def resharded(name: str, sink: Path, shards: int | None = None) -> Pipeline:
    """Word counts (opaque, with a sink reading its change log), letters per word
    (transactional, expiring two txids after a word's last update); undo logs kept."""
    p = Pipeline(
        name,
        LogSource(fields=("line",), mode=SourceMode.TRANSACTIONAL, partitions=2),
        retain_txids=3,
        state_shards=shards,
    )
    words = p.stream.each("line", lambda line: [(w, len(w)) for w in line.split()], ("word", "n"))
    counts = words.group_by("word").persistent_aggregate(
        StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count"
    )
    counts.new_values_stream().sink(FileSink(sink))
    words.group_by("word").persistent_aggregate(
        StateSpec("letters", StateKind.TRANSACTIONAL, expire_after_txids=2), Sum(), "n",
        out_field="letters",
    )  # fmt: skip
    return p


def step(rt: Runtime, lines: list[str]) -> None:
    """One txid of ``lines`` (committed, then exported)."""
    produce(rt, lines)
    run_batches(rt, LocalEngine(), max_batches=1, batch_size=100)
    export(rt)


def everything(rt: Runtime) -> dict:
    """Every state's committed values, each retained txid's, and the sink's rows."""
    out: dict = {}
    committed = rt.ledger.committed_txid()
    for name, persist in rt.pipeline.states.items():
        page = list_state(rt, persist, 10_000)
        out[name] = sorted(page.items)
        keys = [*sorted(key for key, _ in page.items), ("gone",)]
        for txid in range(committed - 2, committed + 1):
            out[f"{name}@{txid}"] = query_as_of(rt, persist, keys, txid)[1]
    sink = json.loads(Path(rt.pipeline.feeds[0].sink.path).read_text())
    out["sink"] = sorted(map(tuple, sink["rows"]))
    return out


@pytest.fixture
def twins(redis_url, home, tmp_path):
    """(the pipeline to reshard, its twin - each with four txids committed, no shards - and
    a function opening a new runtime of either: what each step after a reshard does)."""

    def open_(name: str, shards: int | None = None) -> Runtime:
        return Runtime.open(resharded(name, tmp_path / f"{name}.json", shards), redis_url, home)

    pair = open_("moving"), open_("staying")
    for rt in pair:
        rt.ledger.reset(force=True)
        for i in range(4):
            step(rt, LINES[i : i + 2])
    return (*pair, open_)


def _go_on(moving: Runtime, staying: Runtime, lines: list[list[str]]) -> None:
    for batch in lines:
        step(moving, batch)
        step(staying, batch)
    assert everything(moving) == everything(staying)
    report = audit(moving)
    assert (report.lost, report.doubled, report.mismatched, report.unaudited) == (0, 0, [], [])


@pytest.mark.parametrize("path", [(3,), (3, 5), (4, 1)], ids=["1-3", "1-3-5", "1-4-1"])
def test_a_reshard_moves_every_key_and_the_pipeline_goes_on_exactly(twins, path):
    moving, staying, open_ = twins
    for shards in path:
        done = reshard(open_("moving"), shards)
        assert done.to_shards == shards and done.keys_copied > 0 and done.keys_deleted > 0
        moving = open_("moving")
        assert moving.keyspace.shards == shards
        assert everything(moving) == everything(staying)  # right after it: nothing moved
        _go_on(moving, staying, [LINES[4:6], LINES[6:8]])
    info = status(moving)
    assert info["shards"] == path[-1]
    old = [k for k in moving.client.scan_iter(match="tf:{moving/*") if b":state:" in k]
    assert all(b"/v%d/" % len(path) in k for k in old) or path[-1] == 1


@pytest.mark.parametrize("point", [1, 2, 3, 4])
def test_a_reshard_killed_at_each_point_is_finished_by_running_it_again(twins, point):
    moving, staying, open_ = twins
    txid = moving.ledger.committed_txid() + 1
    faulty = open_("moving").with_(faults=FaultPlan.parse(f"mid-reshard@{txid}#{point}"))
    with pytest.raises(InjectedFaultError):
        reshard(faulty, 3)
    with pytest.raises(ReshardUnderWayError, match="moving to 3 shard"):  # commits wait, and retry
        step(open_("moving"), ["meanwhile"])
    with pytest.raises(ReshardRefusedError, match="resharded to 3 shards: finish that first"):
        reshard(open_("moving"), 2)
    assert reshard(open_("moving"), 3).to_shards == 3
    moving = open_("moving")
    step(moving, [])  # the refused txid commits now
    step(staying, ["meanwhile"])
    _go_on(moving, staying, [LINES[5:7]])
    assert moving.keyspace.shards == 3


def test_an_attempt_under_way_is_fenced_and_writes_nothing_after_the_reshard(twins):
    moving, staying, open_ = twins
    ticket = moving.ledger.begin_commit(moving.ledger.committed_txid() + 1)
    zombie = Fence(ticket.txid, ticket.token, ticket.generation)
    old = moving.keyspace
    claim_shards(moving.client, old, ["counts"], zombie)
    reshard(open_("moving"), 3)
    with pytest.raises(StateError):
        moving.backing("counts").multi_put([('"zz"', f"[{ticket.txid},9,null]")], zombie)
    with pytest.raises(FencedError):  # nor can it claim a shard of the new layout
        claim_shards(moving.client, KeySpace("moving", shards=3, layout=1), ["counts"], zombie)
    _go_on(open_("moving"), staying, [LINES[6:8]])


def test_an_attempt_under_way_writes_nothing_into_shards_being_copied(twins):
    moving, staying, open_ = twins
    reshard(open_("moving"), 3)
    moving = open_("moving")
    ticket = moving.ledger.begin_commit(moving.ledger.committed_txid() + 1)
    zombie = Fence(ticket.txid, ticket.token, ticket.generation)
    claim_shards(moving.client, moving.keyspace, ["counts"], zombie)
    faulty = open_("moving").with_(faults=FaultPlan.parse(f"mid-reshard@{ticket.txid}#1"))
    with pytest.raises(InjectedFaultError):
        reshard(faulty, 2)  # killed part-way through its copy
    for word in ("the", "zz"):  # a key copied already, and one not
        with pytest.raises(FencedError):
            moving.backing("counts").multi_put([(f'"{word}"', f"[{ticket.txid},9,null]")], zombie)
    reshard(open_("moving"), 2)
    _go_on(open_("moving"), staying, [LINES[6:8]])


def test_a_batch_staged_before_the_reshard_commits_after_it(twins):
    """Its blocks lie next to the old layout's shards: the commit reads them back and routes
    every key to its new shard (the Count and Sum apply inside Redis otherwise)."""
    from tridentflow.steps.committer import commit
    from tridentflow.steps.coordinator import coordinate
    from tridentflow.steps.emitter import emit

    moving, staying, open_ = twins
    produce(moving, LINES[4:6])
    txid = moving.ledger.committed_txid() + 1
    moving.ledger.claim(txid, "before-the-reshard")
    coordinate(moving, txid, 100)
    staged = emit(moving, txid, LocalEngine())
    assert staged is not None and staged.manifest["layout"] == [1, 0]
    reshard(open_("moving"), 3)
    moving = open_("moving")
    assert commit(moving, txid).status == "committed"
    export(moving)
    step(staying, LINES[4:6])
    assert everything(moving) == everything(staying)


def test_a_reader_that_read_the_old_layout_reads_the_new_one(twins):
    moving, _, open_ = twins
    old = moving.keyspace
    keys = [json.dumps(w) for w in ("the", "fox", "lazy")]
    before = query_state(moving.client, old, "counts", keys)
    reshard(open_("moving"), 3)
    assert query_state(moving.client, old, "counts", keys) == before
    resharded_once = open_("moving").keyspace
    reshard(open_("moving"), 2)
    assert query_state(moving.client, resharded_once, "counts", keys) == before


def test_a_listing_begun_before_a_reshard_is_told_to_list_again(twins):
    from tridentflow.errors import TridentflowError

    moving, _, open_ = twins
    persist = moving.pipeline.states["counts"]
    first = list_state(moving, persist, 2)
    assert first.next is not None
    reshard(open_("moving"), 3)
    moved = open_("moving")
    with pytest.raises(TridentflowError, match=r"moved to another shard layout .* list it again"):
        list_state(moved, persist, 2, first.next)
    page, seen = list_state(moved, persist, 2), []
    while True:  # a listing begun after it pages through the new layout, every key once
        seen += page.items
        if page.next is None:
            break
        assert page.next.endswith("-1")  # the cursor names the layout
        page = list_state(moved, persist, 2, page.next)
    assert sorted(seen) == sorted(list_state(moved, persist, 10_000).items)


def test_a_process_that_predates_the_reshard_reads_as_of_the_new_one_or_is_told_to_retry(twins):
    """query --as-of reads the undo logs where they are now; an export whose change log moved
    while it read is told to export again, not handed "gone" (a reload); a rewind waits for
    a reshard cut short."""
    from tridentflow.errors import TridentflowError
    from tridentflow.ops.rewind import RewindRefusedError, rewind_pipeline

    moving, staying, open_ = twins
    before = open_("moving")  # opened before the reshard: its keyspace names the old layout
    assert before.keyspace.shards == 1
    reshard(open_("moving"), 3)
    persist = before.pipeline.states["counts"]
    keys = [("the",), ("fox",), ("lazy",)]
    twin = staying.pipeline.states["counts"]
    for txid in (2, 3):
        assert query_as_of(before, persist, keys, txid) == query_as_of(staying, twin, keys, txid)
    produce(moving, LINES[5:6])
    run_batches(open_("moving"), LocalEngine(), max_batches=1, batch_size=100)
    with pytest.raises(TridentflowError, match="while exported: export again"):
        export(before)
    export(open_("moving"))
    faulty = open_("moving").with_(faults=FaultPlan.parse("mid-reshard@6#2"))
    with pytest.raises(InjectedFaultError):
        reshard(faulty, 2)
    with pytest.raises(RewindRefusedError, match="being resharded to 2 shards: finish that first"):
        rewind_pipeline(open_("moving"), 4, force=True)
    reshard(open_("moving"), 2)
    step(staying, LINES[5:6])
    assert everything(open_("moving")) == everything(staying)


def test_what_a_reshard_refuses_in_one_line(twins, redis_url, home, tmp_path):
    moving, _, open_ = twins
    with pytest.raises(ReshardRefusedError, match="in 1 shard\\(s\\) already"):
        reshard(moving, 1)
    with pytest.raises(ReshardRefusedError, match="from 1 to 256"):
        reshard(moving, 0)
    fresh = Runtime.open(resharded("fresh", tmp_path / "f.json"), redis_url, home)
    fresh.ledger.reset(force=True)
    with pytest.raises(ReshardRefusedError, match="no committed state to move: set state_shards=3"):
        reshard(fresh, 3)
    asks_two = open_("moving", 2)  # code that asks for a count the state is not in
    with pytest.raises(StateError, match="tridentflow reshard moving --shards 2 --yes"):
        step(asks_two, ["x"])
    reshard(asks_two, 2)
    with pytest.raises(StateError, match=r"moved to 2 shard\(s\) .* run the step again"):
        step(asks_two, ["x"])  # a step that read the layout before the reshard
    step(open_("moving", 2), [])  # the code and the state agree now
    assert moving.ledger.committed_txid() == 5


def test_the_cli_reshards_with_yes(twins, monkeypatch, capsys, redis_url, home):
    from tridentflow.ops.cli import main

    monkeypatch.setenv("TRIDENTFLOW_REDIS_URL", redis_url)
    monkeypatch.setenv("TRIDENTFLOW_HOME", str(home))
    target = "tests.test_reshard:cli_pipeline"
    assert main(["reshard", target, "--shards", "3"]) == 1
    assert "add --yes" in capsys.readouterr().err
    assert main(["reshard", target, "--shards", "3", "--yes", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert (said["from_shards"], said["to_shards"], said["layout"]) == (1, 3, 1)
    assert main(["status", target, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shards"] == 3


def cli_pipeline() -> Pipeline:
    return resharded("moving", Path("/nonexistent/never-exported.json"))
