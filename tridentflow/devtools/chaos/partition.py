"""A network partition between a txid's steps and Redis (issue 55), in a network namespace of
its own: ``python -m tridentflow.devtools.chaos.partition`` re-runs itself under
``unshare -n`` (Linux, root), so nothing but its own loopback is touched.

Inside, Redis listens on 127.0.0.1 and 127.0.0.2. The driver (coordinate, commit) reaches it
at 127.0.0.1; the emit - the executors' side, which writes the staged blocks - at 127.0.0.2.
A partition is a routing rule that blackholes one address: packets of the connections
already open are dropped (TCP retransmits them once it heals), new connections fail. It is
drawn per txid at a fault point - ``in-emit`` (blocks written, the manifest not yet) cuts the
executors off mid block-write, ``mid-commit``, ``before-ledger`` and ``after-mark`` cut the
driver off mid-commit - and heals after PARTITION_S, past the clients' socket timeout: the
step fails (a command reported failed may still land once it heals) and is retried as
Airflow retries it. At the end: the counts of every word produced exact, ``audit`` clean,
the history holding each txid once, no tx hash of a committed txid written again, no staging
left without its TTL; and the ms from each heal to the next commit (``recovery_ms``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tridentflow.faults
from tridentflow.devtools import devredis
from tridentflow.devtools.chaos.checks import (
    committed_times,
    drill_checks,
    drills_tail,
    drills_totals,
)
from tridentflow.devtools.chaos.config import STEP_FAILURES
from tridentflow.devtools.chaos.pauses import recoveries
from tridentflow.engines.base import Engine
from tridentflow.engines.local import LocalEngine
from tridentflow.faults import Fault, FaultPlan
from tridentflow.registry import load_pipeline
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.runtime import Runtime, connect

DRIVER, EXECUTORS = "127.0.0.1", "127.0.0.2"
PARTITION_S = 1.0
"""How long a partition lasts: past SOCKET_TIMEOUT_S."""
SOCKET_TIMEOUT_S = 0.3
POINTS = {"in-emit": EXECUTORS, "mid-commit": DRIVER, "before-ledger": DRIVER,
          "after-mark": DRIVER}  # fmt: skip
"""Where a partition may start, and whose address it cuts off."""
SPARK_CUT_CHANCE = 0.8
"""With Spark's executors: the chance that an emit is cut off part-way through its job."""
SPARK_CUT_S = (0.0, 0.4)
"""How far into a Spark emit its cut starts (s): the job's read, block writes or after."""
SPARK_FAILURES: tuple[type[BaseException], ...] = (Exception,)
"""A Spark job that failed (Py4J's error, not one of tridentflow's): Airflow retries it."""
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def prepare_namespace() -> None:
    """In a fresh network namespace: loopback up, 127.0.0.2 on it, the local routing table
    looked up after a slot (pref 5) where a partition's rule goes."""
    _ip("link", "set", "lo", "up")
    _ip("addr", "add", f"{EXECUTORS}/32", "dev", "lo")
    _ip("rule", "del", "pref", "0", "lookup", "local")
    _ip("rule", "add", "pref", "10", "lookup", "local")


class Partitions:
    """Cuts one address off for PARTITION_S (a blackhole rule), healing it in a thread;
    ``wait`` until every cut healed; ``cut_off`` names who the next cut isolates."""

    def __init__(self) -> None:
        self.cut_off = DRIVER
        self._threads: list[threading.Thread] = []
        self.cuts: list[str] = []
        self.healed_ms: list[int] = []
        """When each cut healed (this host's clock, ms: Redis's, on loopback)."""

    def cut(self, address: str | None = None) -> None:
        """Cut ``address`` (default: whom ``cut_off`` names) off; it heals by itself."""
        address = address or self.cut_off
        _ip("rule", "add", "pref", "5", "to", address, "blackhole")
        self.cuts.append(address)

        def heal() -> None:
            time.sleep(PARTITION_S)
            _ip("rule", "del", "pref", "5", "to", address, "blackhole")
            self.healed_ms.append(int(time.time() * 1000))

        thread = threading.Thread(target=heal, daemon=True)
        thread.start()
        self._threads.append(thread)

    def cut_during(self, address: str, delay: float) -> Callable[[], bool]:
        """Cut ``address`` off ``delay`` seconds from now, in a thread, unless the function
        returned is called first; it says whether the cut came."""
        lock, state = threading.Lock(), {"cancelled": False, "cut": False}

        def later() -> None:
            time.sleep(delay)
            with lock:
                if not state["cancelled"]:
                    self.cut(address)
                    state["cut"] = True

        def cancel() -> bool:
            with lock:
                state["cancelled"] = True
                return state["cut"]

        thread = threading.Thread(target=later, daemon=True)
        thread.start()
        self._threads.append(thread)
        return cancel

    def wait(self) -> None:
        while self._threads:
            self._threads.pop().join()


