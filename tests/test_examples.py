"""The bundled batch-operation examples through the CLI (local engine), against real Redis:
seed 002's user scores, and the word count with a state-query stream. Also the completeness
check (a tuple lost between stages fails the batch) and a Reducer state across txids."""

from __future__ import annotations

import json

import pytest

from tests.helpers import runtime
from tridentflow import LogSource, Pipeline, Reducer, StateSpec
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import IncompleteBatchError, StagingValueError, StateUpdateError
from tridentflow.examples.user_scores import SEED_BATCH
from tridentflow.faults import FaultPlan
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.runtime import Runtime
from tridentflow.steps.staging import MANIFEST
from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import StateKind

SEED_JSON = "".join(json.dumps(r) + "\n" for r in SEED_BATCH)


def query_json(tf, pipeline: str, state: str, *keys: str) -> dict:
    out = tf("query", pipeline, "--state", state, "--json", *keys)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def produce_json(tf, pipeline: str, records: list) -> None:
    lines = "".join(json.dumps(r) + "\n" for r in records)
    assert tf("produce", pipeline, "-", "--json", input=lines).returncode == 0


def test_seed_002_user_scores(tf):
    assert tf("produce", "user-scores", "-", "--json", input=SEED_JSON).returncode == 0
    lost = tf("run", "user-scores", "--engine", "local", "--faults", "lose-tuple@1")
    assert lost.returncode == 1
    assert "batch is incomplete" in lost.stderr and "0 of 1 announced tuples" in lost.stderr
    assert query_json(tf, "user-scores", "score_sum", "nickt1")["committed_txid"] == 0

    run = tf("run", "user-scores", "--engine", "local")
    assert run.returncode == 0, run.stderr
    first = query_json(tf, "user-scores", "per_batch", "[1]")
    assert first["committed_txid"] == 1
    assert first["values"] == [{"key": [1], "value": {"nickt1": 1, "nickt2": 1, "nickt3": 1}}]
    text = tf("query", "user-scores", "--state", "per_batch", "[1]").stdout
    assert text == '[1]\t{"nickt1": 1, "nickt2": 1, "nickt3": 1}\n'

    # the seed's spout replays the same three tuples as the next batch
    tf("produce", "user-scores", "-", "--json", input=SEED_JSON + '["nickt1", 5]\n')
    assert tf("run", "user-scores", "--engine", "local").returncode == 0
    second = query_json(tf, "user-scores", "per_batch", "[1]", "[2]")
    assert [v["value"] for v in second["values"]] == [
        {"nickt1": 1, "nickt2": 1, "nickt3": 1},
        {"nickt1": 2, "nickt2": 1, "nickt3": 1},
    ]
    sums = tf("query", "user-scores", "--state", "score_sum", "nickt1", "nickt2", "nobody")
    assert sums.stdout == "nickt1\t7\nnickt2\t2\nnobody\t0\n"
    audit = tf("audit", "user-scores")
    assert audit.stdout.strip() == "lost=0 doubled=0 unaudited=per_batch", audit.stdout


def test_word_count_with_a_state_query_stream(tf):
    sentences = ["the cat sat", "the dog sat", "the end"]
    records = [{"kind": "sentence", "text": s} for s in sentences]
    produce_json(tf, "wordcount-drpc", records)
    assert tf("run", "wordcount-drpc", "--engine", "local").returncode == 0
    queries = ["the sat", "cat unicorn", "unicorn", "the sat"]
    later = ["the the the"]  # counted in the same txid as the queries: not seen by them
    records = [{"kind": "query", "text": q} for q in queries]
    records += [{"kind": "sentence", "text": s} for s in later]
    produce_json(tf, "wordcount-drpc", records)
    run = tf("run", "wordcount-drpc", "--engine", "local")
    assert run.returncode == 0, run.stderr
    answers = query_json(tf, "wordcount-drpc", "answers", "the sat", "cat unicorn", "unicorn")
    # "the sat" twice in one batch: one group, Sum adds both lookups (3+2, twice)
    assert [v["value"] for v in answers["values"]] == [10, 1, None]
    counts = tf("query", "wordcount-drpc", "--state", "counts", "the", "cat", "unicorn")
    assert counts.stdout == "the\t6\ncat\t1\nunicorn\t0\n"
    audit = tf("audit", "wordcount-drpc")
    assert audit.stdout.strip() == "lost=0 doubled=0 unaudited=answers", audit.stdout


