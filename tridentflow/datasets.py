"""What a pipeline reads and writes, named as OpenLineage names datasets (a namespace and a
name; https://openlineage.io/docs/spec/naming). Plain data: no OpenLineage, no Airflow.

* the file log: ``file`` and its directory;
* Kafka: ``kafka://HOST:PORT`` (the first bootstrap server) and the topic;
* Redis: ``redis://HOST:PORT`` (``/DB`` when not 0) and the key - a stream, a state's hash;
* PostgreSQL: ``postgres://HOST:PORT`` and ``DATABASE.SCHEMA.TABLE``.

Sources and sinks name their own (``lineage_datasets``); a source or sink of your own that
names none is ``tridentflow`` / ``PIPELINE/NAME``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

DEFAULT_NAMESPACE = "tridentflow"
"""The namespace of a source or sink that does not say where it lives."""


@dataclass(frozen=True)
class LineageDataset:
    """A dataset as OpenLineage names it. ``partitions``: the source partitions it holds (a
    Redis stream holds one, a topic or the file log all: None)."""

    namespace: str
    name: str
    partitions: tuple[int, ...] | None = None


def redis_namespace(url: str) -> str:
    """``redis://HOST:PORT`` (``/DB`` when not 0) of a redis-py URL, without credentials;
    ``redis+unix://PATH`` for a socket. TLS (rediss://) names the same server."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if parts.scheme == "unix":
        db = (query.get("db") or ["0"])[0]
        return f"redis+unix://{parts.path}" + (f"/{db}" if db != "0" else "")
    db = parts.path.strip("/") or (query.get("db") or ["0"])[0]
    host = parts.hostname or "localhost"
    return f"redis://{host}:{parts.port or 6379}" + (f"/{db}" if db not in ("", "0") else "")


def kafka_namespace(bootstrap_servers: str) -> str:
    """``kafka://HOST:PORT`` of the first of ``bootstrap_servers`` (OpenLineage's naming)."""
    first = bootstrap_servers.split(",")[0].strip()
    if "://" in first:  # SASL_SSL://host:port
        first = first.split("://", 1)[1]
    host, _, port = first.rpartition(":")
    return f"kafka://{host or first}:{port or 9092}" if host else f"kafka://{first}:9092"


def postgres_dataset(dsn: str, table_parts: tuple[str, ...]) -> LineageDataset:
    """``postgres://HOST:PORT`` and ``DATABASE.SCHEMA.TABLE`` (schema ``public`` unless the
    table names one) of a libpq DSN or URI."""
    from psycopg.conninfo import conninfo_to_dict  # a PostgresSink exists only with psycopg

    parts = conninfo_to_dict(dsn)
    host = str(parts.get("host") or "localhost").split(",")[0]
    if host.startswith("/"):  # a socket directory: the server on this machine
        host = "localhost"
    port = str(parts.get("port") or "5432").split(",")[0]
    database = parts.get("dbname") or parts.get("user") or "postgres"
    schema, table = table_parts if len(table_parts) == 2 else ("public", table_parts[-1])
    return LineageDataset(f"postgres://{host}:{port}", f"{database}.{schema}.{table}")


def location_dataset(location: str) -> LineageDataset:
    """A table or a directory at ``location`` (a path, ``file://``, ``s3://bucket/path``), as
    the OpenLineage naming spec names it: the scheme and authority as namespace (``file`` for a
    local path), the path as name."""
    parts = urlsplit(location)
    if parts.scheme in ("", "file"):
        return LineageDataset("file", os.path.abspath(parts.path or location))
    return LineageDataset(f"{parts.scheme}://{parts.netloc}", parts.path or "/")


def iceberg_location(warehouse: str, identifier: str) -> str:
    """Where pyiceberg's catalogs put a new table ``namespace.table``:
    ``warehouse/namespace/table`` (how lineage names an Iceberg table without I/O)."""
    namespace, table = identifier.rsplit(".", 1)
    return f"{warehouse.rstrip('/')}/{namespace}/{table}"
