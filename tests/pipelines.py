"""Pipelines used only by the tests (loaded as tests.pipelines:NAME)."""

from __future__ import annotations

from collections.abc import Iterator

from state.maps import StateKind
from tridentflow import Count, LogSource, Pipeline, SourceMode, StateSpec, Sum

POISON = "BOOM"


def split_or_raise(sentence: str) -> Iterator[tuple[str]]:
    """Splits like the word count, but raises on the failure sentinel (Bytewax-style)."""
    for word in sentence.split():
        if word == POISON:
            raise ValueError(f"poison word in {sentence!r}")
        yield (word,)


def poison(max_bad_records: int | None = None) -> Pipeline:
    pipeline = Pipeline(
        "poison",
        LogSource(fields=("sentence",), mode=SourceMode.OPAQUE, partitions=2),
        max_bad_records=max_bad_records,
    )
    pipeline.stream.each("sentence", split_or_raise, "word").group_by("word").persistent_aggregate(
        StateSpec("counts", StateKind.OPAQUE), Count()
    )
    return pipeline


def strict_poison() -> Pipeline:
    return poison(max_bad_records=1)


def scores() -> Pipeline:
    """Two fields, two states, compound keys: per (user, day) sum and per user count."""
    pipeline = Pipeline(
        "scores", LogSource(fields=("user", "day", "score"), mode=SourceMode.TRANSACTIONAL)
    )
    stream = pipeline.stream
    stream.group_by(["user", "day"]).persistent_aggregate(
        StateSpec("by_day", StateKind.TRANSACTIONAL), Sum(), in_fields="score"
    )
    stream.group_by("user").persistent_aggregate(StateSpec("events", StateKind.OPAQUE), Count())
    return pipeline
