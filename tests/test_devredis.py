"""``tridentflow dev-redis`` knows its own server: it reuses the one it started, and never
adopts (nor stops) another redis-server that happens to answer on its port."""

from __future__ import annotations

import io

import pytest
import redis

from tridentflow.devtools import devredis
from tridentflow.errors import TridentflowError
from tridentflow.ops.cli import main


def test_dev_redis_reuses_its_own_server_and_refuses_a_strangers(tmp_path, capsys):
    port = devredis.free_port()
    stranger = devredis.start(port, tmp_path / "stranger")  # someone else's, other data
    try:
        with pytest.raises(TridentflowError, match=rf"port {port} is held by a redis-server "
                           "tridentflow did not start there") as refused:  # fmt: skip
            devredis.ensure_daemon(port, tmp_path / "ours")
        assert "\n" not in str(refused.value) and "--port N" in str(refused.value)
        out = io.StringIO()
        code = main(["dev-redis", "--port", str(port), "--dir", str(tmp_path / "ours")], out)
        assert code != 0 and "--port N" in capsys.readouterr().err
        stop = ["dev-redis", "--port", str(port), "--dir", str(tmp_path / "ours"), "--stop"]
        assert main(stop, io.StringIO()) != 0
        assert devredis.ping(port)  # the stranger's server still runs
    finally:
        stranger.terminate()
        stranger.wait(10)
    ours = tmp_path / "ours"
    url = devredis.ensure_daemon(port, ours)  # a free port: ours starts there
    try:
        assert url == f"redis://127.0.0.1:{port}/0"
        assert devredis.ensure_daemon(port, ours) == url  # and is reused, being ours
    finally:
        assert devredis.shutdown(port, ours)


def test_a_server_started_on_a_port_another_answers_on_is_refused_not_shared(tmp_path):
    """The family 'tests sharing a server': two test workers pick the same free port; the
    second redis-server cannot bind it, and the first answers the readiness ping - the second
    worker then ran on the first one's data (a live Airflow test found a txid held by another
    worker's `cli-` run). ``start`` checks that the server answering is the one it started."""
    port = devredis.free_port()
    assert devredis.FREE_PORTS.start <= port < devredis.FREE_PORTS.stop  # not an ephemeral one
    first = devredis.start(port, tmp_path / "first", appendonly=False)
    try:
        redis_client = redis.Redis(port=port)
        redis_client.set("mine", "first")
        with pytest.raises(devredis.PortTakenError, match=rf"port {port} is answered by another"):
            devredis.start(port, tmp_path / "second", appendonly=False)
        assert redis_client.get("mine") == b"first"  # the first server, untouched
        assert devredis.server_pid(port) == first.pid
    finally:
        first.terminate()
        first.wait(10)
