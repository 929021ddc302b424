"""Runs coordinator -> emit -> commit for consecutive txids in one process (the CLI's ``run``).

The driver binds each txid through the ledger like any orchestrator run; being the single
driver of the pipeline it adopts a pending txid at once (a crashed earlier run's), so resuming
after a crash replays the same txid with the same metadata.

``run_pipelined`` is Trident's max.spout.pending: up to ``depth`` txids are emitted at once (in
threads: concurrent Spark jobs) while commits stay strictly ordered; a later txid that is
ready first waits for its turn, and one whose base changed (an opaque txid-1 re-emitted) is
emitted again before it commits.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from tridentflow.engines.base import Engine
from tridentflow.errors import IncompleteBatchError, NotReadyError, TridentflowError
from tridentflow.sources.base import ListsOnScan, Requires
from tridentflow.steps.committer import CommitResult, commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.runtime import Runtime


@dataclass
class RunSummary:
    results: list[CommitResult] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(r.records for r in self.results)


def backlog(rt: Runtime) -> int:
    """Records in the source not yet covered by a committed txid. A source that must exist
    already (a Kafka topic: its producers make it) raises SourceError if it does not."""
    if not rt.log.exists():
        if isinstance(rt.log, Requires):
            rt.log.require()
        return 0
    offsets = rt.ledger.committed_offsets()
    heads = rt.log.scan().heads  # an unavailable partition's records cannot be read now
    return sum(max(0, head - offsets.get(p, 0)) for p, head in heads.items())


def has_backlog(rt: Runtime) -> bool:
    """Whether ``backlog`` is more than 0, without a listing when a log that lists a store
    (ListsOnScan) already took files no committed txid covers."""
    if isinstance(rt.log, ListsOnScan):
        offsets = rt.ledger.committed_offsets()
        if any(head > offsets.get(p, 0) for p, head in rt.log.taken().heads.items()):
            return True
    return backlog(rt) > 0


def run_one(rt: Runtime, engine: Engine, batch_size: int | None = None) -> CommitResult:
    """Bind (or resume) one txid and take it through coordinate, emit and commit."""
    binding = rt.ledger.bind_run(f"cli-{uuid.uuid4().hex[:12]}", adopt_live=True)
    txid = binding.txid
    coordinate(rt, txid, batch_size)
    emit(rt, txid, engine)
    return commit(rt, txid)


def run_batches(
    rt: Runtime,
    engine: Engine,
    max_batches: int | None = None,
    batch_size: int | None = None,
    on_commit: Callable[[CommitResult], None] | None = None,
) -> RunSummary:
    """Run up to ``max_batches`` txids; without a limit, until the source is drained (or a
    txid reads nothing, e.g. every remaining record sits in a dark partition)."""
    rt.check_layout()
    summary = RunSummary()
    while max_batches is None or len(summary.results) < max_batches:
        if max_batches is None and not rt.ledger.pending_txids() and not has_backlog(rt):
            break
        result = run_one(rt, engine, batch_size)
        summary.results.append(result)
        if on_commit is not None:
            on_commit(result)
        if max_batches is None and result.records == 0 and not rt.ledger.pending_txids():
            break
    return summary


def _emit_when_ready(
    rt: Runtime, txid: int, engine: Engine, stop: threading.Event, timeout: float = 3600
) -> None:
    """Emit ``txid``, waiting while it is not ready (an opaque txid-1 not yet staged); gives
    up when ``stop`` is set (the driver is failing)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            emit(rt, txid, engine)
            return
        except NotReadyError:
            if stop.is_set() or time.monotonic() > deadline:
                raise
            stop.wait(0.05)


def _nothing_after(rt: Runtime, meta: dict) -> bool:
    """Whether a transactional txid's frozen ranges reach every partition's head (nothing left
    after it; a store's listing is not repeated: its coordinator listed, or skipped the listing
    only because the manifest held more than its batch - Runtime.batch_scan). False for an
    opaque txid, whose ranges are decided at its emit."""
    if "ranges" not in meta:
        return False
    heads = (rt.log.taken() if isinstance(rt.log, ListsOnScan) else rt.log.scan()).heads
    return all(int(meta["ranges"].get(str(p), [0, 0])[1]) >= h for p, h in heads.items())


def _commit_emitted(rt: Runtime, txid: int, engine: Engine) -> CommitResult:
    """Commit an emitted txid; if its base moved meanwhile (IncompleteBatchError), emit it
    again and commit that."""
    try:
        return commit(rt, txid)
    except IncompleteBatchError:
        emit(rt, txid, engine)
        return commit(rt, txid)


def run_pipelined(
    rt: Runtime,
    engine: Engine,
    depth: int,
    max_batches: int | None = None,
    batch_size: int | None = None,
    on_commit: Callable[[CommitResult], None] | None = None,
) -> RunSummary:
    """Like run_batches, with up to ``depth`` txids in flight (emitting) at once."""
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise TridentflowError(f"depth must be a whole number >= 1, got {depth!r}")
    rt.check_layout()
    summary = RunSummary()
    driver = f"cli-{uuid.uuid4().hex[:12]}"
    next_txid = rt.ledger.committed_txid() + 1
    in_flight: dict[int, Future] = {}
    launched = 0
    exhausted = False
    stop = threading.Event()

    def launch() -> None:
        nonlocal next_txid, launched, exhausted
        txid = next_txid
        rt.ledger.claim(txid, f"{driver}-{txid}")
        meta = coordinate(rt, txid, batch_size)
        if max_batches is None:
            exhausted = _nothing_after(rt, meta)
        in_flight[txid] = pool.submit(_emit_when_ready, rt, txid, engine, stop)
        next_txid += 1
        launched += 1

    with ThreadPoolExecutor(max_workers=depth, thread_name_prefix="tf-emit") as pool:
        try:
            while True:
                while (
                    len(in_flight) < depth
                    and not exhausted
                    and (max_batches is None or launched < max_batches)
                ):
                    if (
                        max_batches is None
                        and not rt.ledger.pending_txids()
                        and not has_backlog(rt)
                    ):
                        exhausted = True
                        break
                    launch()
                if not in_flight:
                    break
                txid = min(in_flight)
                in_flight.pop(txid).result()
                result = _commit_emitted(rt, txid, engine)
                summary.results.append(result)
                if on_commit is not None:
                    on_commit(result)
                if max_batches is None and result.records == 0:
                    exhausted = True  # the source is drained; the txids in flight commit, empty
        finally:
            stop.set()  # a failing driver: emits waiting for their turn give up
    return summary
