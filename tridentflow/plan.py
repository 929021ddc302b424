"""Compiles a pipeline into small picklable callables, shared by every engine.

``RowDecoder`` turns a source record into a tuple of the source's fields; ``PersistPlan`` turns
one input tuple into the (group key, partial) pairs of one persisted state. Engines (Spark,
local) only decide where these run; the semantics live here once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from state.codec import encode_key
from tridentflow.aggregators import Combiner
from tridentflow.errors import BadRecordError, PipelineError
from tridentflow.pipeline import Each, Persist, Pipeline, StateSpec

Row = tuple[Any, ...]


@dataclass(frozen=True)
class RowDecoder:
    fields: tuple[str, ...]

    def __call__(self, record: Any) -> Row:
        if isinstance(record, dict):
            try:
                return tuple(record[f] for f in self.fields)
            except KeyError as exc:
                raise BadRecordError(f"record has no field {exc.args[0]!r}: {record!r}") from None
        if isinstance(record, list):
            if len(record) != len(self.fields):
                raise BadRecordError(
                    f"record {record!r} has {len(record)} values, expected {len(self.fields)}"
                )
            return tuple(record)
        if len(self.fields) == 1:
            return (record,)
        raise BadRecordError(f"record {record!r} is not an object or list of {self.fields}")


@dataclass(frozen=True)
class EachStep:
    function: Callable[..., Iterable[Sequence[Any]] | None]
    in_idx: tuple[int, ...]
    n_out: int
    name: str

    def __call__(self, row: Row) -> Iterator[Row]:
        produced = self.function(*(row[i] for i in self.in_idx))
        if produced is None:
            return
        for out in produced:
            values = tuple(out) if isinstance(out, (tuple, list)) else (out,)
            if len(values) != self.n_out:
                raise PipelineError(
                    f"each({self.name}) emitted {values!r}: {len(values)} values for "
                    f"{self.n_out} output field(s)"
                )
            yield row + values


@dataclass(frozen=True)
class Expander:
    """Applies a chain of each() steps to one tuple; yields the resulting tuples."""

    steps: tuple[EachStep, ...]

    def __call__(self, row: Row) -> Iterator[Row]:
        rows: Iterable[Row] = (row,)
        for step in self.steps:
            rows = _chain(step, rows)
        yield from rows


def _chain(step: EachStep, rows: Iterable[Row]) -> Iterator[Row]:
    for r in rows:
        yield from step(r)


@dataclass(frozen=True)
class PersistPlan:
    state: StateSpec
    aggregator: Combiner
    expand: Expander
    key_idx: tuple[int, ...]
    arg_idx: tuple[int, ...]

    def pairs(self, row: Row) -> Iterator[tuple[Row, Any]]:
        """(group key, partial) for every tuple the stream makes of one input ``row``."""
        init = self.aggregator.init
        for out in self.expand(row):
            yield tuple(out[i] for i in self.key_idx), init(*(out[i] for i in self.arg_idx))


def compile_persist(persist: Persist, source_fields: tuple[str, ...]) -> PersistPlan:
    fields = list(source_fields)
    steps: list[EachStep] = []
    for op in persist.operations:
        if not isinstance(op, Each):  # pragma: no cover - only each() exists so far
            raise PipelineError(f"unsupported operation {op!r}")
        name = getattr(op.function, "__name__", type(op.function).__name__)
        in_idx = tuple(fields.index(f) for f in op.in_fields)
        steps.append(EachStep(op.function, in_idx, len(op.out_fields), name))
        fields += op.out_fields
    return PersistPlan(
        persist.state,
        persist.aggregator,
        Expander(tuple(steps)),
        tuple(fields.index(f) for f in persist.group_fields),
        tuple(fields.index(f) for f in persist.in_fields),
    )


@dataclass(frozen=True)
class Plan:
    decoder: RowDecoder
    persists: tuple[PersistPlan, ...]


def compile_pipeline(pipeline: Pipeline) -> Plan:
    pipeline.validate()
    source_fields = pipeline.source.fields
    return Plan(
        RowDecoder(source_fields),
        tuple(compile_persist(p, source_fields) for p in pipeline.persists),
    )


@dataclass(frozen=True)
class BadRecord:
    """A record that could not be processed: it goes to the quarantine, not into any state."""

    partition: int
    offset: int
    error: str
    record: str

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "offset": self.offset,
            "error": self.error,
            "record": self.record,
        }


Pairs = list[list[tuple[str, Any]]]
"""Per persisted state, the (encoded group key, partial) pairs one record makes."""

Processed = tuple[int, int, Pairs | None, BadRecord | None]
"""(partition, offset, pairs or None, bad record or None)."""

MAX_QUARANTINED_RECORD = 2000


def evaluate(plan: Plan, raw: bytes) -> Pairs:
    """All (encoded key, partial) pairs of one raw record; raises if the record is bad."""
    row = plan.decoder(json.loads(raw))
    return [[(encode_key(k), v) for k, v in pp.pairs(row)] for pp in plan.persists]


def process(plan: Plan, partition: int, offset: int, raw: bytes) -> Processed:
    """Evaluate one record; any failure (undecodable, missing field, a function raising, an
    unencodable key) quarantines the whole record: none of its tuples count."""
    try:
        return partition, offset, evaluate(plan, raw), None
    except Exception as exc:
        text = raw.decode("utf-8", "replace")[:MAX_QUARANTINED_RECORD]
        error = f"{type(exc).__name__}: {exc}"[:MAX_QUARANTINED_RECORD]
        return partition, offset, None, BadRecord(partition, offset, error, text)
