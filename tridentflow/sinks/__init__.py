"""Sinks: where a new-values stream lands, exactly once per committed txid.

A sink applies one txid's tuples atomically and records the txid with them (PostgreSQL: one
SQL transaction with its progress row; Redis Streams: entry IDs derived from the txid; Delta
Lake: one commit with a ``txn`` action; Iceberg: one snapshot stamped with the txid), so a
retried or concurrent export of a txid already applied changes nothing. ``export``
(tridentflow.steps.exporter) feeds each sink its txids in order after the commits.
"""

from __future__ import annotations

from tridentflow.sinks.base import ExportContext, Sink, SinkError, SinkRefusedError
from tridentflow.sinks.delta import DeltaSink
from tridentflow.sinks.iceberg import IcebergSink
from tridentflow.sinks.postgres import PostgresSink
from tridentflow.sinks.redisstream import RedisStreamSink

__all__ = [
    "DeltaSink",
    "ExportContext",
    "IcebergSink",
    "PostgresSink",
    "RedisStreamSink",
    "Sink",
    "SinkError",
    "SinkRefusedError",
]
