"""Shared fixtures: a real redis-server per test session (free port), a Spark session, a CLI.

Every xdist worker starts its own redis-server, so tests run in parallel without sharing state.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.cli_zygote_client import CliZygote
from tridentflow.devtools import devredis

ROOT = Path(__file__).resolve().parents[1]
CONSOLE_SCRIPT = str(Path(sys.executable).with_name("tridentflow"))
"""The ``tridentflow`` console script of this venv."""
pytest_plugins = ["tests.quiet_shutdown"]

SHORT_LIVED_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Java options for every JVM the tests start (spark-submit, the in-process Spark, Connect
servers, a standalone cluster's daemons): each lives seconds on a few records, where the C1
compiler alone and the serial collector start Spark on less CPU - CPU that two workers on two
cores share. A user's JVMs are not touched; options already in the environment win."""
for _opts in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ.setdefault(_opts, SHORT_LIVED_JVM)
SEED_SENTENCES = ["how are you", "nice to meet you", "what a good day"]
SEED_COUNTS = {
    "how": 1,
    "are": 1,
    "you": 2,
    "nice": 1,
    "to": 1,
    "meet": 1,
    "what": 1,
    "a": 1,
    "good": 1,
    "day": 1,
}


def _start_order(item: pytest.Item) -> int:
    """Longest first: a live Airflow stack's tests (one worker, one after the other), then
    the tests that start Airflow, Spark or a clean venv, the chaos soak, the rest."""
    if item.get_closest_marker("xdist_group") is not None:
        return 0
    for rank, marker in enumerate(("airflow", "spark", "wheel", "soak"), start=1):
        if item.get_closest_marker(marker) is not None:
            return rank
    return 5


FAST_LANE = "TRIDENTFLOW_TEST_LANE"
"""Set to ``fast`` by ``scripts/test.sh --fast``: the lane starts no server topology of a
test's own (a Redis Cluster, replicas, a TLS or ACL Redis, a Kafka broker)."""


def pytest_configure(config: pytest.Config) -> None:
    """In the fast lane, starting a server topology fails the test in one line - as its
    ``java`` refuses a JVM - so a test that needs one and is not marked ``servers`` is found
    there, not left to slow every change down."""
    if os.environ.get(FAST_LANE) == "fast":
        refuse_server_topologies(setattr)


SERVERS_REFUSED = "the fast lane starts no server topology of its own: mark the test servers"


def refuse_server_topologies(patch: Callable[[Any, str, Any], None]) -> None:
    """Make every way a test starts a server topology raise SERVERS_REFUSED, through
    ``patch(owner, name, replacement)`` (``setattr``, or a test's ``monkeypatch.setattr``)."""
    from tests import secure_redis
    from tridentflow.devtools.devcluster import LocalCluster
    from tridentflow.devtools.devkafka import LocalKafka

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError(SERVERS_REFUSED)

    patch(LocalCluster, "start", refuse)
    patch(LocalKafka, "start", refuse)
    patch(secure_redis, "start", refuse)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the long tests first (xdist hands tests out in this order): a long one left for
    the end keeps one worker busy while the other is idle. Stable, so every worker collects
    the same order."""
    items.sort(key=_start_order)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    port = devredis.free_port()
    proc = devredis.start(port, tmp_path_factory.mktemp("redis"), appendonly=False)
    yield port
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def redis_url(redis_server: int) -> str:
    return f"redis://127.0.0.1:{redis_server}/0"


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.close()


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """An admin DSN of a running PostgreSQL (tests.postgres.server)."""
    from tests.postgres import server

    with server() as dsn:
        yield dsn


@pytest.fixture
def pg_dsn(postgres_server: str) -> Iterator[str]:
    """The DSN of a fresh database for this test."""
    from tests.postgres import fresh_database

    with fresh_database(postgres_server) as dsn:
        yield dsn


@pytest.fixture(scope="session")
def spark():
    """The worker's classic session. A session fixture is set up before a test's function
    fixtures (no_connect_mode_after_the_test among them): an earlier test's in-process Connect
    session may have left pyspark's Connect markers, which would make this one a client."""
    from tridentflow.engines.spark import spark_session

    for marker in CONNECT_MODE_MARKERS:
        os.environ.pop(marker, None)
    session = spark_session("tridentflow-tests", "local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Spark Connect server (``tridentflow spark-connect``) for the session."""
    from tridentflow.devtools import connect_server

    home = tmp_path_factory.mktemp("connect-home")
    port = devredis.free_port()
    url = connect_server.start(home, port, "local[2]")
    yield url
    connect_server.stop(home, port)


@pytest.fixture
def cli_env(redis_url: str, home: Path, redis_client) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TRIDENTFLOW_REDIS_URL=redis_url,
        TRIDENTFLOW_HOME=str(home),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
    )
    env.pop("TRIDENTFLOW_FAULTS", None)
    for leaked in CONNECT_MODE_MARKERS:  # a user's shell has no Connect session of this process
        env.pop(leaked, None)
    return env


CONNECT_MODE_MARKERS = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE")
"""What pyspark writes into ``os.environ`` when a process opens a Connect session and does not
remove on ``stop()`` (a remote server's session): left there, every later classic session of
this process, and every child it starts (``tridentflow run``, ``spark-submit``), asks for Connect
and fails with CONNECT_URL_NOT_SET."""


@pytest.fixture(autouse=True)
def no_connect_mode_after_the_test(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts, and leaves the worker, without pyspark's Connect-mode markers, so a test
    that opens a Connect session in-process cannot turn a later test's Spark into a client."""
    for marker in CONNECT_MODE_MARKERS:
        monkeypatch.delenv(marker, raising=False)


@pytest.fixture(scope="session")
def cli_zygote() -> Iterator[CliZygote]:
    """This worker's zygote of the console script (``tests/cli_zygote.py``)."""
    zygote = CliZygote.start()
    yield zygote
    zygote.stop()


@pytest.fixture
def tf(cli_env, cli_zygote):
    """Run the ``tridentflow`` console script; returns CompletedProcess (text).

    Forked from this worker's zygote, which has imported it already (``tests/cli_zygote.py``:
    the same process boundary, streams, environment and exit code, 0.2 s less per run); a run
    under ``PYTHON*`` or locale variables the zygote did not start with is a fresh process."""
    exe = CONSOLE_SCRIPT

    def run(
        *args: str,
        input: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**cli_env, **(env or {})}
        if cli_zygote.can_run(full_env):
            return cli_zygote.run([exe, *args], full_env, ROOT, input=input, timeout=timeout)
        return subprocess.run(
            [exe, *args],
            input=input,
            text=True,
            capture_output=True,
            env=full_env,
            timeout=timeout,
            cwd=ROOT,
        )

    return run


@pytest.fixture
def killable_redis(tmp_path):
    """A redis-server (AOF on) of this test's own, to kill and restart: SIGKILLed at the end."""
    from tridentflow.devtools.chaos import RedisServer

    started = RedisServer(tmp_path / "redis")
    started.start()
    yield started
    started.kill()


@pytest.fixture
def lake(tmp_path, monkeypatch) -> Path:
    """A folder for the lakehouse sinks' tables (and an Iceberg SQL catalog), named by
    TF_TEST_LAKE for the test pipelines that write there."""
    folder = tmp_path / "lake"
    folder.mkdir()
    monkeypatch.setenv("TF_TEST_LAKE", str(folder))
    return folder
