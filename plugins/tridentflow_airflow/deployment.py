"""The deployment a shell's ``tridentflow`` command means when told nothing: the Redis the
Airflow tasks write through (its ``redis_default`` connection, as the api-server finds it:
environment, secrets backends, the metadata DB). Registered under the ``tridentflow.deployments``
entry point, so the CLI (which imports no Airflow) finds it where Airflow is installed.

Asking Airflow costs its start (4-7 s a command). So the answer is remembered beside
``airflow.cfg`` (``$AIRFLOW_HOME/tridentflow-cli.json``, mode 0600: it holds the URL's password
as airflow.cfg holds the DB's), keyed by a digest of everything Airflow's answer comes from -
the ``AIRFLOW_CONN_REDIS_DEFAULT`` variable, else the connection's row in the metadata DB, read
as stored (encrypted) without Airflow - and reused only while that digest is unchanged: an edit
of the connection in the UI is seen by the next command. Where a secrets backend is configured
(its answer cannot be read without Airflow) or the metadata DB cannot be read, Airflow is asked
every time.
"""

from __future__ import annotations

import configparser
import hashlib
import json
import os
from pathlib import Path
from typing import Any

CONN_ID = "redis_default"
CACHE_FILE = "tridentflow-cli.json"
FROM = f"Airflow's connection {CONN_ID}"
DEFAULT_DB = "sqlite:///{AIRFLOW_HOME}/airflow.db"  # Airflow's [database] sql_alchemy_conn


def deployment() -> dict[str, Any] | None:
    """``{"redis_url", "from", "asked_airflow"}`` of Airflow's ``redis_default`` connection;
    None where it is not defined (or Airflow cannot be asked here). Idempotent; the remembered
    answer is used only while what it came from is unchanged."""
    inputs = connection_inputs(CONN_ID)
    if inputs is not None:
        remembered = _remembered(inputs)
        if remembered is not None:
            url = remembered.get("redis_url")
            return {"redis_url": url, "from": FROM, "asked_airflow": False} if url else None
    url = _ask_airflow()
    if inputs is not None:
        _remember(inputs, url)
    return {"redis_url": url, "from": FROM, "asked_airflow": True} if url else None


def _ask_airflow() -> str | None:
    try:
        from tridentflow_airflow.hooks import server_redis_url

        return server_redis_url(CONN_ID)
    except Exception:  # no metadata DB, Airflow not configured here: nothing to say
        return None


class _NeedsAirflow(Exception):
    """What Airflow's answer comes from cannot be read without Airflow."""


def airflow_home() -> Path:
    return Path(os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow"))


def _airflow_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    path = os.environ.get("AIRFLOW_CONFIG") or str(airflow_home() / "airflow.cfg")
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError, OSError) as exc:
        raise _NeedsAirflow("airflow.cfg") from exc  # Airflow itself says what is wrong
    return parser


def _option(parser: configparser.ConfigParser, section: str, key: str) -> str | None:
    """``[section] key`` as Airflow resolves it, where that needs no Airflow: the environment
    variable, else the file. _NeedsAirflow where it comes from a command or a secret."""
    env = f"AIRFLOW__{section.upper()}__{key.upper()}"
    if os.environ.get(f"{env}_CMD") or os.environ.get(f"{env}_SECRET"):
        raise _NeedsAirflow(env)
    if os.environ.get(env):
        return os.environ[env]
    if parser.has_option(section, f"{key}_cmd") or parser.has_option(section, f"{key}_secret"):
        raise _NeedsAirflow(f"[{section}] {key}")
    value = parser.get(section, key, fallback="").strip()
    return value or None


def connection_inputs(conn_id: str) -> str | None:
    """A digest of what Airflow's answer for ``conn_id`` comes from, read without Airflow;
    None where it cannot be read so (a secrets backend, a DB URL from a command, an unreadable
    DB). Airflow's order: a configured secrets backend, the environment, the metadata DB."""
    try:
        return _digest(_inputs(conn_id))
    except _NeedsAirflow:
        return None


def _inputs(conn_id: str) -> list[Any]:
    parser = _airflow_cfg()
    if _option(parser, "secrets", "backend") is not None:
        raise _NeedsAirflow("a secrets backend")
    code = Path(__file__).with_name("hooks.py")  # how a connection becomes a URL
    base = [conn_id, str(code.stat().st_mtime_ns) if code.exists() else ""]
    from_env = os.environ.get(f"AIRFLOW_CONN_{conn_id.upper()}")
    if from_env:
        return [*base, "env", from_env]
    db_url = _option(parser, "database", "sql_alchemy_conn") or DEFAULT_DB
    db_url = db_url.replace("{AIRFLOW_HOME}", str(airflow_home()))
    return [*base, "db", db_url, _connection_row(db_url, conn_id)]


ROW_COLUMNS = "conn_type, host, schema, login, password, port, extra"


def _connection_row(db_url: str, conn_id: str) -> list[str | None] | None:
    """The connection's row as stored (secrets still encrypted), None where there is none;
    _NeedsAirflow where the DB cannot be read here."""
    try:
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        engine = create_engine(db_url, poolclass=NullPool)
        try:
            with engine.connect() as conn:
                row = conn.execute(
                    text(f"SELECT {ROW_COLUMNS} FROM connection WHERE conn_id = :conn_id"),
                    {"conn_id": conn_id},
                ).fetchone()
        finally:
            engine.dispose()
    except Exception as exc:
        raise _NeedsAirflow("the metadata DB") from exc
    return None if row is None else [None if v is None else str(v) for v in row]


def _digest(parts: list[Any]) -> str:
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _cache_path() -> Path:
    return airflow_home() / CACHE_FILE


def _remembered(inputs: str) -> dict[str, Any] | None:
    try:
        entry = json.loads(_cache_path().read_text()).get(CONN_ID)
    except (OSError, ValueError, AttributeError):
        return None
    return entry if isinstance(entry, dict) and entry.get("inputs") == inputs else None


def _remember(inputs: str, url: str | None) -> None:
    """Write the answer for ``inputs`` atomically, readable by its owner only; a home that
    cannot be written is left alone (the next command asks Airflow again)."""
    path = _cache_path()
    tmp = path.with_name(f".{CACHE_FILE}.{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({CONN_ID: {"inputs": inputs, "redis_url": url}}, out)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
