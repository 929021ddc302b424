"""Torn writes (issue 55): a txid's steps talk to Redis through a proxy that cuts a connection
after a drawn byte, ``python -m tridentflow.devtools.chaos.torn --schedules N --seed S``.

The proxy forwards exactly the bytes before the cut and closes the connection to Redis
cleanly (FIN): Redis runs every command those bytes hold whole - a pipeline of block writes up
to some block, a manifest without what follows it, some of a commit's scripts - never the
command the cut falls inside, and nothing after it (a torn pipeline). The client's side is
reset (RST): its answers are lost, so it cannot tell what ran (an indeterminate write). Or the
cut falls in Redis's answers: every command ran, the client's read is cut off mid-reply.
The cut is drawn anywhere in a step's bytes (of what went that way when it ran whole
before): the coordinator's and the commit's (the driver's connection), the emit's reads,
block writes and manifest (the executors' connection, a proxy of its own). A step that
fails is retried, as Airflow retries it. Checked as the partition drill is
(``checks.drill_checks``): every word's count exact, ``audit`` clean, the history holding
each txid once, no tx hash of a committed txid written again, no staging without its TTL,
no staged block that no index lists; and the ms from each tear to the next commit
(``recovery_ms``). No namespace, no root: the proxies listen on loopback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tridentflow.devtools import devredis
from tridentflow.devtools.chaos.checks import (
    committed_times,
    drill_checks,
    drills_tail,
    drills_totals,
)
from tridentflow.devtools.chaos.config import STEP_FAILURES
from tridentflow.devtools.chaos.partition import SPARK_FAILURES
from tridentflow.devtools.chaos.pauses import recoveries
from tridentflow.engines.base import Engine
from tridentflow.engines.local import LocalEngine
from tridentflow.registry import load_pipeline
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.runtime import Runtime, connect

TEAR_CHANCE = 0.7
"""The chance that a try of a txid's steps has one of them torn (if the drawn byte comes
before that step ends)."""
TORN_TRIES = 4
"""Tries of a txid that may be torn; the ones after run whole (as a fault that passed)."""
SPARK_TORN_TRIES = 2
"""With Spark: tries of a txid whose emit is torn (a Spark job is slow to retry)."""
FIRST_GUESS_BYTES = 4096
"""What a step is taken to send before it was seen whole once."""
OVERSHOOT = 1.1
"""The cut is drawn in [0, OVERSHOOT x the bytes the step sent whole]: now and then past its
end (no tear: the step's answers all came)."""
WORDS = tuple(f"w{n:02d}" for n in range(40))
"""Many distinct keys: a txid's blocks span every state shard, in one pipeline of blocks."""


TO_REDIS, TO_CLIENT = "commands", "answers"
"""The two directions a cut may fall in: the clients' commands, Redis's answers."""


class TearingProxy:
    """A TCP proxy on 127.0.0.1 in front of Redis (``upstream``: its port). ``arm(n)``: the
    next ``n`` bytes of the clients' commands (every connection, in the order they arrive)
    reach Redis, then the connection carrying the next byte is cut - the bytes before it
    forwarded, Redis's side closed (FIN: it runs the whole commands it got), the client's
    reset (RST). ``arm(n, TO_CLIENT)``: the same in Redis's answers - every command ran, the
    client gets ``n`` more bytes of answers, then the reset (a read cut off mid-reply).
    ``disarm`` says whether the cut came. Thread-safe; ``close`` stops it."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._armed: tuple[str, int] | None = None
        self._torn = False
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()
        self.moved = {TO_REDIS: 0, TO_CLIENT: 0}
        """Bytes each way so far (forwarded or not)."""
        self.torn_ms: list[int] = []
        """When each cut came (this host's clock, ms: Redis's, on loopback)."""
        threading.Thread(target=self._accept, name="tf-torn-accept", daemon=True).start()

    def arm(self, after: int, direction: str = TO_REDIS) -> None:
        with self._lock:
            self._armed, self._torn = (direction, max(0, after)), False

    def disarm(self) -> bool:
        with self._lock:
            torn, self._armed, self._torn = self._torn, None, False
            return torn

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _address = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
            for source, sink, direction in ((client, server, TO_REDIS),
                                            (server, client, TO_CLIENT)):  # fmt: skip
                threading.Thread(target=self._pump, args=(source, sink, client, server, direction),
                                 daemon=True).start()  # fmt: skip

    def _cut_at(self, size: int, direction: str) -> int | None:
        """How many of the next ``size`` bytes going ``direction`` pass before the cut; None:
        all, no cut."""
        with self._lock:
            self.moved[direction] += size
            if self._armed is None or self._armed[0] != direction:
                return None
            left = self._armed[1]
            if size <= left:
                self._armed = (direction, left - size)
                return None
            self._armed, self._torn = None, True
            self.torn_ms.append(int(time.time() * 1000))
            return left

    def _pump(
        self,
        source: socket.socket,
        sink: socket.socket,
        client: socket.socket,
        server: socket.socket,
        direction: str,
    ) -> None:
        """Forward ``source`` to ``sink`` until either closes, or up to the cut: then Redis's
        side gets a FIN (it runs the whole commands it got) and the client's a reset."""
        try:
            while data := source.recv(65536):
                cut = self._cut_at(len(data), direction)
                sink.sendall(data if cut is None else data[:cut])
                if cut is not None:
                    server.shutdown(socket.SHUT_WR)
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    client.shutdown(socket.SHUT_RD)  # wakes the other pump's recv: it closes
                    break
        except OSError:
            pass
        finally:
            client.close()  # with SO_LINGER 0 after a cut: a reset
            server.close()


def drill(seed: int, workdir: Path, engine: Engine | None = None) -> dict[str, Any]:
    """4-8 txids of ``wordcount`` (transactional) or ``wordcount-opaque``, staged in Redis,
    state shards 1-3, tears drawn from ``seed``; what the checks found. ``engine``: a Spark
    engine's emits (its executors' Python workers read the source and write the blocks
    through the proxy) instead of the local engine's; 2-3 txids."""
    rng = random.Random(f"torn-{seed}")
    port = devredis.free_port()
    (workdir / "redis").mkdir(parents=True)
    server = subprocess.Popen(devredis.server_args(port, workdir / "redis"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    devredis.wait_ready(port, server)
    driver_proxy, executors_proxy = TearingProxy(port), TearingProxy(port)
    try:
        return _run(rng, seed, workdir, (driver_proxy, executors_proxy), engine or LocalEngine())
    finally:
        driver_proxy.close()
        executors_proxy.close()
        server.kill()


def _run(
    rng: random.Random,
    seed: int,
    workdir: Path,
    proxies: tuple[TearingProxy, TearingProxy],
    engine: Engine,
) -> dict[str, Any]:
    driver_proxy, executors_proxy = proxies
    pipeline = load_pipeline(rng.choice(("wordcount", "wordcount-opaque")))
    shards = rng.randint(1, 3)

    def runtime(proxy: TearingProxy) -> Runtime:
        url = f"redis://127.0.0.1:{proxy.port}/0"
        return Runtime(pipeline, connect(url), workdir / "home", url=url, shards=shards,
                       staging_kind="redis")  # fmt: skip

    driver, executors = runtime(driver_proxy), runtime(executors_proxy)
    driver.ledger.reset(force=True)
    tearer = Tearer(rng)
    steps: dict[str, tuple[TearingProxy, Callable[[int], object]]] = {
        "coordinate": (driver_proxy, lambda txid: coordinate(driver, txid, batch_size=1000)),
        "emit": (executors_proxy, lambda txid: emit(executors, txid, engine)),
        "commit": (driver_proxy, lambda txid: commit(driver, txid)),
    }
    produced: list[str] = []
    spark = engine.name == "spark"
    failures, count = 0, rng.randint(3, 4) if spark else rng.randint(4, 8)
    for txid in range(1, count + 1):
        lines = [
            " ".join(rng.choices(WORDS, k=rng.randint(1, 6))) for _ in range(rng.randint(3, 10))
        ]
        driver.source_heads()
        driver.log.append_spread(lines)
        produced += lines
        failed = _tries_of(rng, txid, steps, tearer, spark)
        if failed is None:
            return {"seed": seed, "ok": False, "difference": f"txid {txid} never committed"}
        failures += failed
    return _result(seed, driver, proxies, produced, failures, tearer.events)


def _tries_of(
    rng: random.Random,
    txid: int,
    steps: dict[str, tuple[TearingProxy, Callable[[int], object]]],
    tearer: Tearer,
    spark: bool,
) -> int | None:
    """``txid``'s three steps tried until they all pass, a failed try retried as Airflow
    retries a task (a failed Spark job too), the first ones torn (``_torn_step``); the tries
    that failed, None if the txid never committed."""
    retried = STEP_FAILURES + SPARK_FAILURES if spark else STEP_FAILURES
    for attempt in range(TORN_TRIES + 2):
        torn = _torn_step(rng, attempt, spark)
        try:
            for name, (proxy, step) in steps.items():
                tearer.run(f"{name}@{txid}", proxy, lambda s=step, t=txid: s(t), name == torn)
            return attempt
        except retried:
            continue
    return None


def _result(
    seed: int,
    driver: Runtime,
    proxies: tuple[TearingProxy, TearingProxy],
    produced: list[str],
    failures: int,
    events: list[str],
) -> dict[str, Any]:
    """The drill checked (``checks.drill_checks``) and counted, with its recovery times."""
    found = drill_checks(driver, produced)
    torn_ms = proxies[0].torn_ms + proxies[1].torn_ms
    return {
        "seed": seed,
        "ok": found["difference"] is None,
        "difference": found["difference"],
        "recovery_ms": recoveries(torn_ms, committed_times(driver)),
        "pipeline": driver.pipeline.name,
        "shards": driver.shards,
        "txids": driver.ledger.committed_txid(),
        "records": len(produced),
        "tears": len(torn_ms),
        "executor_tears": len(proxies[1].torn_ms),
        "step_failures": failures,
        "events": events,
        "lost": found["lost"],
        "doubled": found["doubled"],
    }


def _torn_step(rng: random.Random, attempt: int, spark: bool) -> str | None:
    """Which step of a txid's try ``attempt`` (0, 1, ...) is torn, if any: with TEAR_CHANCE
    one of the three for the first TORN_TRIES tries; with Spark, the emit - its executors
    reading and writing - of the first SPARK_TORN_TRIES tries."""
    if spark:
        return "emit" if attempt < SPARK_TORN_TRIES else None
    if attempt < TORN_TRIES and rng.random() < TEAR_CHANCE:
        return rng.choice(("commit", "coordinate", "emit"))
    return None


class Tearer:
    """Runs a step through its proxy, armed (if ``tear``) to cut its commands or its answers
    (drawn) at a byte drawn over what went that way the last time the step ran whole; notes
    each tear (``events``: STEP@TXID+BYTE, or STEP@TXID-BYTE for an answer cut off)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.whole: dict[tuple[str, str], int] = {}
        """Bytes each step (by name) moved each way the last time it ran untorn."""
        self.events: list[str] = []

    def run(self, label: str, proxy: TearingProxy, step: Callable[[], object], tear: bool) -> None:
        name = label.split("@")[0]
        cut, direction = None, self.rng.choice((TO_REDIS, TO_CLIENT))
        if tear:
            whole = self.whole.get((name, direction), FIRST_GUESS_BYTES)
            cut = self.rng.randint(0, int(whole * OVERSHOOT))
            proxy.arm(cut, direction)
        before = dict(proxy.moved)
        try:
            step()
        finally:
            torn = proxy.disarm()
            if torn:
                self.events.append(f"{label}{'+' if direction == TO_REDIS else '-'}{cut}")
        if not torn:
            for way in (TO_REDIS, TO_CLIENT):
                self.whole[(name, way)] = proxy.moved[way] - before[way]


def summary(results: list[dict[str, Any]]) -> str:
    """The drills in one line: what they did, lost and doubled, the recovery times."""
    total = drills_totals(
        results, ("txids", "records", "tears", "executor_tears", "step_failures", "lost", "doubled")
    )
    return (
        f"torn-write drills: {len(results)} drills, {total['txids']} txids, {total['records']} "
        f"records, {total['tears']} tears ({total['executor_tears']} of the executors' "
        f"writes), {total['step_failures']} failed steps retried, lost={total['lost']} "
        f"doubled={total['doubled']}" + drills_tail(results, "tears")
    )


def run_drills(schedules: int, seed: int, engine: Engine | None = None) -> list[dict[str, Any]]:
    """``schedules`` drills, seeds ``seed``...: one result each."""
    results = []
    for n in range(seed, seed + schedules):
        workdir = Path(tempfile.mkdtemp(prefix="tridentflow-torn-"))
        try:
            results.append(drill(n, workdir, engine))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--schedules", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--plant", help="MODULE:FUNCTION called first (a planted bug, e.g. tests.plants:...)"
    )
    parser.add_argument("--spark", action="store_true", help="emit with Spark (local[2])")
    args = parser.parse_args()
    if args.plant:
        module_name, _, function = args.plant.partition(":")
        getattr(importlib.import_module(module_name), function)()
    engine = None
    if args.spark:
        from tridentflow.engines.spark import SparkEngine, spark_session

        engine = SparkEngine(spark_session("tridentflow-torn", "local[2]"))
    results = run_drills(args.schedules, args.seed, engine)
    for result in results:
        print(json.dumps(result))
    print(summary(results))


if __name__ == "__main__":
    main()
