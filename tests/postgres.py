"""A real PostgreSQL for the tests: the machine's at 127.0.0.1:5432 (trust auth, user
postgres) when it answers, else one started from Debian's ``postgresql`` package on a free port
(tridentflow.devtools.devpostgres; ``TRIDENTFLOW_TEST_OWN_POSTGRES=1`` forces that). Each test gets
a fresh database."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from tridentflow.devtools.devpostgres import LocalPostgres, system_dsn

OWN_ENV = "TRIDENTFLOW_TEST_OWN_POSTGRES"


@contextmanager
def server() -> Iterator[str]:
    """The DSN of an admin connection to a running PostgreSQL (started if need be)."""
    found = None if os.environ.get(OWN_ENV) == "1" else system_dsn()
    if found:
        yield found
        return
    with LocalPostgres() as local:
        yield local.dsn


@contextmanager
def fresh_database(admin_dsn: str) -> Iterator[str]:
    """A new, empty database (dropped afterwards); yields its DSN."""
    import psycopg

    name = f"tf_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin_dsn.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def table_rows(dsn: str, table: str, key: str) -> dict:
    """The table as {key: row tuple without the key} (one key column)."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f'SELECT * FROM "{table}"').fetchall()
        names = [d.name for d in conn.execute(f'SELECT * FROM "{table}" LIMIT 0').description]
    i = names.index(key)
    return {r[i]: tuple(v for j, v in enumerate(r) if j != i) for r in rows}
