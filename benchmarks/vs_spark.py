"""Benchmark: tridentflow against what a user would otherwise run, whole processes, one command.

    python benchmarks/vs_spark.py [--sentences 2000000] [--txids 20] [--repeat 2]

Same generated data for every job: --sentences Zipf sentences of 8 words from a 50,000-word
vocabulary, in the word count's 4-partition file log (segments of 100,000 JSON lines, which
Spark reads as text). Each job is a fresh process, timed from start to exit (JVM start
included, as a user pays it), interleaved per repetition; the best of --repeat is reported:

* ``bare-df``: the bare PySpark DataFrame word count, one aggregate, no guarantees (the limit);
* ``tf-one``: ``tridentflow run wordcount``, one txid of every sentence (Spark engine);
* ``ss-foreach``: Spark Structured Streaming, ``AvailableNow`` over the same segment files, one
  file per micro-batch (--txids batches), ``foreachBatch`` -> Redis ``HINCRBY`` (at-least-once:
  the peer a user would pick);
* ``tf-txids``: ``tridentflow run wordcount``, --txids txids of equal size.

Every job's final counts are checked equal; the ratios are the issue's goals 1 and 2.
Needs a Redis: TRIDENTFLOW_REDIS_URL, else a private redis-server (tridentflow.devredis).
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
import time
from itertools import accumulate
from pathlib import Path

VOCABULARY = 50_000
WORDS_PER_SENTENCE = 8
PARTITIONS = 4
SS_KEY = "bench:ss:counts"


def generate(home: Path, sentences: int) -> Path:
    """The word count's source log under ``home``; returns its root."""
    from tridentflow.filelog import FileLog

    rng = random.Random(1)
    words = [f"w{i}" for i in range(VOCABULARY)]
    cumulative = list(accumulate(1 / (i + 1) for i in range(VOCABULARY)))
    log = FileLog(home / "sources" / "wordcount")
    log.ensure(PARTITIONS)
    chunk = 100_000
    for done in range(0, sentences, chunk):
        n = min(chunk, sentences - done)
        log.append_spread(
            " ".join(rng.choices(words, cum_weights=cumulative, k=WORDS_PER_SENTENCE))
            for _ in range(n)
        )
    return log.root


