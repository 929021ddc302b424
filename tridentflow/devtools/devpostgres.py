"""A local PostgreSQL from Debian's ``postgresql`` package, for tests and the chaos harness.

``LocalPostgres`` runs ``initdb`` (trust auth, user ``postgres``) in a directory of its own and
starts ``postgres`` on a free port, as the ``postgres`` user when run as root (initdb refuses
root); ``restart`` stops it the hard way (``immediate``: transactions in flight are aborted,
as in a crash) and starts it again on the same port and data. ``system_dsn`` answers whether
the machine's own server (127.0.0.1:5432, trust auth) is there to use instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tridentflow.devtools.devredis import free_port
from tridentflow.errors import TridentflowError

SYSTEM_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def answers(dsn: str, timeout: int = 3) -> bool:
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=timeout):
            return True
    except psycopg.Error:
        return False


def data_directory(dsn: str) -> Path | None:
    """The data directory of the server answering at ``dsn`` (None if none answers)."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            row = conn.execute("SHOW data_directory").fetchone()
    except psycopg.Error:
        return None
    return Path(row[0]).resolve() if row else None


def system_dsn() -> str | None:
    """The machine's PostgreSQL at 127.0.0.1:5432 if it answers (trust auth), else None."""
    return SYSTEM_DSN if answers(SYSTEM_DSN) else None


def bin_dir() -> Path | None:
    """The newest ``/usr/lib/postgresql/N/bin`` holding ``initdb`` (Debian's layout)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


class LocalPostgres:
    """A throwaway PostgreSQL server (see the module doc). Use as a context manager."""

    def __init__(self, directory: Path | None = None) -> None:
        bindir = bin_dir()
        if bindir is None:
            raise TridentflowError(
                "no PostgreSQL to start: install Debian's postgresql package "
                "(apt-get install postgresql), or point TRIDENTFLOW_POSTGRES_DSN at a server"
            )
        self.bindir = bindir
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="tf-pg-"))
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        # initdb and postgres refuse root: run them as the postgres user, as processes of
        # their own (not under runuser, which would answer a stop's signal itself - a
        # SIGQUIT became a smart shutdown that waited on the open sessions)
        self._user = {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}

    @property
    def data(self) -> Path:
        """The server's data directory (initdb's -D)."""
        return self.directory / "db"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> LocalPostgres:
        data = self.data
        if self._user:
            shutil.chown(self.directory, "postgres", "postgres")
        if not data.exists():
            subprocess.run(
                [str(self.bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
                check=True, capture_output=True, cwd=self.directory, **self._user,
            )  # fmt: skip
        self.proc = subprocess.Popen(
            [str(self.bindir / "postgres"), "-D", str(data), "-p", str(self.port),
             "-h", "127.0.0.1", "-k", str(self.directory), "-c", "fsync=off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            cwd=self.directory, **self._user,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not answers(self.dsn, timeout=1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise TridentflowError(f"the local PostgreSQL on port {self.port} did not start")
            time.sleep(0.1)
        # another server answers on our port (its postmaster.pid alone does not tell: ours
        # writes it before it fails to bind the port), or on our data directory
        if data_directory(self.dsn) != data.resolve() or self.postmaster_pid() != self.proc.pid:
            self.proc.kill()
            raise TridentflowError(
                f"port {self.port} answers, but not the PostgreSQL this started "
                f"(pid {self.proc.pid}): stop the other server on {data}"
            )
        return self

    def postmaster_pid(self) -> int | None:
        """The PID the server on this data directory wrote (postmaster.pid), None if none."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self, immediate: bool = False) -> None:
        """Stop the server: ``immediate`` aborts what is in flight (SIGQUIT), else a fast
        shutdown (SIGINT: transactions rolled back, clients disconnected)."""
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGQUIT if immediate else signal.SIGINT)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """A crash and a restart: everything in flight aborted, committed data kept."""
        self.stop(immediate=True)
        self.start()

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)
