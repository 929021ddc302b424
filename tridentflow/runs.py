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
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from state.ledger import DEFAULT_LEASE_MS
from tridentflow.committer import commit
from tridentflow.coordinator import coordinate
from tridentflow.emitter import emit
from tridentflow.engines.base import Engine
from tridentflow.errors import TridentflowError
from tridentflow.runtime import Runtime
from tridentflow.staging import StagedBatch


class RunNotBoundError(TridentflowError):
    """The run has no txid, or lost it to another run."""


def coordinate_run(
    rt: Runtime, run_id: str, batch_size: int | None = None, lease_ms: int = DEFAULT_LEASE_MS
) -> dict[str, Any]:
    """Bind ``run_id`` to a txid and return {txid, binding, committed, mode, ranges}."""
    binding = rt.ledger.bind_run(run_id, lease_ms)
    result: dict[str, Any] = {
        "pipeline": rt.pipeline.name,
        "run_id": run_id,
        "txid": binding.txid,
        "binding": binding.how,
        "committed": binding.already_committed,
    }
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
    and (GenerationError) any step of a run once its pipeline was reset."""
    rt.ledger.check_generation()
    txid = rt.ledger.txid_of_run(run_id)
    lost = rt.ledger.lost_txid(run_id) if txid is None else None
    if lost is not None:
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
        raise RunNotBoundError(
            f"txid {txid} of run {run_id} was adopted by run {owner}; clear this run's "
            "coordinator to bind a fresh txid"
        )
    return txid


def emit_run(
    rt: Runtime, run_id: str, engine: Engine, lease_ms: int = DEFAULT_LEASE_MS
) -> StagedBatch | None:
    return emit(rt, owned_txid(rt, run_id, lease_ms), engine)


def emit_run_remote(
    rt: Runtime, run_id: str, remote: str, lease_ms: int = DEFAULT_LEASE_MS
) -> dict[str, Any]:
    """``emit_run`` on the Spark engine as a client of the Spark Connect server at ``remote``
    (sc://HOST:PORT); the emit's summary."""
    from tridentflow.engines.spark import SparkEngine, spark_session

    txid = owned_txid(rt, run_id, lease_ms)
    spark = spark_session(
        f"tridentflow-emit-{rt.pipeline.name}", remote=remote, share=session_key(rt)
    )  # not stopped: the pipeline's next emit attaches to the same server-side session
    return emit_summary(rt, txid, emit(rt, txid, SparkEngine(spark)))


def session_key(rt: Runtime) -> str:
    """What Spark Connect clients of one pipeline share a session by (its namespace too)."""
    return f"{rt.namespace}/{rt.pipeline.name}"


def emit_summary(rt: Runtime, txid: int, staged: StagedBatch | None) -> dict[str, Any]:
    """What an emit did, JSON-native: staged (attempt, records, ranges, skipped partitions)
    or already-committed."""
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
    }


def commit_run(rt: Runtime, run_id: str, lease_ms: int = DEFAULT_LEASE_MS) -> dict[str, Any]:
    """Commit the run's txid; the result JSON-native (Airflow shows it as the task's XCom)."""
    result = asdict(commit(rt, owned_txid(rt, run_id, lease_ms)))
    result["skipped_partitions"] = list(result["skipped_partitions"])
    return {"pipeline": rt.pipeline.name, "run_id": run_id, **result}


def release_run(rt: Runtime, run_id: str) -> bool:
    """Release the run's claim on its txid (if it still owns one); True if released."""
    txid = rt.ledger.txid_of_run(run_id)
    if txid is None or txid <= rt.ledger.committed_txid():
        return False
    return rt.ledger.release(txid, run_id)
