"""The steps of one txid - coordinate -> emit -> commit - and what they share.

Read ``runtime`` first (what a step needs: Redis, the ledger, the source log, staging), then
the steps in order: ``coordinator`` (a txid's batch metadata, stored before anything is
emitted), ``emitter`` (computes and stages the batch on an engine), ``committer`` (applies it,
strictly in txid order, fenced). ``staging`` is the files between emit and commit; ``runs``
binds orchestrator runs (Airflow) to txids; ``driver`` runs txids in a loop (the CLI).

The interface the rest uses (operator tools, the Airflow plugin, spark_jobs): the names below.
Steps import the engines, the sources and ``state``; never an operator tool.
"""

from __future__ import annotations

from tridentflow.steps.committer import CommitResult, commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.driver import backlog, run_batches, run_one, run_pipelined
from tridentflow.steps.emitter import emit
from tridentflow.steps.runs import (
    commit_run,
    coordinate_run,
    emit_plan,
    emit_run,
    emit_run_remote,
    owned_txid,
    release_run,
)
from tridentflow.steps.runtime import Runtime

__all__ = [
    "CommitResult",
    "Runtime",
    "backlog",
    "commit",
    "commit_run",
    "coordinate",
    "coordinate_run",
    "emit",
    "emit_plan",
    "emit_run",
    "emit_run_remote",
    "owned_txid",
    "release_run",
    "run_batches",
    "run_one",
    "run_pipelined",
]
