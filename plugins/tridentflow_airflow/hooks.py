"""Connections: Redis (``redis_default``), Spark (``spark_default``) and, for a pipeline with
a PostgresSink, PostgreSQL (``postgres_default``).

A missing connection is a clear error, never a silent fallback (the Spark hook would otherwise
submit to yarn).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseHook

from tridentflow.connections import Connections
from tridentflow.redisconn import CA_PARAM, with_ca
from tridentflow_airflow.compat import AirflowNotFoundException
from tridentflow_airflow.config import use_airflow_config
from tridentflow_airflow.errors import MissingConnectionError

use_airflow_config()  # tridentflow's settings: TRIDENTFLOW_*, then Airflow's [tridentflow]
TRUE = ("1", "true", "yes")


def _connection(conn_id: str, example: str):
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        raise MissingConnectionError(
            f"Airflow connection {conn_id!r} is not defined; e.g. set "
            f"AIRFLOW_CONN_{conn_id.upper()}='{example}'"
        ) from None


class TridentflowRedisHook(BaseHook):
    """Builds the Redis URL of a connection: host, port, db (schema or extra ``db``),
    optional login (an ACL user) and password, TLS (``rediss://``) when the connection type is
    ``rediss`` or extra ``ssl`` is true, with extra ``ssl_ca_certs`` as the CA file."""

    conn_name_attr = "redis_conn_id"
    default_conn_name = "redis_default"
    conn_type = "redis"
    hook_name = "tridentflow Redis"

    def __init__(self, redis_conn_id: str = default_conn_name) -> None:
        super().__init__()
        self.redis_conn_id = redis_conn_id

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """How the UI's connection form shows a Redis connection."""
        return {
            "hidden_fields": [],
            "relabeling": {"schema": "Database number", "login": "ACL user (optional)"},
            "placeholders": {
                "host": "redis.example.com",
                "port": "6379",
                "schema": "1",
                "extra": '{"ssl": true, "ssl_ca_certs": "/etc/ssl/redis-ca.pem"}',
            },
        }

    def get_url(self) -> str:
        """The Redis URL of the connection, looked up through the Task SDK (in a task)."""
        return redis_url_of(
            _connection(self.redis_conn_id, '{"conn_type":"redis","host":"127.0.0.1","port":6379}'),
            self.redis_conn_id,
        )


def redis_url_of(conn: Any, conn_id: str) -> str:
    """The redis-py URL of an Airflow ``redis`` (or ``rediss``) connection: host, port,
    login/password, ``extra.db`` or the schema as the database, ``extra.ssl`` or the type for
    TLS, ``extra.ssl_ca_certs`` as the CA file."""
    if not conn.host:
        raise MissingConnectionError(f"Airflow connection {conn_id!r} has no host")
    extra = conn.extra_dejson
    db = extra.get("db", conn.schema or 0)
    tls = conn.conn_type == "rediss" or str(extra.get("ssl", "")).lower() in TRUE
    auth = ""
    if conn.password:
        auth = f"{quote(conn.login or '', safe='')}:{quote(conn.password, safe='')}@"
    url = f"{'rediss' if tls else 'redis'}://{auth}{conn.host}:{conn.port or 6379}/{int(db)}"
    if extra.get(CA_PARAM):
        url = with_ca(url, extra[CA_PARAM])
    return url


def server_redis_url(conn_id: str = TridentflowRedisHook.default_conn_name) -> str | None:
    """The Redis URL of connection ``conn_id`` as an Airflow server (the api-server, where the
    view runs) finds it: environment, secrets backends, then the metadata DB - the connection
    the tasks use. None if it is not defined."""
    from airflow.models.connection import Connection

    try:
        conn = Connection.get_connection_from_secrets(conn_id)
    except AirflowNotFoundException:
        return None
    return redis_url_of(conn, conn_id)


def check_spark_connection(conn_id: str) -> str:
    """The Spark master a connection names; MissingConnectionError if it does not exist."""
    conn = _connection(conn_id, '{"conn_type":"spark","host":"local[*]"}')
    if not conn.host:
        raise MissingConnectionError(f"Airflow connection {conn_id!r} has no host (master)")
    return conn.host if not conn.port else f"{conn.host}:{conn.port}"


def connection_uri(conn_id: str) -> str | None:
    """Airflow connection ``conn_id`` as a URI (a PostgresSink's ``conn_id``: host, port,
    login, password, schema = the database); None if it is not defined."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    return conn.get_uri()


def airflow_connections() -> Connections:
    """Airflow's connections as tridentflow's sources and sinks look them up
    (tridentflow.connections): the operators and the view pass them with their runtime."""
    return Connections(uri=connection_uri, settings=kafka_config)


KAFKA_CONN_ID = "kafka_default"


def kafka_config(conn_id: str = KAFKA_CONN_ID) -> dict[str, str] | None:
    """The confluent-kafka client settings of Airflow connection ``conn_id``: its extra JSON,
    as the apache-kafka provider's ``kafka`` connection type keeps them
    (``{"bootstrap.servers": ..., "security.protocol": ..., "sasl.password": ...}``); None if
    it is not defined."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    extra = conn.extra_dejson
    config = {str(k): str(v) for k, v in extra.items()} if isinstance(extra, dict) else {}
    if not config.get("bootstrap.servers") and conn.host:
        config["bootstrap.servers"] = f"{conn.host}:{conn.port or 9092}"
    return config or None
