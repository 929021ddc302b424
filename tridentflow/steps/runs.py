"""Orchestrator-facing steps keyed by run id: each orchestrator run is one txid.

These are the plain functions the Airflow operators call (and the spark-submit application,
for emit). They bind the run to a txid through the ledger, so that every retry or manual clear
of any task of the run - the coordinator included - replays the same txid with the same
metadata, and a run whose owner stopped is adopted by the next run.

* ``coordinate_run``: bind (or re-bind) the run, then coordinate its txid. Idempotent.
* ``emit_run`` / ``commit_run``: the txid the run owns; refused with a clear error if another
  run adopted it meanwhile (clear this run's coordinator to bind it afresh).

A run that stopped and whose txid another run adopted (and committed) is bound to a *fresh*
txid if it is cleared later: every green run in the grid committed (or found committed) the
txid it owns, and each txid belongs to exactly one run.
* ``release_run``: the run gave up (its last retry failed): the next run adopts the txid now.

Healing without anyone clearing anything: the orchestrator can say what state a run is in
(``RunState``: Airflow's tasks ask the API server through the Task SDK). A pending txid whose
owner run has *finished* (failed, or marked failed or success by hand) is released when the
next run coordinates, so that run adopts it at once - even when the owner's failure callback
could not release it (Redis was down) and its lease is still live. A live owner keeps it. A
commit refused because an earlier txid is not committed names that txid, its owner run, the
run's state and what unblocks it.

Parallel runs take turns (``turn_wait``: a backfill or a DAG with several active runs): a
commit waits in its task for the txid before it, an opaque source's emit for the txid before
it to be staged (it starts where that one stops) - while the run holding that txid is live;
a finished or lease-expired holder is not waited for (the one-line error says what to do).

No work when there is nothing to do, no JVM for a small batch: ``emit_plan`` tells, from the
ledger and the source's heads alone, whether the run's txid is committed already, its batch is
empty, or it reads at most ``local_emit_max_records`` records (``TRIDENTFLOW_LOCAL_EMIT_MAX_
RECORDS``, 10,000; 0: never); the Airflow emit then starts no Spark job and runs the same
``emit`` on the local engine in its own process (docs/benchmarks.md: the crossover).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tridentflow.engines.base import Engine
from tridentflow.errors import RunNotBoundError, TridentflowError
from tridentflow.settings import env_int
from tridentflow.sources.base import CountsRecords
from tridentflow.sources.specs import SourceMode
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.runtime import Runtime
from tridentflow.steps.staging import StagedBatch
from tridentflow.steps.turns import TURN_WAIT_S, RunState, wait_turn
from tridentflow_state.errors import CommitOrderError
from tridentflow_state.ledger import DEFAULT_LEASE_MS

FINISHED = frozenset({"success", "failed"})
LOCAL_EMIT_ENV = "TRIDENTFLOW_LOCAL_EMIT_MAX_RECORDS"
DEFAULT_LOCAL_EMIT_MAX_RECORDS = 10_000
"""A batch that reads at most this many records is emitted on the local engine in the emit
task's process: a spark-submit costs a JVM start (10-40 s on 2 cores), a Connect job about a
second, where the local engine folds 10,000 records in a fraction of one (benchmarks/
small_txids.py measures the crossover)."""


def local_emit_limit() -> int:
    """The records a batch may read and still be emitted without Spark (0: always Spark)."""
    return env_int(LOCAL_EMIT_ENV, DEFAULT_LOCAL_EMIT_MAX_RECORDS)


def release_finished_owners(rt: Runtime, run_id: str, run_state: RunState) -> list[dict[str, Any]]:
    """Release every pending txid whose owner run (not ``run_id``) has finished, though its
    lease is live: it will never come back for it. [{txid, owner, state}] released."""
    released = []
    now = rt.redis_now_ms()
    for txid in rt.ledger.pending_txids():
        info = rt.ledger.tx_info(txid)
        owner = info.get("owner")
        if not owner or owner == run_id or int(info.get("lease_until") or 0) <= now:
            continue
        state = run_state(owner)
        if state in FINISHED and rt.ledger.release(txid, owner):
            released.append({"txid": txid, "owner": owner, "state": state})
    return released


def coordinate_run(
    rt: Runtime,
    run_id: str,
    batch_size: int | None = None,
    lease_ms: int = DEFAULT_LEASE_MS,
    run_state: RunState | None = None,
) -> dict[str, Any]:
    """Bind ``run_id`` to a txid and return {txid, binding, committed, mode, ranges}. With
    ``run_state``, txids held by finished runs are released first (and adopted here)."""
    released = release_finished_owners(rt, run_id, run_state) if run_state else []
    binding = rt.ledger.bind_run(run_id, lease_ms)
    result: dict[str, Any] = {
        "pipeline": rt.pipeline.name,
        "run_id": run_id,
        "txid": binding.txid,
        "binding": binding.how,
        "committed": binding.already_committed,
    }
    if released:
        result["released"] = released
    if binding.already_committed:
        return result
    meta = coordinate(rt, binding.txid, batch_size)
    result["mode"] = meta.get("mode")
    result["batch_size"] = meta.get("batch_size")
    if "ranges" in meta:
        result["ranges"] = meta["ranges"]
    return result


def owned_txid(rt: Runtime, run_id: str, lease_ms: int = DEFAULT_LEASE_MS) -> int:
    """The txid ``run_id`` is bound to; renews its lease. Refuses a txid another run adopted,
    a txid a rewind took back, and (GenerationError) any step of a run once its pipeline was
    reset, or while it is being rewound. Refusing a txid another run adopted and committed,
    it first deletes the txid's staging: what this run staged as a zombie after the commit
    (its emit failed before the ledger answered) goes with its retry, not the next commit."""
    rt.ledger.check_generation()
    txid = rt.ledger.txid_of_run(run_id)
    lost = rt.ledger.lost_txid(run_id) if txid is None else None
    rewound = rt.ledger.rewound_txid(run_id) if txid is None else None
    if rewound is not None:
        raise RunNotBoundError(
            f"txid {rewound[0]} of run {run_id} was rewound (pipeline {rt.pipeline.name} was "
            f"rewound to txid {rewound[1]}): clear this run's coordinator to bind a fresh txid"
        )
    if lost is not None:
        if lost[0] <= rt.ledger.committed_txid():  # what it staged as a zombie: nobody reads it
            rt.discard_staged(lost[0])
        raise RunNotBoundError(
            f"txid {lost[0]} of run {run_id} was adopted by run {lost[1]} after this run "
            "stopped; clear this run's coordinator to bind a fresh txid"
        )
    if txid is None:
        raise RunNotBoundError(
            f"run {run_id} has no txid in pipeline {rt.pipeline.name}: its coordinator has not "
            "run, or the pipeline was reset since (clear the whole run to start it afresh)"
        )
    if txid <= rt.ledger.committed_txid():
        return txid
    if not rt.ledger.renew_lease(txid, run_id, lease_ms):
        owner = rt.ledger.tx_info(txid).get("owner")
        if owner == run_id:  # released: the run had finished (or gave up) meanwhile
            raise RunNotBoundError(
                f"txid {txid} of run {run_id} was released (the run had finished or given "
                "up, and an operator or the next run freed it): the next run adopts it; clear "
                "this run's coordinator to take it again"
            )
        raise RunNotBoundError(
            f"txid {txid} of run {run_id} was adopted by run {owner}; clear this run's "
            "coordinator to bind a fresh txid"
        )
    return txid


def emit_run(
    rt: Runtime, run_id: str, engine: Engine, lease_ms: int = DEFAULT_LEASE_MS
) -> StagedBatch | None:
    return emit(rt, owned_txid(rt, run_id, lease_ms), engine)


def emit_plan(
    rt: Runtime, run_id: str, lease_ms: int = DEFAULT_LEASE_MS, local_limit: int | None = None
) -> tuple[int, str]:
    """(the run's txid, what its emit has to do): "committed" (nothing: it is), "empty" (its
    batch reads no record), "small" (it reads at most ``local_limit`` records -
    ``local_emit_limit()`` when None: the local engine in this process, no Spark job) or
    "work". Reads the ledger and the source's heads only; renews the run's lease. An opaque
    txid after a pending one reads where that one stops, not known here: "work"."""
    txid = owned_txid(rt, run_id, lease_ms)
    ledger = rt.ledger
    if txid <= ledger.committed_txid():
        return txid, "committed"
    records = batch_records(rt, txid)
    if records is None:
        return txid, "work"
    if records == 0:
        return txid, "empty"
    limit = local_emit_limit() if local_limit is None else local_limit
    return txid, "small" if records <= limit else "work"


def batch_records(rt: Runtime, txid: int) -> int | None:
    """At most how many records ``txid``'s emit reads (positions, so a Kafka topic's gaps
    make it fewer), from its frozen ranges - a transactional source - or, for the next
    txid of any other, from the committed positions, the heads and its batch size; None
    where that is not known before the emit (an opaque txid after a pending one)."""
    ledger = rt.ledger
    meta = ledger.metadata(txid) or {}
    if rt.pipeline.source.mode is SourceMode.TRANSACTIONAL:
        frozen = meta.get("ranges")
        if frozen is None:
            return None
        ranges = {int(p): (int(start), int(end)) for p, (start, end) in frozen.items()}
    elif txid != ledger.committed_txid() + 1:
        return None
    else:
        committed = ledger.committed_offsets()
        size = meta.get("batch_size")
        scan = rt.source_scan() if size is None else rt.batch_scan(committed, int(size))
        heads = scan.heads  # an unavailable partition is skipped by the emit too
        ranges = {}
        for p, head in heads.items():
            start = committed.get(p, 0)
            end = head if size is None else min(head, start + int(size))
            ranges[p] = (start, max(start, end))
    if isinstance(rt.log, CountsRecords):  # offsets that are not records (files)
        return rt.log.records_in(ranges)
    return sum(end - start for start, end in ranges.values())


def note_task(
    rt: Runtime,
    txid: int,
    step: str,
    try_number: int,
    started_ms: int,
    done: bool,
    run_id: str = "",
) -> None:
    """Record the orchestrator's view of a step's task (try ``try_number`` of ``run_id``, which
    started at ``started_ms``; its end once ``done``, failed or not) in the ledger, best effort:
    a try that cannot reach Redis is missing there (its try number is counted by the run's next
    try that can; the console reads every try from Airflow's own records)."""
    try:
        ended = int(time.time() * 1000) if done else None
        rt.ledger.record_task(txid, step, try_number, started_ms, ended, run_id)
    except Exception:  # never fail a task for its bookkeeping
        return


def emit_run_remote(
    rt: Runtime,
    run_id: str,
    remote: str,
    lease_ms: int = DEFAULT_LEASE_MS,
    ship: Sequence[Path] = (),
) -> dict[str, Any]:
    """``emit_run`` on the Spark engine as a client of the Spark Connect server at ``remote``
    (sc://HOST:PORT); the emit's summary. ``ship``: Python files the server's workers must
    import (the pipeline's module: tridentflow.user_code), added to the session first."""
    from tridentflow.engines.spark import SparkEngine, ship_python, spark_session

    txid = owned_txid(rt, run_id, lease_ms)
    spark = spark_session(
        f"tridentflow-emit-{rt.pipeline.name}", remote=remote, share=session_key(rt)
    )  # not stopped: the pipeline's next emit attaches to the same server-side session
    ship_python(spark, ship)
    return emit_summary(rt, txid, emit(rt, txid, SparkEngine(spark)))


def session_key(rt: Runtime) -> str:
    """What Spark Connect clients of one pipeline share a session by (its namespace too)."""
    return f"{rt.namespace}/{rt.pipeline.name}"


def emit_summary(rt: Runtime, txid: int, staged: StagedBatch | None) -> dict[str, Any]:
    """What an emit did, JSON-native: staged (attempt, records, ranges, skipped partitions,
    where it was staged) or already-committed."""
    result: dict[str, Any] = {"pipeline": rt.pipeline.name, "txid": txid}
    if staged is None:
        return {**result, "status": "already-committed"}
    return {
        **result,
        "status": "staged",
        "attempt": staged.attempt,
        "records": staged.records,
        "ranges": staged.manifest["ranges"],
        "skipped": staged.manifest["skipped"],
        "staging": staged.staged_in,
    }


def blocker(rt: Runtime, txid: int, run_state: RunState | None = None) -> str:
    """Why ``txid`` cannot commit yet, in words: the first uncommitted txid before it, its
    owner run and that run's state, and the one action that unblocks it. A txid held by a
    finished run is released here, so the next run adopts it."""
    first = rt.ledger.committed_txid() + 1
    info = rt.ledger.tx_info(first)
    owner = info.get("owner")
    lease_left = (int(info.get("lease_until") or 0) - rt.redis_now_ms()) / 1000
    head = f"txid {txid} cannot commit before txid {first}"
    if not owner or lease_left <= 0:
        return (
            f"{head}, which no run holds now (its owner {owner or 'is unknown'} released it or "
            "its lease ran out): the next run adopts it - trigger one"
        )
    state = run_state(owner) if run_state else None
    if state in FINISHED:
        rt.ledger.release(first, owner)
        return (
            f"{head}, held by run {owner}, which {state if state == 'failed' else 'ended'} "
            f"({state}) without committing it: released now, so the next run adopts it - "
            "trigger one (or let the schedule)"
        )
    shown = f" ({state})" if state else ""
    return (
        f"{head}, held by run {owner}{shown} for {lease_left:.0f}s more: that run commits it "
        f"- let it finish, or mark it failed so that the next run adopts txid {first}"
    )


def wait_emit_turn(
    rt: Runtime, txid: int, run_state: RunState | None = None, timeout: float = TURN_WAIT_S
) -> bool:
    """For a source that is not transactional: wait until txid-1 is staged or committed (the
    emit of ``txid`` starts where txid-1's stops); True once it is (what the emit would read
    may have changed: plan again). A transactional txid's ranges are its own: False at once,
    nothing to wait for."""
    if rt.pipeline.source.mode is SourceMode.TRANSACTIONAL:
        return False
    return wait_turn(rt, lambda: ready_to_emit(rt, txid), lambda: txid - 1, run_state, timeout)


def ready_to_emit(rt: Runtime, txid: int) -> bool:
    """Whether the emit of ``txid`` can start: a transactional txid's ranges are its own; any
    other starts where txid-1's stops, so txid-1 must be staged or committed. Reads only."""
    if rt.pipeline.source.mode is SourceMode.TRANSACTIONAL:
        return True
    ledger = rt.ledger
    return ledger.committed_txid() >= txid - 1 or ledger.staged_attempt(txid - 1) is not None


def commit_run(
    rt: Runtime,
    run_id: str,
    lease_ms: int = DEFAULT_LEASE_MS,
    run_state: RunState | None = None,
    turn_wait: float = 0.0,
) -> dict[str, Any]:
    """Commit the run's txid; the result JSON-native (Airflow shows it as the task's XCom).
    With ``turn_wait``, first waits that long for txid-1 to commit while a live run holds it.
    Refused out of order with one line naming what blocks it (``blocker``)."""
    txid = owned_txid(rt, run_id, lease_ms)
    if turn_wait > 0:
        ledger = rt.ledger

        def turn() -> bool:
            return ledger.committed_txid() >= txid - 1

        # waits on whichever txid is next to commit, while its run is live
        wait_turn(rt, turn, lambda: ledger.committed_txid() + 1, run_state, turn_wait)
    try:
        done = commit(rt, txid)
    except CommitOrderError:
        raise CommitOrderError(blocker(rt, txid, run_state)) from None
    result = asdict(done)
    result["skipped_partitions"] = list(result["skipped_partitions"])
    return {"pipeline": rt.pipeline.name, "run_id": run_id, **result}


def first_started_ms(tx_info: dict[str, str]) -> int | None:
    """When a txid's first step (or its task) started, from its ledger hash; None if none has."""
    started = [int(v) for k, v in tx_info.items() if k.endswith("started_ms") and v.isdigit()]
    return min(started) if started else None


def blocked(rt: Runtime, run_state: RunState | None = None) -> dict[str, Any] | None:
    """Whether the pipeline is blocked, and by what: the first uncommitted txid when no live
    run is working on it - no run holds it (released, or its lease ran out), or its owner run
    has finished (``run_state`` says so) without committing it. None when nothing is pending
    or the owner is alive (or its state unknown). Read-only: releases nothing.

    ``{txid, owner, owner_state, since_ms, action, line}``; ``line`` says it all in one line."""
    first = rt.ledger.committed_txid() + 1
    if first > rt.ledger.last_txid():
        return None
    info = rt.ledger.tx_info(first)
    owner = info.get("owner")
    since_ms = first_started_ms(info)
    live = bool(owner) and int(info.get("lease_until") or 0) > rt.redis_now_ms()
    state = run_state(owner) if live and owner and run_state else None
    if live and state not in FINISHED:
        return None
    if live:
        action = "release it (the view's Release action), or trigger a run: it adopts it"
        line = f"txid {first} is held by run {owner}, which {state} without committing it: {action}"
    else:
        owner, action = None, "trigger a run (or let the schedule): it adopts the txid"
        line = f"txid {first} is pending and no run holds it: {action}"
    return {
        "txid": first,
        "owner": owner,
        "owner_state": state,
        "since_ms": since_ms,
        "action": action,
        "line": line,
    }


def release_finished_owner(rt: Runtime, txid: int, run_state: RunState) -> dict[str, Any]:
    """An operator's release of ``txid`` (a UI action): only when its owner run has finished
    in the orchestrator; TridentflowError (one line) otherwise. Idempotent per owner: the
    ledger's release is conditional on the owner (atomic in Redis)."""
    if txid <= rt.ledger.committed_txid():
        raise TridentflowError(f"txid {txid} is committed: there is nothing to release")
    if txid > rt.ledger.last_txid():
        raise TridentflowError(f"txid {txid} is not known yet")
    info = rt.ledger.tx_info(txid)
    owner = info.get("owner")
    if not owner or int(info.get("lease_until") or 0) <= rt.redis_now_ms():
        raise TridentflowError(
            f"no run holds txid {txid}: nothing to release - trigger a run, it adopts the txid"
        )
    state = run_state(owner)
    if state not in FINISHED:
        raise TridentflowError(
            f"run {owner} is {state or 'in an unknown state'} and keeps txid {txid}: a live "
            "run is never released - wait for it, or mark it failed in Airflow first"
        )
    if not rt.ledger.release(txid, owner):
        raise TridentflowError(f"txid {txid} changed hands meanwhile: reload and look again")
    return {"txid": txid, "released": True, "owner": owner, "owner_state": state}


def release_run(rt: Runtime, run_id: str) -> bool:
    """Release the run's claim on its txid (if it still owns one); True if released."""
    txid = rt.ledger.txid_of_run(run_id)
    if txid is None or txid <= rt.ledger.committed_txid():
        return False
    return rt.ledger.release(txid, run_id)
