"""Count windows over the word count's sentences (Trident's tumbling and sliding windows):
the source exposes each record's position, and every 10 positions make a tumbling window
(``per_window``: sentences per window) while windows of 10 every 5 slide (``sliding``); the
plain word count rides along. Opaque source and states: a dark partition's sentences land in
later windows, each in exactly one position."""

from __future__ import annotations

from tridentflow.aggregators import Count
from tridentflow.examples.wordcount import split
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import Pipeline
from tridentflow.sources.specs import LogSource, SourceMode
from tridentflow_state.maps import StateKind


def wordcount_windowed() -> Pipeline:
    source = LogSource(
        fields=("sentence",), mode=SourceMode.OPAQUE, partitions=4, position_field="position"
    )
    pipeline = Pipeline(
        "wordcount-windowed", source, description="word count and count windows of sentences"
    )
    sentences = pipeline.stream
    sentences.each("sentence", split, "word").group_by("word").persistent_aggregate(
        StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count"
    )
    sentences.tumbling_window(10, on="position").group_by("window").persistent_aggregate(
        StateSpec("per_window", StateKind.OPAQUE), Count(), out_field="sentences"
    )
    sentences.sliding_window(10, 5, on="position").group_by("window").persistent_aggregate(
        StateSpec("sliding", StateKind.OPAQUE), Count(), out_field="sentences"
    )
    return pipeline
