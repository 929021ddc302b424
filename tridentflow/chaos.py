"""The chaos harness: random fault schedules, resume, audit.

Each schedule (fully determined by its seed) picks a bundled pipeline, feeds its source, and
drives orchestrator-style runs (tridentflow.runs: one run id per txid, retried like Airflow
retries a task) through a random mix of:

* a fault at every point - ``raise`` (the step fails) or ``crash`` (nothing after the point
  runs, as with SIGKILL) - on first or second attempts;
* partition outages (``dark``) over txid ranges; for a transactional source, which must wait,
  the outage is repaired after a few failed emits;
* concurrent duplicate commit attempts (a zombie and its retry race; fencing lets one land);
* Redis restarts (SIGKILL of the server, AOF with ``appendfsync always``) between steps;
* source appends between the steps of a batch;
* runs that give up (their txid is released and adopted by the next run).

Then it drains the source without faults and checks two things: the audit (state vs the
source up to the committed offsets) and the exact expected counts of every record produced.
The harness owns its redis-server (a free port) and a scratch directory.
"""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from state.errors import StateError
from tridentflow import devredis
from tridentflow.audit import audit
from tridentflow.driver import backlog, run_batches
from tridentflow.engine import LocalEngine
from tridentflow.errors import PartitionUnavailable, TridentflowError
from tridentflow.faults import POINTS, Dark, Fault, FaultPlan, InjectedFault, SimulatedCrash
from tridentflow.query import query
from tridentflow.registry import load_pipeline
from tridentflow.runs import coordinate_run, emit_run, release_run
from tridentflow.runtime import Runtime, connect

WORDS = ("man", "dog", "apple", "how", "are", "you", "nice", "day", "good", "a", "ünï", "1")
PIPELINES = ("wordcount", "wordcount-opaque", "partitioned-count")
RETRIES = 3
ENGINE = LocalEngine()


@dataclass
class ScheduleResult:
    seed: int
    pipeline: str
    events: list[str] = field(default_factory=list)
    txids: int = 0
    records: int = 0
    lost: int | float = 0
    doubled: int | float = 0
    difference: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.doubled == 0 and self.difference is None

    def line(self) -> str:
        verdict = f"lost={self.lost} doubled={self.doubled}"
        if self.difference:
            verdict += f" FIRST DIFFERENCE: {self.difference}"
        return (
            f"seed={self.seed} pipeline={self.pipeline} txids={self.txids} "
            f"records={self.records} faults=[{', '.join(self.events)}] {verdict}"
        )


