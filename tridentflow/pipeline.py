"""The pipeline API: Trident's stream operations, shaped for Python.

    pipeline = Pipeline("wordcount", LogSource(fields=("sentence",), mode=SourceMode.TRANSACTIONAL))
    (pipeline.stream
        .each(["sentence"], split, ["word"])
        .group_by(["word"])
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count"))

A stream is an immutable chain of operations; every method returns a new stream. Persisting
registers the state on the pipeline. Which (source mode, state kind) pairs are exactly-once is
``GUARANTEES``; the refused pairs raise PipelineError, the at-least-once ones need an explicit
``allow_at_least_once=True`` and are labelled loudly everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from state.keys import check_name
from state.maps import StateKind
from tridentflow.aggregators import Combiner, Reducer
from tridentflow.errors import PipelineError


class SourceMode(StrEnum):
    TRANSACTIONAL = "transactional"
    OPAQUE = "opaque"
    NON_TRANSACTIONAL = "non-transactional"


class Guarantee(StrEnum):
    EXACTLY_ONCE = "exactly-once"
    AT_LEAST_ONCE = "at-least-once"
    REFUSED = "refused"


GUARANTEES: dict[tuple[SourceMode, StateKind], Guarantee] = {
    # Seed 000's table. A transactional state trusts that a replayed txid has the same contents;
    # only a transactional source promises that.
    (SourceMode.TRANSACTIONAL, StateKind.TRANSACTIONAL): Guarantee.EXACTLY_ONCE,
    (SourceMode.TRANSACTIONAL, StateKind.OPAQUE): Guarantee.EXACTLY_ONCE,
    (SourceMode.OPAQUE, StateKind.OPAQUE): Guarantee.EXACTLY_ONCE,
    (SourceMode.OPAQUE, StateKind.TRANSACTIONAL): Guarantee.REFUSED,
    (SourceMode.NON_TRANSACTIONAL, StateKind.TRANSACTIONAL): Guarantee.REFUSED,
    (SourceMode.TRANSACTIONAL, StateKind.NON_TRANSACTIONAL): Guarantee.AT_LEAST_ONCE,
    (SourceMode.OPAQUE, StateKind.NON_TRANSACTIONAL): Guarantee.AT_LEAST_ONCE,
    (SourceMode.NON_TRANSACTIONAL, StateKind.OPAQUE): Guarantee.AT_LEAST_ONCE,
    (SourceMode.NON_TRANSACTIONAL, StateKind.NON_TRANSACTIONAL): Guarantee.AT_LEAST_ONCE,
}

_REFUSAL_REASON = {
    SourceMode.OPAQUE: "an opaque source may replay a txid with different records, and a "
    "transactional state skips keys it already wrote for that txid - records would be lost",
    SourceMode.NON_TRANSACTIONAL: "a non-transactional source may replay a txid with different "
    "records, and a transactional state skips keys it already wrote for that txid",
}


def guarantee_of(source: SourceMode, kind: StateKind) -> Guarantee:
    return GUARANTEES[(SourceMode(source), StateKind(kind))]


@dataclass(frozen=True)
class LogSource:
    """The embedded partitioned file log (see tridentflow.filelog).

    ``batch_size`` is the most records taken from each partition per txid. Records are JSON
    values: a dict gives its ``fields`` by name, a list by position, and a scalar is the single
    field of a one-field source.
    """

    fields: tuple[str, ...]
    mode: SourceMode = SourceMode.TRANSACTIONAL
    partitions: int = 4
    batch_size: int = 10_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", tuple(self.fields))
        object.__setattr__(self, "mode", SourceMode(self.mode))
        if not self.fields:
            raise PipelineError("a source needs at least one field")
        if self.partitions < 1:
            raise PipelineError(f"a source needs at least one partition, got {self.partitions}")
        if self.batch_size < 1:
            raise PipelineError(f"batch_size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True)
class StateSpec:
    name: str
    kind: StateKind = StateKind.OPAQUE

    def __post_init__(self) -> None:
        check_name("state", self.name)
        object.__setattr__(self, "kind", StateKind.parse(self.kind))


@dataclass(frozen=True)
class Each:
    """Trident's each(): ``function(*in_values)`` returns 0..n output tuples, appended as
    ``out_fields``. A function may also return None (no output) or a generator."""

    in_fields: tuple[str, ...]
    function: Callable[..., Iterable[Sequence[Any]] | None]
    out_fields: tuple[str, ...]


@dataclass(frozen=True)
class Filter:
    """Trident's filter(): keep a tuple when ``predicate(*in_values)`` is truthy."""

    in_fields: tuple[str, ...]
    predicate: Callable[..., Any]


