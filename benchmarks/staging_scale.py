"""Benchmark: one txid of K distinct keys on Spark, staging in files vs in Redis (issue 35), side
by side with the bare PySpark job that writes the same counts to Redis from its executors.

    python -m benchmarks.staging_scale [--keys 1000000,2000000,4000000] [--repeat 1] [--cluster]

For each K: K distinct words, each twice, in sentences of 8 words in the word count's
4-partition file log. Each job is a fresh process, timed from start to exit, while a sampler
records the peak RSS of the driver's Python process and of its JVM (the executors' Python
workers are not counted: they are the cluster's); Redis's peak memory is read after each job
(reset before it; each job on an emptied private redis-server):

* ``tf-files``: ``tridentflow run wordcount --engine spark``, one txid, TRIDENTFLOW_STAGING=files
  (the driver streams the partials to files under the home; the commit reads them back);
* ``tf-redis``: the same with TRIDENTFLOW_STAGING=redis (the executors write blocks next to
  each state shard; the driver gets their refs; the commit applies them inside Redis);
* ``bare-foreach``: the bare PySpark DataFrame word count whose executors write the counts with
  ``foreachPartition`` and pipelined ``HSET`` (no txid, no fencing, no replay protection: what a
  user would write by hand).

Every job's result is checked: K keys, 2K in all. By default Spark runs in the driver's JVM
(``local[*]``), so that JVM's figure holds the executors' work too; ``--cluster`` starts a
standalone master and one worker of 2 cores (from the pip package) and runs every job against
it: the driver's JVM is then the driver's alone.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

WORDS_PER_SENTENCE = 8
OCCURRENCES = 2
PARTITIONS = 4
BARE_KEY = "bench:bare:counts"


def generate(home: Path, keys: int) -> Path:
    """K distinct words, each OCCURRENCES times, in the word count's file log; its root."""
    from tridentflow.sources.filelog import FileLog

    log = FileLog(home / "sources" / "wordcount")
    log.ensure(PARTITIONS)
    total = keys * OCCURRENCES
    chunk = 100_000 * WORDS_PER_SENTENCE
    for start in range(0, total, chunk):
        words = [f"k{i % keys}" for i in range(start, min(start + chunk, total))]
        log.append_spread(
            " ".join(words[i : i + WORDS_PER_SENTENCE])
            for i in range(0, len(words), WORDS_PER_SENTENCE)
        )
    return log.root


