"""The Spark engine: the record stage and the batch-operation graph on RDDs.

Every source range is split into read tasks (tridentflow.engine.split_ranges); each task reads
its range through the file log's index and runs ``read_task``: per-record plan, quarantine of
bad records, the Combiner's partial aggregation within the task, and the tuples that batch
operations consume. Only those task outputs are cached; the driver collects the record counts
(Trident's completeness check) and the bad records.

A plan whose states are all fed straight by the source (no batch operations: the word count,
most counters) takes the direct path: one job whose read tasks return their partials, which
the driver combines per key in task order - what the exchange would stage, without its
shuffle and its three further jobs.

Otherwise the graph (tridentflow.graph) runs with ``SparkBackend``: a partition function is
``mapPartitionsWithIndex``; an exchange is ``batchops.Exchange.send`` per sender partition, a
``partitionBy`` on the target, and ``batchops.receive`` per target, whose first output element
is its count report (collected from the cached result) and the rest its tuples, in
deterministic order. RDDs rather than DataFrames: every operation runs arbitrary Python
functions, and benchmarks/wordcount_vs_pyspark.py measures what that costs.
"""

from __future__ import annotations

import functools
import itertools
import os
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tridentflow.batchops import Exchange, StageByKey, StageReport, receive
from tridentflow.engine import (
    ComputeResult,
    LocalEngine,
    Ranges,
    TaskOutput,
    build_states,
    merge_counts,
    read_task,
    split_ranges,
    task_records,
)
from tridentflow.errors import TridentflowError
from tridentflow.graph import ExecContext, GraphBuilder, PartitionFn
from tridentflow.plan import Plan

if TYPE_CHECKING:
    from pyspark import RDD
    from pyspark.sql import SparkSession


def _run_task(log_root: str, plan: Plan, task: tuple[int, int, int]) -> TaskOutput:
    return read_task(log_root, plan, *task)


def _summary(out: TaskOutput) -> tuple[int, Any, list]:
    return out.partition, out.count, out.bad


def _partials(index: int, out: TaskOutput) -> Any:
    return out.partials[index].items()


def _edge(index: int, out: TaskOutput) -> Any:
    return out.edges[index]


def _target(target: int) -> int:
    return target


def _send(exchange: Exchange, sender: int, rows: Any) -> Any:
    return exchange.send(sender, rows)


def _receive(exchange: Exchange, senders: int, lose: bool, target: int, items: Any) -> Any:
    rows, report = receive(exchange.stage, senders, target, (item for _t, item in items), lose)
    yield report
    yield from rows


def _first(items: Any) -> Any:
    return itertools.islice(items, 1)


def _rest(items: Any) -> Any:
    return itertools.islice(items, 1, None)


class SparkBackend:
    """Datasets as RDDs; partition indexes are preserved by every operation."""

    def __init__(self, sc: Any, lose_tuple: bool = False) -> None:
        self.sc = sc
        self._lose = lose_tuple
        self.received: list[RDD] = []

    def map_partitions(self, data: RDD, fn: PartitionFn) -> RDD:
        return data.mapPartitionsWithIndex(fn, preservesPartitioning=False)

    def exchange(self, data: RDD, exchange: Exchange) -> RDD:
        from pyspark import StorageLevel

        senders = data.getNumPartitions()
        routed = data.mapPartitionsWithIndex(functools.partial(_send, exchange))
        received = routed.partitionBy(exchange.n, _target).mapPartitionsWithIndex(
            functools.partial(_receive, exchange, senders, self._lose)
        )
        self._lose = False  # only the first exchange
        received.persist(StorageLevel.MEMORY_AND_DISK)
        self.received.append(received)
        return received.mapPartitions(_rest, preservesPartitioning=True)

    def union(self, parts: list[RDD]) -> RDD:
        return self.sc.union(parts)

    def num_partitions(self, data: RDD) -> int:
        return data.getNumPartitions()

    def reports(self) -> list[StageReport]:
        """Every exchange's reports, in one job (the exchanges are cached)."""
        if not self.received:
            return []
        return self.sc.union([r.mapPartitions(_first) for r in self.received]).collect()

    def release(self) -> None:
        for received in self.received:
            received.unpersist()


