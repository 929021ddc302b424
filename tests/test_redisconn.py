"""tridentflow's Redis client (tridentflow.redisconn.connect) never sends a command again:
a command whose answer was lost - Redis paused past the socket timeout, a connection cut after
the command went out - may still run, and must run once. (redis-py's ``Redis()`` re-sends up
to 10 times; a step that fails is retried whole by its orchestrator instead.)"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import redis

from tridentflow.devtools import devredis
from tridentflow.devtools.chaos.torn import TearingProxy
from tridentflow.redisconn import connect


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test's own (it is stopped with SIGSTOP)."""
    port = devredis.free_port()
    proc = devredis.start(port, tmp_path, appendonly=False)
    yield port, proc
    os.kill(proc.pid, signal.SIGCONT)
    proc.terminate()
    proc.wait(timeout=10)


def test_a_command_that_timed_out_is_not_sent_again(own_redis):
    port, proc = own_redis
    client = connect(f"redis://127.0.0.1:{port}/0", socket_timeout=0.3)
    client.set("n", 0)
    os.kill(proc.pid, signal.SIGSTOP)
    threading.Timer(1.0, os.kill, (proc.pid, signal.SIGCONT)).start()
    started = time.monotonic()
    with pytest.raises(redis.TimeoutError):
        client.incr("n")
    assert time.monotonic() - started < 0.9  # failed at the timeout, not after the pause
    time.sleep(1.3)  # Redis went on: it ran the INCR it had
    assert int(client.get("n")) == 1


def test_a_command_whose_connection_was_cut_is_not_sent_again(own_redis):
    port, _proc = own_redis
    proxy = TearingProxy(port)
    try:
        client = connect(f"redis://127.0.0.1:{proxy.port}/0")
        client.set("n", 0)
        incr = b"*3\r\n$6\r\nINCRBY\r\n$1\r\nn\r\n$1\r\n1\r\n"  # redis-py's INCR
        proxy.arm(len(incr))  # the first INCR whole, its answer lost
        pipe = client.pipeline(transaction=False)
        pipe.incr("n")
        pipe.incr("n")  # cut inside this one: it never runs
        with pytest.raises(redis.ConnectionError):
            pipe.execute()
        assert int(client.get("n")) == 1
    finally:
        proxy.close()
