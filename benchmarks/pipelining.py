"""Benchmark: throughput of pipelined txids (run --depth K) vs one txid at a time.

    python benchmarks/pipelining.py [--records 400000] [--batches 8] [--depths 1,2,3]

Builds a word-count log of --records sentences over 4 partitions, then for each depth resets
the pipeline's state and runs every txid on one in-process SparkSession (local[*]), reporting
wall time and records/s. Needs a Redis: TRIDENTFLOW_REDIS_URL, else a private redis-server.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from tridentflow.devtools import devredis
from tridentflow.engines.spark import SparkEngine, spark_session
from tridentflow.ops.audit import audit
from tridentflow.registry import load_pipeline
from tridentflow.steps.driver import run_batches, run_pipelined
from tridentflow.steps.runtime import Runtime, connect

WORDS = [f"w{i}" for i in range(5000)]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--depths", default="1,2,3")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-"))
    with devredis.url_or_private(work / "redis") as url:
        run(args, work, url)


def run(args: argparse.Namespace, work: Path, url: str) -> None:
    try:
        pipeline = load_pipeline("wordcount")
        rt = Runtime(pipeline, connect(url), work / "home")
        rng = random.Random(1)
        rt.source_heads()
        lines = [" ".join(rng.choices(WORDS, k=8)) for _ in range(args.records)]
        rt.log.append_spread(lines)
        per_partition = -(-args.records // pipeline.source.partitions // args.batches)
        engine = SparkEngine(spark_session("tridentflow-bench"))
        run_batches(rt, engine, max_batches=1, batch_size=10)  # warm the JVM and workers
        print(f"{args.records} records, {args.batches} txids of {per_partition}/partition")
        for depth in [int(d) for d in args.depths.split(",")]:
            rt.ledger.reset()
            shutil.rmtree(rt.staging_root, ignore_errors=True)
            started = time.monotonic()
            if depth == 1:
                summary = run_batches(rt, engine, batch_size=per_partition)
            else:
                summary = run_pipelined(rt, engine, depth, batch_size=per_partition)
            seconds = time.monotonic() - started
            assert audit(rt).ok
            print(
                f"depth {depth}: {len(summary.results)} txids, {summary.records} records in "
                f"{seconds:.1f}s = {summary.records / seconds:,.0f} records/s"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
