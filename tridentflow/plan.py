"""Compiles a pipeline into small picklable callables, shared by every engine.

``RowDecoder`` turns a source record into a tuple of the source's fields; ``PersistPlan`` turns
one input tuple into the (group key, partial) pairs of one persisted state. Engines (Spark,
local) only decide where these run; the semantics live here once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from state.codec import encode_key
from tridentflow.aggregators import Combiner
from tridentflow.errors import BadRecordError, PipelineError
from tridentflow.pipeline import Each, Filter, Map, Persist, Pipeline, Project, StateSpec

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

    def __call__(self, row: Row) -> list[Row]:
        produced = self.function(*[row[i] for i in self.in_idx])
        out_rows = []
        n_out = self.n_out
        for out in produced or ():
            values = out if type(out) is tuple else _as_tuple(out)
            if len(values) != n_out:
                _check_width(values, n_out, f"each({self.name})")
            out_rows.append(row + values)
        return out_rows


def _check_width(values: tuple[Any, ...], n_out: int, what: str) -> tuple[Any, ...]:
    if len(values) != n_out:
        raise PipelineError(f"{what} emitted {values!r}: {len(values)} values for {n_out} field(s)")
    return values


def _as_tuple(out: Any) -> tuple[Any, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


@dataclass(frozen=True)
class FilterStep:
    predicate: Callable[..., Any]
    in_idx: tuple[int, ...]

    def __call__(self, row: Row) -> list[Row]:
        return [row] if self.predicate(*[row[i] for i in self.in_idx]) else []


@dataclass(frozen=True)
class MapStep:
    function: Callable[..., Any]
    n_out: int
    flat: bool
    name: str

    def __call__(self, row: Row) -> list[Row]:
        what = f"{'flat_map' if self.flat else 'map'}({self.name})"
        outs = self.function(*row) if self.flat else (self.function(*row),)
        return [_check_width(_as_tuple(out), self.n_out, what) for out in outs or ()]


@dataclass(frozen=True)
class ProjectStep:
    idx: tuple[int, ...]

    def __call__(self, row: Row) -> list[Row]:
        return [tuple([row[i] for i in self.idx])]


Step = EachStep | FilterStep | MapStep | ProjectStep


@dataclass(frozen=True)
class Expander:
    """Applies a chain of per-tuple steps to one tuple; yields the resulting tuples."""

    steps: tuple[Step, ...]

    def __call__(self, row: Row) -> Iterable[Row]:
        rows: Iterable[Row] = (row,)
        for step in self.steps:
            rows = [out for r in rows for out in step(r)]
        return rows


@dataclass(frozen=True)
class PersistPlan:
    state: StateSpec
    aggregator: Combiner
    expand: Expander
    key_idx: tuple[int, ...]
    arg_idx: tuple[int, ...]

    def pairs(self, row: Row) -> list[tuple[Row, Any]]:
        """(group key, partial) for every tuple the stream makes of one input ``row``."""
        init = self.aggregator.init
        key_idx, arg_idx = self.key_idx, self.arg_idx
        if len(key_idx) == 1:
            k = key_idx[0]
            return [((out[k],), init(*[out[i] for i in arg_idx])) for out in self.expand(row)]
        return [
            (tuple([out[i] for i in key_idx]), init(*[out[i] for i in arg_idx]))
            for out in self.expand(row)
        ]


def compile_persist(persist: Persist, source_fields: tuple[str, ...]) -> PersistPlan:
    fields = list(source_fields)
    steps: list[Step] = []
    for op in persist.operations:
        if isinstance(op, Each):
            name = getattr(op.function, "__name__", type(op.function).__name__)
            in_idx = tuple(fields.index(f) for f in op.in_fields)
            steps.append(EachStep(op.function, in_idx, len(op.out_fields), name))
            fields += op.out_fields
        elif isinstance(op, Filter):
            steps.append(FilterStep(op.predicate, tuple(fields.index(f) for f in op.in_fields)))
        elif isinstance(op, Map):
            name = getattr(op.function, "__name__", type(op.function).__name__)
            steps.append(MapStep(op.function, len(op.out_fields), op.flat, name))
            fields = list(op.out_fields)
        elif isinstance(op, Project):
            steps.append(ProjectStep(tuple(fields.index(f) for f in op.fields)))
            fields = list(op.fields)
        else:  # pragma: no cover - the Stream API builds only these
            raise PipelineError(f"unsupported operation {op!r}")
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


MAX_QUARANTINED_RECORD = 2000


_SCALARS = (str, int, float, bool, type(None))


class KeyEncoder:
    """encode_key with a per-task cache: each distinct key of scalars is encoded once.

    The cache is keyed by (type, value) pairs, because 1 == 1.0 == True in Python while their
    encodings differ; keys holding containers are encoded every time."""

    def __init__(self) -> None:
        self._cache: dict[tuple[Any, ...], str] = {}
        self._strings: dict[str, str] = {}

    def __call__(self, key: tuple[Any, ...]) -> str:
        if len(key) == 1 and type(key[0]) is str:  # the common case: one string field
            encoded = self._strings.get(key[0])
            if encoded is None:
                encoded = self._strings[key[0]] = encode_key(key)
            return encoded
        if not all(type(v) in _SCALARS for v in key):
            return encode_key(key)
        typed = tuple((type(v), v) for v in key)
        encoded = self._cache.get(typed)
        if encoded is None:
            encoded = self._cache[typed] = encode_key(key)
        return encoded


def evaluate(plan: Plan, raw: bytes, encode: Callable[[tuple], str] = encode_key) -> list[list]:
    """Per persisted state, the (encoded key, partial) pairs one raw record makes; raises if
    the record is bad (undecodable, missing field, a function raising, an unencodable key)."""
    row = plan.decoder(json.loads(raw))
    return [[(encode(k), v) for k, v in pp.pairs(row)] for pp in plan.persists]


def bad_record(partition: int, offset: int, raw: bytes, exc: BaseException) -> BadRecord:
    text = raw.decode("utf-8", "replace")[:MAX_QUARANTINED_RECORD]
    error = f"{type(exc).__name__}: {exc}"[:MAX_QUARANTINED_RECORD]
    return BadRecord(partition, offset, error, text)
