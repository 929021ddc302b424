"""The Spark engine: a batch's ranges are read and pre-aggregated by executors.

Every source range is split into tasks of at most TASK_RECORDS records; each task reads its
range through the file log's index (no rescans) and runs ``aggregate_range``: per-record plan,
quarantine of bad records, and the Combiner's partial aggregation within the task (one dict per
state, each distinct key encoded once). Only those small task outputs are cached; the driver
collects the record counts (Trident's completeness check) and the bad records, and each state's
partials are combined across tasks with ``reduceByKey`` and streamed back with toLocalIterator.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tridentflow.engine import ComputeResult, PartitionCount, Ranges, TaskOutput, aggregate_range
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


def _run_task(log_root: str, plan: Plan, task: tuple[int, int, int]) -> TaskOutput:
    return aggregate_range(log_root, plan, *task)


def _count(out: TaskOutput) -> tuple[int, PartitionCount]:
    return out.partition, out.count


def _bad(out: TaskOutput) -> list:
    return out.bad


def _partials(index: int, out: TaskOutput) -> Any:
    return out.partials[index].items()


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
        outputs = sc.parallelize(tasks, len(tasks)).map(
            functools.partial(_run_task, log_root, plan)
        )
        outputs.persist(StorageLevel.MEMORY_AND_DISK)
        for partition, count in outputs.map(_count).collect():
            counts[partition] = PartitionCount.merge(counts[partition], count)
        bad = outputs.flatMap(_bad).collect()
        reducers = max(1, min(sc.defaultParallelism, len(tasks)))
        partials: dict[str, Any] = {}
        for index, pp in enumerate(plan.persists):
            aggregated = outputs.flatMap(functools.partial(_partials, index)).reduceByKey(
                pp.aggregator.combine, reducers
            )
            # Materialise now so the cached task outputs can be released; stream after.
            aggregated.persist(StorageLevel.MEMORY_AND_DISK)
            aggregated.count()
            partials[pp.state.name] = aggregated
        outputs.unpersist()
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
