"""The deployment's named connections, for a source or a sink that names none of its own.

A ``KafkaSource`` without brokers, a ``PostgresSink`` without a DSN: under Airflow they use
Airflow's connections (``kafka_default``, ``postgres_default`` or the sink's ``conn_id``); the
CLI has none and says which setting to give. What a step may look up travels with its runtime
(``Runtime.connections``) and reaches a sink in its ``ExportContext``: never a module global,
so two pipelines in one process (the view, a test) each see only their own deployment's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


def _undefined(_conn_id: str) -> None:
    return None


@dataclass(frozen=True)
class Connections:
    """Lookups of named connections; each answers None for a name it does not define.

    ``uri``: the connection as a URI (a PostgresSink turns it into a libpq DSN);
    ``settings``: its client settings as a flat mapping (a Kafka client's configuration)."""

    uri: Callable[[str], str | None] = _undefined
    settings: Callable[[str], dict[str, str] | None] = _undefined


NONE = Connections()
"""No connections at all (the CLI): every source and sink must name its own, or the
environment must."""
