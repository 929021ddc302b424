"""The live stack over Spark Connect (`tridentflow-airflow up --spark-connect`): a Connect
server killed mid-emit and kept away through every retry; once it is back, the next run commits
everything, with nobody clearing anything (issue 22, goal 1)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.airflow import live
from tests.helpers import runtime, sentences, word_counts
from tridentflow.devtools import connect_server, devredis
from tridentflow.ops.audit import audit
from tridentflow.steps.query import query
from tridentflow_airflow import launcher
from tridentflow_airflow.rest import AirflowApi

pytestmark = [pytest.mark.airflow, pytest.mark.spark]
DAG = "tridentflow_wordcount"


@pytest.fixture(scope="module")
def connect_stack(tmp_path_factory) -> Iterator[tuple[AirflowApi, str, Path, int]]:
    home = tmp_path_factory.mktemp("connect-live-home")
    redis_port, connect_port = devredis.free_port(), devredis.free_port()
    server = devredis.start(redis_port, home / "redis")
    redis_url = f"redis://127.0.0.1:{redis_port}/0"
    env = {  # short retries and Connect deadlines: every try fails within seconds
        "TRIDENTFLOW_RETRY_DELAY_SECONDS": "1",
        "TRIDENTFLOW_RETRIES": "2",
        "TRIDENTFLOW_MAX_RETRY_DELAY_SECONDS": "1",
        "TRIDENTFLOW_CONNECT_TIMEOUT_S": "4",
        "TRIDENTFLOW_CONNECT_RETRY_S": "4",
    }
    try:
        with live.stack(home, redis_url, env, spark_connect=connect_port) as api:
            yield api, redis_url, home, connect_port
    finally:
        server.kill()


def kill_connect_server(home: Path, port: int) -> None:
    """SIGKILL the server's JVM (no graceful stop: a crash)."""
    pid_files = list(connect_server.state_dir(home).glob(f"*tridentflow-{port}*.pid"))
    assert len(pid_files) == 1, pid_files
    pid = int(pid_files[0].read_text().strip())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while connect_server.answering(port):
        assert time.monotonic() < deadline, "the Connect server still answers after SIGKILL"
        time.sleep(0.2)


def counts(rt, words):
    persist = rt.pipeline.states["counts"]
    return dict(zip(words, query(rt, persist, [(w,) for w in words])[1], strict=True))


def test_a_connect_server_killed_mid_emit_heals_with_nobody_clearing(connect_stack):
    api, redis_url, home, port = connect_stack
    ready = launcher.status(home, int(api.base.rsplit(":", 1)[1]))
    assert ready["spark_connect"]["answering"], ready  # `status` shows the Connect server
    rt = runtime("wordcount", redis_url, home)
    committed = rt.ledger.committed_txid()
    lines = sentences(20_000, seed=31)
    rt.source_heads()
    rt.log.append_spread(lines)
    doomed = api.trigger()
    live.wait_task_running(api, doomed, "emit")
    time.sleep(0.5)  # the emit's client is talking to the server (its first job: workers start)
    kill_connect_server(home, port)
    assert api.wait_run(doomed, timeout=300) == "failed"  # every try failed without a server
    emit = api.task(doomed, "emit")
    assert emit["try_number"] == 3, emit  # retries=2: the outage outlasted every retry
    assert rt.ledger.committed_txid() == committed

    connect_server.start(home, port, "local[2]")
    back = time.monotonic()
    healed = api.trigger()
    assert api.wait_run(healed, timeout=240) == "success"
    bound = api.xcom(healed, "coordinate")
    assert bound["txid"] == committed + 1, bound  # the failed run's txid, not a new one
    heads = rt.log.heads()  # the rest in the next runs (the DAG's batch size caps a txid)
    while rt.ledger.committed_offsets() != heads:
        assert api.wait_run(api.trigger(), timeout=240) == "success"
        assert time.monotonic() - back < 180, rt.ledger.committed_offsets()
    took = time.monotonic() - back
    expected = word_counts(lines)
    assert counts(rt, sorted(expected)) == expected
    assert audit(rt).ok
    assert took < 120, f"{took:.0f}s from the Connect server back to everything committed"
