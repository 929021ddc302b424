"""Stream operations and built-in aggregators against a plain-Python reference, on random input
(hypothesis). The reference below is written independently of tridentflow.plan."""

from __future__ import annotations

from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from tridentflow import Count, LogSource, Max, Mean, Min, Pipeline, StateSpec, Sum
from tridentflow.engines.local import LocalEngine
from tridentflow.plan import compile_pipeline
from tridentflow.sources.filelog import FileLog
from tridentflow_state.codec import encode_key
from tridentflow_state.maps import StateKind

records = st.lists(
    st.fixed_dictionaries(
        {
            "user": st.sampled_from(["ann", "bob", "cy", "dee"]),
            "score": st.integers(min_value=-50, max_value=50),
            "tags": st.text(alphabet="abc ", max_size=8),
        }
    ),
    max_size=40,
)


def keep_positive(score):
    return score > 0


def double(user, score, tags):
    return (user, score * 2, tags)


def explode_tags(user, score, tags):
    for tag in tags.split():
        yield (user, tag, score)


def pipeline() -> Pipeline:
    p = Pipeline("ops", LogSource(fields=("user", "score", "tags"), partitions=3))
    s = p.stream.filter("score", keep_positive).map(double)
    s.group_by("user").persistent_aggregate(StateSpec("total"), Sum(), in_fields="score")
    s.group_by("user").persistent_aggregate(StateSpec("low"), Min(), in_fields="score")
    s.group_by("user").persistent_aggregate(StateSpec("high"), Max(), in_fields="score")
    s.group_by("user").persistent_aggregate(StateSpec("avg"), Mean(), in_fields="score")
    tagged = p.stream.flat_map(explode_tags, ["user", "tag", "score"]).project(["tag", "user"])
    tagged.group_by(["tag", "user"]).persistent_aggregate(
        StateSpec("tag_users", StateKind.TRANSACTIONAL), Count()
    )
    p.stream.persistent_aggregate(StateSpec("everything"), Count())
    return p


def reference(rows: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = defaultdict(dict)
    groups: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        if r["score"] > 0:
            groups[r["user"]].append(r["score"] * 2)
    for user, scores in groups.items():
        key = encode_key((user,))
        out["total"][key] = sum(scores)
        out["low"][key] = min(scores)
        out["high"][key] = max(scores)
        out["avg"][key] = [sum(scores), len(scores)]
    for r in rows:
        for tag in r["tags"].split():
            key = encode_key((tag, r["user"]))
            out["tag_users"][key] = out["tag_users"].get(key, 0) + 1
    if rows:
        out["everything"][encode_key(())] = len(rows)
    return out


@settings(max_examples=60, deadline=None)
@given(rows=records)
def test_operations_match_the_reference(tmp_path_factory, rows):
    log = FileLog(tmp_path_factory.mktemp("log"))
    log.ensure(3)
    log.append_spread(rows)
    plan = compile_pipeline(pipeline())
    result = LocalEngine().compute(plan, str(log.root), {p: (0, h) for p, h in log.heads().items()})
    assert not result.bad
    expected = reference(rows)
    for name in ("total", "low", "high", "avg", "tag_users", "everything"):
        assert dict(result.partials[name]) == expected.get(name, {}), name


def test_mean_presents_the_mean_and_zero_values():
    mean = Mean()
    partial = mean.combine(mean.init(3), mean.combine(mean.init(4), mean.zero()))
    assert partial == [7, 2] and mean.present(partial) == 3.5
    assert mean.present(mean.zero()) is None
    assert Min().combine(Min().zero(), 5) == 5 and Max().combine(3, Max().zero()) == 3


def test_map_with_the_wrong_width_is_a_bad_record(tmp_path):
    p = Pipeline("w", LogSource(fields=("x",), partitions=1))
    p.stream.map(lambda x: (x, x), "y").group_by("y").persistent_aggregate(StateSpec("s"), Count())
    log = FileLog(tmp_path / "log")
    log.ensure(1)
    log.append(0, ["a"])
    result = LocalEngine().compute(compile_pipeline(p), str(log.root), {0: (0, 1)})
    assert "2 values for 1 field(s)" in result.bad[0].error


def test_the_key_cache_keeps_int_float_and_bool_apart():
    from tridentflow.plan import KeyEncoder

    encode = KeyEncoder()
    keys = [(1,), (1.0,), (True,), ("a", 1), ("a", 1.0), ([1],), ([1.0],)]
    assert [encode(k) for k in keys] == [encode_key(k) for k in keys]
    assert len({encode(k) for k in keys}) == len(keys)
