"""The stream graph's nodes: what ``Stream`` methods build (tridentflow.pipeline) and the
engines walk (tridentflow.engines.graph). Nodes are immutable and compared by identity; a
stream is a node. Also the specifications a graph ends in: ``StateSpec`` and ``Persist``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from tridentflow.aggregators import AnyAggregator, Combiner, Persistable, StateUpdater, guard
from tridentflow.errors import InvalidNameError, PipelineError
from tridentflow.schemas import Schema
from tridentflow.static_state import Lookup
from tridentflow_state.batch_times import ExpiryRule
from tridentflow_state.keys import check_name
from tridentflow_state.maps import StateKind


def _checked_name(kind: str, name: str) -> str:
    """``name`` if it can name a pipeline or state in Redis keys; PipelineError otherwise."""
    try:
        return check_name(kind, name)
    except ValueError as exc:
        raise InvalidNameError(str(exc)) from None


@dataclass(frozen=True)
class StateSpec:
    """A map state: its name, its kind, and - optionally - its expiry: with
    ``expire_after_txids = N`` the commit of txid T removes every key last updated at a txid
    <= T - N that T does not update; with ``expire_after = timedelta(...)``, every key last
    updated at a txid whose batch time (frozen by the coordinator into its metadata, never a
    committing machine's clock) is at or before T's minus that period; with both, whichever
    comes first. A removal like any other: every sink drops the row, a rewind brings it back
    (tridentflow_state.expiry, tridentflow_state.batch_times)."""

    name: str
    kind: StateKind = StateKind.OPAQUE
    expire_after_txids: int | None = None
    expire_after: timedelta | None = None

    def __post_init__(self) -> None:
        _checked_name("state", self.name)
        object.__setattr__(self, "kind", StateKind.parse(self.kind))
        after, period = self.expire_after_txids, self.expire_after
        if after is None and period is None:
            return
        if after is not None and (
            not isinstance(after, int) or isinstance(after, bool) or after < 1
        ):
            raise PipelineError(
                f"state {self.name}: expire_after_txids={after!r} is not a whole number >= 1 "
                "(the txids a key may go without an update before it is removed)"
            )
        if period is not None and (
            not isinstance(period, timedelta) or period < timedelta(milliseconds=1)
        ):
            raise PipelineError(
                f"state {self.name}: expire_after={period!r} is not a timedelta of 1 ms or "
                "more (the batch time a key may go without an update before it is removed)"
            )
        if self.kind is StateKind.NON_TRANSACTIONAL:
            raise PipelineError(
                f"state {self.name}: a non-transactional state keeps no txid to expire by; "
                "make it transactional or opaque, or drop expire_after_txids/expire_after"
            )

    @property
    def expiry(self) -> ExpiryRule | None:
        """The state's expiry rule (None: its keys never expire)."""
        if self.expire_after_txids is None and self.expire_after is None:
            return None
        period = self.expire_after
        after_ms = None if period is None else period // timedelta(milliseconds=1)
        return ExpiryRule(self.expire_after_txids, after_ms)


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


class Repartition(StrEnum):
    PARTITION_BY = "partition_by"
    SHUFFLE = "shuffle"
    GLOBAL = "global"
    BATCH_GLOBAL = "batch_global"
    BROADCAST = "broadcast"
    LOCAL_OR_SHUFFLE = "local_or_shuffle"


class Scope(StrEnum):
    PARTITION = "partition"  # partition_aggregate: per partition of the stream
    BATCH = "batch"  # aggregate: once per batch
    GROUP = "group"  # group_by().aggregate: once per group per batch


# The stream graph. Nodes are immutable and compared by identity; a stream is a node.


@dataclass(frozen=True, eq=False)
class SourceNode:
    fields: tuple[str, ...]
    position_field: str | None = None
    """The source's position field (LogSource.position_field), last of ``fields``."""
    schema: Schema | None = None
    """The fields' declared types (LogSource.schema, the position a bigint); None: untyped."""


@dataclass(frozen=True, eq=False)
class OpNode:
    parent: Node
    op: Operation
    fields: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class RepartitionNode:
    parent: Node
    how: Repartition
    key_fields: tuple[str, ...]
    parallelism: int | None
    fields: tuple[str, ...]


@dataclass(frozen=True)
class AggSpec:
    """One aggregator of an aggregate (several make a chained aggregate)."""

    in_fields: tuple[str, ...]
    aggregator: AnyAggregator
    out_fields: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "aggregator", guard(self.aggregator))


@dataclass(frozen=True, eq=False)
class AggregateNode:
    parent: Node
    scope: Scope
    group_fields: tuple[str, ...]
    specs: tuple[AggSpec, ...]
    parallelism: int | None
    fields: tuple[str, ...]

    @property
    def combiners_only(self) -> bool:
        """All Combiners: partial aggregation per partition before any repartition."""
        return all(isinstance(s.aggregator, Combiner) for s in self.specs)


