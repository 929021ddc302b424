"""Trident operations beyond the basics, on the local engine against real Redis:
localOrShuffle, parallelismHint on a state's stage and on the source stage, and
groupBy(...).stateQuery(...). (tests/test_spark.py runs the same operations, in
tests.pipelines:everything, on Spark and checks they stage the same values.)"""

from __future__ import annotations

import pytest

from tests.helpers import drain_retrying, sentences, word_counts
from tests.pipelines import keep_all
from tridentflow import Count, LogSource, Pipeline, StateSpec, StateUpdater, Sum
from tridentflow.engines.base import ExecContext
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import PipelineError
from tridentflow.examples.wordcount import split
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.runtime import Runtime
from tridentflow_state.codec import encode_key


def surface() -> Pipeline:
    p = Pipeline("surface", LogSource(fields=("sentence",), partitions=3))
    words = p.stream.each("sentence", split, "word")
    counts = words.group_by("word").persistent_aggregate(StateSpec("counts"), Count())
    words.local_or_shuffle().partition_aggregate([], Count(), "n").partition_persist(
        StateSpec("stay"), keep_all, in_fields="n"
    )
    words.local_or_shuffle().parallelism_hint(5).partition_aggregate(
        [], Count(), "n"
    ).partition_persist(StateSpec("five"), keep_all, in_fields="n")
    hinted = (
        words.project("word").group_by("word").persistent_aggregate(StateSpec("hinted"), Count())
    )
    assert hinted.parallelism_hint(2).persist.parallelism == 2
    words.group_by("word").state_query(counts, "seen").partition_persist(
        StateSpec("seen"), keep_all, key_fields="word", in_fields="seen"
    )
    return p


def test_local_or_shuffle_hints_and_a_grouped_state_query(redis_url, redis_client, home):
    rt = Runtime.open(surface(), redis_url, home)
    first, second = sentences(60, seed=1), sentences(90, seed=2)
    rt.source_heads()
    rt.log.append_spread(first)
    coordinate(rt, 1)
    emit(rt, 1, LocalEngine())
    assert commit(rt, 1).status == "committed"
    rt.log.append_spread(second)
    meta = coordinate(rt, 2)
    ranges = {int(p): tuple(r) for p, r in meta["ranges"].items()}
    result = LocalEngine().compute(rt.plan, str(rt.log.root), ranges, ExecContext(2, redis_url))
    states = {name: dict(pairs) for name, pairs in result.partials.items()}
    words = sum(len(s.split()) for s in second)

    stay = next(iter(states["stay"].values()))
    assert len(stay) == len(ranges) and sum(n for (n,) in stay) == words  # one per read task
    five = next(iter(states["five"].values()))
    assert len(five) == 5 and sum(n for (n,) in five) == words  # a shuffle to 5
    labels = {r.stage.split(":", 1)[1] for r in result.stages}
    assert "local_or_shuffle->5" in labels and not any(x == "local_or_shuffle" for x in labels)
    hinted = [r for r in result.stages if r.stage.endswith("persist(hinted)")]
    assert {r.partition for r in hinted} == {0, 1}  # the state stage in 2 partitions
    assert sorted(states["hinted"].values()) == sorted(word_counts(second).values())

    committed = word_counts(first)  # what txid 1 committed: the query sees that, not txid 2
    seen = {key: values for key, values in states["seen"].items()}
    assert seen and all(
        all(v == committed.get(word) for (v,) in values)
        for (word, values) in ((k.strip('["]'), v) for k, v in seen.items())
    )


def test_a_hint_on_the_source_stage_points_at_the_sources_partitions():
    p = Pipeline("hint", LogSource(fields=("sentence",), partitions=3))
    with pytest.raises(PipelineError, match=r"set LogSource\(partitions=N\)"):
        p.stream.parallelism_hint(8)
    with pytest.raises(PipelineError, match="parallelism must be a positive integer"):
        p.stream.each("sentence", split, "word").group_by("word").persistent_aggregate(
            StateSpec("c"), Count()
        ).parallelism_hint(0)


