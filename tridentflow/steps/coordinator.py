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

A pipeline with a state whose keys expire by time (``expire_after``) also gets the txid's
*batch time* frozen in its metadata (``at_ms``): Redis's clock, never below txid-1's (times
never go back along the txids, even after a failover to a Redis whose clock is behind); the
commit judges expiry by it (tridentflow_state.batch_times), never by its own clock.
"""

from __future__ import annotations

from typing import Any

from tridentflow.errors import NotReadyError, SourceError
from tridentflow.sources.specs import SourceMode
from tridentflow.steps.runtime import Runtime
from tridentflow_state.batch_times import BatchTimes


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
    if rt.pipeline.expires_in_time:
        meta["at_ms"] = freeze_batch_time(rt, txid)
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
    scan = rt.batch_scan(prev_ends, size)
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


def freeze_batch_time(rt: Runtime, txid: int) -> int:
    """The batch time to freeze for ``txid`` (ms): the batch clock's (Redis's TIME by
    default), raised to txid-1's if that is later - its metadata's, else the one its commit
    recorded (tridentflow_state.batch_times)."""
    now = rt.batch_clock(txid) if rt.batch_clock is not None else rt.redis_now_ms()
    if txid <= 1:
        return now
    before = (rt.ledger.metadata(txid - 1) or {}).get("at_ms")
    if before is None:
        before = BatchTimes(rt.client, rt.keyspace).time_of(txid - 1)
    return max(now, int(before or 0))
