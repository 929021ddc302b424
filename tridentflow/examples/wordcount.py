"""Seed 000's word count, and seed 003's partitioned global count.

* ``wordcount``: sentences -> each(split) -> group_by(word) -> persistent_aggregate(Count),
  transactional source, opaque state.
* ``wordcount-opaque``: the same over an opaque source.
* ``partitioned-count``: a global count over 16 partitions of an opaque source (seed 003: a
  partition may go dark during a txid; its records land in a later one).
"""

from __future__ import annotations

from collections.abc import Iterator

from state.maps import StateKind
from tridentflow.aggregators import Count
from tridentflow.pipeline import LogSource, Pipeline, SourceMode, StateSpec


def split(sentence: str) -> Iterator[tuple[str]]:
    """Trident's Split function: one tuple per whitespace-separated word."""
    for word in sentence.split():
        yield (word,)


def _wordcount(name: str, mode: SourceMode) -> Pipeline:
    pipeline = Pipeline(
        name,
        LogSource(fields=("sentence",), mode=mode, partitions=4, batch_size=1000),
        description=f"word count over a {mode.value} source into an opaque state",
    )
    (
        pipeline.stream.each("sentence", split, "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    return pipeline


def wordcount() -> Pipeline:
    return _wordcount("wordcount", SourceMode.TRANSACTIONAL)


def wordcount_opaque() -> Pipeline:
    return _wordcount("wordcount-opaque", SourceMode.OPAQUE)


def partitioned_count() -> Pipeline:
    pipeline = Pipeline(
        "partitioned-count",
        LogSource(fields=("event",), mode=SourceMode.OPAQUE, partitions=16, batch_size=100),
        description="global count over 16 partitions of an opaque source (seed 003)",
    )
    pipeline.stream.persistent_aggregate(
        StateSpec("total", StateKind.OPAQUE), Count(), out_field="count"
    )
    return pipeline
