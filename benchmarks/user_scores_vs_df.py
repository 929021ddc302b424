"""Benchmark: seed 002's shape on Spark against the same job as a PySpark DataFrame (issue 37).

    python -m benchmarks.user_scores_vs_df [--records 200000] [--users 10000] [--repeat 2]

``tridentflow.examples.user_scores``: partition_by(user) -> partition_aggregate (per-partition
user counts) -> global -> aggregate (a Combiner merging the maps) -> a state keyed by txid, plus
a per-user Sum of scores in an opaque state (group_by + persistent_aggregate). One txid of
--records (user, score) records from --users users in its 2-partition file log; each job a
fresh process timed from start to exit (JVM start included), interleaved, best of --repeat:

* ``tf``: ``tridentflow run user-scores --engine spark`` (local[*]), one txid;
* ``df``: what a user would write by hand: read the same segment files, ``groupBy(user)``
  with ``count`` and ``sum(score)`` in one aggregation, the rows to the driver, the count map
  and the sums written to Redis with pipelined ``HSET`` (no txid, no fencing, no replay
  protection).

Both results are checked equal (every user's count in the batch's map, every user's sum).
Needs a Redis: TRIDENTFLOW_REDIS_URL, else a private redis-server.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DF_COUNTS = "bench:df:per_batch"
DF_SUMS = "bench:df:score_sum"


def generate(home: Path, records: int, users: int, seed: int = 2) -> Path:
    from tridentflow.sources.filelog import FileLog

    rng = random.Random(seed)
    log = FileLog(home / "sources" / "user-scores")
    log.ensure(2)
    chunk = 100_000
    for done in range(0, records, chunk):
        n = min(chunk, records - done)
        log.append_spread([f"u{rng.randrange(users)}", rng.randint(0, 100)] for _ in range(n))
    return log.root


def job_df(glob: str, redis_url: str) -> None:
    import redis
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.appName("bench-user-scores-df")
        .master("local[*]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    parsed = F.from_json("value", "array<string>")
    rows = spark.read.text(glob).select(
        parsed[0].alias("user"), parsed[1].cast("long").alias("score")
    )
    totals = rows.groupBy("user").agg(F.count("*").alias("n"), F.sum("score").alias("sum"))
    collected = totals.collect()
    client = redis.Redis.from_url(redis_url, socket_timeout=None)
    client.hset(DF_COUNTS, "1", json.dumps({r["user"]: r["n"] for r in collected}))
    pipe = client.pipeline(transaction=False)
    for i, row in enumerate(collected, 1):
        pipe.hset(DF_SUMS, row["user"], row["sum"])
        if i % 10_000 == 0:
            pipe.execute()
    pipe.execute()
    spark.stop()


def _check(client, records: int) -> None:
    from tridentflow_state.keys import KeySpace

    ks = KeySpace("user-scores")
    stored = json.loads(client.hget(ks.state("per_batch"), "[1]"))[1]
    df_counts = json.loads(client.hget(DF_COUNTS, "1"))
    tf_sums = {
        json.loads(k)[0]: json.loads(v)[1] for k, v in client.hgetall(ks.state("score_sum")).items()
    }
    df_sums = {k.decode(): int(v) for k, v in client.hgetall(DF_SUMS).items()}
    if stored != df_counts or tf_sums != df_sums or sum(df_counts.values()) != records:
        raise SystemExit("the two jobs disagree")
    print(f"checked: both jobs count {records} records of {len(df_counts)} users alike")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    import redis

    from benchmarks.vs_spark import timed_run
    from tridentflow.devtools import devredis

    work = Path(tempfile.mkdtemp(prefix="tf-bench-user-scores-"))
    try:
        with devredis.url_or_private(work / "redis") as redis_url:
            client = redis.Redis.from_url(redis_url, socket_timeout=None)
            home = work / "home"
            root = generate(home, args.records, args.users)
            glob = str(root / "p-*" / "seg-*.jsonl")
            env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
            per_partition = -(-args.records // 2)
            jobs = {
                "tf": [
                    *("tridentflow", "run", "user-scores", "--engine", "spark"),
                    *("--no-progress", "--batches", "1", "--batch-size", str(per_partition)),
                    *("--home", str(home), "--redis-url", redis_url),
                ],
                "df": [sys.executable, __file__, "job-df", glob, redis_url],
            }
            times: dict[str, list[float]] = {name: [] for name in jobs}
            for rep in range(args.repeat):
                for name, argv in jobs.items():
                    if name == "tf":
                        subprocess.run(
                            ["tridentflow", "reset", "user-scores", "--yes", "--home",
                             str(home), "--redis-url", redis_url],
                            env=env, check=True, capture_output=True,
                        )  # fmt: skip
                    else:
                        client.delete(DF_COUNTS, DF_SUMS)
                    times[name].append(timed_run(argv, env))
                    print(f"  rep {rep + 1} {name}: {times[name][-1]:.1f}s", flush=True)
                _check(client, args.records)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    best = {name: min(ts) for name, ts in times.items()}
    print(f"\n{args.records} records, {args.users} users, best of {args.repeat}:")
    for name, ts in times.items():
        print(f"  {name}  {best[name]:6.1f}s   ({', '.join(f'{t:.1f}' for t in ts)})")
    print(f"tf / df = {best['tf'] / best['df']:.2f} (issue 37's goal: <= 1.3)")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "job-df":
        job_df(*sys.argv[2:])
    else:
        main()