class SparkEngine:
    """Runs a plan on a SparkSession: classic (a master, or under spark-submit) or a Spark
    Connect client session (``spark_session(remote=...)``). Over Connect there are no RDDs:
    only the direct path runs (states all fed straight by the source), its read tasks in a
    ``mapInArrow``; a plan with batch operations is refused in one line."""

    name = "spark"

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.remote = is_connect(spark)

    def compute(
        self, plan: Plan, log_root: str, ranges: Ranges, ctx: ExecContext | None = None
    ) -> ComputeResult:
        from pyspark import StorageLevel

        ctx = ctx or ExecContext(0, "")
        tasks = split_ranges(ranges, task_records(plan))
        if not tasks:  # nothing to read: no source partitions, nothing for executors
            return LocalEngine().compute(plan, log_root, ranges, ctx)
        if not plan.edges and not ctx.lose_tuple:  # lose-tuple is a fault in an exchange
            direct = self._compute_direct(plan, log_root, ranges, tasks)
            if direct is not None:
                return direct
        if self.remote:
            raise TridentflowError(
                "over Spark Connect only pipelines whose states are all fed straight by the"
                " source run (this one has batch operations, or a batch of more than"
                f" {DIRECT_PAIRS} partials): use spark-submit, a master, or --engine local"
            )
        sc = self.spark.sparkContext
        outputs = sc.parallelize(tasks, len(tasks)).map(
            functools.partial(_run_task, log_root, plan)
        )
        outputs.persist(StorageLevel.MEMORY_AND_DISK)
        summaries = outputs.map(_summary).collect()  # one job: counts and bad records
        counts = merge_counts(ranges, ((p, count) for p, count, _bad in summaries))
        bad = [b for _p, _count, task_bad in summaries for b in task_bad]
        backend = SparkBackend(sc, ctx.lose_tuple)
        edges = [outputs.flatMap(functools.partial(_edge, e)) for e in range(len(plan.edges))]
        builder = GraphBuilder(plan, backend, edges, ctx)
        task_partials = [
            outputs.flatMap(functools.partial(_partials, i)) for i in range(len(plan.persists))
        ]
        datasets = build_states(plan, builder, task_partials)
        # One job materialises every state (tagged with its index) and counts its keys, so the
        # cached task outputs and exchanges can be released before the driver reads them.
        tagged = sc.union(
            [data.map(functools.partial(_tag, i)) for i, data in enumerate(datasets.values())]
        )
        tagged.persist(StorageLevel.MEMORY_AND_DISK)
        sizes = tagged.map(_tag_of).countByValue()
        reports = backend.reports()
        backend.release()
        outputs.unpersist()
        names = list(datasets.keys())
        streams: dict[str, Any]
        if sum(sizes.values()) <= COLLECT_KEYS:  # small: every state in one job
            collected: dict[int, list] = {i: [] for i in range(len(names))}
            for index, item in tagged.collect():
                collected[index].append(item)
            tagged.unpersist()
            streams = {name: collected[i] for i, name in enumerate(names)}
        else:
            reader = _StateReader(tagged, len(names))
            streams = {name: reader.items(i, sizes.get(i, 0)) for i, name in enumerate(names)}
        bad.sort(key=lambda b: (b.partition, b.offset))
        return ComputeResult(counts, streams, bad, reports)

    def _compute_direct(
        self, plan: Plan, log_root: str, ranges: Ranges, tasks: list[tuple[int, int, int]]
    ) -> ComputeResult | None:
        """A plan whose states are all fed straight by the source, in one Spark job: the read
        tasks' partials go to the driver, which combines them per key in task order - the
        exchange path's sender order, so every value is the one it would stage. None (use
        the exchange path) if the tasks make more than DIRECT_PAIRS partials in all."""
        cap = DIRECT_PAIRS // len(tasks)
        if self.remote:
            results = self._direct_results_arrow(plan, log_root, tasks, cap)
        else:
            results = (
                self.spark.sparkContext.parallelize(tasks, len(tasks))
                .map(functools.partial(_run_task, log_root, plan))
                .map(functools.partial(_direct_output, cap))
                .collect()
            )
        if any(partials is None for _p, _count, _bad, partials in results):
            return None
        counts = merge_counts(ranges, ((p, count) for p, count, _bad, _partials in results))
        bad = sorted(
            (b for _p, _count, task_bad, _partials in results for b in task_bad),
            key=lambda b: (b.partition, b.offset),
        )
        states = {  # the exchange path's per-key staging, over the tasks in sender order
            pp.state.name: StageByKey(pp.aggregator)(
                0, (pair for *_head, partials in results for pair in partials[index])
            )
            for index, pp in enumerate(plan.persists)
        }
        return ComputeResult(counts, states, bad, [])

    def _direct_results_arrow(
        self, plan: Plan, log_root: str, tasks: list[tuple[int, int, int]], cap: int
    ) -> list[tuple]:
        """The read tasks' direct outputs through the DataFrame API (what Spark Connect
        has): ``range(n)`` in n partitions is one task index per Spark partition, each run
        by ``mapInArrow`` and returned pickled; in task order."""
        indexes = self.spark.range(0, len(tasks), 1, len(tasks))
        outputs = indexes.mapInArrow(
            functools.partial(_read_tasks_arrow, log_root, plan, cap, tasks),
            "task long, result binary",
        ).collect()
        return [pickle.loads(row["result"]) for row in sorted(outputs, key=lambda r: r["task"])]


