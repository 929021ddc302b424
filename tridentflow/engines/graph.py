"""The batch-operation graph: from the record stage's streams to the persisted states.

``GraphBuilder`` walks the pipeline's stream graph once per batch (each node built once) and
asks a ``Backend`` (the local engine's lists, or Spark DataFrames) for three things only: run a
function on every partition, exchange tuples between partitions (with Trident's count
reports), and concatenate datasets.
The operations themselves are tridentflow.engines.batchops, written once for both engines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Generic, Protocol, TypeVar

from tridentflow.aggregators import Combiner
from tridentflow.engines.base import ExecContext
from tridentflow.engines.batchops import (
    PHASE_COMBINE,
    PHASE_FULL,
    PHASE_PARTIAL,
    Exchange,
    JoinPartition,
    KeyedValues,
    PartitionAggregate,
    RowsStep,
    StageByKey,
    StateQuery,
    Tag,
    compile_specs,
)
from tridentflow.errors import PipelineError
from tridentflow.nodes import (
    AggregateNode,
    FrameNode,
    JoinNode,
    MergeNode,
    Node,
    OpNode,
    Persist,
    QueryNode,
    Repartition,
    RepartitionNode,
    Scope,
    frames_in,
)
from tridentflow.plan import Plan, compile_step
from tridentflow.static_state import StaticQuery
from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import StateKind

D = TypeVar("D")
PartitionFn = Callable[[int, Iterable[Any]], Iterable[Any]]


class Backend(Protocol, Generic[D]):
    def map_partitions(self, data: D, fn: PartitionFn) -> D: ...

    def exchange(self, data: D, exchange: Exchange) -> D:
        """Route every partition's tuples with ``exchange.send``; each target partition is the
        ``batchops.receive`` of what it got (its StageReport kept for ``reports``)."""

    def union(self, parts: list[D]) -> D: ...

    def num_partitions(self, data: D) -> int: ...

    def frame(self, data: D, node: FrameNode, partitions: int, strict: str | None) -> D:
        """A DataFrame or SQL step over ``data``'s tuples, as ``partitions`` partitions; with
        ``strict`` (the transactional state it feeds), refused unless Spark's plan of it is
        deterministic. Only Spark's DataFrames run one (``engines.dataframes``)."""

    def aggregate(self, data: D, persist: Persist) -> D | None:
        """``persist``'s (key, staged value) pairs computed by the backend's own aggregation
        from a DataFrame step's output ``data``; None: the graph computes them."""


