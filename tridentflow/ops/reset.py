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
from tridentflow.sources.kafka import KafkaLog
from tridentflow.sources.redisstream import RedisStreamLog
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
    streams = rt.log if isinstance(rt.log, RedisStreamLog) else None
    kafka = rt.log if isinstance(rt.log, KafkaLog) else None
    if source and streams is not None:
        streams.check_unshared()  # before anything is reset
    if source and kafka is not None:
        raise TridentflowError(
            f"reset --source would delete Kafka topic {kafka.topic}, which is its producers': "
            "reset without --source starts the pipeline at what the topic holds"
        )
    before = rt.keyspace  # its shards' keys are deleted too, on their own masters
    deleted = rt.ledger.reset(force=force)
    rt.require_replicated(
        f"the reset of pipeline {rt.pipeline.name}",
        "staging and the source were left as they were; run the reset again",
        shards=True,  # each shard's new generation and deletions, on its own master
        also=before,
    )
    shutil.rmtree(rt.staging_root, ignore_errors=True)
    if streams is not None and source:
        streams.delete()
    elif streams is not None:
        rt.ledger.start_at(streams.rebase())
    elif kafka is not None:
        rt.ledger.start_at(kafka.rebase())  # retention may have deleted the first records
    elif source:
        shutil.rmtree(rt.log.root, ignore_errors=True)
    return ResetResult(deleted, source)