TWEETERS = {"u1": ["ann", "bob"], "u2": ["bob"], "u3": []}
FOLLOWERS = {"ann": ["x", "y", "z"], "bob": ["y", "w"]}


def expand(key, values):
    for value in values or ():
        yield (value,)


def grab_and_spoil(url, tweeters):
    """Mutates the looked-up list it is given (user code does): no other tuple may see it."""
    seen = list(tweeters or [])
    if tweeters is not None:
        tweeters.append("spoiled")
    return (len(seen),)


def reach(tweeters_hash: str, followers_file: str) -> Pipeline:
    """TridentReach: the distinct followers of everyone who tweeted a URL, from two static
    states (a Redis hash and a JSON file)."""
    from tridentflow import FileLookup, RedisHashLookup, SourceMode, StateKind

    p = Pipeline("reach", LogSource(fields=("url",), mode=SourceMode.TRANSACTIONAL, partitions=2))
    tweeters = p.static_state("tweeters", RedisHashLookup(tweeters_hash))
    followers = p.static_state("followers", FileLookup(followers_file))
    looked = p.stream.state_query(tweeters, "url", "tweeters")
    looked.each(["url", "tweeters"], grab_and_spoil, "n").group_by("url").persistent_aggregate(
        StateSpec("tweeter_counts", StateKind.OPAQUE), Sum(), "n"
    )
    (
        looked.each(["url", "tweeters"], expand, "tweeter")
        .state_query(followers, "tweeter", "followers")
        .each(["tweeter", "followers"], expand, "follower")
        .group_by(["url", "follower"])
        .aggregate([], Count(), "times")
        .group_by("url")
        .persistent_aggregate(StateSpec("reach", StateKind.OPAQUE), Count())
    )
    return p


def test_static_states_in_a_redis_hash_and_a_file_join_the_stream(
    redis_url, redis_client, home, tmp_path
):
    import json

    from tridentflow.steps.query import query

    redis_client.hset("ref:tweeters", mapping={k: json.dumps(v) for k, v in TWEETERS.items()})
    followers = tmp_path / "followers.json"
    followers.write_text(json.dumps(FOLLOWERS))
    rt = Runtime.open(reach("ref:tweeters", str(followers)), redis_url, home)
    rt.source_heads()
    rt.log.append_spread(["u1", "u2", "u3", "u4", "u1"])
    coordinate(rt, 1)
    emit(rt, 1, LocalEngine())
    assert commit(rt, 1).status == "committed"
    urls = [("u1",), ("u2",), ("u3",), ("u4",)]
    assert query(rt, rt.pipeline.states["reach"], urls)[1] == [4, 2, 0, 0]  # Count: absent = 0
    # every tuple got its own copy of the looked-up list: u1 twice, 2 tweeters each time
    assert query(rt, rt.pipeline.states["tweeter_counts"], urls)[1] == [4, 1, 0, 0]
    assert json.loads(redis_client.hget("ref:tweeters", "u1")) == TWEETERS["u1"]


def test_static_state_rules_and_errors(redis_url, redis_client, home, tmp_path):
    from tridentflow import RedisHashLookup, StateKind
    from tridentflow.errors import SourceError

    p = Pipeline("static", LogSource(fields=("code",), partitions=1))
    countries = p.static_state("countries", RedisHashLookup("ref:countries", values="text"))
    named = p.stream.state_query(countries, "code", "country")
    with pytest.raises(PipelineError, match="whose answer can differ when a txid is replayed"):
        named.group_by("country").persistent_aggregate(
            StateSpec("bad", StateKind.TRANSACTIONAL), Count()
        )
    named.group_by("country").persistent_aggregate(StateSpec("by_country"), Count())
    redis_client.hset("ref:countries", mapping={"US": "United States", "FR": "France"})
    rt = Runtime.open(p, redis_url, home)
    rt.source_heads()
    rt.log.append_spread(["US", "FR", "US", "XX"])
    coordinate(rt, 1)
    emit(rt, 1, LocalEngine())
    commit(rt, 1)
    from tridentflow.steps.query import query

    keys = [("United States",), ("France",), (None,)]
    assert query(rt, rt.pipeline.states["by_country"], keys)[1] == [2, 1, 1]

    strict = Pipeline("strict", LogSource(fields=("code",), partitions=1))
    json_values = strict.static_state("countries", RedisHashLookup("ref:countries"))
    strict.stream.state_query(json_values, "code", "country").group_by(
        "country"
    ).persistent_aggregate(StateSpec("c"), Count())
    rt = Runtime.open(strict, redis_url, home)
    rt.source_heads()
    rt.log.append_spread(["US"])
    coordinate(rt, 1)
    with pytest.raises(SourceError, match="hash ref:countries: value 'United States' is not JSON"):
        emit(rt, 1, LocalEngine())
    with pytest.raises(PipelineError, match="not a RedisHashLookup or a FileLookup"):
        strict.static_state("x", {"US": 1})


