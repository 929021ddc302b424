"""Compiles a pipeline into small picklable callables, shared by every engine.

``RowDecoder`` turns a source record into a tuple of the source's fields; ``Expander`` runs a
chain of per-tuple operations; ``PersistPlan`` names, for one persisted state fed straight by
the source, its chain, group-key and argument fields (tridentflow.engines.tasks.TaskFold folds
it per read task). The batch operations after the per-record stage are in
tridentflow.engines.batchops and tridentflow.engines.graph. Engines (Spark, local) only decide
where these run; the semantics live here once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tridentflow.aggregators import Combiner
from tridentflow.errors import NON_FINITE, BadRecordError, PipelineError
from tridentflow.nodes import (
    Each,
    Filter,
    Map,
    Node,
    Operation,
    OpNode,
    Persist,
    Project,
    SourceNode,
    StateSpec,
    frames_in,
    is_record_level,
    lineage,
    parents_of,
)
from tridentflow.pipeline import Pipeline
from tridentflow.schemas import RecordCheck, Schema
from tridentflow_state.codec import check_unicode, encode_key
from tridentflow_state.errors import KeyEncodingError

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


def as_rows(produced: Iterable[Any] | None, width: int, what: str) -> list[Row]:
    """A function's outputs as tuples of ``width`` values (a bare value is a 1-tuple);
    PipelineError naming ``what`` for a wrong width."""
    return [_check_width(_as_tuple(out), width, what) for out in produced or ()]


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
        return as_rows(outs, self.n_out, what)


@dataclass(frozen=True)
class ProjectStep:
    idx: tuple[int, ...]

    def __call__(self, row: Row) -> list[Row]:
        return [tuple([row[i] for i in self.idx])]


Step = EachStep | FilterStep | MapStep | ProjectStep | RecordCheck


@dataclass(frozen=True)
class Expander:
    """Applies a chain of per-tuple steps to one tuple; yields the resulting tuples."""

    steps: tuple[Step, ...]

    def __call__(self, row: Row) -> Iterable[Row]:
        if len(self.steps) == 1:  # the common chain: no copy of its output
            return self.steps[0](row)
        rows: Iterable[Row] = (row,)
        for step in self.steps:
            rows = [out for r in rows for out in step(r)]
        return rows


@dataclass(frozen=True)
class PersistPlan:
    """A Combiner state fed straight by the source's per-record chain: its pairs are computed
    per record and pre-aggregated inside the read task (the fast path)."""

    state: StateSpec
    aggregator: Combiner
    expand: Expander
    key_idx: tuple[int, ...]
    arg_idx: tuple[int, ...]
    parallelism: int | None = None
    """The state stage's partitions (TridentState.parallelism_hint)."""


def compile_step(op: Operation, fields: list[str]) -> tuple[Step, list[str]]:
    """One per-tuple operation over ``fields``: its step and the fields after it."""
    if isinstance(op, Each):
        in_idx = tuple(fields.index(f) for f in op.in_fields)
        step: Step = EachStep(op.function, in_idx, len(op.out_fields), _name(op.function))
        return step, fields + list(op.out_fields)
    if isinstance(op, Filter):
        return FilterStep(op.predicate, tuple(fields.index(f) for f in op.in_fields)), fields
    if isinstance(op, Map):
        step = MapStep(op.function, len(op.out_fields), op.flat, _name(op.function))
        return step, list(op.out_fields)
    if isinstance(op, Project):
        return ProjectStep(tuple(fields.index(f) for f in op.fields)), list(op.fields)
    raise PipelineError(f"unsupported operation {op!r}")  # pragma: no cover


def _name(function: Any) -> str:
    return getattr(function, "__name__", type(function).__name__)


def compile_chain(node: Node, typed: Schema | None = None) -> Expander:
    """The per-record chain from the source to a record-level ``node``; with ``typed``, its
    tuples held to those types (a DataFrame step's input: a value that does not fit makes
    its record bad)."""
    ops: list[Operation] = []
    while isinstance(node, OpNode):
        ops.append(node.op)
        node = node.parent
    if not isinstance(node, SourceNode):
        raise PipelineError("internal: compile_chain on a node that is not record-level")
    fields = list(node.fields)
    steps: list[Step] = []
    for op in reversed(ops):
        step, fields = compile_step(op, fields)
        steps.append(step)
    if typed is not None:
        steps.append(RecordCheck(typed))
    return Expander(tuple(steps))


def compile_persist(persist: Persist) -> PersistPlan:
    fields = list(persist.fields)
    assert isinstance(persist.aggregator, Combiner)
    return PersistPlan(
        persist.state,
        persist.aggregator,
        compile_chain(persist.node),
        tuple(fields.index(f) for f in persist.group_fields),
        tuple(fields.index(f) for f in persist.in_fields),
        persist.parallelism,
    )


