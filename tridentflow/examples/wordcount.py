"""Seed 000's word count, and seed 003's partitioned global count.

* ``wordcount``: sentences -> each(split) -> group_by(word) -> persistent_aggregate(Count),
  transactional source, opaque state.
* ``wordcount-opaque``: the same over an opaque source.
* ``partitioned-count``: a global count over 16 partitions of an opaque source (seed 003: a
  partition may go dark during a txid; its records land in a later one).
* ``wordcount-batched``: the same counts through batch operations (for the chaos harness).
"""

from __future__ import annotations

from collections.abc import Iterator

from tridentflow.aggregators import Count, Sum
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import Pipeline
from tridentflow.sources.specs import LogSource, SourceMode
from tridentflow_state.maps import StateKind


def split(sentence: str) -> Iterator[tuple[str]]:
    """Trident's Split function: one tuple per whitespace-separated word."""
    for word in sentence.split():
        yield (word,)


def _wordcount(name: str, mode: SourceMode) -> Pipeline:
    source = LogSource(fields=("sentence",), mode=mode, partitions=4, batch_size=1000)
    return wordcount_over(name, source, f"word count over a {mode.value} source")


def wordcount_over(name: str, source: LogSource, description: str) -> Pipeline:
    """The word count (split, group by word, Count into an opaque state) over ``source``,
    whose one field is ``sentence``."""
    pipeline = Pipeline(name, source, description=f"{description} into an opaque state")
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


def wordcount_batched() -> Pipeline:
    """The word count routed through batch operations, over an opaque source: words are
    partitioned by word, counted per word per batch (group_by().aggregate), and the batch counts
    are summed into the state; the sentences per batch (a global aggregate) are summed into
    ``total``. The states equal the plain word count's, so the chaos harness can check them
    exactly while every fault hits the exchange path."""
    pipeline = Pipeline(
        "wordcount-batched",
        LogSource(fields=("sentence",), mode=SourceMode.OPAQUE, partitions=4, batch_size=1000),
        description="word count through partition_by, group_by().aggregate and aggregate",
    )
    words = pipeline.stream.each("sentence", split, "word")
    (
        words.partition_by("word")
        .parallelism_hint(3)
        .group_by("word")
        .aggregate("word", Count(), "n")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Sum(), "n", "count")
    )
    pipeline.stream.aggregate("sentence", Count(), "n").persistent_aggregate(
        StateSpec("total", StateKind.OPAQUE), Sum(), "n", "count"
    )
    return pipeline
