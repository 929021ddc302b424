"""Benchmark: what keeping undo logs (``retain_txids``, issue 24) costs a commit, in time and
in Redis memory, next to what a user would do instead: snapshot each state after each commit.

    python -m benchmarks.undo_retention [--keys 200000] [--repeat 3]

For each write path - Count on an opaque state and Sum on a transactional one (the numeric
combiners applied inside Redis, APPLY_NUMERIC), and Count through the Python map-state path
(FENCED_HSET) - a batch of --keys distinct keys is committed three times: txid 1 creates
every key, txids 2 and 3 update every key. The time is the whole ``commit()``, the figure the
best of --repeat runs of txids 2 and 3 (the steady state), in keys/s, with:

* ``off``: retain_txids 0 (today's commit);
* ``on``: retain_txids 1 - every write also records the key's prior value, and txid 3's
  commit drops txid 2's undo logs (the trim is timed with it);
* ``snapshot``: retention off, and after each commit the state hash copied whole (Redis
  ``COPY``), the per-txid savepoint a user would keep to roll back to.

Memory: ``MEMORY USAGE`` of one txid's undo hash per key it changed, next to the state's own
bytes per key and a snapshot's (every key, changed or not). Then the usual case, a txid that
changes --changed-percent of a state of --keys keys (Count, opaque, in Redis): the same three
modes, and the memory each keeps per txid. Needs a Redis: TRIDENTFLOW_REDIS_URL, else a
private redis-server (no persistence).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.commit_throughput import pipeline
from tridentflow.devtools import devredis
from tridentflow.engines.local import LocalEngine
from tridentflow.ops.audit import audit
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.runtime import Runtime, connect
from tridentflow_state.maps import StateKind

PATHS = [  # (label, combiner, state kind, in Redis)
    ("count opaque, in Redis", "count", StateKind.OPAQUE, True),
    ("sum transactional, in Redis", "sum", StateKind.TRANSACTIONAL, True),
    ("count opaque, Python path", "count", StateKind.OPAQUE, False),
]
MODES = ("off", "on", "snapshot")


def memory(client, key: str) -> int:
    return int(client.memory_usage(key, samples=0) or 0)


def one_run(
    client,
    home: Path,
    op: str,
    kind: StateKind,
    mode: str,
    keys: int,
    changed: int = 0,
    in_redis_ops: bool = True,
) -> dict:
    """Seconds of txids 2 and 3's commits in ``mode``, and the memory figures; ``changed``:
    txids 2 and 3 change only that many of the keys (default: all)."""
    changed = changed or keys
    retain = 1 if mode == "on" else 0
    rt = Runtime(pipeline(op, kind), client, home, retain=retain, in_redis_ops=in_redis_ops)
    rt.ledger.reset(force=True)
    rt.source_heads()
    rng = random.Random(7)
    state = rt.keyspace.state("s")
    seconds = 0.0
    out: dict = {}
    for txid in (1, 2, 3):
        n = keys if txid == 1 else changed
        records = [[f"k{i}", rng.randint(-1000, 1000)] for i in range(n)]
        rt.log.append_spread(records)
        coordinate(rt, rt.ledger.bind_run(f"bench-{txid}").txid, batch_size=keys)
        emit(rt, txid, LocalEngine())
        started = time.perf_counter()
        result = commit(rt, txid)
        if mode == "snapshot":
            client.copy(state, f"{state}:snapshot:{txid}", replace=True)
        took = time.perf_counter() - started
        assert result.status == "committed" and result.keys == n, result
        if txid > 1:
            seconds += took
        if txid == 2:
            out["state_bytes"] = memory(client, state) / keys
            if mode == "on":
                out["undo_total"] = memory(client, rt.keyspace.undo("s", 2))
                out["undo_bytes"] = out["undo_total"] / changed
            if mode == "snapshot":
                out["snapshot_total"] = memory(client, f"{state}:snapshot:2")
                out["snapshot_bytes"] = out["snapshot_total"] / keys
    if mode == "on":  # txid 3's commit dropped txid 2's undo logs: only txid 3's are left
        assert not client.exists(rt.keyspace.undo("s", 2))
        assert client.exists(rt.keyspace.undo("s", 3))
    assert audit(rt).ok
    for txid in (1, 2, 3):
        client.delete(f"{state}:snapshot:{txid}")
    rt.ledger.reset(force=True)
    shutil.rmtree(home, ignore_errors=True)
    out["rate"] = 2 * changed / seconds
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--changed-percent", type=int, default=2, help="the sparse txids: keys changed (%%)"
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-undo-"))
    try:
        with devredis.url_or_private(work / "redis") as url:
            run(args, work, connect(url))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path, client) -> None:
    print(
        f"update commits of {args.keys:,} keys per txid, keys/s (best of {args.repeat}); "
        "retention on = retain_txids 1 (each commit also drops the undo logs it passed)"
    )
    print(
        f"{'write path':<29} {'off':>10} {'on':>10} {'on/off':>7} {'snapshot':>10} {'snap/off':>8}"
    )
    figures = {}
    for label, op, kind, in_redis in PATHS:
        best: dict[str, dict] = {}
        for _ in range(args.repeat):
            for mode in MODES:
                got = one_run(
                    client,
                    work / f"home-{op}-{mode}",
                    op,
                    kind,
                    mode,
                    args.keys,
                    in_redis_ops=in_redis,
                )
                if mode not in best or got["rate"] > best[mode]["rate"]:
                    best[mode] = got
        off, on, snap = (best[m]["rate"] for m in MODES)
        print(
            f"{label:<29} {off:>10,.0f} {on:>10,.0f} {on / off:>6.2f}x {snap:>10,.0f} "
            f"{snap / off:>7.2f}x"
        )
        figures[label] = best
    print("Redis memory, bytes per key (MEMORY USAGE, after txid 2):")
    for label, best in figures.items():
        print(
            f"  {label:<29} state {best['off']['state_bytes']:>6.0f}   undo log "
            f"{best['on']['undo_bytes']:>6.0f} per changed key per retained txid   snapshot "
            f"{best['snapshot']['snapshot_bytes']:>6.0f} per key (changed or not) per txid"
        )
    sparse(args, work, client)


def sparse(args: argparse.Namespace, work: Path, client) -> None:
    """The usual txid: it changes a few of the state's keys (count, opaque, in Redis)."""
    changed = max(1, args.keys * args.changed_percent // 100)
    print(
        f"a state of {args.keys:,} keys, txids changing {changed:,} of them "
        f"({args.changed_percent}%): keys/s, and Redis memory kept per txid"
    )
    best: dict[str, dict] = {}
    try:
        for _ in range(args.repeat):
            for mode in MODES:
                home = work / f"home-sparse-{mode}"
                got = one_run(client, home, "count", StateKind.OPAQUE, mode, args.keys, changed)
                if mode not in best or got["rate"] > best[mode]["rate"]:
                    best[mode] = got
    finally:
        client.close()
    off, on, snap = (best[m]["rate"] for m in MODES)
    print(f"  off {off:,.0f}   on {on:,.0f} ({on / off:.2f}x)   snapshot {snap:,.0f} "
          f"({snap / off:.2f}x)")  # fmt: skip
    print(
        f"  kept per txid: undo log {best['on']['undo_total'] / 1e6:.1f} MB, snapshot "
        f"{best['snapshot']['snapshot_total'] / 1e6:.1f} MB"
    )


if __name__ == "__main__":
    main()
