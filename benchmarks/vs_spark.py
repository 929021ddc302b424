"""Benchmark: tridentflow against what a user would otherwise run, whole processes, one command.

    python benchmarks/vs_spark.py [--sentences 2000000] [--txids 20] [--repeat 2] [--only J,...]

Same generated data for every job: --sentences Zipf sentences of 8 words from a 50,000-word
vocabulary, in the word count's 4-partition file log (segments of 100,000 JSON lines, which
Spark reads as text). Each job is a fresh process, timed from start to exit (JVM start
included, as a user pays it), interleaved per repetition; the best of --repeat is reported:

* ``bare-df``: the bare PySpark DataFrame word count, one aggregate, no guarantees (the limit);
* ``bare-df-redis``: the same, its counts written to a Redis hash from the executors with
  ``foreachPartition`` (pipelined ``HSET``): what a user writes to land a DataFrame's counts;
* ``udf-df``: the same with the pipeline's own per-record ``split`` as a Python UDF;
* ``tf-one``: ``tridentflow run wordcount``, one txid of every sentence (classic Spark,
  local[*] in the process);
* ``tf-connect-one``: the same as a client of a warm local Spark Connect server (started once,
  before the timings: what ``tridentflow spark-connect`` leaves running);
* ``ss-foreach``: Spark Structured Streaming, ``AvailableNow`` over the same segment files, one
  file per micro-batch (--txids batches), ``foreachBatch`` -> Redis ``HINCRBY`` (at-least-once:
  the peer a user would pick);
* ``tf-txids`` / ``tf-connect-txids``: ``tridentflow run wordcount``, --txids txids of equal
  size, classic / over Connect;
* ``tf-df-one`` / ``tf-df-txids``: ``tridentflow run wordcount-df``, the same word count as a
  DataFrame step (``explode(split(...))`` + ``Count``, aggregated by Spark's ``groupBy``) into a
  transactional state, one txid / --txids txids (``tf-one`` and ``tf-txids`` are the same
  pipeline in the Python-function API).

Every job's final counts are checked equal; the ratios are issue 35's goals 1 and 2 and issue
68's goal 5 (``tf-df-one`` / ``bare-df-redis`` <= 1.05; ``ss-foreach`` / ``tf-df-txids`` >= 1.5).
Needs a Redis: TRIDENTFLOW_REDIS_URL, else a private redis-server (tridentflow.devtools.devredis).
Each tridentflow or SS job's database is emptied (FLUSHDB) right before it runs: a previous
invocation's ledger would otherwise make the run read little or nothing, and the check could
pass on the old counts.
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


def generate(home: Path, sentences: int, pipeline: str = "wordcount", seed: int = 1) -> Path:
    """``sentences`` Zipf sentences appended to ``pipeline``'s source log under ``home``;
    returns its root."""
    from tridentflow.sources.filelog import FileLog

    rng = random.Random(seed)
    words = [f"w{i}" for i in range(VOCABULARY)]
    cumulative = list(accumulate(1 / (i + 1) for i in range(VOCABULARY)))
    log = FileLog(home / "sources" / pipeline)
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


def job_bare_df_redis(glob: str, redis_url: str) -> None:
    """The bare word count landed in Redis as a user writes it: each executor partition's
    counts in pipelined HSETs (no txid, no fencing: a retried task writes again)."""
    spark = _session("bench-bare-df-redis")

    def write(rows) -> None:
        import redis

        client = redis.Redis.from_url(redis_url, socket_timeout=None)
        pipe = client.pipeline(transaction=False)
        for n, row in enumerate(rows, 1):
            pipe.hset(SS_KEY, row["word"], row["count"])
            if n % 10_000 == 0:
                pipe.execute()
        pipe.execute()

    _words(spark.read.text(glob)).groupBy("word").count().foreachPartition(write)
    spark.stop()


def job_udf_df(glob: str, out: str) -> None:
    """What goal 3 compares with: the same DataFrame job, its split the pipeline's own
    per-record generator as a Python UDF."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, StringType

    from tridentflow.examples.wordcount import split

    spark = _session("bench-udf-df")
    words = F.udf(lambda s: [w for (w,) in split(s)], ArrayType(StringType()))
    parsed = F.from_json(F.concat(F.lit("["), "value", F.lit("]")), "array<string>")[0]
    df = spark.read.text(glob).select(F.explode(words(parsed)).alias("word"))
    counts = {r["word"]: r["count"] for r in df.groupBy("word").count().collect()}
    Path(out).write_text(json.dumps(counts))
    spark.stop()