@dataclass(frozen=True)
class Map:
    """Trident's map(): ``function(*values)`` returns one tuple that replaces the input;
    ``flat`` (flatMap) returns 0..n of them. The stream's fields become ``out_fields``."""

    function: Callable[..., Any]
    out_fields: tuple[str, ...]
    flat: bool = False


@dataclass(frozen=True)
class Project:
    """Trident's project(): keep only ``fields``, in that order."""

    fields: tuple[str, ...]


Operation = Each | Filter | Map | Project


@dataclass(frozen=True)
class Persist:
    """A persistent aggregate: the stream's tuples, grouped, aggregated into a map state."""

    state: StateSpec
    aggregator: Combiner
    group_fields: tuple[str, ...]
    in_fields: tuple[str, ...]
    out_field: str
    operations: tuple[Operation, ...]
    fields: tuple[str, ...]


def _name(function: Any) -> str:
    return getattr(function, "__name__", type(function).__name__)


def _fields(value: str | Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


@dataclass(frozen=True)
class Stream:
    pipeline: Pipeline
    fields: tuple[str, ...]
    operations: tuple[Operation, ...] = ()

    def _require(self, names: Sequence[str], what: str) -> None:
        missing = [n for n in names if n not in self.fields]
        if missing:
            raise PipelineError(
                f"{what}: no field(s) {', '.join(missing)} in stream fields {list(self.fields)}"
            )

    def each(
        self,
        in_fields: str | Sequence[str],
        function: Callable[..., Iterable[Sequence[Any]] | None],
        out_fields: str | Sequence[str],
    ) -> Stream:
        ins, outs = _fields(in_fields), _fields(out_fields)
        name = _name(function)
        self._require(ins, f"each({name})")
        clash = [f for f in outs if f in self.fields]
        if clash:
            raise PipelineError(f"each({name}): output field(s) {clash} already exist")
        if not callable(function):
            raise PipelineError(f"each(): {function!r} is not callable")
        op = Each(ins, function, outs)
        return Stream(self.pipeline, self.fields + outs, (*self.operations, op))

    def filter(self, in_fields: str | Sequence[str], predicate: Callable[..., Any]) -> Stream:
        ins = _fields(in_fields)
        self._require(ins, f"filter({_name(predicate)})")
        return Stream(self.pipeline, self.fields, (*self.operations, Filter(ins, predicate)))

    def map(
        self, function: Callable[..., Any], out_fields: str | Sequence[str] | None = None
    ) -> Stream:
        """One output tuple per input tuple, from all of its values."""
        outs = self.fields if out_fields is None else _fields(out_fields)
        return Stream(self.pipeline, outs, (*self.operations, Map(function, outs)))

    def flat_map(
        self, function: Callable[..., Any], out_fields: str | Sequence[str] | None = None
    ) -> Stream:
        """0..n output tuples per input tuple, from all of its values."""
        outs = self.fields if out_fields is None else _fields(out_fields)
        return Stream(self.pipeline, outs, (*self.operations, Map(function, outs, flat=True)))

    def project(self, fields: str | Sequence[str]) -> Stream:
        keep = _fields(fields)
        self._require(keep, "project")
        return Stream(self.pipeline, keep, (*self.operations, Project(keep)))

    def group_by(self, fields: str | Sequence[str]) -> GroupedStream:
        group = _fields(fields)
        if not group:
            raise PipelineError("group_by() needs at least one field")
        self._require(group, "group_by")
        return GroupedStream(self, group)

    def persistent_aggregate(
        self,
        state: StateSpec,
        aggregator: Combiner,
        in_fields: str | Sequence[str] = (),
        out_field: str = "value",
    ) -> TridentState:
        """Ungrouped (global) persistent aggregate: a single value (Trident's Snapshottable)."""
        return self.pipeline._persist(self, (), state, aggregator, _fields(in_fields), out_field)


@dataclass(frozen=True)
class GroupedStream:
    stream: Stream
    group_fields: tuple[str, ...]

    def persistent_aggregate(
        self,
        state: StateSpec,
        aggregator: Combiner,
        in_fields: str | Sequence[str] = (),
        out_field: str = "value",
    ) -> TridentState:
        return self.stream.pipeline._persist(
            self.stream, self.group_fields, state, aggregator, _fields(in_fields), out_field
        )


@dataclass(frozen=True)
class TridentState:
    """Handle of a persisted state (what Trident's persistentAggregate returns)."""

    pipeline: Pipeline
    persist: Persist

    @property
    def name(self) -> str:
        return self.persist.state.name


@dataclass(eq=False)
class Pipeline:
    name: str
    source: LogSource
    allow_at_least_once: bool = False
    description: str = ""
    max_bad_records: int | None = None
    """Fail a batch with more quarantined records than this (None: no limit)."""
    max_bad_fraction: float | None = None
    """Fail a batch whose quarantined share of records exceeds this (None: no limit)."""
    persists: list[Persist] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_name("pipeline", self.name)
        if self.max_bad_records is not None and self.max_bad_records < 0:
            raise PipelineError(f"max_bad_records must be >= 0, got {self.max_bad_records}")
        if self.max_bad_fraction is not None and not 0 <= self.max_bad_fraction <= 1:
            raise PipelineError(f"max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}")

    @property
    def stream(self) -> Stream:
        return Stream(self, self.source.fields)

    @property
    def states(self) -> dict[str, Persist]:
        return {p.state.name: p for p in self.persists}

    def _persist(
        self,
        stream: Stream,
        group: tuple[str, ...],
        state: StateSpec,
        aggregator: Combiner,
        in_fields: tuple[str, ...],
        out_field: str,
    ) -> TridentState:
        if isinstance(aggregator, Reducer):
            raise PipelineError(
                f"state {state.name}: Reducer aggregators are not supported by"
                " persistent_aggregate yet; use a Combiner"
            )
        if not isinstance(aggregator, Combiner):
            raise PipelineError(
                f"state {state.name}: persistent_aggregate needs a Combiner, got {aggregator!r}"
                " (a full Aggregator cannot be persisted)"
            )
        stream._require(in_fields, f"persistent_aggregate({state.name})")
        if state.name in self.states:
            raise PipelineError(f"pipeline {self.name}: state {state.name!r} is persisted twice")
        verdict = guarantee_of(self.source.mode, state.kind)
        if verdict is Guarantee.REFUSED:
            raise PipelineError(
                f"pipeline {self.name}: a {self.source.mode.value} source with a "
                f"{state.kind.value} state is refused: {_REFUSAL_REASON[self.source.mode]}. "
                "Use an opaque state."
            )
        if verdict is Guarantee.AT_LEAST_ONCE and not self.allow_at_least_once:
            raise PipelineError(
                f"pipeline {self.name}: a {self.source.mode.value} source with a "
                f"{state.kind.value} state is only AT-LEAST-ONCE (a replay can count twice); "
                "pass allow_at_least_once=True to accept that"
            )
        persist = Persist(
            state, aggregator, group, in_fields, out_field, stream.operations, stream.fields
        )
        self.persists.append(persist)
        return TridentState(self, persist)

    @property
    def guarantee(self) -> Guarantee:
        """The weakest guarantee over all persisted states."""
        verdicts = {guarantee_of(self.source.mode, p.state.kind) for p in self.persists}
        if Guarantee.AT_LEAST_ONCE in verdicts:
            return Guarantee.AT_LEAST_ONCE
        return Guarantee.EXACTLY_ONCE

    def validate(self) -> Pipeline:
        if not self.persists:
            raise PipelineError(f"pipeline {self.name} persists no state")
        return self
