"""Benchmark: a FileSource against Spark Structured Streaming's own file source (issue 69 goal
7), whole processes, one command, 2 cores.

    python -m benchmarks.files_vs_spark [--files 10000] [--rows 1000] [--cap 100]
        [--only tf,tf-df,ss] [--depth 1[,2...]]

The same --files Parquet files of --rows rows each (``user`` of 10,000 keys, ``amount`` an
int), written once into a landing directory, oldest first. Each job is a fresh process, timed
from start to exit (JVM start included, as a user pays it):

* ``tf``: ``tridentflow run`` of a FileSource pipeline (``batch_size`` --cap files a txid)
  summing ``amount`` per user into a transactional state, on the Spark engine (local[*] in
  the process), every file in exactly one committed txid;
* ``tf-df``: the same with the source's schema declared and a SQL step reading it
  (``SELECT user, amount FROM batch``): the executors read the files in columns and Spark's
  ``groupBy().agg()`` sums (tridentflow.engines.columnar);
* ``ss``: ``spark.readStream.parquet`` with ``maxFilesPerTrigger`` --cap and a checkpoint,
  ``trigger(availableNow=True)``, ``foreachBatch`` summing per user in Spark and adding the
  sums to a Redis hash with pipelined HINCRBY (at-least-once: the peer a user would pick; an
  idempotent MERGE would cost it more).

``--depth`` runs each tridentflow job once per value (``run --depth N``: N txids emitting at
once while commits stay ordered, Trident's max.spout.pending; shown as ``tf-df@N`` past 1).

Both results are checked equal to the generated sums. Reported: records/s for each, and the
size of each one's memory of files after the run - Structured Streaming's checkpoint
``sources/`` log (every file it ever saw, compacted, never pruned) against the FileSource's
Redis keys (``MEMORY USAGE``; ``forget_after`` off, so it too remembers every file).
Needs a Redis: TRIDENTFLOW_REDIS_URL, else a private redis-server.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.vs_spark import timed_run

ROOT = Path(__file__).resolve().parent.parent
USERS = 10_000
SS_KEY = "bench:files:ss"
PIPELINES = {"tf": "benchmarks.files_vs_spark:pipeline",
             "tf-df": "benchmarks.files_vs_spark:pipeline_df"}  # fmt: skip
SCHEMA = "user string, amount bigint"


def pipeline(frames: bool = False):
    """The FileSource pipeline the ``tf`` job runs (its landing and cap from the env); with
    ``frames``, ``tf-df``'s (the schema declared, a SQL step reading the source)."""
    from tridentflow import FileSource, Pipeline, StateSpec, Sum
    from tridentflow_state.maps import StateKind

    source = FileSource(
        fields=("user", "amount"),
        uri=os.environ["BENCH_FILES_LANDING"],
        batch_size=int(os.environ.get("BENCH_FILES_CAP", "100")),
        min_age_s=0,
        schema=SCHEMA if frames else None,
    )
    built = Pipeline("bench-files-df" if frames else "bench-files", source)
    stream = built.stream.sql("SELECT user, amount FROM batch", SCHEMA) if frames else built.stream
    stream.group_by("user").persistent_aggregate(
        StateSpec("totals", StateKind.TRANSACTIONAL), Sum(), "amount", "total"
    )
    return built


def pipeline_df():
    return pipeline(frames=True)


