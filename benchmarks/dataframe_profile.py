"""Profile: where a DataFrame step's txid spends its time (issue 68 goal 5), beside the bare
DataFrame job's compute, in one warm SparkSession.

    python -m benchmarks.dataframe_profile [--sentences 2000000] [--repeat 2]

The word count of vs_spark.py (Zipf sentences in the 4-partition file log) as the bundled
``wordcount-df`` (``explode(split(...))`` in a DataFrame step, ``Count`` by Spark's groupBy),
one txid of every sentence, staged in Redis by the executors. Each repetition prints:

* ``record stage (1 core)``: the read tasks' Python alone (``engines.tasks.read_task``: read the
  log, decode each record, check its type), run one after the other in this process - the
  CPU the read job spends before Spark sees a row;
* ``read job``: that job on Spark (``mapInArrow`` over the read tasks, cached; its summaries
  collected: the counts and bad records the completeness check needs);
* ``step and staging``: the rest of the emit's Spark work - the step, Spark's partial and final
  aggregation, the keys encoded and written to Redis by the executors;
* ``emit``: the whole emit (coordinate and commit not counted);
* ``bare compute``: the bare DataFrame job (vs_spark's ``bare-df`` without its JVM start) over
  the same log: read as text, parsed, split, counted, collected.

The first repetition warms the session up; compare the later ones. Starts its own redis-server.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.vs_spark import PARTITIONS, _words, generate


def _timed(phases: dict[str, float], name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - start

    return wrapper


def record_stage_seconds(root: str, sentences: int) -> float:
    """The read tasks of one txid of every sentence, one after the other in this process."""
    from tridentflow.engines.tasks import read_task, split_ranges, task_records
    from tridentflow.plan import compile_pipeline
    from tridentflow.registry import load_pipeline

    plan = compile_pipeline(load_pipeline("wordcount-df"))
    per = sentences // PARTITIONS
    ranges = {p: (0, per + (1 if p < sentences % PARTITIONS else 0)) for p in range(PARTITIONS)}
    start = time.perf_counter()
    for task in split_ranges(ranges, task_records(plan)):
        read_task(root, plan, *task)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sentences", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    import tridentflow.engines.spark as spark_engine
    import tridentflow.steps.driver as driver
    from tridentflow.devtools import devredis
    from tridentflow.engines.spark import SparkEngine, spark_session
    from tridentflow.faults import FaultPlan
    from tridentflow.registry import load_pipeline
    from tridentflow.steps.runtime import Runtime

    work = Path(tempfile.mkdtemp(prefix="tf-df-profile-"))
    port = devredis.free_port()
    server = devredis.start(port, work / "redis", appendonly=False)
    try:
        source = work / "source"
        root = str(generate(source, args.sentences, pipeline="wordcount-df"))
        phases: dict[str, float] = {}
        engine_cls = spark_engine.SparkEngine
        driver.emit = _timed(phases, "emit", driver.emit)
        engine_cls._compute_graph = _timed(phases, "graph", engine_cls._compute_graph)
        spark_engine._stage_on_executors = _timed(
            phases, "staging", spark_engine._stage_on_executors
        )
        spark = spark_session(master="local[*]", app_name="tf-df-profile")
        glob = f"{root}/p-*/seg-*.jsonl"
        print(f"{args.sentences} sentences, one txid of wordcount-df, seconds:")
        for rep in range(1, args.repeat + 1):
            home = work / f"home-{rep}"
            shutil.copytree(source, home)
            rt = Runtime.open(
                load_pipeline("wordcount-df"),
                f"redis://127.0.0.1:{port}/{rep % 16}",
                home,
                FaultPlan.parse(""),
            )
            rt.ledger.reset(force=True)
            stage = record_stage_seconds(root, args.sentences)
            phases.clear()
            result = driver.run_one(rt, SparkEngine(spark), batch_size=args.sentences)
            assert result.records == args.sentences, result
            start = time.perf_counter()
            words = _words(spark.read.text(glob)).groupBy("word").count().collect()
            bare = time.perf_counter() - start
            assert sum(r["count"] for r in words) == args.sentences * 8
            graph, staging = phases.get("graph", 0.0), phases.get("staging", 0.0)
            print(
                f"  rep {rep}: record stage (1 core) {stage:.1f}, read job "
                f"{graph - staging:.1f}, step and staging {staging:.1f}, emit "
                f"{phases.get('emit', 0.0):.1f}; bare compute {bare:.1f}"
            )
    finally:
        server.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
