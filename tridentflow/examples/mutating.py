"""Word counts written the way ordinary Python is written: every aggregator kind updates its
arguments in place, and one state is keyed by typed tokens (``1``, ``1.0``, ``true``, ``0.0``,
``-0.0`` are five different keys). The chaos harness runs these to prove the class of bugs
"user code that mutates its arguments" and "keys that compare equal but differ" cannot
change a count.

* ``mutating``: transactional source; ``counts`` (opaque, a Combiner ``a["n"] += b["n"]``),
  ``seen`` (transactional, a Reducer ``acc["n"] += 1``), ``updated`` (opaque, a full
  Aggregator per word per batch, then a StateUpdater ``current["n"] += ...``), ``typed``
  (opaque, the Combiner over typed tokens), ``odd`` (a StateUpdater that removes a word's key
  whenever its count is even: keys removed and re-added across replays).
* ``mutating-opaque``: the same over an opaque source, every state opaque.

Every state but ``odd`` presents ``{"n": k}`` as ``k``, so each equals the plain word count;
``odd`` holds True for the words of odd count and nothing for the others.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

from tridentflow.aggregators import Aggregator, BatchInfo, Combiner, Reducer, StateUpdater
from tridentflow.examples.wordcount import split
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import Pipeline
from tridentflow.sources.specs import LogSource, SourceMode
from tridentflow_state.codec import encode_key
from tridentflow_state.maps import REMOVE, StateKind


class InPlaceCount(Combiner):
    """``{"n": count}``, combined by mutating the left partial."""

    def init(self, *values: Any) -> dict[str, int]:
        return {"n": 1}

    def combine(self, a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        a["n"] += b["n"]
        return a

    def zero(self) -> dict[str, int]:
        return {"n": 0}

    def present(self, value: Any) -> Any:
        return None if value is None else value["n"]  # None: a key never written


class InPlaceTally(Reducer):
    def init(self) -> dict[str, int]:
        return {"n": 0}

    def reduce(self, acc: dict[str, int], *values: Any) -> dict[str, int]:
        acc["n"] += 1
        return acc

    def present(self, value: Any) -> Any:
        return None if value is None else value["n"]  # None: a key never written


class InPlaceGroupCount(Aggregator):
    def init(self, batch: BatchInfo) -> dict[str, int]:
        return {"n": 0}

    def aggregate(self, acc: dict[str, int], *values: Any) -> dict[str, int]:
        acc["n"] += 1
        return acc

    def complete(self, acc: dict[str, int]) -> list[int]:
        return [acc["n"]]


class OddWords(StateUpdater):
    """Whether a word was seen an odd number of times: ``{"odd": True}`` while odd, removed
    (REMOVE) while even, so keys come and go across txids, replays and failed commits."""

    def update(self, current: Any, tuples: list[tuple[Any, ...]]) -> Any:
        if current is None:
            current = {"odd": False}
        for _ in tuples:
            current["odd"] = not current["odd"]
        return current if current["odd"] else REMOVE

    def present(self, value: Any) -> Any:
        return None if value is None else value["odd"]  # None: absent (removed)


class AddInPlace(StateUpdater):
    def update(self, current: Any, tuples: list[tuple[Any, ...]]) -> dict[str, int]:
        if current is None:
            current = {"n": 0}
        for (n,) in tuples:
            current["n"] += n
        return current

    def present(self, value: Any) -> Any:
        return None if value is None else value["n"]  # None: a key never written


def parse_token(word: str) -> Any:
    """A word as a typed value: JSON numbers and booleans become numbers and booleans."""
    if word in ("true", "false") or word[:1].isdigit() or word[:1] == "-":
        try:
            return json.loads(word)
        except ValueError:
            return word
    return word


def typed_tokens(sentence: str) -> Iterator[tuple[Any]]:
    for word in sentence.split():
        yield (parse_token(word),)


def _mutating(name: str, mode: SourceMode) -> Pipeline:
    opaque_only = mode is not SourceMode.TRANSACTIONAL
    pipeline = Pipeline(
        name,
        LogSource(fields=("sentence",), mode=mode, partitions=4, batch_size=1000),
        description="word counts by aggregators that mutate their arguments",
    )
    words = pipeline.stream.each("sentence", split, "word")
    words.group_by("word").persistent_aggregate(
        StateSpec("counts", StateKind.OPAQUE), InPlaceCount(), out_field="count"
    )
    seen_kind = StateKind.OPAQUE if opaque_only else StateKind.TRANSACTIONAL
    words.group_by("word").persistent_aggregate(
        StateSpec("seen", seen_kind), InPlaceTally(), "word", "seen"
    )
    (
        words.partition_by("word")
        .group_by("word")
        .aggregate("word", InPlaceGroupCount(), "n")
        .partition_persist(
            StateSpec("updated", StateKind.OPAQUE), AddInPlace(), key_fields="word", in_fields="n"
        )
    )
    pipeline.stream.each("sentence", typed_tokens, "token").group_by("token").persistent_aggregate(
        StateSpec("typed", StateKind.OPAQUE), InPlaceCount(), out_field="count"
    )
    words.partition_persist(
        StateSpec("odd", seen_kind), OddWords(), key_fields="word", in_fields="word"
    )
    return pipeline


def mutating() -> Pipeline:
    return _mutating("mutating", SourceMode.TRANSACTIONAL)


def mutating_opaque() -> Pipeline:
    return _mutating("mutating-opaque", SourceMode.OPAQUE)


def expected_counts(sentences: Iterable[str]) -> dict[str, dict[str, int]]:
    """Each state's exact values (as queried), by encoded key, for these sentences."""
    sentences = list(sentences)
    words = Counter(encode_key((w,)) for s in sentences for w in s.split())
    typed = Counter(encode_key((parse_token(w),)) for s in sentences for w in s.split())
    return {
        "counts": dict(words),
        "seen": dict(words),
        "updated": dict(words),
        "typed": dict(typed),
        "odd": {key: True if n % 2 else None for key, n in words.items()},  # None: removed
    }
