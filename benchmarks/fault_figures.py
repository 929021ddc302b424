"""Figures for docs/operations.md (issue 55): what the chaos harness's fault families ran and
found, and the acknowledged commits a Redis crash loses under each persistence setting.

    python -m benchmarks.fault_figures [--schedules 20] [--kills 5]
    python -m benchmarks.fault_figures --only families --family all --schedules 300 \
        --seed 7000 --postgres postgresql://postgres@127.0.0.1:5432/EMPTY_DB   # the soak

1. Per family (``run_chaos`` with the family on; seeds from 3000): schedules run, fault events
   injected (every event that is a fault or an operator's act: raises, crashes, outages, Redis
   restarts, duplicate commits, resets, rewinds, reshards, deploys, table maintenance, Redis
   going back to a snapshot, sink failures), txids committed, records counted, lost, doubled,
   and the wall time.
2. Loss bound: a pipeline commits one small txid after another (one record each, local engine)
   against a redis-server of its own; at a random moment (0.5-1.5 s in) the server is
   SIGKILLed and started again from its files; the acknowledged commits it lost are the last
   txid the committer was told committed minus the ledger's committed txid after the restart.
   ``--kills`` times per setting: AOF ``appendfsync always``, AOF ``everysec``, no persistence.
   A process kill keeps what Redis wrote to the OS, so ``everysec`` loses nothing here; what
   a power loss takes with it (up to the last second's fsync) is the commit rate times one
   second, printed beside it. Then the time from the restart to the next commit (a retrying
   task's, without a human).
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from tridentflow import Count, LogSource, Pipeline, SourceMode, StateKind, StateSpec
from tridentflow.devtools import devredis
from tridentflow.devtools.chaos import run_chaos
from tridentflow.engines.local import LocalEngine
from tridentflow.steps.driver import run_batches
from tridentflow.steps.runtime import Runtime, connect

FAMILIES = (
    ("process deaths, outages, Redis restarts, sinks, resets, rewinds", {}),
    ("+ expiry (after 1-3 txids, 2-4 s of batch time, or both)", {"expiry": True}),
    ("+ Redis goes back to a snapshot (lost acknowledged writes)", {"lost_writes": True}),
    ("+ an operator reshards mid-run", {"reshards": True}),
    ("+ a concurrent reader (each listing checked against its txid)", {"reader": True}),
    ("+ Redis paused mid-step past every lease, adopters racing", {"paused": True}),
    ("+ code of another shape deployed between an emit and its commit", {"deploys": True}),
    ("+ lakehouse tables compacted and vacuumed between steps", {"tables": True}),
    ("+ typed keys and values (None, ints, floats) in Delta, Iceberg, PostgreSQL", {"types": True}),
)
EVERY_FAMILY = {"expiry": True, "lost_writes": True, "reshards": True, "reader": True,
                "paused": True, "deploys": True, "tables": True, "types": True}  # fmt: skip
"""``--family all``: every family at once, in one schedule (the soak of issue 55)."""
FAULT_MARKS = (
    "=raise", "=crash", "dark:", "outage:", "redis-restart", "duplicate-commit", "reset",
    "rewind-to:", "reshard:", "redis-lost-writes", "pg-", "sink-raised", "sink-died",
    "late-block-writer", "lose-tuple", "freeze", "pause@", "deploy:", "tables-",
)  # fmt: skip


def families(
    schedules: int, only: str | None = None, postgres_dsn: str | None = None, seed: int = 3000
) -> bool:
    """Each family (``only``: the one whose flag is named so, e.g. ``paused``; ``all``: every
    family at once). ``postgres_dsn``: the sinks in that (empty) PostgreSQL database too.
    False if a schedule found a difference."""
    print(f"chaos families, {schedules} schedules each (seeds from {seed}):")
    rows, exact = FAMILIES, True
    if only == "all":
        rows = (("every family at once", EVERY_FAMILY),)
    for label, flags in rows:
        if only not in (None, "all") and only not in flags:
            continue
        started = time.perf_counter()
        results = run_chaos(schedules, seed=seed, postgres_dsn=postgres_dsn, on_result=progress,
                            **flags)  # fmt: skip
        took = time.perf_counter() - started
        faults = sum(1 for r in results for e in r.events if any(m in e for m in FAULT_MARKS))
        bad = [r for r in results if not r.ok]
        exact = exact and not bad
        read = {kind: sum(int(e.split(":")[1]) for r in results for e in r.events
                          if e.startswith(f"{kind}:"))
                for kind in ("reader", "reader-streams", "reader-tables")}  # fmt: skip
        recovered = sorted(
            int(e.split(":")[1]) for r in results for e in r.events if e.startswith("recovery-ms:")
        )
        print(
            f"  {label}: {len(results)} schedules, {faults} faults injected, "
            f"{sum(r.txids for r in results)} txids, {sum(r.records for r in results)} records, "
            f"lost={sum(r.lost for r in results)} doubled={sum(r.doubled for r in results)}"
            f"{reader_line(read) if flags.get('reader') else ''}"
            f"{recovery_line(recovered) if recovered else ''}"
            f"{' FIRST DIFFERENCE: ' + str(bad[0].difference) if bad else ''} ({took:.0f} s)"
        )
    return exact


def reader_line(read: dict[str, int]) -> str:
    """What the concurrent reader checked: state listings, stream txids, table snapshots."""
    return (
        f", {read['reader']} listings, {read['reader-streams']} stream txids and "
        f"{read['reader-tables']} table snapshots checked"
    )


def progress(result) -> None:
    """One line per schedule on stderr (a long soak shows how far it is)."""
    print(f"seed {result.seed}: {'ok' if result.ok else 'FAILED'} ({result.seconds:.0f} s)",
          file=sys.stderr, flush=True)  # fmt: skip


def recovery_line(ms: list[int]) -> str:
    """', recovery after N pauses: median M s, max X s' from sorted ms."""
    median = ms[len(ms) // 2] / 1000
    return f", recovery after {len(ms)} pauses: median {median:.1f} s, max {ms[-1] / 1000:.1f} s"


def pipeline() -> Pipeline:
    p = Pipeline("loss-bound", LogSource(fields=("key",), mode=SourceMode.TRANSACTIONAL))
    p.stream.group_by("key").persistent_aggregate(
        StateSpec("counts", StateKind.OPAQUE), Count(), out_field="n"
    )
    return p


class Server:
    """A redis-server of this benchmark's own, with one persistence setting."""

    def __init__(self, directory: Path, fsync: str | None) -> None:
        self.directory, self.fsync = directory, fsync
        self.port = devredis.free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        args = devredis.server_args(self.port, self.directory, appendonly=self.fsync is not None)
        if self.fsync is not None:
            args[args.index("everysec")] = self.fsync
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        devredis.wait_ready(self.port, self.proc)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def one_kill(work: Path, fsync: str | None, rng: random.Random) -> tuple[int, float, float]:
    """(acknowledged commits lost - negative: txids committed whose acknowledgement the kill
    cut off -, commits per second before the kill, seconds from the restart to the next
    commit) of one kill."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    server = Server(work / "redis", fsync)
    (work / "redis").mkdir()
    server.start()
    rt = Runtime(pipeline(), connect(server.url), work / "home")
    rt.ledger.reset(force=True)
    rt.source_heads()
    rt.log.append_spread([[f"k{i % 100}"] for i in range(100_000)])
    acked, stop = [0], threading.Event()

    def commit_forever() -> None:
        while not stop.is_set():
            try:
                summary = run_batches(rt, LocalEngine(), max_batches=1, batch_size=1)
            except Exception:  # the server is gone: stop
                return
            for result in summary.results:
                if result.status == "committed":
                    acked[0] = max(acked[0], result.txid)

    worker = threading.Thread(target=commit_forever, daemon=True)
    started = time.perf_counter()
    worker.start()
    time.sleep(rng.uniform(0.5, 1.5))
    server.kill()
    rate = acked[0] / (time.perf_counter() - started)
    stop.set()
    worker.join(timeout=30)
    last = acked[0]
    server.start()
    restarted = time.perf_counter()
    after = Runtime(pipeline(), connect(server.url), work / "home")
    committed = after.ledger.committed_txid()
    run_batches(after, LocalEngine(), max_batches=1, batch_size=1)
    recovery = time.perf_counter() - restarted
    server.kill()
    return last - committed, rate, recovery


def loss_bounds(kills: int) -> None:
    rng = random.Random(55)
    work = Path(tempfile.mkdtemp(prefix="tf-bench-loss-"))
    print(f"loss bound: redis-server SIGKILLed {kills} times while one-record txids commit:")
    try:
        for label, fsync in (("AOF always", "always"), ("AOF everysec", "everysec"),
                             ("no persistence", None)):  # fmt: skip
            runs = [one_kill(work / "run", fsync, rng) for _ in range(kills)]
            lost = [max(0, n) for n, _, _ in runs]
            unacked = sum(max(0, -n) for n, _, _ in runs)
            rate = sum(r for _, r, _ in runs) / kills
            recovery = max(s for _, _, s in runs)
            print(
                f"  {label}: acknowledged commits lost per kill {lost} (max {max(lost)}; "
                f"committed but not acknowledged: {unacked}); "
                f"{rate:.0f} commits/s, so one second of fsync is {rate:.0f} txids; "
                f"restart to the next commit at most {recovery:.2f} s"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedules", type=int, default=20)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--only", choices=("families", "loss"), default=None)
    parser.add_argument(
        "--family",
        default=None,
        help="with --only families: that family alone (its flag), or all: every family at once",
    )
    parser.add_argument("--seed", type=int, default=3000, help="the families' first seed")
    parser.add_argument(
        "--postgres", default=None, help="an empty PostgreSQL database's DSN: the sinks there too"
    )
    args = parser.parse_args()
    if args.only in (None, "loss"):
        loss_bounds(args.kills)
    if args.only in (None, "families") and not families(
        args.schedules, args.family, args.postgres, args.seed
    ):
        sys.exit(1)  # a difference: the figures above name it


if __name__ == "__main__":
    main()