def drill(seed: int, workdir: Path, engine: Engine | None = None) -> dict[str, Any]:
    """4-8 txids of ``wordcount`` (transactional) or ``wordcount-opaque``, partitions drawn
    from ``seed``; what the checks found. Run inside a namespace of its own, prepared
    (``prepare_namespace``). ``engine``: a Spark engine's emits (its executors' Python
    workers write the blocks) instead of the local engine's; 2-3 txids, and most emits cut
    off a drawn moment into the Spark job."""
    rng = random.Random(f"partition-{seed}")
    port = devredis.free_port()
    args = devredis.server_args(port, workdir / "redis")
    args[args.index("--bind") + 1 : args.index("--bind") + 2] = [DRIVER, EXECUTORS]
    args[args.index("--protected-mode") + 1] = "no"  # 127.0.0.2: inside this namespace only
    (workdir / "redis").mkdir(parents=True)
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    devredis.wait_ready(port, server)
    partitions = Partitions()
    tridentflow.faults.PAUSE_HOOK = partitions.cut  # a "pause" fault starts a partition
    try:
        return _run(rng, seed, port, workdir, partitions, engine or LocalEngine())
    finally:
        tridentflow.faults.PAUSE_HOOK = None
        partitions.wait()
        server.kill()


def _run(
    rng: random.Random,
    seed: int,
    port: int,
    workdir: Path,
    partitions: Partitions,
    engine: Engine,
) -> dict[str, Any]:
    pipeline = load_pipeline(rng.choice(("wordcount", "wordcount-opaque")))
    spark = engine.name == "spark"
    retried = STEP_FAILURES + SPARK_FAILURES if spark else STEP_FAILURES  # a failed Spark job
    count = rng.randint(2, 3) if spark else rng.randint(4, 8)
    events: list[str] = []
    plan = _point_cuts(rng, count, events)
    home = workdir / "home"

    def runtime(address: str) -> Runtime:  # executors connect by the URL: its timeout too
        url = f"redis://{address}:{port}/0?socket_timeout={SOCKET_TIMEOUT_S}"
        return Runtime(pipeline, connect(url, SOCKET_TIMEOUT_S), home, plan, url,
                       staging_kind="redis")  # fmt: skip

    driver, executors = runtime(DRIVER), runtime(EXECUTORS)
    driver.ledger.reset(force=True)
    produced: list[str] = []
    failures = 0
    for txid in range(1, count + 1):
        lines = [" ".join(rng.choices(WORDS, k=rng.randint(1, 4))) for _ in range(3)]
        driver.source_heads()
        driver.log.append_spread(lines)
        produced += lines
        for _ in range(8):  # a failed step is retried, as Airflow retries it
            try:
                _one_txid(rng, txid, driver, executors, engine, partitions, events)
                break
            except retried:
                failures += 1
                partitions.wait()  # the retry comes once the network is back
        else:
            return {"seed": seed, "ok": False, "difference": f"txid {txid} never committed"}
    partitions.wait()
    return _checked(driver, produced, seed, events, failures, partitions)


def _point_cuts(rng: random.Random, count: int, events: list[str]) -> FaultPlan:
    """A partition at a fault point (of POINTS) of 70 % of txids 1..``count``, noted."""
    faults = []
    for txid in range(1, count + 1):
        if rng.random() < 0.7:
            point = rng.choice(sorted(POINTS))
            faults.append(Fault(point, txid, 1, "pause"))
            events.append(f"{point}@{txid}:{POINTS[point]}")
    return FaultPlan(tuple(faults))