class GraphBuilder(Generic[D]):
    """Builds each node's dataset once (memoised by node identity)."""

    def __init__(self, plan: Plan, backend: Backend[D], edges: list[D], ctx: ExecContext) -> None:
        self.plan = plan
        self.backend = backend
        self.edges = edges
        self.ctx = ctx
        self._built: dict[int, D] = {}
        self._stages = 0
        self._strict = {  # DataFrame steps that feed a transactional state: which one
            id(frame): persist.state.name
            for persist in plan.graph_persists
            if persist.state.kind is StateKind.TRANSACTIONAL
            for frame in frames_in(persist.node)
        }

    def _stage(self, label: str) -> str:
        self._stages += 1
        return f"{self._stages}:{label}"

    def exchange(
        self, data: D, how: Repartition, n: int, label: str, node: Node | None = None, **keys: Any
    ) -> D:
        """``data`` moved by ``how`` into ``n`` partitions, as the next stage (labelled, with
        the name ``node`` was given by Stream.name)."""
        name = self.plan.stage_names.get(node) if node is not None else None
        if name:
            label = f"{label}[{name}]"
        return self.backend.exchange(data, Exchange(self._stage(label), how, n, **keys))

    def dataset(self, node: Node) -> D:
        built = self._built.get(id(node))
        if built is None:
            built = self._built[id(node)] = self._build(node)
        return built

    def _build(self, node: Node) -> D:
        edge = self.plan.edge_index(node)
        if edge is not None:
            return self.edges[edge]
        backend = self.backend
        if isinstance(node, OpNode):
            step, _fields = compile_step(node.op, list(node.parent.fields))
            return backend.map_partitions(self.dataset(node.parent), RowsStep(step))
        if isinstance(node, RepartitionNode):
            return self._repartition(node)
        if isinstance(node, AggregateNode):
            return self._aggregate(node)
        if isinstance(node, MergeNode):
            return backend.union([self.dataset(n) for n in node.inputs])
        if isinstance(node, JoinNode):
            return self._join(node)
        if isinstance(node, FrameNode):
            n = node.parallelism or self.plan.default_parallelism
            strict = self._strict.get(id(node))
            return backend.frame(self.dataset(node.parent), node, n, strict)
        if isinstance(node, QueryNode) and node.static is not None:
            static = StaticQuery(
                self.ctx.redis_url,
                node.static,
                tuple(node.parent.fields.index(f) for f in node.key_fields),
            )
            return backend.map_partitions(self.dataset(node.parent), static)
        if isinstance(node, QueryNode):
            query = StateQuery(
                self.ctx.redis_url,
                KeySpace(node.pipeline_name, self.ctx.namespace),
                node.state_name,
                node.persisted,
                tuple(node.parent.fields.index(f) for f in node.key_fields),
                self.ctx.read_state,
            )
            return backend.map_partitions(self.dataset(node.parent), query)
        raise PipelineError(f"internal: no record stage feeds {node!r}")

    def _repartition(self, node: RepartitionNode) -> D:
        if node.how is Repartition.LOCAL_OR_SHUFFLE:
            data = self.dataset(node.parent)
            if node.parallelism is None or node.parallelism == self.backend.num_partitions(data):
                return data  # every tuple stays in its task: nothing moves
            label = f"local_or_shuffle->{node.parallelism}"
            return self.exchange(data, Repartition.SHUFFLE, node.parallelism, label, node)
        single = node.how in (Repartition.GLOBAL, Repartition.BATCH_GLOBAL)
        n = node.parallelism or (1 if single else self.plan.default_parallelism)
        keys = tuple(node.parent.fields.index(f) for f in node.key_fields)
        label = f"{node.how.value}({','.join(node.key_fields)})"
        return self.exchange(self.dataset(node.parent), node.how, n, label, node, key_idx=keys)

    def _aggregate(self, node: AggregateNode) -> D:
        fields = node.parent.fields
        group = tuple(fields.index(f) for f in node.group_fields)
        aggs = compile_specs(node.specs, fields)
        txid = self.ctx.txid
        data = self.dataset(node.parent)
        names = "+".join(repr(s.aggregator) for s in node.specs)
        if node.scope is Scope.PARTITION:
            fn = PartitionAggregate(aggs, group, PHASE_FULL, True, txid)
            return self.backend.map_partitions(data, fn)
        if node.scope is Scope.BATCH:
            how, n, key_idx = Repartition.GLOBAL, 1, ()
        else:
            how = Repartition.PARTITION_BY
            n = node.parallelism or self.plan.default_parallelism
            key_idx = group
        label = f"aggregate({names})"
        if node.combiners_only:  # partial per partition, repartition, combine
            partial = PartitionAggregate(aggs, group, PHASE_PARTIAL, True, txid)
            data = self.backend.map_partitions(data, partial)
            width = len(group)
            moved = self.exchange(data, how, n, label, node, key_idx=tuple(range(width)))
            combine = PartitionAggregate(aggs, tuple(range(width)), PHASE_COMBINE, True, txid)
            return self.backend.map_partitions(moved, combine)
        moved = self.exchange(data, how, n, label, node, key_idx=key_idx)
        regroup = PartitionAggregate(aggs, key_idx, PHASE_FULL, True, txid)
        return self.backend.map_partitions(moved, regroup)

    def _join(self, node: JoinNode) -> D:
        lf, rf = node.left.fields, node.right.fields
        lkey = tuple(lf.index(f) for f in node.left_fields)
        rkey = tuple(rf.index(f) for f in node.right_fields)
        tagged = self.backend.union(
            [
                self.backend.map_partitions(self.dataset(node.left), Tag(0)),
                self.backend.map_partitions(self.dataset(node.right), Tag(1)),
            ]
        )
        n = node.parallelism or self.plan.default_parallelism
        label = f"join({','.join(node.left_fields)}={','.join(node.right_fields)})"
        moved = self.exchange(
            tagged, Repartition.PARTITION_BY, n, label, node, key_idx=lkey, right_key_idx=rkey
        )
        join = JoinPartition(
            lkey,
            rkey,
            tuple(i for i in range(len(lf)) if i not in lkey),
            tuple(i for i in range(len(rf)) if i not in rkey),
        )
        return self.backend.map_partitions(moved, join)

    def persist(self, persist: Persist) -> D:
        """The (encoded key, staged value) pairs of one graph-computed state."""
        if isinstance(persist.node, FrameNode):  # Spark's own groupBy, where it is exact
            aggregated = self.backend.aggregate(self.dataset(persist.node), persist)
            if aggregated is not None:
                return aggregated
        fields = persist.fields
        combiner = persist.aggregator if isinstance(persist.aggregator, Combiner) else None
        keyed = KeyedValues(
            tuple(fields.index(f) for f in persist.group_fields),
            tuple(fields.index(f) for f in persist.in_fields),
            combiner,
        )
        data = self.backend.map_partitions(self.dataset(persist.node), keyed)
        return self.stage_by_key(data, persist.state.name, combiner, persist.parallelism)

    def stage_by_key(
        self, keyed: D, state: str, combiner: Combiner | None, parallelism: int | None = None
    ) -> D:
        """Exchange (key, value) pairs by key, then one staged value per key. The number of
        partitions here changes nothing but speed (at most one per sender); a single
        partition needs no exchange."""
        senders = self.backend.num_partitions(keyed)
        if senders > 1 or (parallelism or 1) > 1:
            n = parallelism or min(self.plan.default_parallelism, senders)
            label = f"persist({state})"
            keyed = self.exchange(
                keyed, Repartition.PARTITION_BY, n, label, key_idx=(0,), encoded_key=True
            )
        return self.backend.map_partitions(keyed, StageByKey(combiner))
