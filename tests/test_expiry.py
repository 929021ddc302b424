"""Expiry in txids (``StateSpec(expire_after_txids=N)``): at the commit of txid T every key last
updated at a txid <= T - N that T does not update is removed. Checked against a model of the
rule txid by txid - with replays, half-done commits and every fault point, on one hash and on
shards - and through what follows a removal: the change log every sink reads, the index that
keeps the work proportional to what expires, a rewind that brings expired keys back."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tests.helpers import produce, runtime
from tests.pipelines import expiring
from tridentflow import Count, LogSource, Pipeline, SourceMode, StateKind, StateSpec
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import PipelineError
from tridentflow.faults import FaultPlan, InjectedFaultError, SimulatedCrash
from tridentflow.ops.audit import audit
from tridentflow.ops.rewind import rewind_pipeline
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.export import changes_of, export
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime
from tridentflow.testing import CollectSink, run_batches
from tridentflow_state import expiry
from tridentflow_state.batch_times import ExpiryRule
from tridentflow_state.codec import live_stamp
from tridentflow_state.expiry import chunk_fields, expiry_index

AFTER = 2
POINTS = ("after-coordinate", "in-emit", "mid-commit", "before-ledger", "after-mark")


def model(batches: list[list[str]], after: int) -> tuple[dict[str, int], list[set[str]]]:
    """The rule, written out: each txid's words counted in, then every word whose last
    update is ``after`` or more txids back and which the txid did not update removed. The
    counts left, and the words each txid expired."""
    counts: dict[str, int] = {}
    last: dict[str, int] = {}
    expired: list[set[str]] = []
    for txid, lines in enumerate(batches, start=1):
        words = Counter(w for line in lines for w in line.split())
        for word, n in words.items():
            counts[word] = counts.get(word, 0) + n
            last[word] = txid
        gone = {w for w, t in last.items() if t <= txid - after and w not in words}
        for word in gone:
            del counts[word], last[word]
        expired.append(gone)
    return counts, expired


def draws(txids: int, seed: int) -> list[list[str]]:
    """Batches whose words come and go: a few words every txid, most now and then."""
    rng = random.Random(seed)
    vocabulary = [f"w{i}" for i in range(24)]
    return [
        [" ".join(rng.sample(vocabulary, rng.randint(1, 6))) for _ in range(rng.randint(1, 4))]
        for _ in range(txids)
    ]


# -- the pipeline spec ---------------------------------------------------------------------------


@pytest.mark.parametrize("after", [0, -1, 1.5, True, "2"])
def test_expire_after_txids_must_be_a_whole_number_of_txids(after):
    with pytest.raises(PipelineError, match=r"expire_after_txids=.* is not a whole number >= 1"):
        StateSpec("counts", StateKind.OPAQUE, expire_after_txids=after)


def test_a_non_transactional_state_cannot_expire_and_says_what_to_do():
    with pytest.raises(PipelineError, match="keeps no txid to expire by; make it transactional"):
        StateSpec("counts", StateKind.NON_TRANSACTIONAL, expire_after_txids=2)


def test_an_expiring_state_is_recounted_txid_by_txid_not_from_the_whole_source():
    """What expires depends on how the records were batched: audit's one-batch recount
    cannot know it; it recounts such a state txid by txid (tested against Redis below)."""
    persist = expiring().states["counts"]
    assert persist.recountable and not persist.batch_invariant
    assert expiring().expiring == {"counts": ExpiryRule(after_txids=AFTER)}


# -- the rule, with no server (tridentflow.testing) ------------------------------------------------


@pytest.mark.parametrize("kind", ["opaque", "transactional"])
@pytest.mark.parametrize("seed", range(6))
def test_the_harness_keeps_exactly_the_keys_the_rule_keeps_under_replays_and_crashes(kind, seed):
    batches = draws(10, seed)
    rng = random.Random(f"faults-{seed}")
    replay = sorted(rng.sample(range(1, 11), 3))
    crashes = sorted(rng.sample(range(1, 11), 3))
    states = run_batches(expiring(kind), batches, replay=replay, crash_mid_commit=crashes)
    expected, _ = model(batches, AFTER)
    assert states["counts"] == expected


def test_the_harness_hands_every_expired_key_to_the_sinks_as_a_removal():
    pipeline = Pipeline("expiry-sink", LogSource(fields=("sentence",), mode=SourceMode.OPAQUE))
    sink = CollectSink()
    (
        pipeline.stream.each("sentence", lambda s: [(w,) for w in s.split()], "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", expire_after_txids=1), Count(), out_field="count")
        .new_values_stream()
        .sink(sink)
    )
    run_batches(pipeline, [["a b"], ["b"], ["c"], ["c"]])
    assert sink.batches[2] == [("a", None), ("b", 2)]  # a: last updated at txid 1
    assert sink.batches[3] == [("b", None), ("c", 1)]
    assert sink.batches[4] == [("c", 2)]
    assert sink.latest() == {"a": ("a", None), "b": ("b", None), "c": ("c", 2)}


# -- the rule in Redis, at every fault point ---------------------------------------------------


def _step_by_step(rt, batches: list[list[str]], faults: dict[int, str], first: int = 1) -> None:
    """Each batch produced, then its txid coordinated, emitted, committed, retried as Airflow
    retries a failed task (a new process: the same txid, the fault no longer armed)."""
    for txid, lines in enumerate(batches, start=first):
        if lines:
            produce(rt, lines)
        attempt = rt.with_(faults=FaultPlan.parse(faults.get(txid, "")))
        for _ in range(4):
            try:
                coordinate(attempt, txid, batch_size=1000)
                emit(attempt, txid, LocalEngine())
                commit(attempt, txid)
                break
            except (InjectedFaultError, SimulatedCrash):
                attempt = rt  # the retry
        assert rt.ledger.committed_txid() == txid


def _stored(rt) -> dict[str, str]:
    """State ``counts`` as stored: field -> raw value, every shard."""
    spaces = [rt.keyspace.shard(i) for i in range(rt.keyspace.shards)]
    out = {}
    for space in spaces:
        out.update(rt.client.hgetall(space.state("counts")))
    return {k.decode(): v.decode() for k, v in out.items()}


def _index(rt, every: bool = False) -> dict:
    """The expiry index of state ``counts``: field -> the highest bucket holding it (every
    bucket, with ``every``), every shard."""
    found: dict[str, list[int]] = {}
    for i in range(rt.keyspace.shards):
        key = rt.keyspace.shard(i).expiry("counts")
        for member, score in rt.client.zrange(key, 0, -1, withscores=True):
            for field in chunk_fields(member):
                found.setdefault(field, []).append(int(score + 0.5))
    return found if every else {field: max(b) for field, b in found.items()}


def _counts(rt) -> dict[str, int]:
    page = list_state(rt, rt.pipeline.states["counts"], limit=10_000)
    return {key[0] if isinstance(key, tuple | list) else key: value for key, value in page.items}


@pytest.mark.parametrize("name", ["tests.pipelines:expiring", "tests.pipelines:expiring_sharded",
                                  "tests.pipelines:expiring_transactional"])  # fmt: skip
@pytest.mark.parametrize("compacting", [False, True], ids=["", "compacting"])
def test_redis_keeps_exactly_the_keys_the_rule_keeps_with_a_fault_at_every_point(
    redis_url, home, name, compacting, monkeypatch
):
    """A fault at every point of the txids that expire keys (raise and crash): the state
    after each txid is the model's; each txid's change log removes exactly the keys it
    expired; the history says how many. ``compacting``: the index compacts at every claim (the
    default waits until it holds twice the state)."""
    if compacting:
        monkeypatch.setattr(expiry, "COMPACT_RATIO", 0)  # as compacting_eagerly()
        monkeypatch.setattr(expiry, "COMPACT_SLACK", 0)
    batches = draws(12, seed=7)
    expected, expired = model(batches, AFTER)
    points = iter(POINTS * 4)
    faults = {t: f"{next(points)}@{t}" for t in range(1, 13) if expired[t - 1] or t % 3 == 0}
    rt = runtime(name, redis_url, home)
    rt.ledger.reset(force=True)
    _step_by_step(rt, batches, faults)
    assert _counts(rt) == expected
    feed = rt.pipeline.feeds[0]
    for txid in range(1, 13):
        removed = {key[0] for _encoded, key, value in changes_of(rt, feed, txid) if value is None}
        assert removed == expired[txid - 1], txid
    history = {entry["txid"]: entry for entry in rt.ledger.history(20)}
    assert [history[t]["expired"] for t in range(1, 13)] == [len(e) for e in expired]
    index = expiry_index(rt.client, rt.keyspace, "counts")
    index.merge(12), index.forget(12 - AFTER)  # what txid 12's settle did, unless cut short
    buckets = _index(rt)  # each live key under the txid that last wrote it
    stored = _stored(rt).items()
    stamps = {field: live_stamp(raw) for field, raw in stored if live_stamp(raw) is not None}
    assert set(stamps) == {f'["{word}"]' for word in expected}
    assert {field: buckets.get(field) for field in stamps} == stamps
    assert min(min(b) for b in _index(rt, every=True).values()) > 12 - AFTER  # nothing older
    report = audit(rt)
    assert (report.ok, report.unaudited, report.keys) == (True, [], len(expected)), report.line()


@pytest.mark.parametrize("name", ["tests.pipelines:expiring", "tests.pipelines:expiring_sharded"])
@pytest.mark.parametrize("first_cut", [1, 2], ids=["fresh", "built"])
def test_commits_cut_short_after_their_marks_in_a_row_still_expire_on_time(
    redis_url, home, name, first_cut
):
    """Two commits in a row cut short right after the mark and never retried (each mark's
    answer lost to a pause or a partition): the next commit merges what the second wrote
    into the expiry index (``built``: the index exists), and keys expire at the txid the rule
    says. ``fresh``: the cut commits are the pipeline's first - the index is built by the
    first settle that runs, and expiry starts one txid after it (found by the every-family
    chaos soak, seeds 7024-7025: a key due at txid 3 expired at 4, audit recounting from
    txid 1); now the claim builds the index of a state that holds nothing yet."""
    cut = f"after-mark@{first_cut},after-mark@{first_cut + 1}"
    rt = runtime(name, redis_url, home, faults=cut)
    rt.ledger.reset(force=True)
    lines = ["a a", "b", "b", "b"] if first_cut == 1 else ["c", "a a", "b", "b", "b"]
    for txid, line in enumerate(lines, start=1):
        produce(rt, [line])
        coordinate(rt, txid, batch_size=100)
        emit(rt, txid, LocalEngine())
        due = first_cut + 2  # a, last updated at first_cut, is due 2 txids later
        if txid in (first_cut, first_cut + 1):
            with pytest.raises(InjectedFaultError):
                commit(rt, txid)
        else:
            commit(rt, txid)
        if txid == due:
            assert "a" not in _counts(rt), f"a still there at txid {txid}"
    assert _counts(rt) == {"b": 3}
    report = audit(rt)
    assert report.ok, report.line()


def test_a_key_that_comes_back_counts_afresh_and_the_sink_sees_it_go_and_return(
    redis_url, redis_client, home
):
    rt = runtime("tests.pipelines:expiring", redis_url, home)
    rt.ledger.reset(force=True)
    redis_client.delete("expiring-out-opaque-1")
    _step_by_step(rt, [["a a b"], ["b"], ["b"], ["a"]], {})
    assert _counts(rt) == {"a": 1, "b": 3}  # a expired at txid 3, came back at 4
    export(rt)
    entries = [fields for _id, fields in redis_client.xrange("expiring-out-opaque-1")]
    words = [(f[b"word"].decode(), f.get(b"count", b"").decode()) for f in entries]
    assert words == [("a", "2"), ("b", "1"), ("b", "2"), ("a", "null"), ("b", "3"), ("a", "1")]


def test_a_rewind_brings_expired_keys_back_and_the_replay_expires_them_again(
    redis_url, home, monkeypatch
):
    monkeypatch.setenv("TRIDENTFLOW_RETAIN_TXIDS", "10")
    rt = runtime("tests.pipelines:expiring", redis_url, home)
    rt.ledger.reset(force=True)
    batches = [["a a b"], ["b"], ["b c"], ["c"], ["c d"]]
    _step_by_step(rt, batches, {})
    assert _counts(rt) == model(batches, AFTER)[0] == {"c": 3, "d": 1}
    rewind_pipeline(rt, 2, force=True)
    assert _counts(rt) == model(batches[:2], AFTER)[0] == {"a": 2, "b": 2}
    assert _index(rt) == {'["a"]': 1, '["b"]': 2}  # made again from the values
    coordinate(rt, 3, batch_size=1000)  # the replay reads the three batches left as one
    emit(rt, 3, LocalEngine())
    commit(rt, 3)
    replayed = [*batches[:2], [line for lines in batches[2:] for line in lines]]
    assert _counts(rt) == model(replayed, AFTER)[0] == {"b": 3, "c": 3, "d": 1}
    removed = [key for _e, key, value in changes_of(rt, rt.pipeline.feeds[0], 3) if value is None]
    assert removed == [("a",)]  # back with the rewind, expired again by the replay


def test_status_and_the_metrics_show_the_keys_expired_by_each_txid(redis_url, home):
    from tridentflow.ops.metrics import figures
    from tridentflow.ops.status import format_status, status

    rt = runtime("tests.pipelines:expiring", redis_url, home)
    rt.ledger.reset(force=True)
    _step_by_step(rt, [["a b c"], ["a"], ["a"], ["a d"]], {})
    info = status(rt)
    counts = info["states"]["counts"]
    assert (counts["keys"], counts["expire_after_txids"]) == (2, AFTER)
    assert counts["expired_by_txid"] == {"4": 0, "3": 2, "2": 0, "1": 0}
    assert "expire after 2 txids (expired by txid 4: 0, 3: 2, 2: 0, 1: 0)" in format_status(info)
    assert figures(rt, info)["last_commit_expired_keys"] == 0
    plain = runtime("wordcount", redis_url, home)
    assert "last_commit_expired_keys" not in figures(plain)  # no state expires: no figure


def test_audit_catches_an_expiring_state_that_kept_a_key_the_rule_removes(
    redis_url, redis_client, home
):
    """The recount must be able to fail: a key put back by hand after it expired (as a bug
    that skipped the expiry would leave it) is reported, and so is one removed too early."""
    rt = runtime("tests.pipelines:expiring", redis_url, home)
    rt.ledger.reset(force=True)
    _step_by_step(rt, [["a b"], ["b"], ["b"]], {})
    assert audit(rt).ok and _counts(rt) == {"b": 3}
    state = rt.keyspace.state("counts")
    redis_client.hset(state, '["a"]', "[1,1,null]")
    assert audit(rt).doubled == 1
    redis_client.hdel(state, '["a"]', '["b"]')
    assert audit(rt).lost == 3


def test_expiry_turned_on_later_starts_from_what_the_state_holds_and_off_again_forgets_it(
    redis_url, redis_client, home
):
    """A state that ran for a while without expiry: the commit that turns it on builds the
    index from every key after its mark (nothing expires in that txid), the next one expires by
    the rule - keys written before expiry was on included. Turned off, the index stops
    following and its built mark goes; turned on again, it is built anew (a stale index would
    expire keys updated while it was off). Audit, under each code, recounts every txid by the
    rule the code that committed it applied (it applied today's to every txid: doubled)."""
    plain = Runtime.open(expiring_words(None), redis_url, home)
    plain.ledger.reset(force=True)
    _step_by_step(plain, [["a b"], ["b"]], {})
    on = Runtime.open(expiring_words(1), redis_url, home)
    _step_by_step(on, [[], ["b"]], {}, first=3)
    # txid 3 turned expiry on: it built the index, expired nothing; txid 4 expired a (txid 1)
    assert _counts(on) == {"b": 3}
    built = on.keyspace.expiry_built("counts")
    assert redis_client.exists(built)
    off = Runtime.open(expiring_words(None), redis_url, home)
    _step_by_step(off, [["a"], ["a"], ["b"]], {}, first=5)  # a lives again, b updated at 7
    assert not redis_client.exists(built)
    again = Runtime.open(expiring_words(1), redis_url, home)
    _step_by_step(again, [["a"]], {}, first=8)  # builds: nothing expires at 8
    assert _counts(again) == {"a": 3, "b": 4}
    _step_by_step(again, [["a"]], {}, first=9)  # b last updated at 7 <= 9 - 1: expired
    assert _counts(again) == {"a": 4}
    for code in (plain, on, off, again):  # each txid recounted by the rule it was committed by
        report = audit(code)
        assert report.ok, (code.pipeline.states["counts"].state.expire_after_txids, report.line())


def expiring_words(after: int | None) -> Pipeline:
    """One pipeline (one name, one state) whose expiry a deploy turns on and off."""
    pipeline = Pipeline("expiry-switch", LogSource(fields=("sentence",), mode=SourceMode.OPAQUE))
    spec = StateSpec("counts", StateKind.OPAQUE, expire_after_txids=after)
    (
        pipeline.stream.each("sentence", lambda s: [(w,) for w in s.split()], "word")
        .group_by("word")
        .persistent_aggregate(spec, Count(), out_field="count")
    )
    return pipeline


@pytest.mark.parametrize("compacting", [False, True], ids=["", "compacting"])
def test_a_key_an_earlier_attempt_wrote_is_judged_by_its_last_committed_update(
    redis_url, home, compacting, monkeypatch
):
    """Key k is indexed under txids 1 and 3 (a key written again keeps its older bucket). At
    txid 4 (N = 3: due are txids <= 1) a first attempt writes k and dies before the mark; its
    replay lacks k (its partition went dark: an opaque replay may differ). k comes up from
    bucket 1 with the earlier attempt's stamp: its last committed update (3) is what counts,
    so it stays. Fails if the commit took the earlier attempt's key as last updated at 1 -
    or, ``compacting`` (at every claim), if the compaction before the replay's writes took k
    out of bucket 3 because the earlier attempt stamped it 4."""
    if compacting:
        monkeypatch.setattr(expiry, "COMPACT_RATIO", 0)  # as compacting_eagerly()
        monkeypatch.setattr(expiry, "COMPACT_SLACK", 0)
    rt = runtime("tests.pipelines:expiring_after_3", redis_url, home)
    rt.ledger.reset(force=True)
    for txid, (p0, p1) in enumerate([("k", "a"), ("b", "c"), ("k", "d"), ("e", "k")], start=1):
        rt.source_heads()
        rt.log.append(0, [{"sentence": p0}])
        rt.log.append(1, [{"sentence": p1}])
        plans = ["before-ledger@4", "dark:1@4"] if txid == 4 else [""]
        for plan in plans:
            attempt = rt.with_(faults=FaultPlan.parse(plan))
            try:
                coordinate(attempt, txid, batch_size=1)
                emit(attempt, txid, LocalEngine())
                commit(attempt, txid)
            except InjectedFaultError:
                continue
        assert rt.ledger.committed_txid() == txid
    assert _counts(rt) == {"k": 2, "b": 1, "c": 1, "d": 1, "e": 1}  # a: txid 1, gone at 4
    coordinate(rt, 5, batch_size=1)  # partition 1's record of txid 4 comes with txid 5
    emit(rt, 5, LocalEngine())
    commit(rt, 5)
    assert _counts(rt)["k"] == 3


def test_an_index_of_keys_written_every_txid_compacts_to_about_the_state_s_size(
    redis_url, home, monkeypatch
):
    """Ten keys written every txid and one new key a txid, N = 20: without compaction the
    index would hold each hot key once per txid of the window (200 and more); it holds at
    most twice the state (+ the slack, lowered to 5 here, + one txid's keys), and exactly the
    keys the rule keeps are kept."""
    monkeypatch.setattr(expiry, "COMPACT_SLACK", 5)
    rt = runtime("tests.pipelines:expiring_after_20", redis_url, home)
    rt.ledger.reset(force=True)
    hot = " ".join(f"h{i}" for i in range(10))
    batches = [[f"{hot} n{t}"] for t in range(1, 41)]
    index = expiry_index(rt.client, rt.keyspace, "counts")
    held = []
    for txid, lines in enumerate(batches, start=1):
        _step_by_step(rt, [lines], {}, first=txid)
        held.append(sum(len(b) for b in _index(rt, every=True).values()))
        assert index.count() == held[-1]  # the count it compacts by is exact here
    expected, _ = model(batches, 20)
    assert _counts(rt) == expected  # 10 hot keys, n21..n40
    assert max(held) <= 2 * (len(expected) + 11) + 5 + 11, held
    assert max(held[20:]) < 10 * 20  # what the window alone would hold
    buckets = _index(rt)
    assert {f'["{k}"]': buckets[f'["{k}"]'] for k in expected} == {
        f'["{k}"]': 40 if k[0] == "h" else int(k[1:]) for k in expected
    }
