"""Benchmark: Redis memory per key of a tridentflow state against a plain ``HSET`` of the same
keys and counts, and what staging and undo retention add (issue 54, "memory you can plan").

    python -m benchmarks.memory [--sizes 1000000,10000000] [--chunk 1000000] [--retain 3]

For each state size S (a fresh Redis database each time; a private redis-server with no
persistence unless TRIDENTFLOW_REDIS_URL is set):

* ``plain``: one hash, ``HSET counts k<i> <count>`` for S keys - the counter a user keeps by
  hand, with no txid, no replay safety;
* ``opaque``, ``transactional``: a Count state of S keys loaded by real commits of --chunk new
  keys each (local engine), measured after the last commit settled;
* ``opaque+expiry``: the same with ``expire_after_txids=1000`` - the expiry index holds each
  key once more (a line of a chunk in the bucket of the txid that wrote it).

Each is reported as ``used_memory`` grown per key (what ``maxmemory`` counts), and by part:
``MEMORY USAGE key SAMPLES 0`` summed over the keys of each part (the state's hash, the expiry
index, undo logs, change logs, staged batches, the rest; a LogSource keeps its records on
disk, not in Redis).

Then, at the first size, two settings an operator sizes Redis for:

* staging: the bytes a txid's batch of --chunk keys holds in Redis between its emit and its
  commit (the staged blocks, freed by the commit);
* retention: with ``retain_txids=--retain``, --retain more txids each update the same --chunk
  keys: the undo logs' bytes per changed key per retained txid.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import redis

from tridentflow import Count, LogSource, Pipeline, SourceMode, StateSpec
from tridentflow.devtools import devredis
from tridentflow.engines.local import LocalEngine
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.runtime import Runtime, connect
from tridentflow_state.maps import StateKind

FAR = 1000
"""expire_after_txids: an index that follows every key, none due."""
PARTS = (
    (":state:", "state"),
    (":expiry:", "expiry index"),
    (":undo:", "undo logs"),
    (":changes:", "change logs"),
    (":staged:", "staging"),
    (":block:", "staging"),
)


def pipeline(kind: StateKind, expire: bool, retain: int | None = None) -> Pipeline:
    p = Pipeline(
        "bench-memory",
        LogSource(fields=("key",), mode=SourceMode.TRANSACTIONAL, partitions=4),
        retain_txids=retain,
    )
    spec = StateSpec("s", kind, expire_after_txids=FAR if expire else None)
    p.stream.group_by("key").persistent_aggregate(spec, Count(), out_field="n")
    return p


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def by_part(client: redis.Redis) -> dict[str, int]:
    """Bytes per part (PARTS), every key of the database measured exactly."""
    parts: dict[str, int] = defaultdict(int)
    for key in client.scan_iter(count=1000):
        name = key.decode()
        part = next((label for marker, label in PARTS if marker in name), "the rest")
        parts[part] += int(client.memory_usage(key, samples=0) or 0)
    return dict(parts)


def plain(client: redis.Redis, size: int, chunk: int) -> tuple[int, int]:
    """(used_memory grown, MEMORY USAGE of the hash) by ``size`` counters in one hash."""
    client.flushdb()
    before = used(client)
    for start in range(0, size, chunk):
        with client.pipeline(transaction=False) as pipe:
            for low in range(start, min(size, start + chunk), 10_000):
                high = min(size, start + chunk, low + 10_000)
                pipe.hset("counts", mapping={f"k{i}": i % 7 + 1 for i in range(low, high)})
            pipe.execute()
    return used(client) - before, int(client.memory_usage("counts", samples=0) or 0)


def one_txid(rt: Runtime, keys: range, staged: dict[str, int] | None = None) -> None:
    """Produce one record per key of ``keys``, emit and commit it as the next txid; with
    ``staged``, the staged batch's bytes are measured between the emit and the commit."""
    rt.log.append_spread([[f"k{i}"] for i in keys])
    txid = rt.ledger.bind_run(f"bench-{rt.ledger.committed_txid() + 1}").txid
    coordinate(rt, txid, batch_size=len(keys))
    emit(rt, txid, LocalEngine())
    if staged is not None:
        staged["bytes"] = by_part(rt.client).get("staging", 0)
    result = commit(rt, txid)
    assert result.status == "committed", result


def tridentflow_state(
    client: redis.Redis, home: Path, size: int, chunk: int, kind: StateKind, expire: bool
) -> tuple[int, dict[str, int], int]:
    """(used_memory grown, bytes by part, the staged bytes of the last txid's batch) of a
    ``size``-key state loaded by commits of ``chunk`` new keys."""
    client.flushdb()
    before = used(client)
    rt = Runtime(pipeline(kind, expire), client, home)
    rt.ledger.reset(force=True)
    rt.source_heads()
    staged: dict[str, int] = {}
    for start in range(0, size, chunk):
        last = start + chunk >= size
        one_txid(rt, range(start, min(size, start + chunk)), staged if last else None)
    assert rt.backing("s").count() == size
    grown, parts = used(client) - before, by_part(client)
    shutil.rmtree(home, ignore_errors=True)
    return grown, parts, staged["bytes"]


def retention(client: redis.Redis, home: Path, chunk: int, retain: int) -> float:
    """Undo-log bytes per changed key per retained txid: ``retain`` txids after the first
    each update the same ``chunk`` keys with ``retain_txids=retain``."""
    client.flushdb()
    rt = Runtime(pipeline(StateKind.OPAQUE, False, retain), client, home)
    rt.ledger.reset(force=True)
    rt.source_heads()
    for _ in range(retain + 1):
        one_txid(rt, range(chunk))
    undo = by_part(client).get("undo logs", 0)
    shutil.rmtree(home, ignore_errors=True)
    return undo / (chunk * retain)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000000,10000000")
    parser.add_argument("--chunk", type=int, default=1_000_000)
    parser.add_argument("--retain", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-memory-"))
    try:
        with devredis.url_or_private(work / "redis") as url:
            run(args, work, connect(url))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path, client: redis.Redis) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    variants = (
        ("opaque", StateKind.OPAQUE, False),
        ("transactional", StateKind.TRANSACTIONAL, False),
        ("opaque+expiry", StateKind.OPAQUE, True),
    )
    print("bytes per key in Redis (used_memory grown / keys; parts: MEMORY USAGE, exact)")
    staged_at_first = None
    for size in sizes:
        grown, usage = plain(client, size, args.chunk)
        base = grown / size
        print(f"{size:,} keys: plain HSET {base:.1f} B/key (its hash: {usage / size:.1f})")
        for label, kind, expire in variants:
            grown, parts, staged = tridentflow_state(
                client, work / "home", size, args.chunk, kind, expire
            )
            per_part = ", ".join(f"{p} {b / size:.1f}" for p, b in sorted(parts.items()))
            print(
                f"  {label:14} {grown / size:6.1f} B/key ({grown / size / base:.2f}x plain)"
                f"   by part: {per_part}"
            )
            if staged_at_first is None:
                staged_at_first = staged
        client.flushdb()
    if staged_at_first is not None:
        print(
            f"staging: one txid's batch of {args.chunk:,} keys holds {staged_at_first:,} B in "
            f"Redis until its commit ({staged_at_first / args.chunk:.1f} B per staged key)"
        )
    per_txid = retention(client, work / "home", args.chunk, args.retain)
    print(
        f"retention: undo logs {per_txid:.1f} B per changed key per retained txid "
        f"(retain_txids={args.retain}, {args.chunk:,} keys changed per txid)"
    )
    client.flushdb()


if __name__ == "__main__":
    main()
