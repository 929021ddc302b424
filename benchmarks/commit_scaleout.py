"""Benchmark: commit scale-out over state shards on a Redis Cluster (issue 12).

    python -m benchmarks.commit_scaleout [--keys 1000000] [--shards 1,3] [--ops count,sum]
                                         [--repeat 2] [--staging files,redis]

Starts a local Redis Cluster of 3 masters (no replicas, no persistence; free ports) and, for
comparison, one plain redis-server. For each combiner (Count on an opaque state, Sum on a
transactional one) and each shard count, a batch of --keys distinct keys is emitted (local
engine, not timed) and committed twice: txid 1 creates every key, txid 2 updates every key.
The time is the whole ``commit()`` (staging verification, the shard claims, every fenced
write, the stray-key check, the ledger mark, the settle). With N shards the commit applies
each chunk's keys shard by shard in N threads, each shard on its own master.

Side by side, what a user would otherwise write: the keys' partials sent with ``HINCRBY`` in
one non-transactional pipeline per 10,000 keys (what a Spark ``foreachBatch`` into Redis
does; no fencing, no ordering, no replay protection), on the same cluster, from one client.
Each figure is the best of --repeat runs, in keys/s.

``--staging``: where the emit staged the batch - ``files`` (the commit reads the lines and sends
them to Redis in chunks) or ``redis`` (blocks next to each shard; the commit applies each block
where it lies: the partials never leave Redis).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.commit_throughput import pipeline, timed_commits
from tridentflow.devtools import devredis
from tridentflow.devtools.devcluster import LocalCluster
from tridentflow.ops.audit import audit
from tridentflow.steps.runtime import Runtime, connect
from tridentflow_state.maps import StateKind

KINDS = {"count": StateKind.OPAQUE, "sum": StateKind.TRANSACTIONAL}


def commit_rates(
    client, work: Path, op: str, shards: int, keys: int, repeat: int, staging: str = "files"
) -> tuple:
    """Best keys/s of commit() creating and updating ``keys`` keys with ``shards`` shards."""
    best = (0.0, 0.0)
    for rep in range(repeat):
        home = work / f"home-{op}-{shards}-{rep}"
        rt = Runtime(pipeline(op, KINDS[op]), client, home, shards=shards, staging_kind=staging)
        rt.ledger.reset(force=True)
        rt.source_heads()
        first, second = timed_commits(rt, keys, random.Random(7))
        assert rt.keyspace.shards == shards
        assert audit(rt).ok
        rt.ledger.reset(force=True)
        shutil.rmtree(home, ignore_errors=True)
        best = (max(best[0], keys / first), max(best[1], keys / second))
    return best


def hincrby_rate(client, keys: int, repeat: int) -> float:
    """Best keys/s of pipelined HINCRBY of ``keys`` keys into one hash per 16 hash tags."""
    best = 0.0
    fields = [f"k{i}" for i in range(keys)]
    for rep in range(repeat):
        started = time.perf_counter()
        for start in range(0, keys, 10_000):
            pipe = client.pipeline(transaction=False)
            for i in range(start, min(start + 10_000, keys)):
                pipe.hincrby(f"bench:{{h{i % 16}}}:{rep}", fields[i], 1)
            pipe.execute()
        best = max(best, keys / (time.perf_counter() - started))
        for h in range(16):
            client.delete(f"bench:{{h{h}}}:{rep}")
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--shards", default="1,3")
    parser.add_argument("--ops", default="count,sum")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--staging", default="files")
    args = parser.parse_args()
    shard_counts = [int(s) for s in args.shards.split(",")]
    work = Path(tempfile.mkdtemp(prefix="tf-bench-scaleout-"))
    cluster = LocalCluster(work / "cluster").start()
    try:
        with devredis.url_or_private(work / "redis") as single_url:
            targets = {"cluster (3 masters)": cluster.url(0), "one redis-server": single_url}
            print(f"commit of {args.keys:,} keys per txid; keys/s, create / update")
            for target, url in targets.items():
                client = connect(url)
                for op in args.ops.split(","):
                    for staging in args.staging.split(","):
                        for shards in shard_counts:
                            create, update = commit_rates(
                                client, work, op, shards, args.keys, args.repeat, staging
                            )
                            print(
                                f"{target:<20} {op:<6} {KINDS[op].value:<14} {staging:<6} "
                                f"shards={shards:<3}{create:>11,.0f} /{update:>11,.0f}",
                                flush=True,
                            )
                rate = hincrby_rate(client, args.keys, args.repeat)
                print(f"{target:<20} bare pipelined HINCRBY (no guarantees): {rate:,.0f}")
                client.close()
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
