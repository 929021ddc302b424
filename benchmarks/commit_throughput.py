"""Benchmark: commit throughput (keys/s) of the built-in numeric combiners, in Redis vs Python.

    python benchmarks/commit_throughput.py [--keys 50000] [--ops count,sum,min,max,mean]
                                           [--repeat 3] [--profile]

For each combiner and state kind (opaque, transactional) a batch of --keys distinct keys is
emitted (local engine, not timed) and committed twice: txid 1 creates every key, txid 2
updates every key (the steady state: read, combine, write [txid, curr, prev]). The time is the
whole ``commit()``: staging verification, every fenced write, the stray-key check and the
ledger mark. Each is run with the commit applying the combiner inside Redis (APPLY_NUMERIC,
the default) and with the Python map-state path. Needs a Redis: TRIDENTFLOW_REDIS_URL, else a
private redis-server (no persistence). Each figure is the best of --repeat runs.
``--profile`` instead profiles one in-Redis update commit (Count, opaque) with cProfile and
prints where its time goes: waiting on Redis (a socket read, or the shard threads' script
calls) versus Python.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import shutil
import tempfile
import time
from pathlib import Path

from tridentflow.aggregators import Count, Max, Mean, Min, Sum
from tridentflow.devtools import devredis
from tridentflow.engines.local import LocalEngine
from tridentflow.nodes import StateSpec
from tridentflow.ops.audit import audit
from tridentflow.pipeline import Pipeline
from tridentflow.sources.specs import LogSource, SourceMode
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.runtime import Runtime, connect
from tridentflow_state.maps import StateKind

COMBINERS = {"count": Count, "sum": Sum, "min": Min, "max": Max, "mean": Mean}


def pipeline(op: str, kind: StateKind) -> Pipeline:
    p = Pipeline(
        f"bench-commit-{op}-{kind.value}",
        LogSource(fields=("key", "value"), mode=SourceMode.TRANSACTIONAL, partitions=4),
    )
    in_fields = () if op == "count" else "value"
    p.stream.group_by("key").persistent_aggregate(StateSpec("s", kind), COMBINERS[op](), in_fields)
    return p


def timed_commits(
    rt: Runtime, keys: int, rng: random.Random, profiler: cProfile.Profile | None = None
) -> list[float]:
    """Seconds of commit() for txid 1 (new keys) and txid 2 (every key updated); with a
    profiler, txid 2's commit runs under it."""
    seconds = []
    for txid in (1, 2):
        records = [
            [f"k{i}", rng.choice((rng.randint(-1000, 1000), rng.random()))] for i in range(keys)
        ]
        rt.log.append_spread(records)
        coordinate(rt, rt.ledger.bind_run(f"bench-{txid}").txid, batch_size=keys)
        emit(rt, txid, LocalEngine())
        profiling = profiler is not None and txid == 2
        if profiling:
            profiler.enable()
        started = time.perf_counter()
        result = commit(rt, txid)
        seconds.append(time.perf_counter() - started)
        if profiling:
            profiler.disable()
        assert result.status == "committed" and result.keys == keys, result
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=50_000)
    parser.add_argument("--ops", default=",".join(COMBINERS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="profile one update commit")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-commit-"))
    with devredis.url_or_private(work / "redis") as url:
        (profile if args.profile else run)(args, work, connect(url))


WAITING_ON_REDIS = {
    "<method 'recv' of '_socket.socket' objects>",
    "<method 'recv_into' of '_socket.socket' objects>",  # redis-py's hiredis parser
    "<method 'acquire' of '_thread.lock' objects>",  # the shard threads' script calls
}
"""What cProfile shows while the commit waits on Redis: a socket read in this thread, or the
wait for the threads that send each shard's scripts (the commit applies every shard's chunks
from a thread of its own while this one splits the next)."""


def profile(args: argparse.Namespace, work: Path, client) -> None:
    profiler = cProfile.Profile()
    rt = Runtime(pipeline("count", StateKind.OPAQUE), client, work / "home-profile")
    rt.ledger.reset(force=True)
    rt.source_heads()
    _first, second = timed_commits(rt, args.keys, random.Random(7), profiler)
    stats = pstats.Stats(profiler)
    redis_wait = sum(row[2] for func, row in stats.stats.items() if func[2] in WAITING_ON_REDIS)
    print(
        f"update commit of {args.keys:,} keys (count, opaque, in Redis): {second:.3f}s, of which "
        f"{redis_wait:.3f}s waiting on Redis and {second - redis_wait:.3f}s elsewhere"
    )
    stats.sort_stats("tottime").print_stats(8)


def run(args: argparse.Namespace, work: Path, client) -> None:
    print(f"commit of {args.keys:,} keys per txid; keys/s (txid 1 creates, txid 2 updates)")
    print(f"{'combiner':<9} {'state':<14} {'in Redis':>22} {'Python':>22} {'speed-up':>9}")
    try:
        for op in args.ops.split(","):
            for kind in (StateKind.OPAQUE, StateKind.TRANSACTIONAL):
                rates = {}
                for in_redis in (True, False):
                    best = (0.0, 0.0)
                    for _ in range(args.repeat):
                        home = work / f"home-{op}-{kind.value}-{in_redis}"
                        rt = Runtime(pipeline(op, kind), client, home, in_redis_ops=in_redis)
                        rt.ledger.reset(force=True)
                        rt.source_heads()
                        first, second = timed_commits(rt, args.keys, random.Random(7))
                        assert audit(rt).ok
                        rt.ledger.reset(force=True)
                        shutil.rmtree(home, ignore_errors=True)
                        rate = (args.keys / first, args.keys / second)
                        best = (max(best[0], rate[0]), max(best[1], rate[1]))
                    rates[in_redis] = best
                fast, slow = rates[True], rates[False]
                print(
                    f"{op:<9} {kind.value:<14} {fast[0]:>10,.0f} /{fast[1]:>10,.0f} "
                    f"{slow[0]:>10,.0f} /{slow[1]:>10,.0f} {fast[1] / slow[1]:>8.1f}x"
                )
    finally:
        client.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
