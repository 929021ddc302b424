"""Durable staging of a batch's emitted output, keyed by txid and emit attempt: one interface
(``base``: the abstract ``StagingArea`` and ``StagedBatch``, the optional ``InBlocks``) and two
places - Redis (``in_redis``, the default: nothing shared between the hosts that emit and
commit but Redis) and files under the home (``in_files``, ``TRIDENTFLOW_STAGING=files``: emit
and commit must share the home). ``layouts`` finds a Redis batch staged before ``tridentflow
reshard``."""

from __future__ import annotations

from tridentflow.steps.staging.base import CODE_SHAPE, InBlocks, StagedBatch, StagingArea
from tridentflow.steps.staging.in_files import (
    MANIFEST,
    STAGING_ENV,
    FileStagedBatch,
    FileStagingArea,
)
from tridentflow.steps.staging.in_redis import RedisStagedBatch, RedisStagingArea

STAGING_KINDS = ("files", "redis")
DEFAULT_STAGING = "redis"

__all__ = [
    "CODE_SHAPE",
    "DEFAULT_STAGING",
    "MANIFEST",
    "STAGING_ENV",
    "STAGING_KINDS",
    "FileStagedBatch",
    "FileStagingArea",
    "InBlocks",
    "RedisStagedBatch",
    "RedisStagingArea",
    "StagedBatch",
    "StagingArea",
]