def generate(landing: Path, files: int, rows: int, seed: int = 7) -> dict[str, int]:
    """``files`` Parquet files of ``rows`` rows, mtimes one second apart; the sums."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    landing.mkdir(parents=True)
    sums: dict[str, int] = {}
    t0 = time.time() - files - 10
    for i in range(files):
        users = [f"u{rng.randrange(USERS)}" for _ in range(rows)]
        amounts = [rng.randrange(1000) for _ in range(rows)]
        for user, amount in zip(users, amounts, strict=True):
            sums[user] = sums.get(user, 0) + amount
        path = landing / f"part-{i:06}.parquet"
        pq.write_table(pa.table({"user": users, "amount": amounts}), path)
        os.utime(path, (t0 + i, t0 + i))
    return sums


def job_ss(landing: str, redis_url: str, checkpoint: str, cap: int) -> None:
    """The peer: Structured Streaming's file source over the landing directory."""
    import redis
    from pyspark.sql import functions as F

    from benchmarks.vs_spark import _session

    client = redis.Redis.from_url(redis_url, socket_timeout=None)

    def sink(batch, _epoch: int) -> None:
        rows = batch.groupBy("user").agg(F.sum("amount").alias("total")).collect()
        pipe = client.pipeline(transaction=False)
        for row in rows:
            pipe.hincrby(SS_KEY, row["user"], int(row["total"]))
        pipe.execute()

    spark = _session("bench-files-ss")  # vs_spark's: local[*], 4 shuffle partitions
    stream = (
        spark.readStream.schema("user string, amount long")
        .option("maxFilesPerTrigger", cap)
        .parquet(landing)
    )
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def tf_result(redis_url: str, home: Path, frames: bool) -> tuple[dict[str, int], int]:
    """The committed sums, and the bytes the pipeline's file bookkeeping holds in Redis."""
    from tridentflow.steps.query import list_state
    from tridentflow.steps.runtime import Runtime

    rt = Runtime.open(pipeline(frames), redis_url=redis_url, home=home)
    page = list_state(rt, rt.pipeline.states["totals"], limit=USERS * 2)
    sums = {k[0]: int(v) for k, v in page.items}
    keys = [rt.keyspace.files_taken, rt.keyspace.files_meta, rt.keyspace.files_forget]
    keys += [rt.keyspace.files_manifest(p) for p in range(rt.pipeline.source.partitions)]
    held = sum(int(rt.client.memory_usage(k, samples=0) or 0) for k in keys)
    return sums, held


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rows", type=int, default=1_000)
    parser.add_argument("--cap", type=int, default=100)
    parser.add_argument("--only", default="tf,tf-df,ss")
    parser.add_argument("--depth", default="1", help="run --depth of the tridentflow jobs, a list")
    parser.add_argument("job", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:  # a child process: the SS job
        _, landing, redis_url, checkpoint, cap = args.job
        job_ss(landing, redis_url, checkpoint, int(cap))
        return
    from tridentflow.devtools import devredis

    work = Path(tempfile.mkdtemp(prefix="tf-bench-files-"))
    try:
        with devredis.url_or_private(work / "redis") as redis_url:
            run(args, work, redis_url)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path, redis_url: str) -> None:
    import redis

    landing = work / "landing"
    started = time.monotonic()
    want = generate(landing, args.files, args.rows)
    records = args.files * args.rows
    print(
        f"{args.files:,} Parquet files of {args.rows:,} rows ({records:,} records, "
        f"{directory_bytes(landing) / 1e6:,.1f} MB) written in {time.monotonic() - started:.1f} s; "
        f"{args.cap} files per txid / micro-batch"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "BENCH_FILES_LANDING": str(landing), "BENCH_FILES_CAP": str(args.cap)}  # fmt: skip
    os.environ.update(BENCH_FILES_LANDING=str(landing), BENCH_FILES_CAP=str(args.cap))
    client = redis.Redis.from_url(redis_url, socket_timeout=None)
    jobs = args.only.split(",")
    print(f"{'job':<8} {'seconds':>8} {'records/s':>11} {'memory of files':>16}  where")
    depths = [int(d) for d in args.depth.split(",")]
    for job, depth in [(j, d) for j in PIPELINES if j in jobs for d in depths]:
        client.flushdb()
        home = work / f"home-{job}-{depth}"
        seconds = timed_run(
            ["tridentflow", "run", PIPELINES[job], "--engine", "spark", "--no-progress",
             "--depth", str(depth), "--home", str(home), "--redis-url", redis_url],
            env,
        )  # fmt: skip
        sums, held = tf_result(redis_url, home, job == "tf-df")
        assert sums == want, f"{job}: the sums differ from the files'"
        name = job if depth == 1 else f"{job}@{depth}"
        print(f"{name:<8} {seconds:>8.1f} {records / seconds:>11,.0f} {held:>16,}  Redis keys")
    if "ss" in jobs:
        client.flushdb()
        checkpoint = work / "ss-checkpoint"
        argv = [sys.executable, "-m", "benchmarks.files_vs_spark", "job",
                str(landing), redis_url, str(checkpoint), str(args.cap)]  # fmt: skip
        seconds = timed_run(argv, env)
        raw = client.hgetall(SS_KEY)
        assert {k.decode(): int(v) for k, v in raw.items()} == want, "ss: the sums differ"
        held = directory_bytes(checkpoint / "sources")
        print(f"{'ss':<8} {seconds:>8.1f} {records / seconds:>11,.0f} {held:>16,}  checkpoint "
              "sources/")  # fmt: skip
    client.close()


if __name__ == "__main__":
    main()