def test_named_stages_label_their_exchanges_and_the_errors_that_fail_a_batch(
    redis_url, redis_client, home
):
    p = Pipeline("named", LogSource(fields=("sentence",), partitions=2))
    words = p.stream.each("sentence", split, "word")
    spread = words.shuffle().name("spread")
    spread.group_by("word").aggregate([], Count(), "n").name("per-word").partition_persist(
        StateSpec("n"), keep_all, key_fields="word", in_fields="n"
    )
    rt = Runtime.open(p, redis_url, home)
    rt.source_heads()
    rt.log.append_spread(sentences(30, seed=5))
    ranges = {int(k): tuple(r) for k, r in coordinate(rt, 1)["ranges"].items()}
    result = LocalEngine().compute(rt.plan, str(rt.log.root), ranges, ExecContext(1, redis_url))
    labels = {r.stage.split(":", 1)[1] for r in result.stages}
    assert "shuffle()[spread]" in labels and "aggregate(Count())[per-word]" in labels, labels

    from tridentflow.engines.base import check_stages
    from tridentflow.errors import IncompleteBatchError

    lossy = ExecContext(1, redis_url, lose_tuple=True)
    lost = LocalEngine().compute(rt.plan, str(rt.log.root), ranges, lossy)
    with pytest.raises(IncompleteBatchError, match=r"shuffle\(\)\[spread\]"):
        check_stages(1, lost.stages)
    for bad in ("", "x" * 65, "a[b]", "two\nlines"):
        with pytest.raises(PipelineError, match=r"name\(\)"):
            words.name(bad)


def open_sessions(current, tuples):
    """Logins minus logouts per user; a user with none open is removed (REMOVE)."""
    from tridentflow import REMOVE

    n = current or 0
    for (action,) in tuples:
        n += 1 if action == "in" else -1
    return REMOVE if n <= 0 else n


def test_removed_keys_leave_the_store_once_committed_and_survive_a_failed_commit(
    redis_url, redis_client, home
):
    from tridentflow import SourceMode, StateKind
    from tridentflow.faults import FaultPlan, InjectedFaultError
    from tridentflow.ops.audit import audit
    from tridentflow.steps.query import query

    p = Pipeline("sessions", LogSource(fields=("user", "action"), mode=SourceMode.OPAQUE))
    p.stream.partition_persist(
        StateSpec("open", StateKind.OPAQUE), open_sessions, key_fields="user", in_fields="action"
    )
    rt = Runtime.open(p, redis_url, home, FaultPlan.parse("before-ledger@2"))
    rt.source_heads()
    rt.log.append_spread([["ann", "in"], ["bob", "in"], ["bob", "in"]])
    coordinate(rt, 1)
    emit(rt, 1, LocalEngine())
    commit(rt, 1)
    rt.log.append_spread([["ann", "out"], ["bob", "out"]])
    coordinate(rt, 2)
    emit(rt, 2, LocalEngine())
    with pytest.raises(InjectedFaultError):
        commit(rt, 2)  # every key written, the ledger not marked: ann is a tombstone
    state = rt.pipeline.states["open"]
    field = encode_key(("ann",))
    assert redis_client.hexists(rt.keyspace.state("open"), field)
    assert query(rt, state, [("ann",), ("bob",)])[1] == [1, 2]  # still txid 1's values
    assert commit(rt, 2).status == "committed"
    assert not redis_client.hexists(rt.keyspace.state("open"), field)  # gone for good
    assert query(rt, state, [("ann",), ("bob",)])[1] == [None, 1]
    assert audit(rt).ok


