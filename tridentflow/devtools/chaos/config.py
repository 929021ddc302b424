"""What every schedule shares: the words, the pipelines, the bounds, a result, the server."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tridentflow.devtools import devredis
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import (
    TridentflowError,
)
from tridentflow.faults import InjectedFaultError, SimulatedCrash
from tridentflow_state.errors import StateError

WORDS = (
    "man", "dog", "apple", "how", "are", "you", "nice", "day", "good", "a", "ünï", "中文",
    "1", "1.0", "true", "0.0", "-0.0",
)  # fmt: skip
BAD_LINES = ('{"not json', '"bad \\ud800 word"', '["wrong", "arity"]', "\xff")
"""Undecodable records an external producer could write; each must be quarantined."""
BAD_ENTRIES = ({b"sentence": b"caf\xe9"}, {b"sent\xffence": b"x"}, {b"other": b"field"})
"""Stream entries another producer could XADD that are no sentence; each is quarantined."""
PIPELINES = ("wordcount", "wordcount-opaque", "partitioned-count", "mutating", "mutating-opaque")
STREAM_PIPELINES = ("wordcount-stream", "wordcount-stream-tx")
"""Redis Streams sources: their schedules add the external stream mutations."""
KAFKA_PIPELINES = ("wordcount-kafka", "wordcount-kafka-opaque")
"""Kafka sources (a broker of the harness's own, ``kafka=``): each schedule reads a topic of
its own; outages freeze the broker (SIGSTOP), between steps and in the middle of an emit."""
BAD_KAFKA_VALUES = (b'{"not json', b"\xff\xfe", b'["wrong", "arity"]')
"""Kafka records another producer could write that are no sentence; each is quarantined."""
RETRIES = 3
RETRIES_SPENT_CHANCE = 0.25
"""In the paused family: the chance that a failed step was its task's last try (no retry)."""
DRAIN_REFIRE_S = 30.0
"""The drain's watcher repeats an unanswered fire after this long (its clock is simulated)."""
DRAIN_POLLS = 5_000
"""The drain's watcher polls at most this often; records still waiting then are a difference."""
RETAIN_TXIDS = 3
"""Undo logs kept in every schedule (the operator's rewinds)."""
REWIND_CHANCE = 0.04
"""Per step: the operator rewinds the pipeline (at most twice a schedule)."""
RESHARD_CHANCE = 0.1
"""Per step: the operator reshards the pipeline to another count (at most once a schedule;
not where Redis goes back to a snapshot, which would take the layout back with it)."""
DEPLOY_CHANCE = 0.3
"""Per emit: the operator deploys code of another shape before its commit (at most once a
schedule; ``run_chaos(deploys=True)``)."""
DEPLOYED_STATE = "deployed"
"""The state the deploy's code adds (counting what the pipeline's first state counts)."""
MAINTENANCE_CHANCE = 0.15
"""Per step of a schedule with lakehouse tables: the operator compacts or vacuums them (at
most three times a schedule; ``run_chaos(tables=True)``)."""
PARALLEL_CHANCE = 0.06
"""Per step between runs: several runs at once (a backfill with max_active_runs > 1)."""
STEP_FAILURES = (SimulatedCrash, InjectedFaultError, TridentflowError, StateError, redis.RedisError)
"""What a run's step may fail with in a schedule: retried, as Airflow retries a task."""
PARALLEL_WAITS = 30
"""A parallel run's step found not its turn this often in a row gives up (the run before it
is gone, or stuck)."""
CHAOS_COLUMNS = {"key": "text", "value": "jsonb"}
"""The chaos tables: the key's canonical encoding, the value as JSON."""
SHARD_CHOICES = (1, 2, 3)
"""State shards a schedule may run with (see schedule_shards): the sharded fencing and
commit under every fault, in a third of the schedules each."""
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

    def back_to_snapshot(self) -> None:
        """SIGKILL, then start from the last snapshot (``SAVE``) with the AOF set aside - what
        a Redis whose AOF lost its tail, or restored from an older backup, comes back with.
        The AOF is on again (rewritten from the snapshot) before this returns, so later
        restarts keep what follows."""
        self.kill()
        shutil.rmtree(self.directory / "appendonlydir", ignore_errors=True)
        self.start(appendonly=False)
        client = devredis.client(self.port, connect_timeout=2, timeout=30)
        try:
            client.config_set("appendonly", "yes")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                info = client.info("persistence")
                rewriting = info["aof_rewrite_in_progress"] or info["aof_rewrite_scheduled"]
                if info["aof_enabled"] and not rewriting:
                    return
                time.sleep(0.02)
            raise TridentflowError(f"redis on port {self.port}: the AOF rewrite did not finish")
        finally:
            client.close()
