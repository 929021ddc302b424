"""Connecting to Redis: the URL (argument, environment, a CA file for TLS), a client checked
with PING, errors that name their cause in one line, and the URL as it may be shown.

A URL is never shown with its password (``redacted``); it travels to other processes (the
emit's spark-submit, Spark executors) through the environment or task payloads, never argv.
TLS is ``rediss://``; the CA that signed the server's certificate is the URL parameter
``ssl_ca_certs=FILE`` (``with_ca`` adds it). Certificates are always verified: a failed
verification is an error, never a fallback to plain text.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tridentflow.errors import TridentflowError

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
REDIS_URL_ENV = "TRIDENTFLOW_REDIS_URL"
CA_PARAM = "ssl_ca_certs"


def resolve_redis_url(explicit: str | None = None, ca_file: str | None = None) -> str:
    """The URL to use: ``explicit``, else TRIDENTFLOW_REDIS_URL, else the local default; with
    ``ca_file`` as its TLS CA (see ``with_ca``)."""
    url = explicit or os.environ.get(REDIS_URL_ENV) or DEFAULT_REDIS_URL
    return with_ca(url, ca_file) if ca_file else url


def with_ca(url: str, ca_file: str) -> str:
    """``url`` with ``ca_file`` as the CA its TLS connections verify the server against."""
    parts = urlsplit(url)
    if parts.scheme != "rediss":
        raise TridentflowError(
            f"a Redis CA file is only used over TLS, but {redacted(url)} is not rediss://"
        )
    path = Path(ca_file).expanduser().resolve()
    if not path.is_file():
        raise TridentflowError(f"Redis CA file {ca_file} does not exist")
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != CA_PARAM]
    query.append((CA_PARAM, str(path)))
    return urlunsplit(parts._replace(query=urlencode(query, safe="/")))


SECRET_PARAMS = frozenset({"password", "ssl_password"})
"""URL query parameters redis-py takes as credentials (``?password=``: the login's password,
``?ssl_password=``: the TLS key's). With the URL's own ``user:password@``, every way a URL
carries a secret to redis-py."""


def _password(parts) -> str | None:
    try:
        return parts.password
    except ValueError:  # an unparsable port: the netloc is still shown redacted below
        return None


def url_secrets(url: str) -> set[str]:
    """Every secret ``url`` carries, as written and decoded (what must never be shown)."""
    parts = urlsplit(url)
    found: set[str] = set()
    password = _password(parts)
    if password:
        found |= {password, unquote(password)}
    for pair in parts.query.split("&"):
        name, _eq, raw = pair.partition("=")
        if unquote(name).lower() in SECRET_PARAMS and raw:
            found |= {raw, unquote(raw), unquote(raw.replace("+", " "))}
    return {secret for secret in found if secret}


def redacted(url: str) -> str:
    """The URL with every secret (the password, ``?password=``, ``?ssl_password=``) shown as
    ``***``, for messages."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _at, host = netloc.rpartition("@")
        user, colon, _password = userinfo.partition(":")
        netloc = f"{user}:***@{host}" if colon else netloc
    query = "&".join(
        f"{name}=***" if unquote(name).lower() in SECRET_PARAMS else f"{name}{eq}{raw}"
        for name, eq, raw in (pair.partition("=") for pair in parts.query.split("&"))
        if name or eq
    )
    shown = urlunsplit(parts._replace(netloc=netloc, query=query))
    if url.startswith(f"{parts.scheme}://") and not shown.startswith(f"{parts.scheme}://"):
        shown = f"{parts.scheme}://{shown[len(parts.scheme) + 1 :]}"  # unix:///path keeps //
    return shown


def scrubbed(text: str, url: str) -> str:
    """``text`` with every secret of ``url`` (as written, and decoded) replaced by ``***``."""
    for secret in sorted(url_secrets(url), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def redis_user(url: str) -> str:
    """The Redis (ACL) user a URL logs in as."""
    return urlsplit(url).username or "default"


def _tls_hint(url: str, text: str) -> str | None:
    """A one-line explanation of a TLS failure, None if ``text`` is not one."""
    shown = redacted(url)
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        detail = text.split("certificate verify failed:")[-1].split("(")[0].strip(" )")
        return (
            f"TLS with Redis at {shown} failed: the server's certificate could not be verified"
            f" ({detail or 'certificate verify failed'}); give the CA that signed it"
            f" (--redis-ca FILE, or {CA_PARAM}=FILE in the URL)"
        )
    if "WRONG_VERSION_NUMBER" in text or "wrong version number" in text:
        return f"TLS with Redis at {shown} failed: the port does not speak TLS (use redis://)"
    if urlsplit(url).scheme == "rediss" and ("SSL" in text or "ssl" in text):
        return f"TLS with Redis at {shown} failed: {text}"
    return None


CLIENT_OPTIONS = {"socket_connect_timeout": 5, "socket_timeout": 60, "health_check_interval": 30}

NO_RESEND = Retry(NoBackoff(), 0)
"""The client never sends a command again after a timeout or a lost connection (redis-py's
``Redis()`` would, up to 10 times; its cluster client 3): the first send may still run - a
paused Redis runs it once it goes on, a cut connection ran the whole commands it delivered -
and a command sent twice may run twice. A step that fails is retried whole, by its
orchestrator; each step is idempotent as a whole, a single command need not be."""


def connect(url: str, socket_timeout: float | None = None) -> redis.Redis:
    """A Redis client for ``url``, checked with PING; a clear one-line error if Redis is
    unreachable, refuses the login, fails TLS, or does not let this user PING.
    ``socket_timeout``: seconds a command may wait for its answer (default 60; then it fails
    with a timeout, though Redis may still run it later - the chaos harness's paused-Redis
    family shortens it). The client never sends a command again (NO_RESEND), nor does a
    cluster client: a node's failure fails the command and makes it find the nodes again
    (where the slots are now), and the step fails, to be retried whole; a MOVED
    redirection (nothing ran) is still followed.

    A URL naming any node of a Redis Cluster gives a cluster client (cluster mode is detected
    with INFO): every key of a pipeline shares one hash tag, so each script's keys live in one
    slot and one node."""
    shown = redacted(url)
    options: dict[str, object] = dict(CLIENT_OPTIONS)
    if socket_timeout is not None:
        options["socket_timeout"] = socket_timeout
    try:
        client = redis.Redis.from_url(url, retry=NO_RESEND, **options)
        client.ping()
        if _cluster_enabled(client):  # (a db other than 0 failed at SELECT, below)
            client.close()
            client = redis.RedisCluster.from_url(url, retry=NO_RESEND, **options)
            client.ping()
    except redis.AuthenticationError as exc:  # before ConnectionError: it is one
        raise TridentflowError(f"Redis at {shown} refused the login: {exc}") from None
    except redis.exceptions.NoPermissionError as exc:
        raise TridentflowError(
            f"Redis user {redis_user(url)!r} at {shown} may not run PING: {exc}"
        ) from None
    except redis.ResponseError as exc:
        if "SELECT is not allowed in cluster mode" in str(exc):
            raise TridentflowError(
                f"{shown} is a Redis Cluster node: a cluster has only database 0"
            ) from None
        raise TridentflowError(f"Redis at {shown} refused to connect: {exc}") from None
    except (redis.ConnectionError, redis.TimeoutError, ValueError, OSError) as exc:
        text = str(exc)
        raise TridentflowError(
            _tls_hint(url, text) or f"cannot reach Redis at {shown}: {text}"
        ) from None
    return client


def _cluster_enabled(client: redis.Redis) -> bool:
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    except redis.exceptions.NoPermissionError:
        return False  # a user without INFO: a single server is the only thing it can use


def url_of(client: redis.Redis) -> str:
    """A URL that opens a client like ``client`` (user, password, TLS CA, db), for other
    processes; prefer the URL the client was opened with where it is known."""
    if isinstance(client, redis.RedisCluster):
        node = client.get_default_node()
        kw = {**client.nodes_manager.connection_kwargs, "host": node.host, "port": node.port}
        connection_class = kw.get("connection_class")
    else:
        kw = client.connection_pool.connection_kwargs
        connection_class = client.connection_pool.connection_class
    auth = ""
    if kw.get("password"):
        auth = f"{quote(kw.get('username') or '', safe='')}:{quote(kw['password'], safe='')}@"
    if kw.get("path"):
        return f"unix://{auth}{kw['path']}?db={kw.get('db', 0)}"
    tls = "ssl_ca_certs" in kw or connection_class is redis.SSLConnection
    scheme = "rediss" if tls else "redis"
    url = f"{scheme}://{auth}{kw.get('host', '127.0.0.1')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"
    if kw.get("ssl_ca_certs"):
        url += f"?{CA_PARAM}={kw['ssl_ca_certs']}"
    return url