class Concat(Reducer):
    """Order-sensitive: the stored string grows in batch order, batch after batch."""

    def init(self) -> str:
        return ""

    def reduce(self, acc: str, letter: str) -> str:
        return acc + letter


def letters() -> Pipeline:
    p = Pipeline("letters", LogSource(fields=("key", "letter"), partitions=2))
    p.stream.group_by("key").persistent_aggregate(
        StateSpec("words", StateKind.TRANSACTIONAL), Concat(), "letter"
    )
    return p


def test_a_reducer_state_folds_batches_in_order_and_replays_exactly(redis_url, redis_client, home):
    rt = Runtime.open(letters(), redis_url, home, FaultPlan.parse("mid-commit@1"))
    rt.source_heads()
    rt.log.append(0, [["a", "h"], ["b", "w"], ["a", "e"]])
    rt.log.append(1, [["a", "l"], ["b", "o"]])
    coordinate(rt, 1)
    emit(rt, 1, LocalEngine())
    try:
        commit(rt, 1)
    except Exception as exc:  # the injected mid-commit fault: half the keys written
        assert "injected fault" in str(exc)
    assert commit(rt, 1).status == "committed"  # the replay skips what attempt 1 wrote
    rt.log.append(0, [["a", "l"], ["b", "r"]])
    rt.log.append(1, [["a", "o"], ["b", "ld"]])
    coordinate(rt, 2)
    emit(rt, 2, LocalEngine())
    commit(rt, 2)
    from tridentflow.steps.query import query

    _txid, values = query(rt, rt.pipeline.states["words"], [("a",), ("b",), ("c",)])
    assert values == ["hello", "world", ""]