def _one_txid(
    rng: random.Random,
    txid: int,
    driver: Runtime,
    executors: Runtime,
    engine: Engine,
    partitions: Partitions,
    events: list[str],
) -> None:
    """One try of ``txid``'s three steps; with Spark, the emit cut off a drawn moment into
    its job (most of the time)."""
    partitions.cut_off = DRIVER
    coordinate(driver, txid, batch_size=1000)
    partitions.cut_off = EXECUTORS
    cancel, delay = None, 0.0
    if engine.name == "spark" and rng.random() < SPARK_CUT_CHANCE:  # mid block-write
        delay = rng.uniform(*SPARK_CUT_S)
        cancel = partitions.cut_during(EXECUTORS, delay)
    try:
        emit(executors, txid, engine)
    finally:
        if cancel is not None and cancel():
            events.append(f"spark-emit@{txid}+{delay:.1f}s:{EXECUTORS}")
    partitions.cut_off = DRIVER
    commit(driver, txid)


def _checked(
    rt: Runtime,
    produced: list[str],
    seed: int,
    events: list[str],
    failures: int,
    partitions: Partitions,
) -> dict[str, Any]:
    found = drill_checks(rt, produced)
    return {
        "seed": seed,
        "ok": found["difference"] is None,
        "recovery_ms": recoveries(partitions.healed_ms, committed_times(rt)),
        "difference": found["difference"],
        "pipeline": rt.pipeline.name,
        "txids": rt.ledger.committed_txid(),
        "records": len(produced),
        "partitions": len(partitions.cuts),
        "executor_partitions": partitions.cuts.count(EXECUTORS),
        "step_failures": failures,
        "events": events,
        "lost": found["lost"],
        "doubled": found["doubled"],
    }


def run_in_namespace(
    schedules: int, seed: int, plant: str | None = None, spark: bool = False
) -> list[dict[str, Any]]:
    """Run ``schedules`` drills (seeds seed...) in a network namespace of their own (a
    child process under ``unshare -n``); one result per drill. ``plant``: ``module:function``
    called in the child first (a test's planted bug); ``spark``: the emits run on Spark
    (local[2], started in the namespace). RuntimeError (one line) where no namespace can be
    made (not Linux, not root)."""
    module = "tridentflow.devtools.chaos.partition"
    command = ["unshare", "-n", sys.executable, "-m", module, "--inside",
               "--schedules", str(schedules), "--seed", str(seed)]  # fmt: skip
    if plant is not None:
        command += ["--plant", plant]
    if spark:
        command.append("--spark")
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        raise RuntimeError("a network partition drill needs unshare and ip (util-linux, iproute2)")
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the partition drill failed (exit {done.returncode}): {tail}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def summary(results: list[dict[str, Any]]) -> str:
    """The drills in one line: what they did, lost and doubled, the recovery times."""
    total = drills_totals(
        results, ("txids", "partitions", "executor_partitions", "step_failures", "lost", "doubled")
    )
    return (
        f"partition drills: {len(results)} drills, {total['txids']} txids, "
        f"{total['partitions']} partitions ({total['executor_partitions']} of the executors), "
        f"{total['step_failures']} failed steps retried, lost={total['lost']} "
        f"doubled={total['doubled']}" + drills_tail(results, "heals")
    )


def _spark_engine() -> Engine:
    """A Spark engine on local[2] inside the namespace (its JVM and Python workers bound to
    the namespace's loopback)."""
    from tridentflow.engines.spark import SparkEngine, spark_session

    os.environ["SPARK_LOCAL_IP"] = DRIVER
    return SparkEngine(spark_session("tridentflow-partition", "local[2]"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--schedules", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--plant", help="MODULE:FUNCTION called first, in the namespace (a planted bug)"
    )
    parser.add_argument(
        "--spark", action="store_true", help="emit with Spark (local[2]) in the namespace"
    )
    args = parser.parse_args()
    if not args.inside:
        results = run_in_namespace(args.schedules, args.seed, args.plant, args.spark)
        for result in results:
            print(json.dumps(result))
        print(summary(results))
        return
    os.environ.setdefault("TRIDENTFLOW_STAGING", "redis")
    if args.plant:
        module_name, _, function = args.plant.partition(":")
        getattr(importlib.import_module(module_name), function)()
    prepare_namespace()
    engine = _spark_engine() if args.spark else None
    for seed in range(args.seed, args.seed + args.schedules):
        workdir = Path(tempfile.mkdtemp(prefix="tridentflow-partition-"))
        try:
            result = drill(seed, workdir, engine)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
