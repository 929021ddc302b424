"""Every Spark Connect call is bounded and fails in one line naming the endpoint: a port that
accepts TCP but is not Spark Connect (the client alone retried for 10+ minutes), a server
killed in the middle of an emit (the client waited ~11 minutes, then printed a gRPC object),
and a job still running at its deadline. After each, the pipeline resumes exactly."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis

from tests.conftest import ROOT
from tridentflow.devtools import connect_server, devredis

pytestmark = pytest.mark.spark
SLOW = "tests.pipelines:slow"


def one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr[-2000:]
    return lines[0]


def _serve(listener: socket.socket, reply: bytes, accepted: list[socket.socket]) -> None:
    """Accept connections and answer each with ``reply`` (nothing: a silent server)."""
    while True:
        try:
            conn, _addr = listener.accept()
        except OSError:
            return
        accepted.append(conn)
        if reply:
            conn.sendall(reply)


def test_a_port_that_is_not_spark_connect_fails_within_the_handshake_deadline(tf, cli_env):
    """The same for a server that never answers and one that answers garbage."""
    for reply in (b"", b"HTTP/1.1 400 Bad Request\r\n\r\n"):
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        port = listener.getsockname()[1]
        accepted: list[socket.socket] = []
        serve = functools.partial(_serve, listener, reply, accepted)
        threading.Thread(target=serve, daemon=True).start()
        started = time.monotonic()
        done = tf("run", "wordcount", "--remote", f"sc://127.0.0.1:{port}",
                  env={"TRIDENTFLOW_CONNECT_TIMEOUT_S": "3"}, timeout=120)  # fmt: skip
        took = time.monotonic() - started
        listener.close()
        line = one_line(done)
        assert f"cannot reach Spark Connect at sc://127.0.0.1:{port} within 3s" in line, line
        assert "TRIDENTFLOW_CONNECT_TIMEOUT_S" in line and "<_" not in line
        assert took < 15, took


def _server_pid(home: Path) -> int:
    (pid_file,) = (home / "spark-connect").rglob("*.pid")
    return int(pid_file.read_text().split()[0])


@pytest.mark.soak  # the soak lane, CI runs it after the suite (README)
def test_a_server_killed_mid_emit_fails_the_run_in_one_line_then_it_resumes(
    tf, cli_env, tmp_path, connect_url
):
    home = tmp_path / "connect-home"
    port = devredis.free_port()
    url = connect_server.start(home, port, "local[2]")
    env = {"TRIDENTFLOW_CONNECT_RETRY_S": "4"}
    lines = "\n".join(f"w{i % 7} w{i % 3} every" for i in range(800)) + "\n"
    assert tf("produce", SLOW, "-", input=lines).returncode == 0
    try:
        run = subprocess.Popen(
            [str(Path(os.sys.executable).with_name("tridentflow")), "run", SLOW, "--remote", url],
            env={**cli_env, **env}, cwd=ROOT, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        ledger = redis.Redis.from_url(cli_env["TRIDENTFLOW_REDIS_URL"])
        deadline = time.monotonic() + 120
        while run.poll() is None and time.monotonic() < deadline:  # until txid 1 is emitting
            if ledger.hget("tf:{slow}:tx:1", "emit_attempts"):
                break
            time.sleep(0.1)
        time.sleep(2)  # its Spark job under way (800 records at 20 ms each)
        assert run.poll() is None, run.stderr.read() if run.stderr else ""
        os.kill(_server_pid(home), signal.SIGKILL)
        killed = time.monotonic()
        _out, err = run.communicate(timeout=180)
        took = time.monotonic() - killed
    finally:
        if connect_server.answering(port):
            connect_server.stop(home, port)
    assert run.returncode == 1 and len(err.strip().splitlines()) == 1, err[-2000:]
    assert f"Spark Connect at {url} stopped answering during the job" in err, err
    assert "_MultiThreadedRendezvous" not in err and took < 60, (took, err)

    again = tf("run", SLOW, "--remote", connect_url, env=env)  # another server: the same txid
    assert again.returncode == 0, again.stderr[-2000:]
    assert tf("audit", SLOW).stdout.strip() == "lost=0 doubled=0"
    assert tf("query", SLOW, "every").stdout.split() == ["every", "800"]


def test_a_job_past_its_deadline_is_interrupted_in_one_line(tf, connect_url):
    lines = "\n".join(f"w{i % 5}" for i in range(400)) + "\n"
    assert tf("produce", SLOW, "-", input=lines).returncode == 0
    started = time.monotonic()
    done = tf("run", SLOW, "--remote", connect_url,
              env={"TRIDENTFLOW_SPARK_JOB_TIMEOUT_S": "1"}, timeout=300)  # fmt: skip
    line = one_line(done)
    assert f"Spark Connect at {connect_url}: the job did not finish within 1s" in line, line
    assert time.monotonic() - started < 60
    assert tf("run", SLOW, "--remote", connect_url).returncode == 0  # no deadline: it commits
    assert tf("audit", SLOW).stdout.strip() == "lost=0 doubled=0"
