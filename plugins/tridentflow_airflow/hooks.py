"""Connections: Redis (``redis_default``), Spark (``spark_default``) and, for a pipeline with
a PostgresSink, PostgreSQL (``postgres_default``).

A missing connection is a clear error, never a silent fallback (the Spark hook would otherwise
submit to yarn).
"""

from __future__ import annotations

from urllib.parse import quote

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException

from tridentflow.errors import TridentflowError
from tridentflow.redisconn import CA_PARAM, with_ca

TRUE = ("1", "true", "yes")


class MissingConnectionError(TridentflowError):
    pass


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

    def get_url(self) -> str:
        conn = _connection(
            self.redis_conn_id, '{"conn_type":"redis","host":"127.0.0.1","port":6379}'
        )
        if not conn.host:
            raise MissingConnectionError(f"Airflow connection {self.redis_conn_id!r} has no host")
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


def check_spark_connection(conn_id: str) -> str:
    """The Spark master a connection names; MissingConnectionError if it does not exist."""
    conn = _connection(conn_id, '{"conn_type":"spark","host":"local[*]"}')
    if not conn.host:
        raise MissingConnectionError(f"Airflow connection {conn_id!r} has no host (master)")
    return conn.host if not conn.port else f"{conn.host}:{conn.port}"


def postgres_dsn(conn_id: str) -> str | None:
    """The libpq DSN of Airflow connection ``conn_id`` (a ``postgres`` connection: host,
    port, login, password, schema = the database); None if it is not defined. Installed as
    tridentflow.sinks.postgres.CONNECTION_RESOLVER by the export task."""
    from tridentflow.sinks.postgres import dsn_of_uri

    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    return dsn_of_uri(conn.get_uri())


KAFKA_CONN_ID = "kafka_default"


def kafka_config(conn_id: str = KAFKA_CONN_ID) -> dict[str, str] | None:
    """The confluent-kafka client settings of Airflow connection ``conn_id``: its extra JSON,
    as the apache-kafka provider's ``kafka`` connection type keeps them
    (``{"bootstrap.servers": ..., "security.protocol": ..., "sasl.password": ...}``); None if
    it is not defined. Installed as tridentflow.sources.kafka.CONFIG_RESOLVER by the tasks."""
    try:
        conn = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None
    extra = conn.extra_dejson
    config = {str(k): str(v) for k, v in extra.items()} if isinstance(extra, dict) else {}
    if not config.get("bootstrap.servers") and conn.host:
        config["bootstrap.servers"] = f"{conn.host}:{conn.port or 9092}"
    return config or None
