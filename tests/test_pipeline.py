from __future__ import annotations

import pytest

from state.maps import StateKind
from tridentflow import GUARANTEES, Count, Guarantee, LogSource, Pipeline, SourceMode, StateSpec
from tridentflow.aggregators import Reducer
from tridentflow.errors import PipelineError
from tridentflow.registry import load_pipeline


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

    class Last(Reducer):
        def init(self):
            return None

        def reduce(self, acc, *values):
            return values[0]

    with pytest.raises(PipelineError, match="Combiner"):
        p.stream.group_by("sentence").persistent_aggregate(StateSpec("s"), Last())
    with pytest.raises(ValueError, match="state name"):
        StateSpec("bad name")


def test_registry_finds_examples_and_module_attributes():
    assert load_pipeline("wordcount").name == "wordcount"
    ref = "tridentflow.examples.wordcount:wordcount_opaque"
    assert load_pipeline(ref).name == "wordcount-opaque"
    with pytest.raises(PipelineError, match="unknown pipeline"):
        load_pipeline("nope")
    with pytest.raises(PipelineError, match="cannot import"):
        load_pipeline("no_such_module:x")
