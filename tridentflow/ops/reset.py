"""Resetting a pipeline: a new generation, its Redis keys and staging deleted, its source too
if asked (``tridentflow reset``; the chaos harness's operator).

Order is what makes it safe: the new generation is set first, atomically with the check that
no run holds a live lease (state.ledger.Ledger.reset), so every step still in flight is refused
from then on; with ``--wait-replicas`` the reset must be on the replicas before anything
outside Redis (staging, the source log) is deleted - a failover that undid an unreplicated
reset would otherwise bring back a ledger whose source records are gone.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass

from tridentflow.errors import TridentflowError
from tridentflow.sources.base import Deletes, GuardsDelete, Rebases
from tridentflow.steps.runtime import Runtime


@dataclass(frozen=True)
class ResetResult:
    deleted_keys: int
    source_deleted: bool


def reset_pipeline(rt: Runtime, force: bool = False, source: bool = False) -> ResetResult:
    """Reset ``rt``'s pipeline (see the module doc). PipelineBusyError while a run holds a
    live lease (unless ``force``); ReplicationError, with nothing outside Redis deleted, if
    the replicas do not acknowledge the reset; SourceError, with nothing reset, if ``source``
    would delete streams other readers read. Idempotent: run it again after an error.

    A reader of Redis Streams reset without ``source`` starts at what its streams still hold
    (``RedisStreamLog.rebase``): entries trimmed before the reset are not counted, and audit
    recomputes from there."""
    log = rt.log
    if source:  # before anything is reset: a log others read, or its producers own, stays
        if isinstance(log, GuardsDelete):
            log.check_delete()
        if not isinstance(log, Deletes):
            raise TridentflowError(
                f"reset --source: the source log of {rt.pipeline.name} "
                f"({rt.pipeline.source.describe()}) cannot be "
                "deleted by tridentflow (it has no delete()): delete it with its own tools, or "
                "reset without --source"
            )
    before = rt.keyspace  # its shards' keys are deleted too, on their own masters
    deleted = rt.ledger.reset(force=force)
    for cached in ("staging", "file_staging", "redis_staging"):  # the old generation's
        rt.__dict__.pop(cached, None)
    rt.require_replicated(
        f"the reset of pipeline {rt.pipeline.name}",
        "staging and the source were left as they were; run the reset again",
        shards=True,  # each shard's new generation and deletions, on its own master
        also=before,
    )
    shutil.rmtree(rt.staging_root, ignore_errors=True)
    if source:
        log.delete()  # type: ignore[attr-defined]  # Deletes, checked above
    elif isinstance(log, Rebases):  # start at what the log still holds (trimmed, retention)
        rt.ledger.start_at(log.rebase())
    return ResetResult(deleted, source)
