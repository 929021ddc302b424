"""Connections: Redis (``redis_default``) and Spark (``spark_default``).

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
