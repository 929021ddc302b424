"""The record stage's per-task fold (tridentflow.engines.tasks.TaskFold) against a plain-Python
reference, on random keys of every JSON type (hypothesis): keys that compare equal but encode
differently never share a slot, and a key that cannot be encoded quarantines exactly its own
records, whether it is a str (encoded once per task, after the fold) or not."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tridentflow import Count, LogSource, Pipeline, StateSpec, Sum
from tridentflow.engines.local import LocalEngine
from tridentflow.examples.mutating import InPlaceCount
from tridentflow.plan import compile_pipeline
from tridentflow.sources.filelog import FileLog
from tridentflow_state.codec import encode_key

LONE = "\ud800"
"""A token the function turns into a str with a lone surrogate: no UTF-8 can hold it."""

tokens = st.one_of(
    st.sampled_from(["a", "b", "1", "LONE", "-0.0"]),
    st.integers(min_value=-1, max_value=2),
    st.sampled_from([0.0, -0.0, 1.0, True, False, None]),
    st.lists(st.sampled_from([0, 1, 1.0, "a"]), max_size=2),
)
records = st.lists(st.lists(tokens, max_size=6), max_size=25)


def token_pairs(tokens):
    for token in tokens:
        yield (LONE if token == "LONE" else token, 1)


def pipeline() -> Pipeline:
    p = Pipeline("fold", LogSource(fields=("tokens",), partitions=1))
    stream = p.stream.each("tokens", token_pairs, ("token", "one"))
    stream.group_by("token").persistent_aggregate(StateSpec("counts"), Count())
    stream.group_by("token").persistent_aggregate(StateSpec("sums"), Sum(), "one", "sum")
    stream.group_by("token").persistent_aggregate(StateSpec("objects"), InPlaceCount())
    stream.group_by(("token", "one")).persistent_aggregate(StateSpec("pairs"), Count())
    return p


def reference(rows: list[list]) -> tuple[dict[str, Counter], list[int]]:
    counts: Counter = Counter()
    pairs: Counter = Counter()
    bad = []
    for offset, row in enumerate(rows):
        if "LONE" in row:
            bad.append(offset)
            continue
        counts.update(encode_key((t,)) for t in row)
        pairs.update(encode_key((t, 1)) for t in row)
    return {"counts": counts, "sums": counts, "objects": counts, "pairs": pairs}, bad


@settings(max_examples=150, deadline=None)
@given(rows=records)
def test_the_fold_matches_the_reference_for_keys_of_every_type(tmp_path_factory, rows):
    log = FileLog(tmp_path_factory.mktemp("log"))
    log.ensure(1)
    log.append(0, [{"tokens": row} for row in rows])
    expected, bad = reference(rows)
    for states in (None, ["counts"], ["sums"], ["objects"], ["pairs"]):
        plan = compile_pipeline(pipeline(), states)
        result = LocalEngine().compute(plan, str(log.root), {0: (0, len(rows))})
        assert [b.offset for b in result.bad] == bad
        got = {name: dict(items) for name, items in result.partials.items()}
        if "objects" in got:
            got["objects"] = {k: v["n"] for k, v in got["objects"].items()}
        assert got == {name: dict(expected[name]) for name in got}