def test_a_lost_tuple_fails_the_emit_and_a_doctored_manifest_fails_the_commit(
    redis_url, redis_client, home
):
    rt = runtime("user-scores", redis_url, home, faults="lose-tuple@1")
    rt = rt.with_(staging_kind="files")  # the manifest doctored on disk
    rt.source_heads()
    rt.log.append_spread(SEED_BATCH)
    coordinate(rt, 1)
    with pytest.raises(IncompleteBatchError) as exc:
        emit(rt, 1, LocalEngine())
    assert "must not commit" in str(exc.value) and "announced tuples" in str(exc.value)
    assert rt.ledger.staged_attempt(1) is None  # nothing staged, nothing to commit
    staged = emit(rt, 1, LocalEngine())  # attempt 2: no fault
    manifest = json.loads((staged.directory / MANIFEST).read_text())
    assert manifest["stages"] and all(s[4] == s[5] for s in manifest["stages"])
    manifest["stages"][0][5] -= 1  # received one tuple fewer than announced
    (staged.directory / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(IncompleteBatchError) as exc:
        commit(rt, 1)
    assert "it must not commit" in str(exc.value)
    assert rt.ledger.committed_txid() == 0
    emit(rt, 1, LocalEngine())
    assert commit(rt, 1).status == "committed"


def test_a_state_query_stream_sees_the_last_committed_value_during_a_pending_commit(
    redis_url, redis_client, home
):
    rt = runtime("wordcount-drpc", redis_url, home, faults="mid-commit@2")
    rt = rt.with_(staging_kind="files")  # half of 8 keys (one Redis block would be applied whole)
    rt.source_heads()
    rt.log.append_spread([{"kind": "sentence", "text": "a b c d e f g h"}])
    for txid in (1, 2):
        coordinate(rt, txid)
        emit(rt, txid, LocalEngine())
        if txid == 2:
            try:
                commit(rt, txid)
            except Exception as exc:  # half of txid 2's keys are written, it is not committed
                assert "injected fault" in str(exc)
        else:
            commit(rt, txid)
            rt.log.append_spread([{"kind": "sentence", "text": "a b c d e f g h"}])
    stored = rt.backing("counts").multi_get([f'["{w}"]' for w in "abcdefgh"])
    assert 2 in [s[0] for s in stored] and 1 in [s[0] for s in stored]  # half-applied txid 2

    from tridentflow.engines.batchops import StateQuery

    counts = rt.pipeline.states["counts"]
    keyspace = KeySpace("wordcount-drpc")
    lookup = StateQuery(redis_url, keyspace, "counts", counts.aggregator, (0,))
    rows = lookup(0, [(w,) for w in "abcdefgh"] + [("zzz",)])
    assert rows == [(w, 1) for w in "abcdefgh"] + [("zzz", None)]
    assert commit(rt, 2).status == "committed"
    assert lookup(0, [("a",)]) == [("a", 2)]


def test_a_state_query_stream_over_another_pipelines_state(redis_url, redis_client, home):
    from tridentflow.examples.user_scores import keep_latest
    from tridentflow.registry import load_pipeline
    from tridentflow.steps.query import query

    counted = runtime("wordcount", redis_url, home)
    counted.source_heads()
    counted.log.append_spread(["a b a", "c a"])
    coordinate(counted, 1)
    emit(counted, 1, LocalEngine())
    commit(counted, 1)

    lookup = Pipeline("lookup", LogSource(fields=("word",), partitions=1))
    counts = load_pipeline("wordcount").state("counts")
    lookup.stream.state_query(counts, "word", "count").partition_persist(
        StateSpec("seen"), keep_latest, key_fields="word", in_fields="count"
    )
    rt = Runtime.open(lookup, redis_url, home)
    rt.source_heads()
    rt.log.append(0, ["a", "c", "zzz"])
    coordinate(rt, 1)
    emit(rt, 1, LocalEngine())
    commit(rt, 1)
    _txid, values = query(rt, rt.pipeline.states["seen"], [("a",), ("c",), ("zzz",)])
    assert values == [3, 1, None]


class Boom(Reducer):
    def init(self):
        return 0

    def reduce(self, acc, value):
        if value == "boom":
            raise ValueError("no booms")
        return acc + 1


def as_set(current, tuples):
    return {t[0] for t in tuples}


def test_bad_aggregator_output_fails_with_a_clear_error_and_loses_nothing(
    redis_url, redis_client, home
):
    p = Pipeline("bad-agg", LogSource(fields=("key", "value"), partitions=1))
    p.stream.group_by("key").persistent_aggregate(StateSpec("n"), Boom(), "value")
    rt = Runtime.open(p, redis_url, home)
    rt.source_heads()
    rt.log.append(0, [["a", "x"], ["b", "y"]])
    for txid in (1, 2):
        coordinate(rt, txid)
        emit(rt, txid, LocalEngine())
        if txid == 2:
            break
        commit(rt, txid)
        rt.log.append(0, [["a", "x"], ["b", "boom"]])
    with pytest.raises(StateUpdateError) as exc:
        commit(rt, 2)
    assert "state n: Boom() failed on key" in str(exc.value) and "no booms" in str(exc.value)
    from tridentflow.steps.query import query

    assert rt.ledger.committed_txid() == 1
    assert query(rt, rt.pipeline.states["n"], [("a",), ("b",)])[1] == [1, 1]  # txid 1's values

    q = Pipeline("bad-value", LogSource(fields=("key",), partitions=1))
    q.stream.partition_persist(StateSpec("s"), as_set, key_fields="key", in_fields="key")
    rt = Runtime.open(q, redis_url, home)
    rt.source_heads()
    rt.log.append(0, ["a"])
    coordinate(rt, 1)
    emit(rt, 1, LocalEngine())  # the set is made at commit: staging holds tuples
    with pytest.raises(StateUpdateError) as exc:
        commit(rt, 1)
    assert "state s: as_set failed on key" in str(exc.value) and "not JSON serializable" in str(
        exc.value
    )
    assert rt.ledger.committed_txid() == 0
    with pytest.raises(StagingValueError, match="state s: cannot stage"):
        rt.staging.write({"txid": 9, "attempt": 1}, {}, {"s": [("k", {1, 2})]})