def test_static_lookup_fields_of_typed_keys():
    """One-field keys by their value as text, whatever the type (a bool is not the array
    [true]); compound keys by their JSON array."""
    from tridentflow.static_state import lookup_field

    fields = [lookup_field((v,)) for v in ("US", 42, 1.0, True, None)]
    assert fields == ["US", "42", "1.0", "true", "null"]
    assert lookup_field(("ann", 3)) == '["ann",3]' and lookup_field((True, None)) == "[true,null]"


def test_a_reducer_that_removes_keys_audits_clean(redis_url, redis_client, home):
    """REMOVE from a Reducer (a word removed at its second occurrence): the audit recomputes
    it as absent, as the map state stores it."""
    from tridentflow import REMOVE, Reducer
    from tridentflow.ops.audit import audit

    class Once(Reducer):
        def init(self):
            return 0

        def reduce(self, acc, *values):
            return REMOVE if acc == 1 else acc + 1

    p = Pipeline("once", LogSource(fields=("sentence",), partitions=2))
    p.stream.each("sentence", split, "word").group_by("word").persistent_aggregate(
        StateSpec("once"), Once()
    )
    rt = Runtime.open(p, redis_url, home)
    rt.source_heads()
    rt.log.append_spread(["a b", "b c"])
    coordinate(rt, 1)
    emit(rt, 1, LocalEngine())
    commit(rt, 1)
    fields = {k.decode() for k in redis_client.hkeys(rt.keyspace.state("once"))}
    assert fields == {encode_key(("a",)), encode_key(("c",))}  # b was removed
    report = audit(rt)
    assert report.ok and report.keys == 2, report


class SeenWithThe(StateUpdater):
    """Per word: [times seen, what key "the" held when the commit reached this word] - an
    updater that reads another key of its state during the commit (Trident's multiGet)."""

    reads_state = True

    def update(self, current, tuples, state):
        the = state.get("the")
        return [(current or [0])[0] + len(tuples), None if the is None else the[0]]


def reading() -> Pipeline:
    from tridentflow import SourceMode

    p = Pipeline("reading", LogSource(fields=("sentence",), mode=SourceMode.TRANSACTIONAL))
    words = p.stream.each("sentence", split, "word")
    for kind in ("transactional", "opaque"):
        words.partition_persist(StateSpec(kind, kind), SeenWithThe(), key_fields="word")
    return p


def test_an_updater_reads_other_keys_the_same_way_in_every_replay(redis_url, home, tmp_path):
    """A commit that fails half-way, and one that fails before the mark, replay: every value
    an updater stored from what it read equals the value of a run without faults."""
    from tridentflow.faults import FaultPlan
    from tridentflow.steps.query import list_state
    from tridentflow.steps.runtime import connect

    lines = [f"the {s}" if i % 3 else s for i, s in enumerate(sentences(200, seed=4))]
    states = {}
    for faults in ("", "mid-commit@2=raise,mid-commit@3=raise,before-ledger@4=raise"):
        rt = Runtime(reading(), connect(redis_url), tmp_path / f"h{bool(faults)}",
                     FaultPlan.parse(faults), namespace=f"r{bool(faults)}")  # fmt: skip
        rt.ledger.reset(force=True)
        rt.log.ensure(4)
        rt.log.append_spread(lines)
        drain_retrying(rt, batch_size=13)
        assert rt.ledger.committed_txid() >= 4
        states[faults] = {
            kind: list_state(rt, rt.pipeline.states[kind], limit=10_000).items
            for kind in ("transactional", "opaque")
        }
        counted = {k[0]: v[0] for k, v in states[faults]["opaque"]}
        assert counted == word_counts(lines)
        assert {v[1] for _k, v in states[faults]["opaque"]} - {None} != set()  # it read "the"
    clean, faulted = states.values()
    for kind in ("transactional", "opaque"):
        assert sorted(map(str, faulted[kind])) == sorted(map(str, clean[kind]))
