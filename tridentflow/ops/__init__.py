"""Operator tools: what a person runs against a deployment's pipelines - never part of a
txid's own steps.

``cli`` (the ``tridentflow`` command), ``status``, ``audit`` (recompute and compare),
``reset``, ``rewind``, ``acl`` (the Redis ACL rules one pipeline needs), ``metrics`` (the
figures, Prometheus text) and ``bounded`` (reads with a deadline, for the view and the
scrape). Queries (``steps.query``) and exports (``steps.export``) are pipeline steps; the
development servers and the chaos harness are ``tridentflow.devtools``.

Operator tools import the steps and everything below them; nothing below imports them.
"""

from __future__ import annotations

from tridentflow.ops.audit import AuditReport, audit
from tridentflow.ops.reset import reset_pipeline
from tridentflow.ops.status import status
from tridentflow.steps.query import list_state, query

__all__ = ["AuditReport", "audit", "list_state", "query", "reset_pipeline", "status"]
