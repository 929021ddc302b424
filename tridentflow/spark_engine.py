"""The Spark engine: a batch's ranges are read by executors, pre-aggregated per key.

Every source range is split into tasks of at most TASK_RECORDS records; each task reads its
range through the file log's index (no rescans). The decoded records are cached once and used
for two things: the per-partition record counts (Trident's completeness check) and, for each
persisted state, ``flatMap(pairs).reduceByKey(combine)`` - a Combiner's partial aggregation per
Spark partition, then combine. The result streams to the driver with toLocalIterator.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tridentflow.engine import ComputeResult, PartitionCount, Ranges, read_processed
from tridentflow.plan import Plan

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TASK_RECORDS = 50_000


def split_ranges(ranges: Ranges, task_records: int = TASK_RECORDS) -> list[tuple[int, int, int]]:
    tasks = []
    for partition, (start, end) in sorted(ranges.items()):
        for s in range(start, end, task_records):
            tasks.append((partition, s, min(end, s + task_records)))
    return tasks


def _read_task(log_root: str, plan: Plan, task: tuple[int, int, int]):
    partition, start, end = task
    return read_processed(log_root, plan, partition, start, end)


def _count(record) -> tuple[int, tuple[int, int, int]]:
    partition, offset, _pairs, _bad = record
    return partition, (1, offset, offset)


def _is_bad(record) -> bool:
    return record[3] is not None


def _bad(record):
    return record[3]


def _merge_counts(a: tuple[int, int, int], b: tuple[int, int, int]) -> tuple[int, int, int]:
    return a[0] + b[0], min(a[1], b[1]), max(a[2], b[2])


def _pairs(index: int, record) -> Any:
    pairs = record[2]
    return () if pairs is None else pairs[index]


class SparkEngine:
    name = "spark"

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def compute(self, plan: Plan, log_root: str, ranges: Ranges) -> ComputeResult:
        from pyspark import StorageLevel

        sc = self.spark.sparkContext
        tasks = split_ranges(ranges)
        counts = {p: PartitionCount(0, None, None) for p in ranges}
        if not tasks:
            return ComputeResult(counts, {pp.state.name: [] for pp in plan.persists}, [])
        records = sc.parallelize(tasks, len(tasks)).flatMap(
            functools.partial(_read_task, log_root, plan)
        )
        records.persist(StorageLevel.MEMORY_AND_DISK)
        for partition, (n, first, last) in records.map(_count).reduceByKey(_merge_counts).collect():
            counts[partition] = PartitionCount(n, first, last)
        bad = records.filter(_is_bad).map(_bad).collect()
        reducers = max(1, min(sc.defaultParallelism, len(tasks)))
        partials: dict[str, Any] = {}
        for index, pp in enumerate(plan.persists):
            aggregated = records.flatMap(functools.partial(_pairs, index)).reduceByKey(
                pp.aggregator.combine, reducers
            )
            # Materialise now so the cached input can be released; stream to the driver after.
            aggregated.persist(StorageLevel.MEMORY_AND_DISK)
            aggregated.count()
            partials[pp.state.name] = aggregated
        records.unpersist()
        streams = {name: _stream_and_release(rdd) for name, rdd in partials.items()}
        return ComputeResult(counts, streams, sorted(bad, key=lambda b: (b.partition, b.offset)))


def _stream_and_release(rdd):
    try:
        yield from rdd.toLocalIterator()
    finally:
        rdd.unpersist()


LOG4J2 = Path(__file__).with_name("log4j2.properties")


def quiet_java_options() -> str:
    return f"-Dlog4j2.configurationFile=file:{LOG4J2}"


def spark_session(app_name: str = "tridentflow", master: str | None = None) -> SparkSession:
    """A SparkSession configured for tridentflow (UI off, warnings-only logging)."""
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
