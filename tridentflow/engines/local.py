"""The local engine: the plain-Python reference of every operation, in one process (used by
``audit``, by tests as the reference, and for quick local runs)."""

from __future__ import annotations

from typing import Any

from tridentflow.engines.base import ComputeResult, ExecContext, Ranges
from tridentflow.engines.batchops import Exchange, receive
from tridentflow.engines.graph import GraphBuilder, PartitionFn
from tridentflow.engines.tasks import (
    build_states,
    merge_counts,
    read_task,
    split_ranges,
    task_records,
)
from tridentflow.errors import PipelineError
from tridentflow.nodes import FrameNode, Persist, frames_in
from tridentflow.plan import Plan

NO_FRAMES = (
    "{step}: a DataFrame or SQL step runs on Spark only; use --engine spark (spark-submit or "
    "Spark Connect), or tridentflow.testing.run_batches(..., spark=session) in tests"
)


class LocalEngine:
    """Single-process engine: the plain-Python reference of every operation."""

    name = "local"

    def compute(
        self, plan: Plan, log_root: str, ranges: Ranges, ctx: ExecContext | None = None
    ) -> ComputeResult:
        ctx = ctx or ExecContext(0, "")
        if plan.frames:
            frame = next(f for p in plan.graph_persists for f in frames_in(p.node))
            raise PipelineError(NO_FRAMES.format(step=frame.label))
        tasks = split_ranges(ranges, task_records(plan), ctx.position_base)
        outputs = [read_task(log_root, plan, *task) for task in tasks]
        counts = merge_counts(ranges, ((o.partition, o.count) for o in outputs))
        bad = [b for o in outputs for b in o.bad]
        backend = LocalBackend(ctx.lose_tuple)
        edges = [[o.edges[e] for o in outputs] for e in range(len(plan.edges))]
        builder = GraphBuilder(plan, backend, edges, ctx)
        task_partials = [
            [list(o.partials[i].items()) for o in outputs] for i in range(len(plan.persists))
        ]
        datasets = build_states(plan, builder, task_partials)
        partials = {
            name: [pair for partition in data for pair in partition]
            for name, data in datasets.items()
        }
        return ComputeResult(counts, partials, bad, backend.reports)


# -- the local backend --------------------------------------------------------------------------


class LocalBackend:
    """Datasets as lists of partitions, each a list of tuples, in one process."""

    def __init__(self, lose_tuple: bool = False) -> None:
        self.reports: list[Any] = []
        self._lose = lose_tuple

    def map_partitions(self, data: list[list[Any]], fn: PartitionFn) -> list[list[Any]]:
        return [list(fn(index, rows)) for index, rows in enumerate(data)]

    def exchange(self, data: list[list[Any]], exchange: Exchange) -> list[list[Any]]:
        buckets: list[list[Any]] = [[] for _ in range(exchange.n)]
        for sender, rows in enumerate(data):
            for target, item in exchange.send(sender, rows):
                buckets[target].append(item)
        out = []
        for target, items in enumerate(buckets):
            rows, report = receive(exchange.stage, len(data), target, items, self._lose)
            self.reports.append(report)
            out.append(rows)
        self._lose = False  # the fault hits the first exchange only
        return out

    def union(self, parts: list[list[list[Any]]]) -> list[list[Any]]:
        return [partition for part in parts for partition in part]

    def num_partitions(self, data: list[list[Any]]) -> int:
        return len(data)

    def frame(self, data: Any, node: FrameNode, partitions: int, strict: str | None) -> Any:
        raise PipelineError(NO_FRAMES.format(step=node.label))

    def aggregate(self, data: Any, persist: Persist) -> None:
        return None
