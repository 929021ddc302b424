"""Helpers for the integration tests: sentences, runtimes, reference counts."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from tridentflow.devtools.sample_data import WORDS, sentences, word_counts  # noqa: F401 (re-exported)
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import IncompleteBatchError
from tridentflow.faults import FaultPlan, InjectedFaultError, SimulatedCrash
from tridentflow.registry import load_pipeline
from tridentflow.steps.driver import run_batches
from tridentflow.steps.runtime import Runtime


def runtime(name: str, redis_url: str, home: Path, faults: str = "") -> Runtime:
    return Runtime.open(load_pipeline(name), redis_url, home, FaultPlan.parse(faults))


def produce(rt: Runtime, lines: list[str]) -> None:
    rt.source_heads()
    rt.log.append_spread(lines)


def drain_retrying(rt: Runtime, batch_size: int, tries: int = 40) -> None:
    """Run txids until the source is drained, each failure retried as Airflow retries a task
    (the same txid replays): an injected fault (raise or crash) or a batch refused as
    incomplete (lose-tuple). AssertionError if it never drains."""
    for _ in range(tries):
        try:
            run_batches(rt, LocalEngine(), batch_size=batch_size)
            return
        except (InjectedFaultError, SimulatedCrash, IncompleteBatchError):
            continue
    raise AssertionError(f"did not drain in {tries} tries")


def assert_caught(results, pattern: str) -> None:
    """A planted bug's run of the chaos harness: its last schedule failed (the harness stops
    at the first), and with the difference the bug makes (``pattern``, a regex) - not some
    unrelated failure."""
    import re

    last = results[-1]
    assert not last.ok, f"{len(results)} schedules did not expose it"
    assert re.search(pattern, last.difference or ""), last.line()


def lua_planted(after: str, lua: str):
    """``LuaScript.__call__`` with a planted bug inside Redis: every state script whose source
    holds the line ``after`` runs with ``lua`` inserted right below it (a new script, its own
    SHA)."""
    from tridentflow_state.scripts import LuaScript

    original = LuaScript.__call__
    planted: dict[str, LuaScript] = {}

    def call(self, client, keys, args):
        if after not in self.source:
            return original(self, client, keys, args)
        if self.name not in planted:
            planted[self.name] = LuaScript(self.name, self.source.replace(after, after + lua))
        return original(planted[self.name], client, keys, args)

    return call


def plant_in_lua(monkeypatch, after: str, lua: str) -> None:
    """``lua_planted`` for this test."""
    from tridentflow_state.scripts import LuaScript

    monkeypatch.setattr(LuaScript, "__call__", lua_planted(after, lua))


@contextlib.contextmanager
def moto_s3(*buckets: str, process: bool = False) -> Iterator[str]:
    """A real S3 API on loopback (moto's server) holding ``buckets``; its endpoint URL. The
    credentials are ``k`` / ``s``, the region us-east-1. ``process``: the server in a process
    of its own, for a client that holds the GIL while it waits on the store (delta-rs's
    ``load_cdf`` and ``is_deltatable``: a server thread of this process could never answer)."""
    import subprocess
    import sys

    import boto3
    from moto.server import ThreadedMotoServer

    from tridentflow.devtools.devredis import free_port

    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    if process:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        stop = server.terminate
    else:
        threaded = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
        threaded.start()
        stop = threaded.stop
    try:
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="k",
                              aws_secret_access_key="s", region_name="us-east-1")  # fmt: skip
        for tries_left in reversed(range(100)):  # a process's server: until it answers
            try:
                for bucket in buckets:
                    client.create_bucket(Bucket=bucket)
                break
            except Exception:
                if not tries_left:
                    raise
                time.sleep(0.1)
        yield endpoint
    finally:
        stop()
