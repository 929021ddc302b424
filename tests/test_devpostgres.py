"""The harness's own PostgreSQL: a restart is a real crash and a real start."""

from __future__ import annotations

import os

import psycopg
import pytest

from tridentflow.devtools.devpostgres import LocalPostgres
from tridentflow.errors import TridentflowError


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_restart_aborts_the_open_transaction_and_keeps_what_was_committed():
    """The server crashes (SIGQUIT to the postmaster itself) while a session holds an open
    transaction, and a new postmaster serves the same data: the session is gone, its write
    with it, the committed row kept. (Under runuser, the signal went to runuser, which asked
    for a smart shutdown that waited on that very session, then left the old server running.)"""
    with LocalPostgres() as server:
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (v int)")
            conn.execute("INSERT INTO t VALUES (1)")
        before = server.postmaster_pid()
        assert before == server.proc.pid
        session = psycopg.connect(server.dsn)
        session.execute("INSERT INTO t VALUES (2)")  # in flight
        server.restart()
        assert not alive(before)
        assert server.postmaster_pid() == server.proc.pid != before
        with pytest.raises(psycopg.OperationalError):
            session.execute("SELECT 1")
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("SELECT v FROM t").fetchall() == [(1,)]


def test_a_port_held_by_another_server_is_refused_in_one_line():
    """Two servers on one port: the second does not take the first's answers for its own."""
    with LocalPostgres() as first:
        second = LocalPostgres()
        second.port = first.port
        with pytest.raises(TridentflowError, match=r"did not start|not the PostgreSQL"):
            second.start()
        assert alive(first.proc.pid)
