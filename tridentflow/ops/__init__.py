"""Operator tools: what a person (or a test, or a benchmark) runs against pipelines - never
part of a txid's own steps.

``cli`` (the ``tridentflow`` command), ``status``, ``query`` (stateQuery and listings),
``audit`` (recompute and compare), ``reset``, ``acl`` (the Redis ACL rules one pipeline
needs), ``chaos`` (the fault-schedule harness), and local servers for development, tests and
benchmarks: ``devredis`` (a redis-server), ``devcluster`` (a Redis Cluster, with replication
that can lag), ``connect_server`` (a Spark Connect server).

Operator tools import the steps and everything below them; nothing below imports them.
"""

from __future__ import annotations

from tridentflow.ops.audit import AuditReport, audit
from tridentflow.ops.query import list_state, query
from tridentflow.ops.reset import reset_pipeline
from tridentflow.ops.status import status

__all__ = ["AuditReport", "audit", "list_state", "query", "reset_pipeline", "status"]
