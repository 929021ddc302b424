"""A word count with a state-query stream in the same pipeline (Trident's TridentWordCount with
its DRPC stream).

The source carries two kinds of records: ``{"kind": "sentence", "text": ...}`` is counted
into ``counts``; ``{"kind": "query", "text": "cat dog"}`` looks up each of its words in
``counts`` (the last committed values, one Redis round trip per partition and chunk of keys),
drops unknown words, and sums the rest per query into ``answers``:

    query stream: each(split) -> state_query(counts, word) -> filter(known)
                  -> group_by(text).aggregate(Sum) -> partition_persist(answers)

A query therefore sees the counts committed before its own txid. ``answers`` is fed by a state
query, whose answer may change when a txid is replayed, so it must be an opaque state (a
transactional one is refused).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from tridentflow.aggregators import Count, Sum
from tridentflow.examples.user_scores import keep_latest
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import Pipeline
from tridentflow.sources.specs import LogSource, SourceMode
from tridentflow_state.maps import StateKind


def split(text: str) -> Iterator[tuple[str]]:
    for word in text.split():
        yield (word,)


def is_sentence(kind: str) -> bool:
    return kind == "sentence"


def is_query(kind: str) -> bool:
    return kind == "query"


def known(count: Any) -> bool:
    return count is not None


def wordcount_drpc() -> Pipeline:
    pipeline = Pipeline(
        "wordcount-drpc",
        LogSource(fields=("kind", "text"), mode=SourceMode.TRANSACTIONAL, partitions=4),
        description="word count plus a query stream over its own counts (stateQuery)",
    )
    counts = (
        pipeline.stream.filter("kind", is_sentence)
        .each("text", split, "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    (
        pipeline.stream.filter("kind", is_query)
        .each("text", split, "word")
        .state_query(counts, "word", "count")
        .filter("count", known)
        .group_by("text")
        .aggregate("count", Sum(), "total")
        .partition_persist(
            StateSpec("answers", StateKind.OPAQUE),
            keep_latest,
            key_fields="text",
            in_fields="total",
        )
    )
    return pipeline