DIRECT_PAIRS = 2_000_000
"""At most this many (key, partial) pairs in all go from the read tasks straight to the driver
(about 100 bytes each there); a batch whose tasks make more takes the exchange path, and its
read tasks run again."""


def _direct_output(cap: int, out: TaskOutput) -> tuple[int, Any, list, list | None]:
    """A read task's result for the driver: its partials only if they make at most ``cap``
    pairs."""
    pairs = sum(len(p) for p in out.partials)
    partials = [list(p.items()) for p in out.partials] if pairs <= cap else None
    return out.partition, out.count, out.bad, partials


def _read_tasks_arrow(
    log_root: str, plan: Plan, cap: int, tasks: list[tuple[int, int, int]], batches: Iterator[Any]
) -> Iterator[Any]:
    """mapInArrow body: the direct output of each task whose index comes in, pickled."""
    import pyarrow as pa

    for batch in batches:
        for index in batch.column(0).to_pylist():
            out = _direct_output(cap, read_task(log_root, plan, *tasks[index]))
            yield pa.RecordBatch.from_pydict({"task": [index], "result": [pickle.dumps(out)]})


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect client session."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


COLLECT_KEYS = 200_000
"""States with at most this many keys in all are collected in one job; past that, each state
is read on its own, and one bigger than this is streamed partition by partition
(toLocalIterator), so the driver never holds it whole."""


def _tag(index: int, item: Any) -> tuple[int, Any]:
    return index, item


def _tag_of(item: tuple[int, Any]) -> int:
    return item[0]


def _is(index: int, item: tuple[int, Any]) -> bool:
    return item[0] == index


def _untag(item: tuple[int, Any]) -> Any:
    return item[1]


class _StateReader:
    """Reads each state's items out of the cached, tagged RDD; releases it after the last."""

    def __init__(self, tagged: RDD, states: int) -> None:
        self.tagged = tagged
        self.open = states

    def items(self, index: int, size: int) -> Any:
        try:
            selected = self.tagged.filter(functools.partial(_is, index)).map(_untag)
            if size <= COLLECT_KEYS:
                yield from selected.collect() if size else ()
            else:
                yield from selected.toLocalIterator()
        finally:
            self.open -= 1
            if self.open == 0:
                self.tagged.unpersist()


LOG4J2 = Path(__file__).with_name("log4j2.properties")


def quiet_java_options() -> str:
    return f"-Dlog4j2.configurationFile=file:{LOG4J2}"


def spark_session(
    app_name: str = "tridentflow", master: str | None = None, remote: str | None = None
) -> SparkSession:
    """A SparkSession configured for tridentflow (UI off, warnings-only logging). Python
    workers run this interpreter unless PYSPARK_PYTHON says otherwise (a venv's packages,
    redis among them, are then there even when the venv is not on PATH). ``remote``
    (sc://HOST:PORT) makes it a Spark Connect client instead: no JVM here."""
    if remote:
        from pyspark.sql import SparkSession

        try:
            return SparkSession.builder.remote(remote).appName(app_name).getOrCreate()
        except Exception as exc:  # grpc's errors are many screens long
            raise TridentflowError(
                f"cannot reach Spark Connect at {remote}: {type(exc).__name__}"
            ) from None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if "PYSPARK_SUBMIT_ARGS" not in os.environ:  # in-process JVM: quiet its logging too
        os.environ["PYSPARK_SUBMIT_ARGS"] = (
            f'--driver-java-options "{quiet_java_options()}" pyspark-shell'
        )
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    elif not SparkConf().contains("spark.master"):  # not under spark-submit
        builder = builder.master("local[*]")
    return (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
