"""Benchmark: where a txid's emit stops being worth a JVM (issue 66 item 14).

    python -m benchmarks.small_txids [--sizes 5,1000,10000,50000]
                                     [--pipelines wordcount,tests.pipelines:everything]
                                     [--repeat 2] [--no-submit]

For each pipeline and batch of N records, one coordinated txid is emitted, best of
``--repeat``, two ways:

* **in the task** - ``emit_run`` on the local engine in this process: what the Airflow emit
  task does when the batch reads at most ``local_emit_max_records`` (10,000 by default);
* **spark-submit** - the job the emit task starts otherwise (``spark_jobs/emit_batch.py``,
  local[2], the operator's own Spark settings), wall time of the process.

Both stage the same txid (each is a new emit attempt; the later deletes the earlier), from the
coordinated txid to the staged attempt recorded in the ledger. Reported: each time and their
ratio. Where "in the task" is still well below spark-submit, a small batch is better emitted
without Spark; where it approaches it, the threshold should stay below. The heavy pipeline is
the test pipeline with every batch operation (12 exchanges, eight states); the word count is
the common case. Needs nothing running: it starts a private Redis.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tridentflow_spark_jobs
from tridentflow.devtools import devredis
from tridentflow.devtools.sample_data import sentences
from tridentflow.engines.local import LocalEngine
from tridentflow.engines.spark import quiet_java_options
from tridentflow.registry import load_pipeline
from tridentflow.steps.runs import coordinate_run, emit_run
from tridentflow.steps.runtime import Runtime

DEFAULT_PIPELINES = "wordcount,tests.pipelines:everything"
EMIT_APPLICATION = Path(tridentflow_spark_jobs.__file__).with_name("emit_batch.py")


def spark_submit(pipeline: str, run_id: str, redis_url: str, home: Path, namespace: str) -> float:
    """Seconds of the spark-submit emit the Airflow task would start for ``run_id``."""
    submit = Path(sys.executable).with_name("spark-submit")
    argv = [
        str(submit), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
        "--conf", f"spark.driver.extraJavaOptions={quiet_java_options()}",
        str(EMIT_APPLICATION), "--pipeline", pipeline, "--run-id", run_id,
    ]  # fmt: skip
    env = {
        **os.environ,
        "TRIDENTFLOW_REDIS_URL": redis_url,
        "TRIDENTFLOW_HOME": str(home),
        "TRIDENTFLOW_NAMESPACE": namespace,
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
    }
    started = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"spark-submit failed: {proc.stderr[-2000:]}")
    return seconds


def in_task(rt: Runtime, run_id: str) -> float:
    started = time.perf_counter()
    staged = emit_run(rt, run_id, LocalEngine())
    seconds = time.perf_counter() - started
    assert staged is not None and staged.records > 0
    return seconds


def measure(ref: str, n: int, repeat: int, submit: bool, redis_url: str, work: Path) -> None:
    namespace = f"small-{n}"  # each measurement's own ledger in the one database
    home = work / namespace
    rt = Runtime.open(load_pipeline(ref), redis_url, home, namespace=namespace)
    rt.source_heads()
    rt.log.append_spread(sentences(n, seed=4))
    partitions = rt.pipeline.source.partitions
    run_id = f"bench-{n}"
    coordinate_run(rt, run_id, batch_size=-(-n // partitions))
    local = min(in_task(rt, run_id) for _ in range(repeat))
    shown = f"{ref:<28} {n:>7,} records: in the task {local:7.2f} s"
    if submit:
        remote = min(spark_submit(ref, run_id, redis_url, home, namespace) for _ in range(repeat))
        shown += f", spark-submit {remote:6.2f} s, in the task / spark-submit {local / remote:.2f}"
    print(shown, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="5,1000,10000,50000")
    parser.add_argument("--pipelines", default=DEFAULT_PIPELINES)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-submit", action="store_true", help="time the local emit only")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-small-"))
    try:
        with devredis.emptied_databases(work / "redis", 1) as (redis_url,):
            print(f"{os.cpu_count()} cores; best of {args.repeat}", flush=True)
            for ref in args.pipelines.split(","):
                for n in (int(x) for x in args.sizes.split(",")):
                    measure(ref, n, args.repeat, not args.no_submit, redis_url, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
