"""The emitter: reads exactly one txid's batch and stages its per-key partial aggregates.

``emit(rt, txid, engine)`` counts a new emit attempt, works out the ranges to read, runs the
engine, and stages the output under (txid, attempt); the attempt is recorded as staged only
after its manifest is durable. A committed txid is a no-op. Safe to re-run at any time.

* transactional source: the ranges are the ones frozen in the metadata. A dark partition with
  records in its range makes the emit fail (PartitionUnavailableError): the batch cannot be replayed
  without it, and the pipeline waits - Trident's documented weakness of this source kind.
Records that cannot be processed (undecodable, missing fields, a function raising) are staged
as bad records and quarantined at commit; they never fail the batch unless the pipeline's
max_bad_records / max_bad_fraction is exceeded (TooManyBadRecordsError). Every exchange between
stages reports its tuple counts; a batch whose counts disagree (a lost tuple) fails here, and
the reports are staged so the commit checks them again.

* opaque / non-transactional source: each partition is read from its committed position (or,
  pipelined, from where txid-1's staged attempt stopped) up to ``batch_size`` records; a dark
  partition is skipped and its records arrive in a later txid.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis

from tridentflow.engines.base import Engine, ExecContext, check_stages
from tridentflow.errors import (
    IncompleteBatchError,
    NotReadyError,
    PartitionUnavailableError,
    TooManyBadRecordsError,
)
from tridentflow.sources.specs import SourceMode
from tridentflow.steps.recorded_settings import code_shape
from tridentflow.steps.runtime import Runtime
from tridentflow.steps.staging import CODE_SHAPE, StagedBatch


def unreadable_partitions(rt: Runtime, txid: int) -> tuple[dict[int, int], dict[int, str]]:
    """(head of every readable partition, reason for every other one) while ``txid`` reads:
    really unavailable partitions (missing, unreadable, torn HEAD) and injected dark ones. A
    store's listing is not repeated here (``known_scan``): the coordinator's froze the txid."""
    scan = rt.known_scan()
    heads, unavailable = dict(scan.heads), dict(scan.unavailable)
    for partition in rt.faults.dark_partitions(txid):
        if partition in heads:
            del heads[partition]
            unavailable[partition] = "dark (injected fault)"
    return heads, unavailable


def _probe(rt: Runtime, partition: int, start: int, end: int) -> str | None:
    """Why [start, end) of ``partition`` cannot be read now, or None if it can."""
    try:
        rt.log.probe(partition, start, end)
    except PartitionUnavailableError as exc:
        return exc.reason
    return None


def emit_ranges(
    rt: Runtime, txid: int, meta: dict[str, Any]
) -> tuple[dict[int, tuple[int, int]], list[int], dict[int, int]]:
    """(ranges to read, partitions skipped, positions after this batch) for ``txid``."""
    heads, unavailable = unreadable_partitions(rt, txid)
    if meta["mode"] == SourceMode.TRANSACTIONAL.value:
        ranges = {int(p): (int(r[0]), int(r[1])) for p, r in meta["ranges"].items()}
        for partition, (start, end) in sorted(ranges.items()):
            if end <= start:
                continue
            reason = unavailable.get(partition)
            if reason is None and heads.get(partition, 0) < end:
                reason = f"unavailable: its head {heads.get(partition, 0)} is before {end}"
            if reason is None:
                reason = _probe(rt, partition, start, end)
            if reason is not None:
                raise PartitionUnavailableError(
                    partition,
                    f"{reason}; txid {txid} of a transactional source replays exactly "
                    f"[{start}, {end}) and waits for it",
                )
        skipped = [int(p) for p in meta.get("unavailable", [])]
        return ranges, skipped, {p: end for p, (_start, end) in ranges.items()}
    positions = start_positions(rt, txid, meta)
    size = int(meta["batch_size"])
    ranges, skipped = {}, sorted(unavailable)
    for partition, head in heads.items():
        start = positions.get(partition, 0)
        end = min(head, start + size)
        # behind its start (restored from an older copy, replaced), or its files unreadable
        if head < start or _probe(rt, partition, start, end) is not None:
            skipped.append(partition)
            continue
        ranges[partition] = (start, end)
    known = set(heads) | set(unavailable) | set(positions)
    after = {p: ranges[p][1] if p in ranges else positions.get(p, 0) for p in sorted(known)}
    return ranges, sorted(skipped), after


def start_positions(rt: Runtime, txid: int, meta: dict[str, Any]) -> dict[int, int]:
    """Where an opaque txid starts reading: the committed positions, or - pipelined, while
    txid-1 is not committed yet - where txid-1's newest staged attempt stopped. The commit
    re-checks the start against the committed positions, so a base that changed fails there."""
    while True:
        committed = rt.ledger.committed_txid()
        if committed >= txid - 1:
            return rt.ledger.committed_offsets()
        previous = rt.ledger.staged_attempt(txid - 1)
        if previous is None:
            raise NotReadyError(
                f"{meta['mode']} txid {txid} starts where txid {txid - 1} stops: emit txid "
                f"{txid - 1} first (the ledger stands at {committed})"
            )
        try:
            manifest = rt.staging_of(txid - 1, previous).manifest(txid - 1, previous)
        except IncompleteBatchError:
            if rt.ledger.committed_txid() >= txid - 1:
                continue  # txid-1 committed meanwhile and its staging was discarded
            raise
        return {int(p): int(v) for p, v in manifest["next_positions"].items()}


def check_bad_records(rt: Runtime, txid: int, records: int, bad: int) -> None:
    """Fail the batch (TooManyBadRecordsError) when it has more bad records than allowed."""
    pipeline = rt.pipeline
    if pipeline.max_bad_records is not None and bad > pipeline.max_bad_records:
        raise TooManyBadRecordsError(
            f"txid {txid}: {bad} of {records} records are bad (max_bad_records="
            f"{pipeline.max_bad_records}); see them with `tridentflow quarantine` after fixing"
            " the limit, or fix the input"
        )
    limit = pipeline.max_bad_fraction
    if limit is not None and records and bad / records > limit:
        raise TooManyBadRecordsError(
            f"txid {txid}: {bad} of {records} records are bad, more than max_bad_fraction="
            f"{pipeline.max_bad_fraction}"
        )


def emit(rt: Runtime, txid: int, engine: Engine) -> StagedBatch | None:
    """Stage txid's batch as a new attempt; None if the txid is already committed.

    What an attempt leaves behind when it is abandoned goes with it (``rt.discard_attempts``):
    an attempt that fails (a refused batch, a Spark job that failed) deletes its staging,
    blocks its executors wrote before the checks included; an attempt that stages deletes the
    blocks of its killed Spark tasks (``prune``) and the staging of earlier attempts of the
    txid that died part-way (all but the recorded one, which a commit may be reading); an
    attempt that finds its txid committed meanwhile (a zombie - its failure too, the commit
    having deleted the staging it was writing) deletes the txid's staging, and
    so does any emit of a committed txid - not best effort: if Redis does not answer (paused,
    say), the step fails and its retry deletes it, so a zombie's staging never outlives it;
    an attempt whose record in the ledger goes unanswered deletes its staging before it fails
    (a step that is never retried - its retries spent, a zombie nobody retries - leaves nothing:
    a commit that finds the attempt recorded but gone fails and its txid is emitted again).
    The commit deletes the rest (committer.commit)."""
    ledger = rt.ledger
    ledger.check_generation()
    if txid <= ledger.committed_txid():
        rt.discard_staged(txid)  # what a zombie of it left, if its own discard failed
        return None
    meta = ledger.metadata(txid)
    if meta is None:
        raise NotReadyError(f"txid {txid} has no batch metadata: run its coordinator first")
    ranges, skipped, next_positions = emit_ranges(rt, txid, meta)
    attempt = ledger.next_attempt(txid, "emit")  # only attempts that get to read count
    if attempt == 0:  # committed meanwhile
        return None
    staged_before = ledger.staged_attempt(txid)
    rt.discard_attempts(txid, (a for a in range(1, attempt) if a != staged_before))
    header = attempt_header(
        rt.pipeline.name, txid, attempt, meta["mode"], engine.name, ranges, skipped, next_positions
    )
    header[CODE_SHAPE] = code_shape(rt)  # a commit by code of another shape refuses the batch
    try:
        staged = _compute_and_stage(rt, txid, attempt, engine, ranges, next_positions, header)
    except Exception as exc:
        if _abandoned(rt, txid, attempt, exc):
            return None
        raise
    if record_staged(rt, txid, attempt) == 0:  # committed meanwhile: nobody will read it
        rt.discard_staged(txid)
        return None
    rt.staging.prune(staged)
    return staged


def attempt_header(
    pipeline: str,
    txid: int,
    attempt: int,
    mode: str,
    engine: str,
    ranges: dict[int, tuple[int, int]],
    skipped: Iterable[int] = (),
    next_positions: dict[int, int] | None = None,
) -> dict[str, Any]:
    """The head of an emit attempt's manifest: what it is and what it read (the staging adds
    the counts, the stages and its parts; the emitter the code shape)."""
    return {
        "pipeline": pipeline,
        "txid": txid,
        "attempt": attempt,
        "mode": mode,
        "engine": engine,
        "ranges": {str(p): [s, e] for p, (s, e) in sorted(ranges.items())},
        "skipped": sorted(skipped),
        "next_positions": {str(p): v for p, v in sorted((next_positions or {}).items())},
    }


def _abandoned(rt: Runtime, txid: int, attempt: int, exc: Exception) -> bool:
    """After emit ``attempt`` failed with ``exc``: its staging deleted; True if the txid was
    committed meanwhile (a zombie: the commit deleted its staging under it - the emit answers
    None). A staging directory gone under it while Redis cannot say is one line
    (IncompleteBatchError: a retry helps); otherwise the caller re-raises ``exc``."""
    rt.discard_attempts(txid, [attempt])
    committed = _committed_meanwhile(rt, txid)
    if committed:
        rt.discard_staged(txid)
        return True
    if committed is None and isinstance(exc, FileNotFoundError):
        raise IncompleteBatchError(
            f"txid {txid}: the staging of emit attempt {attempt} was deleted while it was "
            "written, and Redis did not answer whether the txid was committed meanwhile: "
            "retry the emit (it finds the txid committed, or stages it again)"
        ) from exc
    return False


def record_staged(rt: Runtime, txid: int, attempt: int) -> int:
    """Record ``attempt`` as ``txid``'s staged one (the ledger's answer: 0 if the txid is
    committed). Unanswered (a paused Redis: maybe recorded, maybe not), the attempt's staging
    is deleted before the error goes on - the step may never be retried - and a commit that
    finds it recorded but gone fails; the txid is emitted again."""
    try:
        return rt.ledger.record_staged(txid, attempt)
    except redis.RedisError:
        rt.discard_attempts(txid, [attempt])
        raise


def _committed_meanwhile(rt: Runtime, txid: int) -> bool | None:
    """Whether ``txid`` is committed now (None if Redis cannot say: the failure stands)."""
    try:
        return txid <= rt.ledger.committed_txid()
    except redis.RedisError:
        return None


def _compute_and_stage(
    rt: Runtime,
    txid: int,
    attempt: int,
    engine: Engine,
    ranges: dict[int, tuple[int, int]],
    next_positions: dict[int, int],
    header: dict[str, Any],
) -> StagedBatch:
    """Run the engine over ``ranges``, check the batch (exchanges, bad records) and stage it
    under (txid, attempt), the manifest last."""
    lose = rt.faults.armed("lose-tuple", txid, attempt) is not None
    # the records before this batch: every known partition's start, skipped ones included
    base = sum(next_positions.values()) - sum(end - start for start, end in ranges.values())
    area = rt.staging
    ctx = ExecContext(
        txid,
        rt.redis_url,
        lose_tuple=lose,
        namespace=rt.namespace,
        position_base=base,
        blocks=area.space(txid, attempt),  # None: staged in files, by the driver
    )
    result = engine.compute(rt.plan, str(rt.log.root), ranges, ctx)
    check_stages(txid, result.stages)
    check_bad_records(rt, txid, sum(c.n for c in result.counts.values()), len(result.bad))
    header["stages"] = [r.to_json() for r in result.stages]
    return area.write(
        header,
        result.counts,
        result.partials,
        result.bad,
        before_manifest=lambda: rt.faults.fire("in-emit", txid, attempt),
    )