@dataclass(frozen=True, eq=False)
class MergeNode:
    inputs: tuple[Node, ...]
    fields: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class JoinNode:
    left: Node
    right: Node
    left_fields: tuple[str, ...]
    right_fields: tuple[str, ...]
    parallelism: int | None
    fields: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class QueryNode:
    """Trident's stateQuery with MapGet: appends the committed value of each tuple's key."""

    parent: Node
    pipeline_name: str
    state_name: str
    persisted: Persistable | None
    key_fields: tuple[str, ...]
    fields: tuple[str, ...]
    static: Lookup | None = None
    """A static state's store (read as it is, not a map state's committed value)."""


@dataclass(frozen=True, eq=False)
class FrameNode:
    """A DataFrame or SQL step (Stream.spark, Stream.sql): the batch's tuples of ``parent`` as
    a Spark DataFrame typed by ``input_schema``, transformed by Spark - ``transform(df)``, or
    the SQL ``query`` over a view named ``batch`` - into a DataFrame of ``schema``'s columns
    (the node's fields), in ``parallelism`` partitions (None: the pipeline's default)."""

    parent: Node
    transform: Callable[[Any], Any] | None
    query: str | None
    input_schema: Schema
    schema: Schema
    parallelism: int | None
    fields: tuple[str, ...]

    @property
    def label(self) -> str:
        """The step for messages: ``spark(fn)`` or ``sql``."""
        if self.transform is None:
            return "sql"
        return f"spark({getattr(self.transform, '__name__', type(self.transform).__name__)})"


Node = (
    SourceNode
    | OpNode
    | RepartitionNode
    | AggregateNode
    | MergeNode
    | JoinNode
    | QueryNode
    | FrameNode
)


def known_schema(node: Node) -> Schema | None:
    """The declared types of ``node``'s fields, where they are known: a typed source, a
    DataFrame step, and what only filters, projects or moves their tuples."""
    while True:
        if isinstance(node, SourceNode):
            return node.schema
        if isinstance(node, FrameNode):
            return node.schema
        if isinstance(node, RepartitionNode) or (
            isinstance(node, OpNode) and isinstance(node.op, Filter)
        ):
            node = node.parent
            continue
        if isinstance(node, OpNode) and isinstance(node.op, Project):
            parent = known_schema(node.parent)
            return None if parent is None else parent.select(node.op.fields)
        return None


def frames_in(node: Node) -> list[FrameNode]:
    """The DataFrame steps ``node`` depends on."""
    return [n for n in lineage(node) if isinstance(n, FrameNode)]


def parents_of(node: Node) -> tuple[Node, ...]:
    if isinstance(node, SourceNode):
        return ()
    if isinstance(node, MergeNode):
        return node.inputs
    if isinstance(node, JoinNode):
        return (node.left, node.right)
    return (node.parent,)


def lineage(node: Node) -> list[Node]:
    """Every node ``node`` depends on, itself included, each once, parents first."""
    seen: dict[int, Node] = {}

    def visit(n: Node) -> None:
        if id(n) in seen:
            return
        for parent in parents_of(n):
            visit(parent)
        seen[id(n)] = n

    visit(node)
    return list(seen.values())


def is_record_level(node: Node) -> bool:
    """True if ``node`` is the source followed only by per-record operations."""
    while isinstance(node, OpNode):
        node = node.parent
    return isinstance(node, SourceNode)


@dataclass(frozen=True)
class Persist:
    """A persisted state: the stream's tuples, grouped by ``group_fields``, folded into a map
    state by a Combiner, a Reducer or a StateUpdater (``partition_persist``)."""

    state: StateSpec
    aggregator: Persistable
    group_fields: tuple[str, ...]
    in_fields: tuple[str, ...]
    out_field: str
    node: Node
    parallelism: int | None = None
    """Partitions of the state stage (its exchange by key); None: as many as senders, at most
    the pipeline's default_parallelism. Speed only: the staged values never depend on it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "aggregator", guard(self.aggregator))

    @property
    def fields(self) -> tuple[str, ...]:
        return self.node.fields

    @property
    def batch_invariant(self) -> bool:
        """True if the state depends only on the records, not on how they were batched: then
        ``audit`` can recompute it from the whole source as one batch."""
        return self.recountable and self.state.expiry is None

    @property
    def recountable(self) -> bool:
        """True if each txid's effect on the state depends only on its records: ``audit`` can
        recompute it - as one batch, or (an expiring state, whose expiry depends on the txids)
        txid by txid from the ranges the ledger's history kept."""
        return (
            is_record_level(self.node)
            and not isinstance(self.aggregator, StateUpdater)
            and not any(
                isinstance(n, SourceNode) and n.position_field for n in lineage(self.node)
            )  # positions depend on how records were batched
        )
