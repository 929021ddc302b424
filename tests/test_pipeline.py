from __future__ import annotations

import re

import pytest

from tridentflow import GUARANTEES, Count, Guarantee, LogSource, Pipeline, SourceMode, StateSpec
from tridentflow.aggregators import Aggregator, Reducer, Sum
from tridentflow.errors import PipelineError
from tridentflow.registry import load_pipeline
from tridentflow.sources.specs import RedisStreamSource
from tridentflow_state.maps import StateKind


def make(mode, kind, **kw):
    p = Pipeline("p", LogSource(fields=("x",), mode=mode), **kw)
    p.stream.group_by("x").persistent_aggregate(StateSpec("s", kind), Count())
    return p


@pytest.mark.parametrize(("mode", "kind"), list(GUARANTEES))
def test_the_guarantee_table_is_enforced(mode, kind):
    verdict = GUARANTEES[(mode, kind)]
    if verdict is Guarantee.REFUSED:
        with pytest.raises(PipelineError, match="refused"):
            make(mode, kind, allow_at_least_once=True)
    elif verdict is Guarantee.AT_LEAST_ONCE:
        with pytest.raises(PipelineError, match="AT-LEAST-ONCE"):
            make(mode, kind)
        assert make(mode, kind, allow_at_least_once=True).guarantee is Guarantee.AT_LEAST_ONCE
    else:
        assert make(mode, kind).guarantee is Guarantee.EXACTLY_ONCE


def test_seed_000_table():
    assert GUARANTEES[(SourceMode.OPAQUE, StateKind.TRANSACTIONAL)] is Guarantee.REFUSED
    assert GUARANTEES[(SourceMode.OPAQUE, StateKind.OPAQUE)] is Guarantee.EXACTLY_ONCE
    assert GUARANTEES[(SourceMode.TRANSACTIONAL, StateKind.TRANSACTIONAL)] is Guarantee.EXACTLY_ONCE


def test_definition_errors_are_clear():
    p = Pipeline("p", LogSource(fields=("sentence",)))
    with pytest.raises(PipelineError, match="no field"):
        p.stream.group_by("word")
    with pytest.raises(PipelineError, match="already exist"):
        p.stream.each("sentence", lambda s: [(s,)], "sentence")
    with pytest.raises(PipelineError, match="persists no state"):
        p.validate()

    with pytest.raises(ValueError, match="state name"):
        StateSpec("bad name")


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (lambda: LogSource(fields=()), "at least one field"),
        (lambda: LogSource(fields=("a",), partitions=0), "at least one partition, got 0"),
        (lambda: LogSource(fields=("a",), batch_size=0), "batch_size must be >= 1, got 0"),
        (lambda: LogSource(fields=("a",), position_field="a"), "already a field"),
        (lambda: RedisStreamSource(fields=("a",), partitions=0), "at least one partition"),
        (lambda: RedisStreamSource(fields=("a",), streams="s:{pipeline}"), "name {partition}"),
    ],
)
def test_bad_sources_are_one_clear_error(source, message):
    with pytest.raises(PipelineError, match=re.escape(message)):
        source()


class Last(Reducer):
    def init(self):
        return None

    def reduce(self, acc, *values):
        return values[0]


class Pairs(Aggregator):
    def init(self, batch):
        return []

    def aggregate(self, acc, *values):
        return [*acc, values]

    def complete(self, acc):
        return acc


def test_a_full_aggregator_cannot_be_persisted():
    p = Pipeline("p", LogSource(fields=("a", "b")))
    with pytest.raises(PipelineError, match=r"full Aggregator .* cannot be persisted"):
        p.stream.group_by("a").persistent_aggregate(StateSpec("s"), Pairs(), "b")
    with pytest.raises(PipelineError, match="not a StateUpdater"):
        p.stream.partition_persist(StateSpec("s"), Pairs())
    # a Reducer can be persisted; a full Aggregator can be aggregated, then persisted
    p.stream.group_by("a").persistent_aggregate(StateSpec("last"), Last(), "b")
    pairs = p.stream.aggregate(["a", "b"], Pairs(), ["a2", "b2"])
    pairs.group_by("a2").persistent_aggregate(StateSpec("n"), Count())
    assert sorted(p.states) == ["last", "n"]


