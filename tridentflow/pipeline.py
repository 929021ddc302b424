"""The pipeline API: Trident's stream operations, shaped for Python.

    pipeline = Pipeline("wordcount", LogSource(fields=("sentence",), mode=SourceMode.TRANSACTIONAL))
    (pipeline.stream
        .each(["sentence"], split, ["word"])
        .group_by(["word"])
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count"))

A stream is a node of an immutable graph rooted at the source: per-tuple operations (each,
filter, map, flat_map, project), repartitions (partition_by, shuffle, global_, batch_global,
broadcast, with parallelism_hint), batch aggregates (aggregate, partition_aggregate,
group_by().aggregate, chained_agg), merge, join and state_query; every method returns a new
stream, and branches of one stream share its computation. Persisting (persistent_aggregate,
partition_persist) registers the state on the pipeline. Which (source mode, state kind) pairs
are exactly-once is ``GUARANTEES``; the refused pairs raise PipelineError, the at-least-once
ones need an explicit ``allow_at_least_once=True`` and are labelled loudly everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from tridentflow.aggregators import (
    Aggregator,
    AnyAggregator,
    Combiner,
    FunctionUpdater,
    Persistable,
    Reducer,
    StateUpdater,
)
from tridentflow.errors import PipelineError
from tridentflow.nodes import (
    AggregateNode,
    AggSpec,
    Each,
    Filter,
    FrameNode,
    JoinNode,
    Map,
    MergeNode,
    Node,
    Operation,
    OpNode,
    Persist,
    Project,
    QueryNode,
    Repartition,
    RepartitionNode,
    Scope,
    SourceNode,
    StateSpec,
    _checked_name,
    known_schema,
    lineage,
)
from tridentflow.schemas import Schema, parse_schema
from tridentflow.sinks.base import Sink
from tridentflow.sources.specs import (
    LogSource,
    SourceMode,
)
from tridentflow.static_state import FileLookup, Lookup, RedisHashLookup, StaticState
from tridentflow_state.batch_times import ExpiryRule
from tridentflow_state.keys import check_shards
from tridentflow_state.maps import StateKind


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


def _name(function: Any) -> str:
    return getattr(function, "__name__", type(function).__name__)


def _fields(value: str | Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _check_parallelism(n: int | None) -> None:
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise PipelineError(f"parallelism must be a positive integer, got {n!r}")


def _with_parallelism(node: Node, n: int) -> Node:
    """``node`` with the nearest upstream repartitioning stage set to ``n`` partitions."""
    if isinstance(node, (RepartitionNode, FrameNode)):
        return replace(node, parallelism=n)
    if isinstance(node, JoinNode):
        return replace(node, parallelism=n)
    if isinstance(node, AggregateNode):
        if node.scope is Scope.GROUP:
            return replace(node, parallelism=n)
        if node.scope is Scope.BATCH:
            raise PipelineError(
                "parallelism_hint: an aggregate() makes one result per batch in one partition;"
                " a hint has no meaning there"
            )
        return replace(node, parent=_with_parallelism(node.parent, n))
    if isinstance(node, (OpNode, QueryNode)):
        return replace(node, parent=_with_parallelism(node.parent, n))
    raise PipelineError(
        "parallelism_hint: no repartitioning stage (partition_by, shuffle, local_or_shuffle, "
        "global_, batch_global, broadcast, group_by().aggregate, join) before it: the source "
        "stage runs one task per partition of the source (and per batch_size records of it); "
        "set LogSource(partitions=N) to change it, or repartition first"
    )


def _check_specs(specs: Sequence[AggSpec], fields: tuple[str, ...], what: str) -> None:
    if not specs:
        raise PipelineError(f"{what}: no aggregators")
    outs: list[str] = []
    for spec in specs:
        agg = spec.aggregator
        if not isinstance(agg, (Combiner, Reducer, Aggregator)):
            raise PipelineError(
                f"{what}: {agg!r} is not a Combiner, Reducer or Aggregator"
                + (
                    " (a StateUpdater is for partition_persist)"
                    if isinstance(agg, StateUpdater)
                    else ""
                )
            )
        missing = [f for f in spec.in_fields if f not in fields]
        if missing:
            raise PipelineError(f"{what}({agg!r}): no field(s) {missing} in {list(fields)}")
        if not spec.out_fields:
            raise PipelineError(f"{what}({agg!r}): needs at least one output field")
        if not isinstance(agg, Aggregator) and len(spec.out_fields) != 1:
            raise PipelineError(
                f"{what}({agg!r}): a {type(agg).__mro__[1].__name__} makes one value; got "
                f"output fields {list(spec.out_fields)}"
            )
        outs += spec.out_fields
    if len(set(outs)) != len(outs):
        raise PipelineError(f"{what}: output fields {outs} repeat a name")


def _check_typed_persist(
    node: Node,
    state: StateSpec,
    aggregator: Persistable,
    group: tuple[str, ...],
    in_fields: tuple[str, ...],
) -> None:
    """A state fed straight by a DataFrame step: its key and argument fields must have types
    a state can hold (JSON values), and Sum/Mean numbers; PipelineError in one line."""
    if not isinstance(node, FrameNode):
        return
    from tridentflow.aggregators import Mean, Sum

    inner = getattr(aggregator, "inner", aggregator)
    for name in (*group, *in_fields):
        kind = node.schema.type_of(name)
        if not kind.json_like:
            raise PipelineError(
                f"state {state.name}: field {name} of {node.label} is {kind.ddl()}, which a "
                "state cannot key or hold (JSON values only); cast it in the step (e.g. "
                f"CAST({name} AS STRING), or a number)"
            )
    if isinstance(inner, (Sum, Mean)):
        for name in in_fields:
            kind = node.schema.type_of(name)
            if not kind.numeric:
                raise PipelineError(
                    f"state {state.name}: {type(inner).__name__}({name}) needs a number, but "
                    f"{node.label} declares {name} {kind.ddl()}; cast it in the step"
                )


@dataclass(frozen=True)
class Stream:
    pipeline: Pipeline
    node: Node

    @property
    def fields(self) -> tuple[str, ...]:
        return self.node.fields

    def _require(self, names: Sequence[str], what: str) -> None:
        missing = [n for n in names if n not in self.fields]
        if missing:
            raise PipelineError(
                f"{what}: no field(s) {', '.join(missing)} in stream fields {list(self.fields)}"
            )

    def _op(self, op: Operation, fields: tuple[str, ...]) -> Stream:
        return Stream(self.pipeline, OpNode(self.node, op, fields))

    # -- per-tuple operations ---------------------------------------------------------------
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
        return self._op(Each(ins, function, outs), self.fields + outs)

    def tumbling_window(self, size: int | float, on: str, out_field: str = "window") -> Stream:
        """One tuple per record, with the start of its window of ``size`` on field ``on``
        (event time, or the source's ``position_field`` for count windows) as ``out_field``.
        Persist per window with ``.group_by(out_field).persistent_aggregate(...)``."""
        return self.sliding_window(size, size, on, out_field)

    def sliding_window(
        self, size: int | float, slide: int | float, on: str, out_field: str = "window"
    ) -> Stream:
        """One tuple per window of ``size`` every ``slide`` that holds the record's ``on``
        value (size / slide windows each), with that window's start as ``out_field``."""
        from tridentflow.windows import Windows

        return self.each(on, Windows(size, slide), out_field)

    def filter(self, in_fields: str | Sequence[str], predicate: Callable[..., Any]) -> Stream:
        ins = _fields(in_fields)
        self._require(ins, f"filter({_name(predicate)})")
        return self._op(Filter(ins, predicate), self.fields)

    def map(
        self, function: Callable[..., Any], out_fields: str | Sequence[str] | None = None
    ) -> Stream:
        """One output tuple per input tuple, from all of its values."""
        outs = self.fields if out_fields is None else _fields(out_fields)
        return self._op(Map(function, outs), outs)

    def flat_map(
        self, function: Callable[..., Any], out_fields: str | Sequence[str] | None = None
    ) -> Stream:
        """0..n output tuples per input tuple, from all of its values."""
        outs = self.fields if out_fields is None else _fields(out_fields)
        return self._op(Map(function, outs, flat=True), outs)

    def project(self, fields: str | Sequence[str]) -> Stream:
        keep = _fields(fields)
        self._require(keep, "project")
        return self._op(Project(keep), keep)

    # -- DataFrame and SQL steps (run by Spark) ----------------------------------------------
    def spark(
        self,
        function: Callable[[Any], Any],
        schema: str | Schema | Any,
        input_schema: str | Schema | Any = None,
    ) -> Stream:
        """A DataFrame step: ``function(df)`` gets the batch's tuples as a Spark DataFrame
        whose columns are this stream's fields, and returns a DataFrame whose columns are
        ``schema``'s (Spark DDL, e.g. ``"word string"``, or a StructType): the new stream's
        fields. Spark runs it - its functions, Python and pandas UDFs - on spark-submit and over
        Spark Connect; the local engine refuses it. The input's types are the source's
        ``schema`` (LogSource(schema=...)) or an earlier step's, else ``input_schema``."""
        if not callable(function):
            raise PipelineError(f"spark(): {function!r} is not callable (a DataFrame -> DataFrame)")
        return self._frame(function, None, schema, input_schema, f"spark({_name(function)})")

    def sql(
        self, query: str, schema: str | Schema | Any, input_schema: str | Schema | Any = None
    ) -> Stream:
        """A SQL step: Spark SQL ``query`` over a view named ``batch`` (this stream's fields
        as columns), whose result's columns are ``schema``'s; see ``spark``."""
        if not isinstance(query, str) or not query.strip():
            raise PipelineError(f"sql(): {query!r} is not a SQL query (SELECT ... FROM batch)")
        if not re.search(r"\bbatch\b", query, re.IGNORECASE):
            raise PipelineError(
                f"sql(): the query reads no view named batch ({query.strip()[:60]!r}): "
                "the batch's records are FROM batch"
            )
        return self._frame(None, query, schema, input_schema, "sql")

    def _frame(
        self,
        function: Callable[[Any], Any] | None,
        query: str | None,
        schema: Any,
        input_schema: Any,
        what: str,
    ) -> Stream:
        if schema is None:
            raise PipelineError(
                f"{what}: needs schema=, the output's columns and types as Spark DDL (e.g. "
                "schema='word string'), so that the next steps are checked before a txid runs"
            )
        output = parse_schema(schema)
        if input_schema is not None:
            given = parse_schema(input_schema)
            if given.names != self.fields:
                raise PipelineError(
                    f"{what}: input_schema names {list(given.names)}, the stream's fields are "
                    f"{list(self.fields)}; name each field once, in order"
                )
            typed = given
        else:
            known = known_schema(self.node)
            if known is None:
                raise PipelineError(
                    f"{what}: the types of the stream's fields {list(self.fields)} are not "
                    "known; give the source a schema (LogSource(schema='...')) or this step "
                    "input_schema='...'"
                )
            typed = known
        node = FrameNode(self.node, function, query, typed, output, None, output.names)
        return Stream(self.pipeline, node)

    # -- repartitioning ---------------------------------------------------------------------
    def _repartition(self, how: Repartition, keys: tuple[str, ...] = ()) -> Stream:
        node = RepartitionNode(self.node, how, keys, None, self.fields)
        return Stream(self.pipeline, node)

    def partition_by(self, fields: str | Sequence[str]) -> Stream:
        """Tuples with equal ``fields`` go to the same partition (a stable hash)."""
        keys = _fields(fields)
        if not keys:
            raise PipelineError("partition_by() needs at least one field")
        self._require(keys, "partition_by")
        return self._repartition(Repartition.PARTITION_BY, keys)

    def shuffle(self) -> Stream:
        """Spread tuples evenly (round robin, deterministic) over the stage's partitions."""
        return self._repartition(Repartition.SHUFFLE)

    def global_(self) -> Stream:
        """Every tuple of the batch to one partition (Trident's global())."""
        return self._repartition(Repartition.GLOBAL)

    def batch_global(self) -> Stream:
        """Every tuple of a batch to one partition. One batch runs at a time per txid here, so
        this is global_() (Trident spreads different batches over tasks)."""
        return self._repartition(Repartition.BATCH_GLOBAL)

    def broadcast(self) -> Stream:
        """Every tuple to every partition of the next stage."""
        return self._repartition(Repartition.BROADCAST)

    def local_or_shuffle(self) -> Stream:
        """Trident's localOrShuffle: tuples stay in the task that made them (every read task
        is local to itself), so no exchange happens; with a ``parallelism_hint`` that changes
        the number of partitions, it is shuffle(). Results never depend on which."""
        return self._repartition(Repartition.LOCAL_OR_SHUFFLE)

    def name(self, label: str) -> Stream:
        """Name this stream's operation (Trident's name()): a repartition, an aggregate or a
        join so named shows its name in its exchange's stage label (``2:shuffle()[spread]``),
        in the completeness report of every batch (the manifest, ``status``, the view) and in
        the error that fails a batch when that exchange loses or gains tuples."""
        if not isinstance(label, str) or not label.strip() or len(label) > 64:
            raise PipelineError(f"name(): a stage name is 1-64 characters, got {label!r}")
        if any(c in label for c in "\n\r[]"):
            raise PipelineError(f"name(): {label!r} holds a newline or a bracket")
        self.pipeline.stage_names[self.node] = label
        return self

    def parallelism_hint(self, n: int) -> Stream:
        """Run the stage since the last repartition as ``n`` partitions (Trident's
        parallelismHint). Results never depend on it, except where a partition-level
        operation (partition_aggregate) is asked for by the pipeline itself."""
        _check_parallelism(n)
        return Stream(self.pipeline, _with_parallelism(self.node, n))

    # -- batch operations -------------------------------------------------------------------
    def _aggregate(
        self, scope: Scope, group: tuple[str, ...], specs: Sequence[AggSpec], what: str
    ) -> Stream:
        _check_specs(specs, self.fields, what)
        outs = tuple(f for spec in specs for f in spec.out_fields)
        clash = [f for f in outs if f in group]
        if clash:
            raise PipelineError(f"{what}: output field(s) {clash} repeat a group field")
        node = AggregateNode(self.node, scope, group, tuple(specs), None, group + outs)
        return Stream(self.pipeline, node)

    def aggregate(
        self,
        in_fields: str | Sequence[str],
        aggregator: AnyAggregator,
        out_fields: str | Sequence[str],
    ) -> Stream:
        """One aggregate of the whole batch, in one partition (a Combiner aggregates each
        partition first; an empty batch gives its zero(), a Reducer its init())."""
        spec = AggSpec(_fields(in_fields), aggregator, _fields(out_fields))
        return self._aggregate(Scope.BATCH, (), [spec], "aggregate")

    def partition_aggregate(
        self,
        in_fields: str | Sequence[str],
        aggregator: AnyAggregator,
        out_fields: str | Sequence[str],
    ) -> Stream:
        """One aggregate per partition of the stream (an empty partition too)."""
        spec = AggSpec(_fields(in_fields), aggregator, _fields(out_fields))
        return self._aggregate(Scope.PARTITION, (), [spec], "partition_aggregate")

    def chained_agg(self) -> ChainedAggregate:
        """Several aggregators in one pass: ``.chained_agg().aggregate(..).aggregate(..)
        .chain_end()``; the output is the cross product of their outputs."""
        return ChainedAggregate(self, ())

    def merge(self, *others: Stream) -> Stream:
        return self.pipeline.merge(self, *others)

    def join(
        self,
        fields: str | Sequence[str],
        other: Stream,
        other_fields: str | Sequence[str],
        out_fields: str | Sequence[str],
    ) -> Stream:
        return self.pipeline.join(self, fields, other, other_fields, out_fields)

    def group_by(self, fields: str | Sequence[str]) -> GroupedStream:
        group = _fields(fields)
        if not group:
            raise PipelineError("group_by() needs at least one field")
        self._require(group, "group_by")
        return GroupedStream(self, group)

    def state_query(
        self,
        state: TridentState | StaticState,
        key_fields: str | Sequence[str],
        out_field: str = "value",
    ) -> Stream:
        """Append the last committed value of ``state`` at each tuple's key (None if absent):
        Trident's stateQuery with MapGet. Keys are fetched in batches, one Redis round trip per
        partition and chunk of keys. ``state`` may also be a static state
        (``Pipeline.static_state``): reference data read as it is."""
        keys = _fields(key_fields)
        self._require(keys, f"state_query({state.name})")
        if out_field in self.fields:
            raise PipelineError(f"state_query({state.name}): field {out_field!r} already exists")
        if isinstance(state, StaticState):
            if not keys:
                raise PipelineError(f"state_query({state.name}): give the key field(s)")
            node = QueryNode(
                self.node, self.pipeline.name, state.name, None, keys,
                (*self.fields, out_field), state.lookup,
            )  # fmt: skip
            return Stream(self.pipeline, node)
        width = len(state.persist.group_fields)
        if len(keys) != width:
            raise PipelineError(
                f"state_query({state.name}): the state is keyed by {width} field(s) "
                f"{list(state.persist.group_fields)}; got key fields {list(keys)}"
            )
        node = QueryNode(
            self.node,
            state.pipeline.name,
            state.name,
            state.persist.aggregator,
            keys,
            (*self.fields, out_field),
        )
        return Stream(self.pipeline, node)

    # -- persistence ------------------------------------------------------------------------
    def persistent_aggregate(
        self,
        state: StateSpec,
        aggregator: Combiner | Reducer,
        in_fields: str | Sequence[str] = (),
        out_field: str = "value",
    ) -> TridentState:
        """Ungrouped (global) persistent aggregate: a single value (Trident's Snapshottable)."""
        return self.pipeline._persist(self, (), state, aggregator, _fields(in_fields), out_field)

    def partition_persist(
        self,
        state: StateSpec,
        updater: StateUpdater | Callable[[Any, list[tuple[Any, ...]]], Any],
        key_fields: str | Sequence[str] = (),
        in_fields: str | Sequence[str] = (),
    ) -> TridentState:
        """Persist with a custom updater: per key (``key_fields``; none: one global value),
        ``updater.update(current, tuples)`` once per txid, ``tuples`` being the batch's
        ``in_fields`` values for that key in batch order."""
        if not isinstance(updater, StateUpdater):
            if not callable(updater) or isinstance(updater, (Combiner, Reducer, Aggregator)):
                raise PipelineError(
                    f"partition_persist({state.name}): {updater!r} is not a StateUpdater or a "
                    "function(current, tuples); use persistent_aggregate for aggregators"
                )
            updater = FunctionUpdater(updater)
        keys = _fields(key_fields)
        self._require(keys, f"partition_persist({state.name})")
        return self.pipeline._persist(self, keys, state, updater, _fields(in_fields), "value")


@dataclass(frozen=True)
class GroupedStream:
    stream: Stream
    group_fields: tuple[str, ...]

    def aggregate(
        self,
        in_fields: str | Sequence[str],
        aggregator: AnyAggregator,
        out_fields: str | Sequence[str],
    ) -> Stream:
        """One aggregate per group per batch; the output is the group fields then
        ``out_fields``, partitioned by group."""
        spec = AggSpec(_fields(in_fields), aggregator, _fields(out_fields))
        return self.stream._aggregate(Scope.GROUP, self.group_fields, [spec], "aggregate")

    def partition_aggregate(
        self,
        in_fields: str | Sequence[str],
        aggregator: AnyAggregator,
        out_fields: str | Sequence[str],
    ) -> Stream:
        """One aggregate per group within each partition (no repartitioning)."""
        spec = AggSpec(_fields(in_fields), aggregator, _fields(out_fields))
        return self.stream._aggregate(
            Scope.PARTITION, self.group_fields, [spec], "partition_aggregate"
        )

    def chained_agg(self) -> ChainedAggregate:
        return ChainedAggregate(self.stream, self.group_fields)

    def state_query(self, state: TridentState | StaticState, out_field: str = "value") -> Stream:
        """Trident's groupBy(...).stateQuery(...): each tuple with the last committed value of
        ``state`` (or a static state's value) at its group key (the group fields are the
        key)."""
        return self.stream.state_query(state, self.group_fields, out_field)

    def persistent_aggregate(
        self,
        state: StateSpec,
        aggregator: Combiner | Reducer,
        in_fields: str | Sequence[str] = (),
        out_field: str = "value",
    ) -> TridentState:
        return self.stream.pipeline._persist(
            self.stream, self.group_fields, state, aggregator, _fields(in_fields), out_field
        )


@dataclass(frozen=True)
class ChainedAggregate:
    """Builder of a chained aggregate (Trident's chainedAgg()...chainEnd())."""

    stream: Stream
    group_fields: tuple[str, ...]
    specs: tuple[AggSpec, ...] = ()
    scope: Scope | None = None

    def _add(self, scope: Scope, in_fields, aggregator, out_fields) -> ChainedAggregate:
        if self.scope is not None and self.scope is not scope:
            raise PipelineError(
                "chained_agg: aggregate() and partition_aggregate() cannot be mixed in a chain"
            )
        spec = AggSpec(_fields(in_fields), aggregator, _fields(out_fields))
        return ChainedAggregate(self.stream, self.group_fields, (*self.specs, spec), scope)

    def aggregate(self, in_fields, aggregator: AnyAggregator, out_fields) -> ChainedAggregate:
        scope = Scope.GROUP if self.group_fields else Scope.BATCH
        return self._add(scope, in_fields, aggregator, out_fields)

    def partition_aggregate(
        self, in_fields, aggregator: AnyAggregator, out_fields
    ) -> ChainedAggregate:
        return self._add(Scope.PARTITION, in_fields, aggregator, out_fields)

    def chain_end(self) -> Stream:
        if self.scope is None:
            raise PipelineError("chained_agg: chain_end() with no aggregators")
        return self.stream._aggregate(self.scope, self.group_fields, self.specs, "chained_agg")


@dataclass(frozen=True)
class Feed:
    """A state's new-values stream ending in a sink: what ``export`` runs after each commit."""

    state: str
    node: Node
    """The stream's last node (per-tuple operations over a SourceNode of the change tuples)."""
    sink: Sink
    """A tridentflow.sinks Sink, bound to the stream's fields."""

    @property
    def name(self) -> str:
        return str(self.sink.name)


_NEW_VALUES_OPS = "each, filter, map, flat_map, project and sink()"


@dataclass(frozen=True)
class NewValuesStream:
    """Trident's ``newValuesStream()``: for each committed txid, one tuple per key the txid
    changed in a state - the key fields, then the new committed value (None: the key was
    removed). Values are read from the txid's change log, written before its commit mark,
    so every replay of an export sees the same tuples. Supports the per-tuple operations and
    ends in a sink (``sink(PostgresSink(...))``); it is not part of the batch graph."""

    state: TridentState
    stream: Stream

    @property
    def fields(self) -> tuple[str, ...]:
        return self.stream.fields

    def _wrap(self, stream: Stream) -> NewValuesStream:
        return NewValuesStream(self.state, stream)

    def each(
        self,
        in_fields: str | Sequence[str],
        function: Callable[..., Iterable[Sequence[Any]] | None],
        out_fields: str | Sequence[str],
    ) -> NewValuesStream:
        return self._wrap(self.stream.each(in_fields, function, out_fields))

    def filter(
        self, in_fields: str | Sequence[str], predicate: Callable[..., Any]
    ) -> NewValuesStream:
        return self._wrap(self.stream.filter(in_fields, predicate))

    def map(
        self, function: Callable[..., Any], out_fields: str | Sequence[str] | None = None
    ) -> NewValuesStream:
        return self._wrap(self.stream.map(function, out_fields))

    def flat_map(
        self, function: Callable[..., Any], out_fields: str | Sequence[str] | None = None
    ) -> NewValuesStream:
        return self._wrap(self.stream.flat_map(function, out_fields))

    def project(self, fields: str | Sequence[str]) -> NewValuesStream:
        return self._wrap(self.stream.project(fields))

    def sink(self, sink: Any) -> Feed:
        """Export this stream to ``sink`` after every commit, txid by txid, exactly once
        (the sink applies each txid atomically and records it; see tridentflow.sinks)."""
        pipeline = self.state.pipeline
        if not isinstance(sink, Sink):
            raise PipelineError(
                f"sink(): {sink!r} is not a sink (PostgresSink, RedisStreamSink, DeltaSink, "
                "IcebergSink, or a subclass of tridentflow.sinks.base.Sink of your own)"
            )
        try:
            bound = sink.bind(self.fields, self.state.persist.group_fields)
        except ValueError as exc:
            raise PipelineError(f"pipeline {pipeline.name}: {exc}") from None
        _checked_name("sink", bound.name)
        if any(f.name == bound.name for f in pipeline.feeds):
            raise PipelineError(
                f"pipeline {pipeline.name}: two sinks are named {bound.name!r}; give one "
                "another name=..."
            )
        claimed = bound.claims()
        for other in pipeline.feeds:
            shared = set(claimed) & set(other.sink.claims())
            if shared:
                raise PipelineError(
                    f"pipeline {pipeline.name}: sinks {other.name!r} and {bound.name!r} both "
                    f"write {sorted(shared)[0]} (two writers of one target collide); give "
                    "each its own"
                )
        feed = Feed(self.state.name, self.stream.node, bound)
        pipeline.feeds.append(feed)
        return feed

    def __getattr__(self, name: str) -> Any:
        if hasattr(Stream, name):
            hint = (
                " (to persist the new values, chain a second pipeline: RedisStreamSink here, a "
                "RedisStreamSource there)"
                if "persist" in name or "aggregate" in name
                else ""
            )
            raise PipelineError(
                f"a new-values stream supports {_NEW_VALUES_OPS}, not {name}(){hint}"
            )
        raise AttributeError(name)


@dataclass(frozen=True)
class TridentState:
    """Handle of a persisted state (what Trident's persistentAggregate returns)."""

    pipeline: Pipeline
    persist: Persist

    @property
    def name(self) -> str:
        return self.persist.state.name

    def new_values_stream(self) -> NewValuesStream:
        """The values each committed txid changed: fields ``group fields + (out_field,)``
        (Trident's newValuesStream); see NewValuesStream."""
        persist = self.persist
        fields = (*persist.group_fields, persist.out_field)
        return NewValuesStream(self, Stream(self.pipeline, SourceNode(fields)))

    def parallelism_hint(self, n: int) -> TridentState:
        """Run this state's stage (the exchange by key before staging) as ``n`` partitions
        (Trident's parallelismHint after persistentAggregate). Speed only. States fed straight
        by the source are folded per read task and have no such stage (the hint is kept for
        the exchange path Spark falls back to past DIRECT_PAIRS)."""
        _check_parallelism(n)
        persists = self.pipeline.persists
        index = next(i for i, p in enumerate(persists) if p is self.persist)
        persists[index] = replace(self.persist, parallelism=n)
        return TridentState(self.pipeline, persists[index])


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
    default_parallelism: int = 4
    """Partitions of a repartitioning stage without a parallelism_hint. Engine-independent, so
    partition-level results are the same on Spark and on the local engine."""
    state_shards: int | None = None
    """Redis hashes (state shards, each in a slot of its own) every map state is split into,
    so that a Redis Cluster spreads one pipeline's state and commit load over its masters
    (None: TRIDENTFLOW_STATE_SHARDS, else 1). Fixed once the pipeline has state: changing it
    needs a reset."""
    change_log_limit: int = 100
    """Txids of change log kept for a state with sinks (new_values_stream): a sink further
    behind reloads the whole state (PostgresSink) or fails with one line (RedisStreamSink)."""
    retain_txids: int | None = None
    """Committed txids whose undo logs are kept (state.undo): state can be read as of any of
    them (``query --as-of``) and rewound to it (``rewind``). None: TRIDENTFLOW_RETAIN_TXIDS,
    else 0 (off: nothing more is stored than the state itself)."""
    persists: list[Persist] = field(default_factory=list)
    feeds: list[Feed] = field(default_factory=list)
    """The new-values streams and their sinks (NewValuesStream.sink)."""
    stage_names: dict[Node, str] = field(default_factory=dict)
    """Names given with ``Stream.name``, by node (nodes compare by identity)."""
    origin: dict[str, str | None] | None = field(
        default=None, init=False, repr=False, compare=False
    )
    """Where ``registry.load_pipeline`` found it: ``{"ref": "module:attribute", "path": the
    folder that makes the module importable, None for an installed one}``; None for a
    pipeline built in code. Its commits record it, so the CLI finds the pipeline by name."""

    def __post_init__(self) -> None:
        _checked_name("pipeline", self.name)
        if self.max_bad_records is not None and self.max_bad_records < 0:
            raise PipelineError(f"max_bad_records must be >= 0, got {self.max_bad_records}")
        if self.max_bad_fraction is not None and not 0 <= self.max_bad_fraction <= 1:
            raise PipelineError(f"max_bad_fraction must be in [0, 1], got {self.max_bad_fraction}")
        _check_parallelism(self.default_parallelism)
        if (
            not isinstance(self.change_log_limit, int)
            or isinstance(self.change_log_limit, bool)
            or self.change_log_limit < 1
        ):
            raise PipelineError(
                f"change_log_limit must be a whole number >= 1, got {self.change_log_limit!r}"
            )
        if self.retain_txids is not None and (
            not isinstance(self.retain_txids, int)
            or isinstance(self.retain_txids, bool)
            or self.retain_txids < 0
        ):
            raise PipelineError(
                f"retain_txids must be a whole number >= 0, got {self.retain_txids!r}"
            )
        if self.state_shards is not None:
            try:
                check_shards(self.state_shards)
            except ValueError as exc:
                raise PipelineError(f"pipeline {self.name}: {exc}") from None
        self._source_node = SourceNode(
            self.source.stream_fields, self.source.position_field, self.source.stream_schema
        )

    @property
    def stream(self) -> Stream:
        """The source stream (the same node every time, so branches share one read)."""
        return Stream(self, self._source_node)

    def _own(self, streams: Sequence[Stream], what: str) -> None:
        for s in streams:
            if s.pipeline is not self:
                raise PipelineError(
                    f"{what}: a stream of pipeline {s.pipeline.name} cannot be used in {self.name}"
                )

    def merge(self, *streams: Stream) -> Stream:
        """The union of streams of this batch (Trident's merge); fields are the first
        stream's, and every stream must have as many."""
        if len(streams) < 2:
            raise PipelineError("merge() needs at least two streams")
        self._own(streams, "merge")
        width = len(streams[0].fields)
        for s in streams[1:]:
            if len(s.fields) != width:
                raise PipelineError(
                    f"merge(): streams have {width} and {len(s.fields)} fields "
                    f"({list(streams[0].fields)} vs {list(s.fields)}); project them first"
                )
        return Stream(self, MergeNode(tuple(s.node for s in streams), streams[0].fields))

    def join(
        self,
        left: Stream,
        left_fields: str | Sequence[str],
        right: Stream,
        right_fields: str | Sequence[str],
        out_fields: str | Sequence[str],
    ) -> Stream:
        """Inner join of two streams within each batch (Trident's join). Output: the join
        fields, then the left stream's other fields, then the right's, named ``out_fields``."""
        self._own((left, right), "join")
        lkeys, rkeys, outs = _fields(left_fields), _fields(right_fields), _fields(out_fields)
        left._require(lkeys, "join (left)")
        right._require(rkeys, "join (right)")
        if not lkeys or len(lkeys) != len(rkeys):
            raise PipelineError(
                f"join(): join fields {list(lkeys)} and {list(rkeys)} must be non-empty and "
                "equally many"
            )
        width = len(lkeys) + len(left.fields) - len(lkeys) + len(right.fields) - len(rkeys)
        if len(outs) != width or len(set(outs)) != len(outs):
            raise PipelineError(
                f"join(): needs {width} distinct output field names (join fields, left's "
                f"others, right's others), got {list(outs)}"
            )
        node = JoinNode(left.node, right.node, lkeys, rkeys, None, outs)
        return Stream(self, node)

    @property
    def states(self) -> dict[str, Persist]:
        return {p.state.name: p for p in self.persists}

    def feeds_of(self, state: str) -> list[Feed]:
        return [f for f in self.feeds if f.state == state]

    @property
    def expiring(self) -> dict[str, ExpiryRule]:
        """State -> its expiry rule, for the states that expire keys."""
        return {
            name: rule for name, p in self.states.items() if (rule := p.state.expiry) is not None
        }

    @property
    def expires_in_time(self) -> bool:
        """Whether a state's keys expire by batch time (``expire_after``): then the
        coordinator freezes each txid's batch time into its metadata."""
        return any(rule.after_ms is not None for rule in self.expiring.values())

    @property
    def fed_states(self) -> list[str]:
        """States a new-values stream reads: their commits write a change log."""
        return sorted({f.state for f in self.feeds})

    def static_state(self, name: str, lookup: Lookup) -> StaticState:
        """Trident's newStaticState: read-only reference data for ``state_query``, in a Redis
        hash (``RedisHashLookup``) or a JSON file (``FileLookup``); see
        tridentflow.static_state."""
        if not isinstance(lookup, (RedisHashLookup, FileLookup)):
            raise PipelineError(
                f"static state {name}: {lookup!r} is not a RedisHashLookup or a FileLookup"
            )
        return StaticState(name, lookup)

    def state(self, name: str) -> TridentState:
        """The handle of persisted state ``name``, e.g. to state_query it from another
        pipeline: ``other.stream.state_query(wordcount().state("counts"), "word")``."""
        if name not in self.states:
            raise PipelineError(
                f"pipeline {self.name} has no state {name!r} (states: {sorted(self.states)})"
            )
        return TridentState(self, self.states[name])

    def _persist(
        self,
        stream: Stream,
        group: tuple[str, ...],
        state: StateSpec,
        aggregator: Persistable,
        in_fields: tuple[str, ...],
        out_field: str,
    ) -> TridentState:
        if not isinstance(aggregator, (Combiner, Reducer, StateUpdater)):
            hint = (
                " (a full Aggregator may emit several tuples per batch and cannot be persisted;"
                " aggregate() it first, then persist its output)"
                if isinstance(aggregator, Aggregator)
                else ""
            )
            raise PipelineError(
                f"state {state.name}: persistent_aggregate needs a Combiner or a Reducer, got "
                f"{aggregator!r}{hint}"
            )
        self._own((stream,), f"persistent_aggregate({state.name})")
        stream._require(in_fields, f"persistent_aggregate({state.name})")
        queried = [n for n in lineage(stream.node) if isinstance(n, QueryNode)]
        if queried and state.kind is StateKind.TRANSACTIONAL:
            raise PipelineError(
                f"pipeline {self.name}: state {state.name} is fed by a state query "
                f"({queried[0].state_name}), whose answer can differ when a txid is replayed; "
                "a transactional state would keep the first answer. Use an opaque state."
            )
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
        _check_typed_persist(stream.node, state, aggregator, group, in_fields)
        persist = Persist(state, aggregator, group, in_fields, out_field, stream.node)
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
