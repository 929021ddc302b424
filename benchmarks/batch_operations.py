"""Benchmark: the fixed cost of batch operations on Spark vs the local engine.

    python -m benchmarks.batch_operations [--sentences 900,20000] [--repeat 2] [--connect]
    python -m benchmarks.batch_operations --per-exchange [--repeat 3] [--connect]

Runs one batch of the test pipeline that uses every batch operation (tests.pipelines:
everything: 12 exchanges - partition_by, shuffle, global, broadcast, a join, grouped and
global aggregates, a state query, eight states) on SparkEngine (local[2]) and on LocalEngine,
and reports the best wall time of each, with the Spark jobs, stages and tasks of one batch.
With ``--connect``, the Spark side is a client of a local Spark Connect server (local[2],
started first and warmed by one batch, as ``tridentflow spark-connect`` leaves one running);
the jobs, stages and tasks are then not counted (no SparkContext on a client).
On classic Spark the graph runs on RDDs unless ``TRIDENTFLOW_SPARK_GRAPH=frames``.

``--per-exchange``: what one exchange costs a batch - the same 900 sentences through a chain
of 1 and of 9 ``shuffle()`` exchanges before a Count (each chain's best of --repeat, warm);
(t9 - t1) / 8 is the cost of one more exchange.
Needs a Redis for the state query (TRIDENTFLOW_REDIS_URL, default 127.0.0.1:6379; it is only
read). Run from the repository root (it imports the test pipeline).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from tridentflow import Count, LogSource, Pipeline, StateSpec
from tridentflow.devtools import connect_server, devredis
from tridentflow.devtools.sample_data import sentences
from tridentflow.engines.base import ExecContext
from tridentflow.engines.local import LocalEngine
from tridentflow.engines.spark import SparkEngine, spark_session
from tridentflow.plan import compile_pipeline
from tridentflow.registry import load_pipeline
from tridentflow.sources.filelog import FileLog
from tridentflow.steps.runtime import resolve_redis_url


def timed(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.monotonic()
        fn()
        best = min(best, time.monotonic() - started)
    return best


def shuffles(k: int) -> Pipeline:
    """Sentences through ``k`` shuffle() exchanges, then counted per sentence."""
    pipeline = Pipeline(f"bench-shuffles-{k}", LogSource(fields=("sentence",), partitions=3))
    stream = pipeline.stream
    for _ in range(k):
        stream = stream.shuffle()
    stream.group_by("sentence").persistent_aggregate(StateSpec("n"), Count())
    return pipeline


def per_exchange(spark: Any, work: Path, ctx: ExecContext, repeat: int) -> None:
    log = FileLog(work / "log-chain")
    log.ensure(3)
    log.append_spread(sentences(900, seed=4))
    ranges = {p: (0, h) for p, h in log.heads().items()}
    best = {}
    for k in (1, 9):
        plan = compile_pipeline(shuffles(k))

        def run(plan=plan, k=k):
            result = SparkEngine(spark).compute(plan, str(log.root), ranges, ctx)
            assert len({r.stage for r in result.stages}) == k + 1  # every exchange ran
            assert all(r.ok for r in result.stages)
            for items in result.partials.values():
                list(items)

        run()  # warm up
        best[k] = timed(run, repeat)
    per = (best[9] - best[1]) / 8
    print(f"1 exchange {best[1]:.2f}s, 9 exchanges {best[9]:.2f}s: {per:.3f}s per exchange")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sentences", default="900,20000")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--connect", action="store_true", help="Spark as a Connect client")
    parser.add_argument("--per-exchange", action="store_true", help="one exchange's cost")
    args = parser.parse_args()
    plan = compile_pipeline(load_pipeline("tests.pipelines:everything"))
    ctx = ExecContext(1, resolve_redis_url())
    work = Path(tempfile.mkdtemp(prefix="tf-bench-ops-"))
    port = None
    try:
        if args.connect:
            port = devredis.free_port()
            url = connect_server.start(work / "connect", port, "local[2]")
            spark = spark_session("tridentflow-bench-batchops", remote=url)
        else:
            spark = spark_session("tridentflow-bench-batchops", "local[2]")
        if args.per_exchange:
            per_exchange(spark, work, ctx, args.repeat)
        for n in () if args.per_exchange else (int(x) for x in args.sentences.split(",")):
            log = FileLog(work / f"log-{n}")
            log.ensure(3)
            log.append_spread(sentences(n, seed=4))
            ranges = {p: (0, h) for p, h in log.heads().items()}

            def on_spark(log=log, ranges=ranges):
                result = SparkEngine(spark).compute(plan, str(log.root), ranges, ctx)
                for items in result.partials.values():
                    list(items)

            def local(log=log, ranges=ranges):
                result = LocalEngine().compute(plan, str(log.root), ranges, ctx)
                for items in result.partials.values():
                    list(items)

            on_spark()  # warm up
            counted = ""
            if not args.connect:
                sc = spark.sparkContext
                sc.setJobGroup(f"n{n}", "one batch")
                on_spark()
                tracker = sc.statusTracker()
                jobs = tracker.getJobIdsForGroup(f"n{n}")
                stages = {s for j in jobs for s in tracker.getJobInfo(j).stageIds}
                tasks = sum(tracker.getStageInfo(s).numTasks for s in stages)
                counted = f" ({len(jobs)} jobs, {len(stages)} stages, {tasks} tasks)"
            t_spark = timed(on_spark, args.repeat)
            t_local = timed(local, args.repeat)
            where = "spark connect" if args.connect else "spark"
            print(f"{n} sentences: {where} {t_spark:.2f}s{counted}, local {t_local:.2f}s")
        if not args.connect:
            spark.stop()
    finally:
        if port is not None:
            connect_server.stop(work / "connect", port)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
