"""Runs coordinator -> emit -> commit for consecutive txids in one process (the CLI's ``run``).

The driver binds each txid through the ledger like any orchestrator run; being the single
driver of the pipeline it adopts a pending txid at once (a crashed earlier run's), so resuming
after a crash replays the same txid with the same metadata.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from tridentflow.committer import CommitResult, commit
from tridentflow.coordinator import coordinate
from tridentflow.emitter import emit
from tridentflow.engine import Engine
from tridentflow.runtime import Runtime


@dataclass
class RunSummary:
    results: list[CommitResult] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(r.records for r in self.results)


def backlog(rt: Runtime) -> int:
    """Records in the source not yet covered by a committed txid."""
    if not rt.log.exists():
        return 0
    offsets = rt.ledger.committed_offsets()
    return sum(head - offsets.get(p, 0) for p, head in rt.log.heads().items())


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
    summary = RunSummary()
    while max_batches is None or len(summary.results) < max_batches:
        if max_batches is None and not rt.ledger.pending_txids() and backlog(rt) == 0:
            break
        result = run_one(rt, engine, batch_size)
        summary.results.append(result)
        if on_commit is not None:
            on_commit(result)
        if max_batches is None and result.records == 0 and not rt.ledger.pending_txids():
            break
    return summary
