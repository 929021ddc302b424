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

# No names are re-exported here: every ``tridentflow`` command imports this package first,
# and a command that needs neither the audit nor the status should not import them. Import
# from the module: ``from tridentflow.ops.audit import audit``.