class RedisServer:
    """A redis-server the harness can SIGKILL and restart on the same port and data dir."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = devredis.free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, appendonly: bool = True) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        args = devredis.server_args(self.port, self.directory, appendonly=appendonly)
        args[args.index("everysec")] = "always"  # no acknowledged write is lost on a crash
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        devredis.wait_ready(self.port, self.proc)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
            self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()


class Chaos:
    def __init__(
        self,
        workdir: Path | None = None,
        pipelines: Sequence[str] = PIPELINES,
        redis_restarts: bool = True,
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="tridentflow-chaos-"))
        self.pipelines = tuple(pipelines)
        self.redis_restarts = redis_restarts
        self.redis = RedisServer(self.workdir / "redis")

    def __enter__(self) -> Chaos:
        self.redis.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.redis.kill()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- one schedule ------------------------------------------------------------------------
    def run_schedule(self, seed: int) -> ScheduleResult:
        started = time.monotonic()
        rng = random.Random(seed)
        name = rng.choice(self.pipelines)
        result = ScheduleResult(seed, name)
        home = self.workdir / f"schedule-{seed}"
        shutil.rmtree(home, ignore_errors=True)
        rt = Runtime(load_pipeline(name), connect(self.redis.url), home)
        rt.ledger.reset()
        produced: list[str] = []

        def append(n: int, during: str | None = None) -> None:
            lines = [
                " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5))) for _ in range(n)
            ]
            rt.source_heads()
            rt.log.append_spread(lines)
            produced.extend(lines)
            if during:
                result.events.append(f"append+{n}@{during}")

        append(rng.randint(5, 60))
        runs = rng.randint(3, 8)
        rt.faults = self._fault_plan(rng, runs, rt.pipeline.source.partitions, result.events)
        batch_size = rng.choice([1, 2, 3, 5, 20])
        self._drive(rng, rt, runs, batch_size, append, result)

        rt.faults = FaultPlan()  # resume: drain what is left, with no faults
        run_batches(rt, ENGINE)
        result.txids = rt.ledger.committed_txid()
        result.records = len(produced)
        self._check(rt, produced, result)
        rt.client.close()
        shutil.rmtree(home, ignore_errors=True)
        result.seconds = time.monotonic() - started
        return result

    @staticmethod
    def _fault_plan(rng: random.Random, runs: int, partitions: int, events: list[str]) -> FaultPlan:
        faults = []
        for txid in range(1, runs + 1):
            for attempt in (1, 2):
                if rng.random() < (0.6 if attempt == 1 else 0.2):
                    fault = Fault(rng.choice(POINTS), txid, attempt, rng.choice(("raise", "crash")))
                    faults.append(fault)
                    events.append(str(fault))
        darks = []
        if rng.random() < 0.5:
            first = rng.randint(1, runs)
            dark = Dark(rng.randrange(partitions), first, first + rng.randint(0, 2))
            darks.append(dark)
            events.append(f"dark:{dark.partition}@{dark.first}-{dark.last}")
        return FaultPlan(tuple(faults), tuple(darks))

    def _drive(
        self,
        rng: random.Random,
        rt: Runtime,
        runs: int,
        batch_size: int,
        append: Callable[..., None],
        result: ScheduleResult,
    ) -> None:
        run_no, failures, dark_failures, step_index = 0, 0, 0, 0
        run_id = f"run-{run_no}"
        steps = ("coordinate", "emit", "commit")
        for step in range(runs * 10):
            if rt.ledger.committed_txid() >= runs:
                return
            roll = rng.random()
            if self.redis_restarts and roll < 0.08:
                self.redis.restart()
                result.events.append(f"redis-restart@step{step}")
                continue
            if roll < 0.15:
                append(rng.randint(1, 10), during=f"step{step}")
                continue
            try:
                for index in range(step_index, len(steps)):
                    step_index = index
                    if steps[index] == "coordinate":
                        coordinate_run(rt, run_id, batch_size, lease_ms=60_000)
                    elif steps[index] == "emit":
                        emit_run(rt, run_id, ENGINE, lease_ms=60_000)
                    else:
                        racers = 2 if rng.random() < 0.2 else 1
                        if racers > 1:
                            result.events.append(f"duplicate-commit@{run_id}")
                        self._commit_race(rt, run_id, racers)
                    if index < 2 and rng.random() < 0.15:
                        append(rng.randint(1, 5), during=f"{run_id}:after-{steps[index]}")
                run_no, failures, step_index = run_no + 1, 0, 0
                run_id = f"run-{run_no}"
            except PartitionUnavailable:
                dark_failures += 1
                if dark_failures >= 3:  # the operator repairs the partition
                    rt.faults = FaultPlan(rt.faults.faults, ())
                    result.events.append(f"repaired-dark@step{step}")
            except (SimulatedCrash, InjectedFault, TridentflowError, StateError):
                failures += 1
                if rng.random() < 0.3:  # an outage starts while the txid is being retried
                    txid = rt.ledger.committed_txid() + 1
                    dark = Dark(rng.randrange(rt.pipeline.source.partitions), txid, txid)
                    rt.faults = FaultPlan(rt.faults.faults, (*rt.faults.darks, dark))
                    result.events.append(f"dark:{dark.partition}@{txid}(mid-txid)")
                if rng.random() < 0.4:  # a person clears the whole run: from coordinate again
                    step_index = 0
                    result.events.append(f"clear:{run_id}")
                if failures >= RETRIES:  # the run gives up; the next run adopts its txid
                    release_run(rt, run_id)
                    result.events.append(f"gave-up:{run_id}")
                    run_no, failures, step_index = run_no + 1, 0, 0
                    run_id = f"run-{run_no}"

    def _commit_race(self, rt: Runtime, run_id: str, racers: int) -> None:
        from tridentflow.runs import commit_run

        if racers == 1:
            commit_run(rt, run_id)
            return
        errors: list[BaseException] = []
        results: list[str] = []

        def attempt() -> None:
            other = Runtime(rt.pipeline, connect(self.redis.url), rt.home, rt.faults)
            try:
                results.append(commit_run(other, run_id)["status"])
            except BaseException as exc:  # collected; re-raised below if no racer landed
                errors.append(exc)
            finally:
                other.client.close()

        threads = [threading.Thread(target=attempt) for _ in range(racers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if "committed" not in results and "already-committed" not in results and errors:
            raise errors[0]

    def _check(self, rt: Runtime, produced: list[str], result: ScheduleResult) -> None:
        left = backlog(rt)
        if left:
            result.difference = f"{left} records were never committed"
        report = audit(rt)
        result.lost, result.doubled = report.lost, report.doubled
        if report.mismatched and not result.difference:
            name, key, exp, act = report.mismatched[0]
            result.difference = f"{name} {key}: expected {exp!r}, stored {act!r}"
        expected = _expected(rt, produced)
        for state_name, values in expected.items():
            persist = rt.pipeline.states[state_name]
            keys = sorted(values)
            _committed, got = query(rt, persist, keys)
            for key, want, have in zip(keys, (values[k] for k in keys), got, strict=True):
                if want != have and not result.difference:
                    result.difference = f"{state_name} {key}: produced {want}, stored {have}"


def _expected(rt: Runtime, produced: list[str]) -> dict[str, dict[tuple, int]]:
    """Exact counts of everything produced, for the bundled pipelines."""
    expected: dict[str, dict[tuple, int]] = {}
    for name, persist in rt.pipeline.states.items():
        if persist.group_fields:
            counter = Counter((w,) for line in produced for w in line.split())
            expected[name] = dict(counter)
        else:
            expected[name] = {(): len(produced)}
    return expected


def run_chaos(
    schedules: int,
    seed: int = 0,
    pipelines: Sequence[str] = PIPELINES,
    on_result: Callable[[ScheduleResult], None] | None = None,
    redis_restarts: bool = True,
) -> list[ScheduleResult]:
    """Run ``schedules`` schedules with seeds seed, seed+1, ...; stop at the first failure."""
    results = []
    with Chaos(pipelines=pipelines, redis_restarts=redis_restarts) as chaos:
        for s in range(seed, seed + schedules):
            outcome = chaos.run_schedule(s)
            results.append(outcome)
            if on_result is not None:
                on_result(outcome)
            if not outcome.ok:
                break
    return results
