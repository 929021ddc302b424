"""The batch-operation graph on RDDs: how classic Spark (a master, spark-submit) runs it.

Every operation of the graph is a Python function, and Spark's RDD API is its cheapest way to
run one per partition: no Spark SQL planning on the driver, no Arrow round trip per batch, and
consecutive partition functions pipelined into one Python pass by PySpark itself. A fresh JVM -
one spark-submit per emit - pays neither Spark SQL's first-query warm-up nor the Arrow runner's
(``benchmarks.user_scores_vs_df``: seed 002's shape, one 200k txid, 10.9 s on RDDs, 17.8 s on
DataFrames, on 2 cores).
Spark Connect has no RDDs: there the same graph runs on DataFrames (``frames``).

A dataset is an RDD whose Spark partition ``i`` is logical partition ``i`` (the index a
``PartitionFn`` gets). No operation keeps a partitioner, so a union is always the parts'
partitions one after the other. An exchange routes every sender's tuples with
``batchops.Exchange.send``, shuffles them by target (``partitionBy``, one target per Spark
partition) and runs ``batchops.receive`` per target: its tuples in (sender, send order), and
its count report added to an accumulator (``ReportsParam``) - nothing of an exchange is cached.

A read task's record count and bad records go to the driver in an accumulator too (a
``ReportsParam`` keyed by the task's index): its output then feeds the graph alone, and when
one consumer reads it (a word count: one state fed by the source, no batch operations) it is
not cached - every partial would otherwise be pickled into Spark's block store and back once
more. Two or more consumers share a cached copy.

The whole batch then runs in two jobs: the first materialises every state, tagged and cached,
and counts them per tag; the second collects them (past COLLECT_KEYS, each state on its own, a
big one streamed partition by partition). Staging in Redis, one job: the executors write the
states' blocks and return their refs.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from tridentflow.engines.base import COLLECT_KEYS, ComputeResult, ExecContext, Ranges
from tridentflow.engines.batchops import Exchange, StageReport, receive
from tridentflow.engines.blocks import write_state_blocks
from tridentflow.engines.graph import GraphBuilder, PartitionFn
from tridentflow.engines.tasks import ReadTask, TaskOutput, build_states, merge_counts, read_task
from tridentflow.errors import IncompleteBatchError, PipelineError
from tridentflow.nodes import FrameNode, Persist
from tridentflow.plan import Plan
from tridentflow_state.staged import BlockRef, WrittenBlocks

if TYPE_CHECKING:
    from pyspark import RDD, Accumulator, SparkContext


def _read(
    log_root: str, plan: Plan, summaries: Accumulator, index: int, tasks: Iterable[ReadTask]
) -> Iterator[TaskOutput]:
    for task in tasks:
        out = read_task(log_root, plan, *task)
        summaries.add({index: (out.partition, out.count, out.bad)})
        yield out


def _edge(index: int, out: TaskOutput) -> list[Any]:
    return out.edges[index]


def _partials(index: int, out: TaskOutput) -> Iterable[tuple[str, Any]]:
    return out.partials[index].items()


def _listed(fn: PartitionFn, part: int, items: Iterable[Any]) -> Iterable[Any]:
    return fn(part, list(items))  # every PartitionFn gets a list, as the local engine hands it


def _send(exchange: Exchange, sender: int, rows: Iterable[Any]) -> Iterator[Any]:
    return exchange.send(sender, rows)


def _target(target: int) -> int:
    return target


def _receive(
    exchange: Exchange,
    senders: int,
    lose: bool,
    reports: Accumulator,
    target: int,
    items: Iterable[Any],
) -> list[Any]:
    rows, report = receive(exchange.stage, senders, target, (item for _t, item in items), lose)
    reports.add({(exchange.stage, target): report})
    return rows


class ReportsParam:
    """Spark accumulator of count reports, keyed by (stage, target): a target recomputed (a
    retried task, a dataset read twice) reports the same again, and counts once. (The read
    tasks' summaries use it too, keyed by the task's index.)"""

    def zero(self, _value: dict) -> dict:
        return {}

    def addInPlace(self, into: dict, more: dict) -> dict:
        into.update(more)
        return into


def _tag(index: int, item: Any) -> tuple[int, Any]:
    return index, item


def _tag_of(item: tuple[int, Any]) -> int:
    return item[0]


def _is(index: int, item: tuple[int, Any]) -> bool:
    return item[0] == index


def _untag(item: tuple[int, Any]) -> Any:
    return item[1]


class RddBackend:
    """``tridentflow.engines.graph.Backend`` on RDDs (classic Spark only). Each exchange's
    targets add their count reports to an accumulator (``ReportsParam``) as they receive."""

    def __init__(self, sc: SparkContext, lose_tuple: bool = False) -> None:
        self.sc = sc
        self._lose = lose_tuple
        self._reports = sc.accumulator({}, ReportsParam())
        self.exchanges: list[tuple[Exchange, int]] = []
        self.cached: list[RDD] = []

    def map_partitions(self, data: RDD, fn: PartitionFn) -> RDD:
        return data.mapPartitionsWithIndex(functools.partial(_listed, fn))

    def exchange(self, data: RDD, exchange: Exchange) -> RDD:
        senders = data.getNumPartitions()
        routed = data.mapPartitionsWithIndex(functools.partial(_send, exchange))
        received = routed.partitionBy(exchange.n, _target).mapPartitionsWithIndex(
            functools.partial(_receive, exchange, senders, self._lose, self._reports)
        )
        self._lose = False  # the lose-tuple fault hits the first exchange only
        self.exchanges.append((exchange, senders))
        return received

    def union(self, parts: list[RDD]) -> RDD:
        return self.sc.union(parts)

    def num_partitions(self, data: RDD) -> int:
        return data.getNumPartitions()

    def frame(self, data: RDD, node: FrameNode, partitions: int, strict: str | None) -> RDD:
        raise PipelineError(f"internal: {node.label} reached the RDD graph (engines.dataframes)")

    def aggregate(self, data: RDD, persist: Persist) -> None:
        return None

    def cache(self, rdd: RDD) -> RDD:
        from pyspark import StorageLevel

        rdd.persist(StorageLevel.MEMORY_AND_DISK)
        self.cached.append(rdd)
        return rdd

    def reports(self) -> list[StageReport]:
        """Every exchange's reports, once the jobs that computed them ran. A target that never
        reported counts as one that received no report (it fails the batch's check)."""
        got = self._reports.value
        found = []
        for exchange, senders in self.exchanges:
            for target in range(exchange.n):
                report = got.get((exchange.stage, target))
                found.append(report or StageReport(exchange.stage, target, senders, 0, 0, 0))
        return found

    def release(self) -> None:
        for rdd in self.cached:
            rdd.unpersist()
        self.cached.clear()


def compute_graph(
    sc: SparkContext,
    plan: Plan,
    log_root: str,
    ranges: Ranges,
    ctx: ExecContext,
    tasks: list[ReadTask],
) -> ComputeResult:
    """The batch on RDDs: one Spark partition per read task, the graph, and every state's
    (key, staged value) pairs (or, staging in Redis, the blocks its executors wrote)."""
    backend = RddBackend(sc, ctx.lose_tuple)
    summaries_by_task = sc.accumulator({}, ReportsParam())
    try:
        outputs = sc.parallelize(tasks, len(tasks)).mapPartitionsWithIndex(
            functools.partial(_read, log_root, plan, summaries_by_task)
        )
        if len(plan.edges) + len(plan.persists) > 1:  # one consumer reads it once: no cache
            outputs = backend.cache(outputs)
        edges = [outputs.flatMap(functools.partial(_edge, e)) for e in range(len(plan.edges))]
        task_partials = [
            outputs.flatMap(functools.partial(_partials, i)) for i in range(len(plan.persists))
        ]
        builder = GraphBuilder(plan, backend, edges, ctx)
        datasets = build_states(plan, builder, task_partials)
        names = list(datasets)
        states = [data.map(functools.partial(_tag, i)) for i, data in enumerate(datasets.values())]
        if ctx.blocks is not None:  # one job: the executors write every state's blocks
            body = functools.partial(write_state_blocks, ctx.redis_url, ctx.blocks, names)
            refs: dict[str, list[BlockRef]] = {name: [] for name in names}
            for tag, item in sc.union(states).mapPartitions(body).collect():
                refs[names[tag]] += item
            streams: dict[str, Any] = {name: WrittenBlocks(refs[name]) for name in names}
        else:
            tagged = backend.cache(sc.union(states))
            sizes = tagged.map(_tag_of).countByValue()  # one job materialises all of it
            streams = _collected(tagged, names, sizes)
        reports = backend.reports()
        summaries = [summary for _i, summary in sorted(summaries_by_task.value.items())]
    finally:
        backend.release()
    if len(summaries) != len(tasks):  # every read task ran in the jobs above: never here
        raise IncompleteBatchError(
            f"txid {ctx.txid}: batch is incomplete, it must not commit: "
            f"{len(tasks) - len(summaries)} of {len(tasks)} read tasks never reported a count"
        )
    counts = merge_counts(ranges, ((p, count) for p, count, _bad in summaries))
    bad = sorted(
        (b for _p, _count, task_bad in summaries for b in task_bad),
        key=lambda b: (b.partition, b.offset),
    )
    return ComputeResult(counts, streams, bad, reports)


def _collected(tagged: RDD, names: list[str], sizes: dict[int, int]) -> dict[str, Any]:
    """Every state's items from the cached tagged RDD."""
    if sum(sizes.values()) <= COLLECT_KEYS:
        by_tag: dict[int, list] = {tag: [] for tag in range(len(names))}
        for tag, item in tagged.collect():
            by_tag[tag].append(item)
        return {name: by_tag[i] for i, name in enumerate(names)}
    streams: dict[str, Any] = {}
    for i, name in enumerate(names):
        selected = tagged.filter(functools.partial(_is, i)).map(_untag)
        if not sizes.get(i):
            streams[name] = []
        elif sizes[i] <= COLLECT_KEYS:
            streams[name] = selected.collect()
        else:
            streams[name] = list(selected.toLocalIterator())
    return streams