def job_bare(glob: str, redis_url: str, master: str = "local[*]") -> None:
    """The bare DataFrame job: count, then HSET from the executors (foreachPartition)."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.appName("bench-bare-foreach")
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    parsed = F.from_json(F.concat(F.lit("["), "value", F.lit("]")), "array<string>")[0]
    words = spark.read.text(glob).select(F.explode(F.split(parsed, " ")).alias("word"))

    def write(rows) -> None:
        import redis

        client = redis.Redis.from_url(redis_url, socket_timeout=None)
        pipe = client.pipeline(transaction=False)
        for n, row in enumerate(rows, 1):
            pipe.hset(BARE_KEY, row["word"], row["count"])
            if n % 10_000 == 0:
                pipe.execute()
        pipe.execute()

    words.groupBy("word").count().foreachPartition(write)
    spark.stop()


class PeakRss:
    """Samples a process tree every 0.2 s: the peak RSS of the top process and of its JVM."""

    def __init__(self, pid: int) -> None:
        self.top = psutil.Process(pid)
        self.python = 0
        self.jvm = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.python = max(self.python, self.top.memory_info().rss)
                for child in self.top.children(recursive=True):
                    if child.name() == "java":
                        self.jvm = max(self.jvm, child.memory_info().rss)
            except psutil.Error:
                pass
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _timed(argv: list[str], env: dict[str, str]) -> tuple[float, int, int]:
    started = time.monotonic()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = PeakRss(process.pid)
    _out, err = process.communicate()
    elapsed = time.monotonic() - started
    peak.stop()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed: {err.decode().strip()[-2000:]}")
    return elapsed, peak.python, peak.jvm


def _check_tf(client, keys: int) -> None:
    from tridentflow_state.keys import KeySpace

    ks = KeySpace("wordcount")
    state = ks.state("counts")
    n, total = client.hlen(state), 0
    for _field, raw in client.hscan_iter(state, count=10_000):
        total += int(raw.split(b",")[1])  # [txid, curr, prev]
    if (n, total) != (keys, keys * OCCURRENCES):
        raise SystemExit(f"tridentflow committed {n} keys, {total} in all; expected {keys}")


def _check_bare(client, keys: int) -> None:
    n, total = client.hlen(BARE_KEY), 0
    for _field, raw in client.hscan_iter(BARE_KEY, count=10_000):
        total += int(raw)
    if (n, total) != (keys, keys * OCCURRENCES):
        raise SystemExit(f"the bare job wrote {n} keys, {total} in all; expected {keys}")


JOBS = ("tf-files", "tf-redis", "bare-foreach")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", default="1000000,2000000,4000000")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--only", help="comma-separated jobs (default: all)")
    parser.add_argument("--cluster", action="store_true", help="a standalone master + worker")
    args = parser.parse_args()
    import redis

    from tridentflow.devtools import devredis

    only = args.only.split(",") if args.only else list(JOBS)
    work = Path(tempfile.mkdtemp(prefix="tf-bench-staging-"))
    port = devredis.free_port()
    server = devredis.start(port, work / "redis", appendonly=False)
    redis_url = f"redis://127.0.0.1:{port}/0"
    # FLUSHALL of a 8M-key server takes longer than redis-py's default 5 s read timeout
    client = redis.Redis.from_url(redis_url, socket_timeout=None)
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    rows = []
    cluster = None
    master = "local[*]"
    if args.cluster:
        from tridentflow.devtools.devspark import StandaloneCluster

        cluster = StandaloneCluster(work / "spark").start(workers=1, cores=2)
        master = cluster.url
    try:
        for keys in [int(k) for k in args.keys.split(",")]:
            home = work / f"home-{keys}"
            started = time.monotonic()
            root = generate(home, keys)
            print(f"{keys} keys generated in {time.monotonic() - started:.1f}s", flush=True)
            glob = str(root / "p-*" / "seg-*.jsonl")
            per_partition = -(-keys * OCCURRENCES // WORDS_PER_SENTENCE // PARTITIONS)
            for rep in range(args.repeat):
                for name in only:
                    client.flushall()
                    client.config_resetstat()
                    client.execute_command("MEMORY", "PURGE")
                    before = int(client.info("memory")["used_memory"])
                    if name == "bare-foreach":
                        argv = [sys.executable, __file__, "job-bare", glob, redis_url, master]
                    else:
                        argv = [
                            *("tridentflow", "run", "wordcount", "--engine", "spark"),
                            *("--no-progress", "--batches", "1"),
                            *("--batch-size", str(per_partition), "--home", str(home)),
                            *("--redis-url", redis_url, "--master", master),
                        ]
                    staging = "redis" if name == "tf-redis" else "files"
                    wall, py, jvm = _timed(argv, dict(env, TRIDENTFLOW_STAGING=staging))
                    peak = int(client.info("memory")["used_memory_peak"]) - before
                    if name == "bare-foreach":
                        _check_bare(client, keys)
                    else:
                        _check_tf(client, keys)
                    row = (keys, name, rep + 1, wall, py >> 20, jvm >> 20, max(peak, 0) >> 20)
                    rows.append(row)
                    print(
                        f"  {keys:>9} {name:13s} rep {rep + 1}: {wall:6.1f}s  driver python "
                        f"{row[4]:5d} MB  driver jvm {row[5]:5d} MB  redis peak +{row[6]} MB",
                        flush=True,
                    )
            shutil.rmtree(home, ignore_errors=True)
    finally:
        if cluster is not None:
            cluster.stop()
        server.terminate()
        server.wait()
        shutil.rmtree(work, ignore_errors=True)
    print("\nkeys | job | wall s | driver Python MB | driver JVM MB | Redis peak +MB")
    for keys in sorted({r[0] for r in rows}):
        for name in only:
            mine = [r for r in rows if r[0] == keys and r[1] == name]
            best = min(mine, key=lambda r: r[3])
            print(f"{keys} | {name} | {best[3]:.1f} | {best[4]} | {best[5]} | {best[6]}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "job-bare":
        job_bare(*sys.argv[2:])
    else:
        main()
