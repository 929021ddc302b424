"""Benchmark: ``tridentflow reshard`` - seconds per million state keys to move a pipeline's state
to another shard count, on one Redis and on a 3-master Redis Cluster, side by side with what a
user would do without it: reset the pipeline and recompute the state from its source.

    python -m benchmarks.reshard [--keys 1000000] [--retain 0] [--cluster]

A Count state of --keys keys is loaded by one real commit (local engine; its emit and commit
timed: the recompute a reset would need, at best - the source must still hold every record),
then resharded 1 -> 3 and 3 -> 2 (each timed: fields copied, old keys deleted), then 2 -> 3 under
tracemalloc (its time is tracemalloc's, not the reshard's: only its memory is the figure). With
--retain R, R more txids each update every key first, so the undo logs (R per key) move too.
The Python process's peak traced memory during that last reshard says what "moves in chunks"
means: it does not grow with the state. One Redis: a private redis-server with no persistence
(or TRIDENTFLOW_REDIS_URL); --cluster: a local 3-master cluster (tridentflow.devtools.devcluster).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

import redis

from benchmarks.memory import one_txid
from tridentflow import Count, LogSource, Pipeline, SourceMode, StateSpec
from tridentflow.devtools import devredis
from tridentflow.ops.reshard import reshard
from tridentflow.steps.runtime import Runtime, connect
from tridentflow_state.maps import StateKind


def pipeline(retain: int) -> Pipeline:
    p = Pipeline(
        "bench-reshard",
        LogSource(fields=("key",), mode=SourceMode.TRANSACTIONAL, partitions=4),
        retain_txids=retain or None,
    )
    p.stream.group_by("key").persistent_aggregate(
        StateSpec("s", StateKind.OPAQUE), Count(), out_field="n"
    )
    return p


def run(client: redis.Redis, home: Path, keys: int, retain: int, where: str) -> None:
    if not isinstance(client, redis.RedisCluster):
        client.flushdb()
    rt = Runtime(pipeline(retain), client, home)
    rt.ledger.reset(force=True)
    rt.source_heads()
    started = time.perf_counter()
    one_txid(rt, range(keys))
    recompute = time.perf_counter() - started
    for _ in range(retain):
        one_txid(rt, range(keys))
    per_million = 1_000_000 / keys
    print(
        f"{where}: a Count state of {keys:,} keys"
        + (f", {retain} undo logs each" if retain else "")
    )
    print(
        f"  reset + recompute from the source (emit + commit of its {keys:,} records): "
        f"{recompute:.1f} s ({recompute * per_million:.1f} s per million keys)"
    )
    for shards, traced in ((3, False), (2, False), (3, True)):
        fresh = Runtime(pipeline(retain), client, home)
        if traced:
            tracemalloc.start()
        started = time.perf_counter()
        done = reshard(fresh, shards)
        took = time.perf_counter() - started
        peak = tracemalloc.get_traced_memory()[1] if traced else None
        if traced:
            tracemalloc.stop()
        if peak is not None:
            print(
                f"  reshard {done.from_shards} -> {done.to_shards} under tracemalloc: peak "
                f"traced Python memory {peak / 1e6:.1f} MB for {done.fields_copied:,} fields"
            )
            continue
        print(
            f"  reshard {done.from_shards} -> {done.to_shards}: {took:.1f} s "
            f"({took * per_million:.1f} s per million keys; {done.fields_copied:,} fields in "
            f"{done.keys_copied} keys copied, {done.keys_deleted} deleted; "
            f"{recompute / took:.1f}x faster than the recompute)"
        )
    after = Runtime(pipeline(retain), client, home)
    assert after.backing("s").count() == keys, "every key moved"
    after.ledger.reset(force=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--retain", type=int, default=0)
    parser.add_argument("--cluster", action="store_true", help="a local 3-master Redis Cluster")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-reshard-"))
    try:
        if args.cluster:
            from tridentflow.devtools.devcluster import LocalCluster

            cluster = LocalCluster(work / "cluster").start()
            try:
                client = connect(cluster.url(0))
                run(client, work / "home", args.keys, args.retain, "3-master Redis Cluster")
            finally:
                cluster.stop()
        else:
            with devredis.url_or_private(work / "redis") as url:
                run(connect(url), work / "home", args.keys, args.retain, "one Redis")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