@dataclass(frozen=True)
class Plan:
    """A compiled pipeline.

    * ``persists``: Combiner states fed straight by the source (pre-aggregated per read task).
    * ``edges``: record-level streams that batch operations (or other states) consume; each
      read task collects their tuples. Both are computed per record, all or nothing, so a bad
      record (quarantined) reaches no state and no edge.
    * ``graph_persists``: the states computed by the batch-operation graph
      (tridentflow.engines.graph) from the edges.
    """

    decoder: RowDecoder
    persists: tuple[PersistPlan, ...]
    edges: tuple[tuple[Node, Expander], ...] = ()
    graph_persists: tuple[Persist, ...] = ()
    default_parallelism: int = 4
    stage_names: Mapping[Node, str] = field(default_factory=dict)
    """``Stream.name`` labels, by node."""
    position: bool = False
    """Whether the source stream carries each record's position (LogSource.position_field)
    after the record's fields."""

    @property
    def frames(self) -> bool:
        """Whether a DataFrame or SQL step feeds a state: only Spark's DataFrames run it."""
        return any(frames_in(p.node) for p in self.graph_persists)

    def edge_index(self, node: Node) -> int | None:
        for index, (edge_node, _expand) in enumerate(self.edges):
            if edge_node is node:
                return index
        return None


def _graph_edges(persists: Sequence[Persist]) -> list[Node]:
    """Record-level nodes that a batch operation or a graph-computed state consumes."""
    edges: dict[int, Node] = {}
    for persist in persists:
        if is_record_level(persist.node):
            edges.setdefault(id(persist.node), persist.node)
            continue
        for node in lineage(persist.node):
            if is_record_level(node):
                continue
            for parent in parents_of(node):
                if is_record_level(parent):
                    edges.setdefault(id(parent), parent)
    return list(edges.values())


def compile_pipeline(pipeline: Pipeline, states: Collection[str] | None = None) -> Plan:
    """The plan of every persisted state, or of the ``states`` named."""
    pipeline.validate()
    persists = [p for p in pipeline.persists if states is None or p.state.name in states]
    fast = [p for p in persists if is_record_level(p.node) and isinstance(p.aggregator, Combiner)]
    graph = [p for p in persists if not any(p is f for f in fast)]
    typed = {  # the record-level inputs of DataFrame steps, held to their declared types
        id(frame.parent): frame.input_schema
        for p in graph
        for frame in frames_in(p.node)
        if is_record_level(frame.parent)
    }
    return Plan(
        RowDecoder(pipeline.source.fields),
        tuple(compile_persist(p) for p in fast),
        tuple((node, compile_chain(node, typed.get(id(node)))) for node in _graph_edges(graph)),
        tuple(graph),
        pipeline.default_parallelism,
        dict(pipeline.stage_names),
        pipeline.source.position_field is not None,
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

    The cache must never change an encoding, so its key is the value's exact identity as JSON
    sees it: the type with the value (1 == 1.0 == True in Python, but their encodings differ)
    and, for floats, the bit pattern (0.0 == -0.0, but they are two keys). Keys holding
    containers are encoded every time."""

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
        typed = tuple((float, v.hex()) if type(v) is float else (type(v), v) for v in key)
        encoded = self._cache.get(typed)
        if encoded is None:
            encoded = self._cache[typed] = encode_key(key)
        return encoded


def _no_constant(name: str) -> Any:
    raise BadRecordError(f"record holds {name}: {NON_FINITE}")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise BadRecordError(f"record holds {text[:40]}: {NON_FINITE}")
    return value


_decode_json = json.JSONDecoder(parse_constant=_no_constant, parse_float=_finite_float).decode
"""JSON as Python reads it, but NaN / Infinity / 1e400 are bad records, never floats."""


def decode_record(raw: bytes) -> Any:
    """A source line as its JSON value; BadRecordError unless it is valid UTF-8 JSON whose
    strings are valid Unicode (``"\\ud800"`` is valid JSON, but no UTF-8 file or Redis value
    can hold the lone surrogate it decodes to: JavaScript writes it for a cut emoji)."""
    try:
        value = _decode_json(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadRecordError(f"record is not UTF-8: {exc}") from None
    if b"\\u" in raw:  # only escapes can smuggle a lone surrogate into valid UTF-8
        try:
            check_unicode(json.dumps(value, ensure_ascii=False), "record")
        except KeyEncodingError as exc:
            raise BadRecordError(str(exc)) from None
    return value


def bad_record(partition: int, offset: int, raw: bytes, exc: BaseException) -> BadRecord:
    text = raw.decode("utf-8", "replace")[:MAX_QUARANTINED_RECORD]
    error = f"{type(exc).__name__}: {exc}"[:MAX_QUARANTINED_RECORD]
    return BadRecord(partition, offset, error, text)
