"""The coordinator: batch metadata for a txid (Trident's initializeTransaction).

``coordinate(rt, txid)`` creates the metadata on the first attempt and stores it in the ledger
before anything is emitted; every later attempt - a retry, a manual clear - gets the stored
copy back unchanged. Idempotent. With ``--wait-replicas``, it returns only once the stored
metadata is on the replicas (a failover must not hand a replay other ranges).

* transactional source: the metadata freezes each partition's range [start, end) for the txid:
  start is where txid-1 ended, end is at most ``batch_size`` records further, bounded by the
  partition's head. Partitions added later join at the next txid. A partition that cannot be
  read at that moment (missing, unreadable, or its head behind where it should start) gets
  an empty range and is listed under ``unavailable``: its records come in a later txid.
* opaque and non-transactional sources: the metadata holds only the batch size; the emitter
  reads from the committed positions whatever is readable (see tridentflow.steps.emitter).
"""

from __future__ import annotations

from typing import Any

from tridentflow.errors import NotReadyError, SourceError
from tridentflow.sources.specs import SourceMode
from tridentflow.steps.runtime import Runtime


def coordinate(rt: Runtime, txid: int, batch_size: int | None = None) -> dict[str, Any]:
    """Return the batch metadata of ``txid``, creating and storing it on the first call."""
    ledger = rt.ledger
    ledger.check_generation()
    rt.check_layout()
    attempt = ledger.next_attempt(txid, "coordinate")
    meta = ledger.metadata(txid)
    if meta is None:
        committed = ledger.committed_txid()
        if txid <= committed:
            return {"txid": txid, "already_committed": True}
        meta = ledger.store_metadata(txid, new_metadata(rt, txid, committed, batch_size))
        if meta is None:  # committed meanwhile: a replay of a txid that needs nothing more
            return {"txid": txid, "already_committed": True}
    rt.require_replicated(
        f"txid {txid}'s batch metadata", "not emitted yet; retry the coordinator (it waits again)"
    )
    rt.faults.fire("after-coordinate", txid, attempt)
    return meta


def new_metadata(
    rt: Runtime, txid: int, committed: int, batch_size: int | None = None
) -> dict[str, Any]:
    source = rt.pipeline.source
    size = int(source.batch_size if batch_size is None else batch_size)
    if size < 1:
        raise SourceError(f"batch size must be a whole number >= 1, got {batch_size!r}")
    meta: dict[str, Any] = {"txid": txid, "mode": source.mode.value, "batch_size": size}
    if source.mode is not SourceMode.TRANSACTIONAL:
        return meta
    if txid - 1 == committed:
        prev_ends = rt.ledger.committed_offsets()
    else:
        prev = rt.ledger.metadata(txid - 1)
        if prev is None or "ranges" not in prev:
            raise NotReadyError(
                f"txid {txid} cannot be coordinated before txid {txid - 1} (not coordinated yet)"
            )
        prev_ends = {int(p): int(r[1]) for p, r in prev["ranges"].items()}
    ranges: dict[str, list[int]] = {}
    scan = rt.source_scan()
    unavailable = []
    for partition in scan.partitions:
        start = prev_ends.get(partition, 0)
        head = scan.heads.get(partition)
        if head is None or head < start:  # unreadable now, or behind: nothing to freeze
            unavailable.append(partition)
            head = start
        ranges[str(partition)] = [start, min(head, start + size)]
    meta["ranges"] = ranges
    if unavailable:
        meta["unavailable"] = unavailable
    return meta