def _session(app: str):
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.appName(app)
        .master("local[*]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )


def _words(df):
    from pyspark.sql import functions as F

    # each line is one JSON string literal: wrap it in an array to parse it in the JVM
    parsed = F.from_json(F.concat(F.lit("["), "value", F.lit("]")), "array<string>")[0]
    return df.select(F.explode(F.split(parsed, " ")).alias("word"))


def job_bare_df(glob: str, out: str) -> None:
    """The limit: read, parse, split, count, collect; no state, no guarantees."""
    spark = _session("bench-bare-df")
    counts = {
        r["word"]: r["count"]
        for r in _words(spark.read.text(glob)).groupBy("word").count().collect()
    }
    Path(out).write_text(json.dumps(counts))
    spark.stop()


def job_ss_foreach(glob: str, redis_url: str, checkpoint: str) -> None:
    """The peer: Structured Streaming over the same files, each micro-batch's counts added to a
    Redis hash with pipelined HINCRBY (a replayed micro-batch would add twice)."""
    import redis

    client = redis.Redis.from_url(redis_url)

    def sink(batch, _epoch: int) -> None:
        rows = _words(batch).groupBy("word").count().collect()
        pipe = client.pipeline(transaction=False)
        for row in rows:
            pipe.hincrby(SS_KEY, row["word"], row["count"])
        pipe.execute()

    spark = _session("bench-ss-foreach")
    stream = spark.readStream.option("maxFilesPerTrigger", 1).text(glob)
    query = (
        stream.writeStream.foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


def _timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed: {done.stderr.strip()[-2000:]}")
    return elapsed


def _tf_counts(redis_url: str, home: Path, env: dict[str, str]) -> dict[str, int]:
    """The committed word counts, through ``tridentflow query --all`` pages."""
    counts: dict[str, int] = {}
    after: list[str] = []
    while True:
        listing = subprocess.run(
            [
                "tridentflow",
                "query",
                "wordcount",
                "--all",
                "--json",
                "--limit",
                "100000",
                "--redis-url",
                redis_url,
                "--home",
                str(home),
                *after,
            ],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        page = json.loads(listing.stdout)
        counts.update((item["key"][0], item["value"]) for item in page["values"])
        if not page["next"]:
            return counts
        after = ["--after", page["next"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=2_000_000)
    parser.add_argument("--txids", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", help="comma-separated jobs to run (default: all)")
    args = parser.parse_args()
    if not 1 <= args.repeat <= 3:
        parser.error("--repeat must be 1..3 (each repetition uses its own Redis databases)")
    from tridentflow import devredis

    work = Path(tempfile.mkdtemp(prefix="tf-bench-vs-spark-"))
    try:
        with devredis.url_or_private(work / "redis") as redis_url:
            _run(args, work, redis_url)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run(args: argparse.Namespace, work: Path, redis_url: str) -> None:
    home = work / "home"
    started = time.monotonic()
    root = generate(home, args.sentences)
    print(f"generated {args.sentences} sentences in {time.monotonic() - started:.1f}s", flush=True)
    glob = str(root / "p-*" / "seg-*.jsonl")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    per_partition = -(-args.sentences // PARTITIONS)
    me = [sys.executable, __file__]
    base = redis_url.rsplit("/", 1)[0]
    jobs = {
        "bare-df": lambda r: [*me, "job-bare-df", glob, str(work / f"df-{r}.json")],
        "tf-one": lambda r: _tf_run(home, f"{base}/{1 + 4 * r}", per_partition, 1),
        "ss-foreach": lambda r: (
            [*me, "job-ss", glob, f"{base}/{2 + 4 * r}", str(work / f"ss-ckpt-{r}")]
        ),
        "tf-txids": lambda r: _tf_run(
            home, f"{base}/{3 + 4 * r}", -(-per_partition // args.txids), args.txids
        ),
    }
    only = args.only.split(",") if args.only else list(jobs)
    times: dict[str, list[float]] = {name: [] for name in only}
    for r in range(args.repeat):
        for name in only:
            times[name].append(_timed(jobs[name](r), env))
            print(f"  rep {r + 1} {name}: {times[name][-1]:.1f}s", flush=True)
    _check(only, work, home, base, env, args.sentences)
    best = {name: min(ts) for name, ts in times.items()}
    print(f"\n{args.sentences} sentences, best of {args.repeat} (whole processes):")
    for name in only:
        print(f"  {name:11s} {best[name]:7.1f}s   ({', '.join(f'{t:.1f}' for t in times[name])})")
    if {"tf-one", "bare-df"} <= best.keys():
        print(f"goal 1: tf-one / bare-df   = {best['tf-one'] / best['bare-df']:.2f} (<= 1.3)")
    if {"tf-txids", "ss-foreach"} <= best.keys():
        ratio = best["ss-foreach"] / best["tf-txids"]
        print(f"goal 2: throughput tf-txids / ss-foreach = {ratio:.2f} (>= 1.0)")


def _tf_run(home: Path, redis_url: str, batch_size: int, batches: int) -> list[str]:
    return [
        "tridentflow",
        "run",
        "wordcount",
        "--engine",
        "spark",
        "--no-progress",
        "--batch-size",
        str(batch_size),
        "--batches",
        str(batches),
        "--home",
        str(home),
        "--redis-url",
        redis_url,
    ]


def _check(
    jobs: list[str], work: Path, home: Path, base: str, env: dict[str, str], sentences: int
) -> None:
    """Every job's counts equal (the first repetition's databases and outputs)."""
    import redis

    results: dict[str, dict[str, int]] = {}
    if "bare-df" in jobs:
        results["bare-df"] = json.loads((work / "df-0.json").read_text())
    if "ss-foreach" in jobs:
        raw = redis.Redis.from_url(f"{base}/2").hgetall(SS_KEY)
        results["ss-foreach"] = {k.decode(): int(v) for k, v in raw.items()}
    for name, db in (("tf-one", 1), ("tf-txids", 3)):
        if name in jobs:
            results[name] = _tf_counts(f"{base}/{db}", home, env)
    totals = {name: sum(counts.values()) for name, counts in results.items()}
    expected = sentences * WORDS_PER_SENTENCE
    wrong = [n for n, counts in results.items() if counts != next(iter(results.values()))]
    if wrong or any(t != expected for t in totals.values()):
        raise SystemExit(f"counts differ: totals {totals}, expected {expected}; differ: {wrong}")
    print(f"counts checked: {len(jobs)} jobs agree on {expected} words")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "job-bare-df":
        job_bare_df(*sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "job-ss":
        job_ss_foreach(*sys.argv[2:])
    else:
        main()