def test_batch_operation_errors_name_the_problem():
    p = Pipeline("p", LogSource(fields=("a", "b")))
    s = p.stream
    with pytest.raises(PipelineError, match="no repartitioning stage"):
        s.each("a", lambda a: [(a,)], "c").parallelism_hint(2)
    with pytest.raises(PipelineError, match="positive integer"):
        s.shuffle().parallelism_hint(0)
    with pytest.raises(PipelineError, match="one result per batch"):
        s.aggregate("a", Count(), "n").parallelism_hint(2)
    with pytest.raises(PipelineError, match="2 and 1 fields"):
        p.merge(s, s.project("a"))
    with pytest.raises(PipelineError, match="needs 3 distinct output field names"):
        p.join(s, "a", s, "a", ["a", "b"])
    with pytest.raises(PipelineError, match="equally many"):
        p.join(s, ["a", "b"], s, "a", ["a", "b"])
    with pytest.raises(PipelineError, match="makes one value"):
        s.aggregate("a", Count(), ["x", "y"])
    with pytest.raises(PipelineError, match="cannot be mixed"):
        s.chained_agg().aggregate("a", Count(), "x").partition_aggregate("a", Count(), "y")
    with pytest.raises(PipelineError, match="repeat a name"):
        s.chained_agg().aggregate("a", Count(), "x").aggregate("b", Count(), "x").chain_end()
    other = Pipeline("q", LogSource(fields=("a",)))
    with pytest.raises(PipelineError, match="cannot be used in"):
        p.merge(s.project("a"), other.stream)
    counts = s.group_by("a").persistent_aggregate(StateSpec("counts"), Count())
    with pytest.raises(PipelineError, match="keyed by 1 field"):
        s.state_query(counts, ["a", "b"])
    looked_up = s.state_query(counts, "a", "count")
    with pytest.raises(PipelineError, match=r"state query .* Use an opaque state"):
        looked_up.group_by("a").persistent_aggregate(
            StateSpec("t", StateKind.TRANSACTIONAL), Sum(), "count"
        )
    # a hint sets the nearest repartition, through per-tuple operations and partition aggregates
    hinted = s.partition_by("a").partition_aggregate("b", Count(), "n").parallelism_hint(3)
    assert hinted.node.parent.parallelism == 3


def test_registry_finds_examples_and_module_attributes():
    assert load_pipeline("wordcount").name == "wordcount"
    ref = "tridentflow.examples.wordcount:wordcount_opaque"
    assert load_pipeline(ref).name == "wordcount-opaque"
    with pytest.raises(PipelineError, match="unknown pipeline") as exc:
        load_pipeline("nope")
    assert "did you mean" not in str(exc.value)
    with pytest.raises(PipelineError, match="'wordcout': did you mean 'wordcount'"):
        load_pipeline("wordcout")
    with pytest.raises(PipelineError, match="cannot import"):
        load_pipeline("no_such_module:x")


def test_a_typo_in_a_pipeline_module_or_attribute_names_the_closest(tmp_path, monkeypatch):
    """A DAG's or the CLI's `module:attribute` with a typo: the one line names the closest
    module of the user's folders on the path (the dags folder, the current one) or the
    closest attribute - never a module of the installed packages; nothing close, no hint."""
    (tmp_path / "user_sums.py").write_text(
        "from tridentflow.examples.wordcount import wordcount as build\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_pipeline("user_sums:build").name == "wordcount"
    with pytest.raises(PipelineError) as exc:
        load_pipeline("user_sum:build")
    assert "cannot import user_sum" in str(exc.value)
    assert str(exc.value).endswith("(did you mean user_sums:build?)")
    with pytest.raises(PipelineError) as exc:
        load_pipeline("user_sums:bild")
    assert str(exc.value).endswith("has no attribute 'bild' (did you mean user_sums:build?)")
    with pytest.raises(PipelineError) as exc:
        load_pipeline("pyspork:build")  # close to an installed package, not a user's module
    assert "did you mean" not in str(exc.value)
