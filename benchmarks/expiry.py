"""Benchmark: what expiry in txids (``StateSpec(expire_after_txids=N)``, issue 54) costs a
commit, and that the cost follows the keys a txid writes and expires - not the state's size -
next to what a user would do without it: sweep the whole state for old keys after each commit.

    python -m benchmarks.expiry [--sizes 10000,1000000,10000000] [--batch 10000] [--txids 5]

For each state size S, a Count on an opaque state (applied inside Redis) holds S keys; then
--txids txids each update the same --batch keys (nothing is due: N = 1000), timed as the whole
``commit()``:

* ``off``: the state without expiry;
* ``on``: ``expire_after_txids=1000`` - each commit also reads the candidates (none due) and
  merges what it wrote into the index;
* ``sweep``: no expiry, and after each commit a scan of the whole state for keys not updated
  in N txids (HSCAN, JSON stamps) - what one writes without an index (it deletes nothing
  here: only the reading is timed).

Then the keys that do expire: with N = 1, each txid updates --batch new keys and expires the
--batch of the txid before (so every commit writes --batch keys and removes --batch keys).

The S keys beyond the batch are loaded as a commit of txid 1 leaves them (the hash field
``[1,1,null]``, and in the index's bucket of txid 1): loading 10M keys through ten million records
of a commit would time the loader, not the commit. Needs a Redis: TRIDENTFLOW_REDIS_URL, else
a private redis-server (no persistence).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from tridentflow import Count, LogSource, Pipeline, SourceMode, StateSpec
from tridentflow.devtools import devredis
from tridentflow.engines.local import LocalEngine
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.runtime import Runtime, connect
from tridentflow_state.expiry import add_chunks, add_count
from tridentflow_state.maps import StateKind

LOAD_CHUNK = 10_000
FAR = 1000
"""expire_after_txids when nothing is to expire during the timed txids."""


def pipeline(after: int | None) -> Pipeline:
    p = Pipeline(
        "bench-expiry",
        LogSource(fields=("key",), mode=SourceMode.TRANSACTIONAL, partitions=4),
    )
    spec = StateSpec("s", StateKind.OPAQUE, expire_after_txids=after)
    p.stream.group_by("key").persistent_aggregate(spec, Count(), out_field="n")
    return p


def one_txid(rt: Runtime, txid: int, keys: list[str]) -> float:
    """Produce ``keys`` (one record each), run the txid, and return its commit's seconds."""
    rt.log.append_spread([[k] for k in keys])
    coordinate(rt, rt.ledger.bind_run(f"bench-{txid}").txid, batch_size=len(keys))
    emit(rt, txid, LocalEngine())
    started = time.perf_counter()
    result = commit(rt, txid)
    took = time.perf_counter() - started
    assert result.status == "committed", result
    return took


def load(rt: Runtime, size: int, batch: int, indexed: bool) -> None:
    """The keys ``batch``..``size`` as txid 1's commit leaves them."""
    client, state = rt.client, rt.keyspace.state("s")
    index = rt.keyspace.expiry("s")
    for start in range(batch, size, LOAD_CHUNK):
        fields = [f"k{i}" for i in range(start, min(size, start + LOAD_CHUNK))]
        client.hset(state, mapping={f'["{f}"]': "[1,1,null]" for f in fields})
        if indexed:
            add_chunks(client, index, {1: [f'["{f}"]' for f in fields]})
            add_count(client, index, len(fields))


def sweep(rt: Runtime, through: int) -> int:
    """What one writes without an index: read the whole state for keys last updated at or
    before ``through``; how many it found."""
    found = 0
    for _field, raw in rt.client.hscan_iter(rt.keyspace.state("s"), count=1000):
        if json.loads(raw)[0] <= through:
            found += 1
    return found


def steady(client, home: Path, size: int, batch: int, txids: int, mode: str) -> float:
    """Keys/s of ``txids`` commits updating the same ``batch`` keys of a ``size``-key state."""
    rt = Runtime(pipeline(FAR if mode == "on" else None), client, home)
    rt.ledger.reset(force=True)
    rt.source_heads()
    hot = [f"k{i}" for i in range(batch)]
    one_txid(rt, 1, hot)
    load(rt, size, batch, indexed=mode == "on")
    assert rt.backing("s").count() == size
    seconds = 0.0
    for txid in range(2, txids + 2):
        seconds += one_txid(rt, txid, hot)
        if mode == "sweep":
            started = time.perf_counter()
            assert sweep(rt, txid - FAR) == 0
            seconds += time.perf_counter() - started
    rt.ledger.reset(force=True)
    shutil.rmtree(home, ignore_errors=True)
    return batch * txids / seconds


def expiring(client, home: Path, batch: int, txids: int) -> tuple[float, float]:
    """Keys/s written and expired by commits that each write ``batch`` new keys and expire
    the ``batch`` the txid before wrote (N = 1); and the same commits without expiry."""
    rates = []
    for after in (1, None):
        rt = Runtime(pipeline(after), client, home)
        rt.ledger.reset(force=True)
        rt.source_heads()
        one_txid(rt, 1, [f"t1-{i}" for i in range(batch)])
        seconds = sum(
            one_txid(rt, t, [f"t{t}-{i}" for i in range(batch)]) for t in range(2, txids + 2)
        )
        if after is not None:
            assert rt.backing("s").count() == batch  # only the last txid's keys are left
        rt.ledger.reset(force=True)
        shutil.rmtree(home, ignore_errors=True)
        rates.append(batch * txids / seconds)
    return rates[0], rates[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,1000000,10000000")
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--txids", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-bench-expiry-"))
    try:
        with devredis.url_or_private(work / "redis") as url:
            run(args, work, connect(url))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args: argparse.Namespace, work: Path, client) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"commits updating the same {args.batch:,} keys of a state of S keys, keys/s (best of "
        f"{args.repeat}, {args.txids} txids each); on = expire_after_txids={FAR} (none due)"
    )
    print(f"{'S':>12} {'off':>10} {'on':>10} {'on/off':>7} {'on vs smallest':>15} "
          f"{'sweep':>10} {'sweep/off':>9}")  # fmt: skip
    smallest = None
    for size in sizes:
        best = {}
        for mode in ("off", "on", "sweep"):
            best[mode] = max(
                steady(client, work / f"home-{mode}", size, args.batch, args.txids, mode)
                for _ in range(args.repeat)
            )
        smallest = smallest or best["on"]
        print(
            f"{size:>12,} {best['off']:>10,.0f} {best['on']:>10,.0f} "
            f"{best['on'] / best['off']:>6.2f}x {smallest / best['on']:>14.2f}x "
            f"{best['sweep']:>10,.0f} {best['sweep'] / best['off']:>8.3f}x"
        )
    on, off = max(
        (expiring(client, work / "home-expiring", args.batch, args.txids)
         for _ in range(args.repeat)),
        key=lambda pair: pair[0],
    )  # fmt: skip
    print(
        f"commits writing {args.batch:,} new keys and expiring the {args.batch:,} of the txid "
        f"before (N = 1): {on:,.0f} keys written/s, next to {off:,.0f} without expiry "
        f"({on / off:.2f}x)"
    )
    client.close()


if __name__ == "__main__":
    main()