def job_ss_foreach(glob: str, redis_url: str, checkpoint: str) -> None:
    """The peer: Structured Streaming over the same files, each micro-batch's counts added to a
    Redis hash with pipelined HINCRBY (a replayed micro-batch would add twice)."""
    import redis

    client = redis.Redis.from_url(redis_url, socket_timeout=None)

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


def timed_run(argv: list[str], env: dict[str, str]) -> float:
    """Seconds ``argv`` took as a whole process; SystemExit with its stderr if it failed."""
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed: {done.stderr.strip()[-2000:]}")
    return elapsed


def _tf_counts(
    redis_url: str, home: Path, env: dict[str, str], pipeline: str = "wordcount"
) -> dict[str, int]:
    """The committed word counts, through ``tridentflow query --all`` pages."""
    counts: dict[str, int] = {}
    after: list[str] = []
    while True:
        listing = subprocess.run(
            [
                "tridentflow",
                "query",
                pipeline,
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
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    from tridentflow.devtools import devredis

    work = Path(tempfile.mkdtemp(prefix="tf-bench-vs-spark-"))
    try:
        with devredis.url_or_private(work / "redis") as redis_url:
            _run(args, work, redis_url)
    finally:
        shutil.rmtree(work, ignore_errors=True)


JOBS = (
    "bare-df",
    "bare-df-redis",
    "udf-df",
    "tf-one",
    "tf-connect-one",
    "ss-foreach",
    "tf-txids",
    "tf-connect-txids",
    "tf-df-one",
    "tf-df-txids",
)
TF_JOBS = ("tf-one", "tf-connect-one", "tf-txids", "tf-connect-txids", "tf-df-one", "tf-df-txids")
REDIS_JOBS = ("ss-foreach", "bare-df-redis")  # they write SS_KEY in their own database
DF_PIPELINE = "wordcount-df"


def _pipeline(job: str) -> str:
    return DF_PIPELINE if job.startswith("tf-df-") else "wordcount"


def _db(base: str, job: str) -> str:
    """Each job that writes Redis has its own database (1..8 of the default 16), emptied
    before each of its runs; the counts are checked after the first repetition."""
    return f"{base}/{1 + (TF_JOBS + REDIS_JOBS).index(job)}"


def _run(args: argparse.Namespace, work: Path, redis_url: str) -> None:
    home = work / "home"
    started = time.monotonic()
    root = generate(home, args.sentences)
    print(f"generated {args.sentences} sentences in {time.monotonic() - started:.1f}s", flush=True)
    glob = str(root / "p-*" / "seg-*.jsonl")
    only = args.only.split(",") if args.only else list(JOBS)
    if any(_pipeline(name) == DF_PIPELINE for name in only):  # the same records, its own log
        shutil.copytree(root, root.parent / DF_PIPELINE)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    per_partition = -(-args.sentences // PARTITIONS)
    per_txid = -(-per_partition // args.txids)
    me = [sys.executable, __file__]
    base = redis_url.rsplit("/", 1)[0]
    remote: list[str] = []
    if any("connect" in name for name in only):
        from tridentflow.devtools import connect_server, devredis

        port = devredis.free_port()
        started = time.monotonic()
        remote = ["--remote", connect_server.start(work / "connect", port)]
        print(f"Spark Connect server up in {time.monotonic() - started:.1f}s (not timed)")
    jobs = {
        "bare-df": lambda r: [*me, "job-bare-df", glob, str(work / f"df-{r}.json")],
        "bare-df-redis": lambda r: [*me, "job-bare-df-redis", glob, _db(base, "bare-df-redis")],
        "udf-df": lambda r: [*me, "job-udf-df", glob, str(work / f"udf-{r}.json")],
        "tf-one": lambda r: _tf_run(home, _db(base, "tf-one"), per_partition, 1),
        "tf-connect-one": lambda r: [
            *_tf_run(home, _db(base, "tf-connect-one"), per_partition, 1),
            *remote,
        ],
        "ss-foreach": lambda r: (
            [*me, "job-ss", glob, _db(base, "ss-foreach"), str(work / f"ss-ckpt-{r}")]
        ),
        "tf-txids": lambda r: _tf_run(home, _db(base, "tf-txids"), per_txid, args.txids),
        "tf-connect-txids": lambda r: [
            *_tf_run(home, _db(base, "tf-connect-txids"), per_txid, args.txids),
            *remote,
        ],
        "tf-df-one": lambda r: _tf_run(home, _db(base, "tf-df-one"), per_partition, 1, DF_PIPELINE),
        "tf-df-txids": lambda r: _tf_run(
            home, _db(base, "tf-df-txids"), per_txid, args.txids, DF_PIPELINE
        ),
    }
    import redis

    try:
        times: dict[str, list[float]] = {name: [] for name in only}
        for r in range(args.repeat):
            for name in only:
                if name in TF_JOBS or name in REDIS_JOBS:  # never a previous run's state:
                    redis.Redis.from_url(
                        _db(base, name), socket_timeout=None
                    ).flushdb()  # it would read nothing
                times[name].append(timed_run(jobs[name](r), env))
                print(f"  rep {r + 1} {name}: {times[name][-1]:.1f}s", flush=True)
            if r == 0:  # before the second repetition empties the databases
                _check(only, work, home, base, env, args.sentences)
    finally:
        if remote:
            connect_server.stop(work / "connect", port)
    best = {name: min(ts) for name, ts in times.items()}
    print(f"\n{args.sentences} sentences, best of {args.repeat} (whole processes):")
    for name in only:
        print(f"  {name:16s} {best[name]:7.1f}s   ({', '.join(f'{t:.1f}' for t in times[name])})")
    for goal, ours, theirs, limit in (
        ("1", "tf-one", "bare-df", "<= 1.3"),
        ("1 (Connect)", "tf-connect-one", "bare-df", "<= 1.3"),
        ("3", "tf-one", "udf-df", "<= 1.3"),
        ("68.5", "tf-df-one", "bare-df-redis", "<= 1.05"),
        ("68.5 (Python API)", "tf-one", "bare-df-redis", "the other way to write it"),
    ):
        if {ours, theirs} <= best.keys():
            print(f"goal {goal}: {ours} / {theirs} = {best[ours] / best[theirs]:.2f} ({limit})")
    for goal, ours, limit in (
        ("2", "tf-txids", ">= 1.0"),
        ("2", "tf-connect-txids", ">= 1.0"),
        ("68.5", "tf-df-txids", ">= 1.5"),
    ):
        if {ours, "ss-foreach"} <= best.keys():
            ratio = best["ss-foreach"] / best[ours]
            print(f"goal {goal}: throughput {ours} / ss-foreach = {ratio:.2f} ({limit})")


def _tf_run(
    home: Path, redis_url: str, batch_size: int, batches: int, pipeline: str = "wordcount"
) -> list[str]:
    return [
        "tridentflow",
        "run",
        pipeline,
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
    """Every job's counts equal (the first repetition's databases and outputs); SystemExit
    naming the jobs that differ."""
    import redis

    results: dict[str, dict[str, int]] = {}
    for name, output in (("bare-df", "df-0.json"), ("udf-df", "udf-0.json")):
        if name in jobs:
            results[name] = json.loads((work / output).read_text())
    for name in REDIS_JOBS:
        if name in jobs:
            raw = redis.Redis.from_url(_db(base, name), socket_timeout=None).hgetall(SS_KEY)
            results[name] = {k.decode(): int(v) for k, v in raw.items()}
    for name in TF_JOBS:
        if name in jobs:
            results[name] = _tf_counts(_db(base, name), home, env, _pipeline(name))
    totals = {name: sum(counts.values()) for name, counts in results.items()}
    expected = sentences * WORDS_PER_SENTENCE
    wrong = [n for n, counts in results.items() if counts != next(iter(results.values()))]
    if wrong or any(t != expected for t in totals.values()):
        raise SystemExit(f"counts differ: totals {totals}, expected {expected}; differ: {wrong}")
    print(f"counts checked: {len(jobs)} jobs agree on {expected} words")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "job-bare-df":
        job_bare_df(*sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "job-bare-df-redis":
        job_bare_df_redis(*sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "job-udf-df":
        job_udf_df(*sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "job-ss":
        job_ss_foreach(*sys.argv[2:])
    else:
        main()
