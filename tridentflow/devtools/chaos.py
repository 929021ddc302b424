"""The chaos harness: random fault schedules, resume, audit.

Each schedule (fully determined by its seed) picks a bundled pipeline, feeds its source, and
drives orchestrator-style runs (tridentflow.steps.runs: one run id per txid, retried like Airflow
retries a task) through a random mix of:

* a fault at every point - ``raise`` (the step fails) or ``crash`` (nothing after the point
  runs, as with SIGKILL) - on first or second attempts;
* partition outages (``dark``) over txid ranges; for a transactional source, which must wait,
  the outage is repaired after a few failed emits;
* concurrent duplicate commit attempts (a zombie and its retry race; fencing lets one land);
* Redis restarts (SIGKILL of the server, AOF with ``appendfsync always``) between steps;
* source appends between the steps of a batch, with undecodable records among them (not
  JSON, a lone surrogate, the wrong arity: quarantined, never counted);
* real partition outages: a partition's directory moved aside (a dropped mount) or its HEAD
  torn, for a few steps; appends meanwhile go to the readable partitions;
* an operator's ``reset --source`` while a run is in flight: the run's next step must be
  refused (GenerationError), and only what is produced afterwards may be counted;
* runs that give up (their txid is released and adopted by the next run);
* an operator's rewind while a run is in flight (undo logs are kept in every schedule): to a
  retained txid, half the time killed part-way (``mid-rewind``) and run again; the run's
  next step must be refused, in its own process and in a new one, and the replay must count
  every record once;
* for the Redis Streams pipelines (``STREAM_PIPELINES``), the external mutations other
  clients make: XDEL of entries already read (the last one too), trims of what was read, and
  entries removed before they were read (XDEL, XTRIM MAXLEN), a stream deleted or deleted
  and recreated, bytes that are not UTF-8. The first kind must go on counting; for the
  others the operator sees the reason in ``status``, resets the reader, and from then on
  exactly what the streams hold must be counted;
* state shards: a schedule's states are split into 1, 2 or 3 shards (fenced per shard);
* staging: a schedule's emits stage in files or in Redis (blocks next to each shard), drawn
  from its seed; every step of the schedule stages the same way;
* against a gated Redis Cluster with replicas (``cluster=``, tridentflow.devtools.devcluster):
  failovers with replication lag - a master's replication is held (the ledger's or a state
  shard's), the run goes on with ``--wait-replicas 1``, and a few steps later that master is
  killed while its replica is behind, the replica takes over and the old master rejoins.

* sinks in every schedule: each state's new-values stream (keys mapped to their canonical
  encoding) goes to Redis streams (1, 2 or 3 of them per sink, ``sink_parts``) and, given a
  PostgreSQL (``postgres_dsn``), to a table; exports run after commits and between steps,
  with faults inside them (``mid-export``: raise, crash), errors of no tridentflow type
  raised inside a sink (``KeyError``, ``OverflowError``, a driver's ...) and exporters dying
  between a sink's streams, two exporters at once, the PostgreSQL session killed
  mid-transaction (``pg_terminate_backend``) - or, on a server of its own (``postgres=``),
  the server crashed and restarted right there - and an operator's ``export --resync``.
  Every failure of an export must come out as the sink's one ``SinkError`` line (anything
  else is the schedule's difference); a rewind below what any stream holds must be refused.
  After the drain every table equals the state row for row, and the streams' last entry per
  key is the state's value, with no change twice.

* for the Kafka pipelines (``KAFKA_PIPELINES``, given a broker: tridentflow.devtools.devkafka), the
  broker frozen (SIGSTOP) between steps or while an emit reads, for a few steps: an opaque
  txid skips its partitions, a transactional one fails its emit until the broker is back;
  records produced meanwhile are sent once it is (a producer's retries); transactions'
  commit markers between records (offsets that hold none), and undecodable records.

The pipelines include ``mutating`` and ``mutating-opaque`` (every aggregator kind mutating its
arguments; typed keys where ``0.0``/``-0.0`` and ``1``/``1.0``/``true`` differ).

Then it drains the source without faults, as ``schedule="on-data"`` would (the family "an
orchestrator merging, doubling and delaying events"): a run starts only when the asset
watcher's question (tridentflow.steps.watch) fires; fires while a run is queued merge into it,
some come twice, queued runs start late, and every run of the faulty phase has finished
(their txids, held under live leases, are released and adopted). Then it checks two things:
the audit (state vs the source up to the committed offsets) and the exact expected counts of
every record produced.
The harness owns its redis-server (a free port) and a scratch directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import redis

from tridentflow.devtools import devredis
from tridentflow.devtools.devcluster import LocalCluster
from tridentflow.devtools.devkafka import LocalKafka
from tridentflow.devtools.devpostgres import LocalPostgres
from tridentflow.engines.base import Engine
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import (
    IncompleteBatchError,
    NotReadyError,
    PartitionUnavailable,
    ReplicationError,
    SourceError,
    TridentflowError,
    one_line,
)
from tridentflow.examples.mutating import expected_counts
from tridentflow.faults import STEP_POINTS, Dark, Fault, FaultPlan, InjectedFault, SimulatedCrash
from tridentflow.ops.audit import audit
from tridentflow.ops.reset import reset_pipeline
from tridentflow.ops.status import status
from tridentflow.registry import load_pipeline
from tridentflow.sinks import DeltaSink, IcebergSink, PostgresSink, RedisStreamSink, SinkError
from tridentflow.sinks.redisstream import companion_key
from tridentflow.sources.filelog import encode_record
from tridentflow.steps.driver import backlog
from tridentflow.steps.export import export
from tridentflow.steps.query import list_state, query
from tridentflow.steps.runs import (
    RunState,
    commit_run,
    coordinate_run,
    emit_run,
    ready_to_emit,
    release_run,
)
from tridentflow.steps.runtime import Runtime, connect
from tridentflow.steps.staging import RedisStagingArea
from tridentflow.steps.watch import Watch, work_waiting
from tridentflow_state.codec import decode_key, encode_key
from tridentflow_state.errors import GenerationError, PipelineBusyError, StateError
from tridentflow_state.undo import retained

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
DRAIN_REFIRE_S = 30.0
"""The drain's watcher repeats an unanswered fire after this long (its clock is simulated)."""
DRAIN_POLLS = 5_000
"""The drain's watcher polls at most this often; records still waiting then are a difference."""
RETAIN_TXIDS = 3
"""Undo logs kept in every schedule (the operator's rewinds)."""
REWIND_CHANCE = 0.04
"""Per step: the operator rewinds the pipeline (at most twice a schedule)."""
PARALLEL_CHANCE = 0.06
"""Per step between runs: several runs at once (a backfill with max_active_runs > 1)."""
STEP_FAILURES = (SimulatedCrash, InjectedFault, TridentflowError, StateError, redis.RedisError)
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


class Chaos:
    def __init__(
        self,
        workdir: Path | None = None,
        pipelines: Sequence[str] = PIPELINES,
        redis_restarts: bool = True,
        engine: Engine | None = None,
        redis_url: str | None = None,
        cluster: LocalCluster | None = None,
        postgres_dsn: str | None = None,
        postgres: LocalPostgres | None = None,
        kafka: LocalKafka | None = None,
    ) -> None:
        """``kafka``: the broker the Kafka pipelines' schedules read (and freeze).
        ``postgres_dsn``: a database the schedules' PostgresSinks write tables to (one per
        schedule and state, dropped after it); without it, the sinks are Redis streams only.
        ``postgres``: a server of the harness's own (tridentflow.devtools.devpostgres), which it
        also crashes and restarts while a sink is in the middle of a transaction.
        ``engine``: what emits (default the local engine; e.g. a SparkEngine over a Spark
        Connect session). ``redis_url``: run against that Redis (a cluster, say) instead of
        an own redis-server; it is never restarted then. ``cluster``: a gated cluster with
        replicas (tridentflow.devtools.devcluster): commits wait for one replica, and schedules fail
        masters over with their replicas behind."""
        self.engine = engine or ENGINE
        self.cluster = cluster
        self.staging_kind = "files"  # the current schedule's (schedule_staging)
        if cluster is not None:
            redis_url = cluster.url()
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="tridentflow-chaos-"))
        self.pipelines = tuple(pipelines)
        self.redis = RedisServer(self.workdir / "redis")
        self.external_url = redis_url
        self.redis_restarts = redis_restarts and redis_url is None
        self.postgres = postgres
        self.postgres_dsn = postgres.dsn if postgres is not None else postgres_dsn
        self.kafka = kafka
        logging.getLogger("psycopg").setLevel(logging.ERROR)  # killed sessions are on purpose

    @property
    def url(self) -> str:
        if self.cluster is not None:  # any node still up
            return f"redis://127.0.0.1:{self.cluster.announced(self.cluster.alive()[0])}/0"
        return self.external_url or self.redis.url

    def _runtime(self, pipeline, home: Path, faults: FaultPlan | None = None, shards: int = 1):
        """A runtime of its own (a new process's): against a gated cluster, its commits wait
        for one replica (a short timeout: a held replica fails them fast)."""
        rt = Runtime(
            pipeline,
            connect(self.url),
            home,
            faults or FaultPlan(),
            shards=shards,
            staging_kind=self.staging_kind,
        )
        rt.retain = RETAIN_TXIDS  # undo logs in every schedule: the operator's rewinds
        if self.cluster is not None:
            rt.replicas, rt.replica_timeout_ms = 1, 300
        return rt

    def __enter__(self) -> Chaos:
        if self.external_url is None:
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
        shards = schedule_shards(seed)
        self.staging_kind = schedule_staging(seed)
        rt = self._runtime(self._pipeline(name, seed), home, shards=shards)
        if shards > 1:
            result.events.append(f"state-shards:{shards}")
        if self.staging_kind != "files":
            result.events.append(f"staging:{self.staging_kind}")
        traits = rt.log.chaos  # what the source says the harness may do to it
        if traits.fresh == "delete-source":  # e.g. streams live in Redis: start from none
            reset_pipeline(rt, force=True, source=True)
        else:
            rt.ledger.reset(force=True)
        sched = _Schedule(rng, rt, result, home / "aside")
        if traits.fresh == "create":  # the producers' log: made for the schedule
            rt.log.create(rt.pipeline.source.partitions)
            sched.kafka = self.kafka
            sched.kafka_rng = random.Random(f"kafka-{seed}")
        sched.sink_rng = random.Random(f"sinks-{seed}")
        sched.sink_edge_rng = random.Random(f"sink-edges-{seed}")
        sched.rewind_rng = random.Random(f"rewind-{seed}")
        sched.seed = seed
        sched.lake = lakehouse_schedule(seed)
        sched.parallel_rng = random.Random(f"parallel-{seed}")
        self._drop_sink_targets(rt, seed)
        sched.append(rng.randint(5, 60))
        runs = rng.randint(3, 8)
        rt.faults = self._fault_plan(rng, runs, rt.pipeline.source.partitions, result.events)
        rt.faults = FaultPlan(
            rt.faults.faults + _sink_faults(sched.sink_rng, runs, result.events), rt.faults.darks
        )
        batch_size = rng.choice([1, 2, 3, 5, 20])
        self._drive(sched, runs, batch_size)

        sched.end_outage("drain")
        loses = sched.rt.log.chaos.removals_lose_records
        if loses and status(sched.rt)["unavailable_partitions"]:
            sched.operator_resets_reader("drain")
        if sched.lagging is not None:  # the replica catches up: nothing lost, nothing to fail
            self.cluster.release_replication(sched.lagging[0])
            sched.lagging = None
        rt = sched.rt
        rt.faults = FaultPlan()  # resume: drain what is left, with no faults
        self._drain_on_events(sched, batch_size)
        result.txids = rt.ledger.committed_txid()
        result.records = len(sched.produced)
        self._check(rt, sched.produced, result)
        self._check_sinks(rt, result, sched.committed_changes)
        self._drop_sink_targets(rt, seed)
        rt.client.close()
        shutil.rmtree(home, ignore_errors=True)
        result.seconds = time.monotonic() - started
        return result

    def _drain_on_events(self, sched: _Schedule, batch_size: int) -> None:
        """Drain as ``schedule="on-data"`` runs a pipeline, Airflow's side as it behaves: a
        fire is an asset event, queued until the scheduler creates a run from it (events
        queued meanwhile merge into that one; some are delivered twice); a created run waits
        for its turn (max_active_runs=1), and its coordinator may be slow to bind (several
        polls, while the watcher asks how many runs are queued or running); every run of the
        faulty phase has finished; half the schedules cap a txid at ``batch_size`` (the DAG's
        param), so the rest of a backlog needs the watcher to fire again. Stops once nothing
        is queued, nothing fires and nothing waits - or after DRAIN_POLLS polls: what is left
        then is the schedule's difference (``_check``), as is a run that found nothing to
        read (the family "one fire, two runs": a fire repeated while its run was coming)."""
        rt, rng = sched.rt, random.Random(f"drain-{sched.seed}")
        cap = batch_size if rng.random() < 0.5 else None
        watch = Watch(refire_after=DRAIN_REFIRE_S)
        live: set[str] = set()

        def run_state(run_id: str) -> str:
            return "running" if run_id in live else "failed"

        clock, event_queued, created, runs = 0.0, False, 0, 0
        binding_in = -1  # polls until the running run's coordinator binds (-1: none runs)
        for _ in range(DRAIN_POLLS):
            active = created + (binding_in >= 0)
            fired = watch.poll(rt, clock, run_state, lambda a=active: a)
            if fired is not None:
                if event_queued or rng.random() < 0.2:  # merged into the queued event, or doubled
                    sched.result.events.append(f"merged-event@drain{runs}")
                event_queued = True
            if event_queued and rng.random() < 0.6:  # the scheduler creates a run from it
                event_queued, created = False, created + 1
            if binding_in < 0 and created and rng.random() < 0.7:  # its turn (else later)
                created -= 1
                binding_in = rng.choice((0, 0, 1, 3, 8))  # a slow coordinator: polls to bind
            if binding_in == 0:
                binding_in, runs = -1, runs + 1
                run_id = f"drain-{runs}"
                live.add(run_id)
                bound = coordinate_run(rt, run_id, cap, run_state=run_state)
                emit_run(rt, run_id, self.engine)
                done = commit_run(rt, run_id)
                live.discard(run_id)
                sched.note_changes(rt.ledger.txid_of_run(run_id))
                fresh = bound["binding"] == "new" and done["status"] == "committed"
                if fresh and not done["records"] and not sched.result.difference:
                    sched.result.difference = (
                        f"{run_id} committed a new txid {done['txid']} with nothing to read: "
                        "a fire was repeated while its run was queued or binding"
                    )
            elif binding_in > 0:
                binding_in -= 1
            elif (
                not (event_queued or created) and fired is None and not work_waiting(rt, run_state)
            ):
                break
            clock += rng.choice((0.5, 1.0, 5.0, DRAIN_REFIRE_S))
        left = rt.ledger.pending_txids()
        if left and not sched.result.difference:
            sched.result.difference = f"txid {left[0]} was left pending: no run came for it"

    @staticmethod
    def _fault_plan(rng: random.Random, runs: int, partitions: int, events: list[str]) -> FaultPlan:
        faults = []
        for txid in range(1, runs + 1):
            for attempt in (1, 2):
                if rng.random() < (0.6 if attempt == 1 else 0.2):
                    fault = Fault(
                        rng.choice(STEP_POINTS), txid, attempt, rng.choice(("raise", "crash"))
                    )
                    faults.append(fault)
                    events.append(str(fault))
        darks = []
        if rng.random() < 0.5:
            first = rng.randint(1, runs)
            dark = Dark(rng.randrange(partitions), first, first + rng.randint(0, 2))
            darks.append(dark)
            events.append(f"dark:{dark.partition}@{dark.first}-{dark.last}")
        return FaultPlan(tuple(faults), tuple(darks))

    def _drive(self, sched: _Schedule, runs: int, batch_size: int) -> None:
        rng, result = sched.rng, sched.result
        run_no, failures, dark_failures, step_index = 0, 0, 0, 0
        run_id = f"run-{run_no}"
        steps = ("coordinate", "emit", "commit")
        for step in range(runs * 10):
            if self.cluster is not None and self._failover_step(sched, step):
                continue
            rt = sched.rt
            if rt.ledger.committed_txid() >= runs:
                if failures:  # the run's failed step is retried, as Airflow does
                    self._finish_run(rt, run_id, steps[step_index:])
                return
            torn = sched.torn_since_rewind()  # an exporter died between a sink's parts
            soon = torn and random.Random(f"torn-{sched.seed}-{step}-go").random() < 0.3
            chance = REWIND_CHANCE * (3 if sched.lake else 1)  # and the tables go back too
            if sched.rewinds < 2 and (sched.rewind_rng.random() < chance or soon):
                self._rewind_in_flight(sched, run_id, steps[step_index], step)
                run_no, failures, step_index = run_no + 1, 0, 0
                run_id = f"run-{run_no}"
                continue
            if step_index == 0 and sched.parallel_rng.random() < PARALLEL_CHANCE:
                run_no = self._parallel_runs(sched, run_no, batch_size)
                failures, run_id = 0, f"run-{run_no}"
                continue
            roll = rng.random()
            if self.redis_restarts and roll < 0.08:
                self.redis.restart()
                result.events.append(f"redis-restart@step{step}")
                continue
            if roll < 0.15:
                sched.append(rng.randint(1, 10), during=f"step{step}")
                self._maybe_export(sched, f"step{step}")
                continue
            if roll < 0.19:
                disturb = rt.log.chaos.disturb
                if disturb == "remove-entries":
                    sched.mutate_stream(f"step{step}")
                elif disturb == "freeze-broker":
                    sched.toggle_broker(f"step{step}")
                elif disturb == "dark-partition":
                    sched.toggle_outage(f"step{step}")
                continue
            if roll < 0.2 and not sched.was_reset:
                self._reset_in_flight(sched, run_id, steps[step_index], step)
                run_no, failures, step_index = run_no + 1, 0, 0
                run_id = f"run-{run_no}"
                continue
            try:
                for index in range(step_index, len(steps)):
                    step_index = index
                    if steps[index] == "coordinate":
                        coordinate_run(rt, run_id, batch_size, lease_ms=60_000)
                    elif steps[index] == "emit":
                        sched.maybe_freeze_mid_emit(run_id)
                        emit_run(rt, run_id, self.engine, lease_ms=60_000)
                        sched.maybe_late_block_writer(run_id, step)
                    else:
                        racers = 2 if rng.random() < 0.2 else 1
                        if racers > 1:
                            result.events.append(f"duplicate-commit@{run_id}")
                        self._commit_race(rt, run_id, racers)
                        sched.note_changes(rt.ledger.txid_of_run(run_id))
                        self._maybe_export(sched, f"after-commit:{run_id}")
                    if index < 2 and rng.random() < 0.15:
                        sched.append(rng.randint(1, 5), during=f"{run_id}:after-{steps[index]}")
                run_no, failures, step_index = run_no + 1, 0, 0
                run_id = f"run-{run_no}"
            except PartitionUnavailable:
                dark_failures += 1
                if dark_failures >= 3:  # the operator repairs the partition
                    rt.faults = FaultPlan(rt.faults.faults, ())
                    sched.end_outage(f"step{step}")
                    result.events.append(f"repaired-dark@step{step}")
                    if rt.log.chaos.removals_lose_records:
                        sched.operator_resets_reader(f"step{step}")
                        dark_failures, run_no, failures, step_index = 0, run_no + 1, 0, 0
                        run_id = f"run-{run_no}"
            except STEP_FAILURES:
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

    def _finish_run(self, rt: Runtime, run_id: str, steps: Sequence[str]) -> None:
        """The rest of a run whose txid committed while one of its steps failed (a commit cut
        short after its mark), as Airflow's retry or a person's clear runs it: every step
        finds the txid committed and does nothing but delete what it left."""
        with contextlib.suppress(*STEP_FAILURES):
            for step in steps:
                if step == "coordinate":
                    coordinate_run(rt, run_id, None, lease_ms=60_000)
                elif step == "emit":
                    emit_run(rt, run_id, self.engine, lease_ms=60_000)
                else:
                    commit_run(rt, run_id, 60_000)

    def _parallel_runs(self, sched: _Schedule, run_no: int, batch_size: int) -> int:
        """2-3 runs at once, as Airflow runs a backfill with max_active_runs > 1: they bind in
        order (each coordinator waits for the run before it by date:
        tridentflow_airflow.dated_order); then their emits and commits interleave, each run in
        a process of its own (its own runtime), in an order drawn from the seed. A step whose
        turn has not come - an opaque txid's emit before the txid before it is staged, a
        commit before the txid before it committed (``wait_turn``'s checks, as the operators
        wait on them) - waits and is tried again later; records arrive in between; a third of
        the time an operator clears the first run's emit after the second emitted from where
        it stopped. A failed step is retried up to RETRIES times, a step that waits too long
        fails; then the run gives up (released: a later run adopts its txid). One thread, so
        the schedule stays fully determined by its seed. The next run number."""
        rt, rng = sched.rt, sched.parallel_rng
        run_ids = [f"run-{run_no + i}" for i in range(rng.randint(2, 3))]
        sched.result.events.append(f"parallel:{'+'.join(run_ids)}")
        live = set(run_ids)
        runtimes = {
            r: self._runtime(rt.pipeline, rt.home, rt.faults, rt.shards or 1) for r in run_ids
        }

        def run_state(run_id: str) -> str:
            return "running" if run_id in live else "failed"

        def retried(step: Callable[[], object]) -> bool:
            for _ in range(RETRIES):
                try:
                    step()
                    return True
                except STEP_FAILURES:
                    continue
            return False

        def give_up(run_id: str) -> None:
            with contextlib.suppress(*STEP_FAILURES):
                release_run(runtimes[run_id], run_id)
            sched.result.events.append(f"gave-up:{run_id}")
            live.discard(run_id)

        try:
            for run_id in run_ids:  # in date order
                if not retried(
                    lambda r=run_id: coordinate_run(runtimes[r], r, batch_size, 60_000, run_state)
                ):
                    give_up(run_id)
            todo = {r: ["emit", "commit"] for r in run_ids if r in live}
            first, second = run_ids[0], run_ids[1]
            if first in todo and second in todo and rng.random() < 0.3:
                self._clear_emit_between(sched, runtimes, first, second, todo, retried)
            tries = dict.fromkeys(todo, 0)
            waits = dict.fromkeys(todo, 0)
            while todo:
                run_id = rng.choice(sorted(todo))
                if rng.random() < 0.1:  # records arrive while the runs read (another producer)
                    sched.append(rng.randint(1, 8), during=f"parallel:{run_id}")
                outcome = self._turn_step(runtimes[run_id], run_id, todo[run_id][0], run_state)
                if outcome == "ran":
                    todo[run_id].pop(0)
                    tries[run_id] = waits[run_id] = 0
                elif outcome == "failed":
                    tries[run_id] += 1
                else:
                    waits[run_id] += 1
                if tries[run_id] >= RETRIES or waits[run_id] >= PARALLEL_WAITS:
                    give_up(run_id)
                    todo[run_id] = []
                if not todo[run_id]:
                    del todo[run_id]
                    live.discard(run_id)
        finally:
            for other in runtimes.values():
                other.client.close()
        for run_id in run_ids:
            sched.note_changes(rt.ledger.txid_of_run(run_id))
        self._maybe_export(sched, f"after-parallel:{run_ids[-1]}")
        return run_no + len(run_ids)

    def _turn_step(self, rt: Runtime, run_id: str, step: str, run_state: RunState) -> str:
        """Run ``run_id``'s ``step`` if its turn has come (the checks ``wait_turn`` waits
        on, with no time to wait): "ran", "waited" (not its turn), or "failed"."""
        try:
            txid = rt.ledger.txid_of_run(run_id)
            if txid is None:
                raise NotReadyError(f"{run_id} lost its txid")
            if step == "emit":
                if not ready_to_emit(rt, txid):
                    return "waited"
                emit_run(rt, run_id, self.engine, lease_ms=60_000)
            else:
                if rt.ledger.committed_txid() < txid - 1:
                    return "waited"
                commit_run(rt, run_id, 60_000, run_state)
            return "ran"
        except STEP_FAILURES:
            return "failed"

    def _clear_emit_between(
        self,
        sched: _Schedule,
        runtimes: dict[str, Runtime],
        first: str,
        second: str,
        todo: dict[str, list[str]],
        retried: Callable[[Callable[[], object]], bool],
    ) -> None:
        """An operator clears ``first``'s emit after ``second`` emitted from where ``first``'s
        stopped - records arriving in between, so the second try of ``first`` reads on."""

        def emit(run_id: str) -> bool:
            return retried(lambda: emit_run(runtimes[run_id], run_id, self.engine, 60_000))

        if not emit(first):
            return
        todo[first] = ["commit"]
        sched.append(sched.parallel_rng.randint(1, 8), during=f"parallel:{first}")
        if not emit(second):
            return
        todo[second] = ["commit"]
        sched.result.events.append(f"cleared-emit:{first}@parallel")
        if not emit(first):
            todo[first] = ["emit", "commit"]

    def _failover_step(self, sched: _Schedule, step: int) -> bool:
        """Against a gated cluster: maybe hold a master's replication (a shard's, or the
        ledger's); a few steps after, fail it over with its replica behind, and go on with a
        new runtime (a new process). True if this step was spent on it."""
        cluster, rng, rt = self.cluster, sched.rng, sched.rt
        assert cluster is not None
        if sched.lagging is not None:
            port, steps_left = sched.lagging
            if steps_left > 0:
                sched.lagging = (port, steps_left - 1)
                return False
            cluster.failover(port)
            sched.lagging = None
            sched.result.events.append(f"failover-with-lag@step{step}")
            old = sched.rt
            sched.rt = self._runtime(old.pipeline, old.home, old.faults, old.shards or 1)
            old.client.close()
            return True
        if rng.random() >= 0.12:
            return False
        ks = rt.keyspace
        ledger_master = cluster.master_of(ks.ledger)
        shard_masters = [cluster.master_of(ks.shard(i).ledger) for i in range(ks.shards)]
        others = [m for m in shard_masters if m != ledger_master]
        target = rng.choice(others) if others and rng.random() < 0.7 else ledger_master
        cluster.hold_replication(target)
        sched.lagging = (target, rng.randint(1, 3))
        role = "ledger" if target == ledger_master else "shard"
        sched.result.events.append(f"replication-lag:{role}@step{step}")
        return True

    def _reset_in_flight(self, sched: _Schedule, run_id: str, next_step: str, step: int) -> None:
        """An operator resets the pipeline (and its source) while ``run_id`` is in flight: its
        next step must be refused; a new runtime (a new process) goes on from scratch."""
        old = sched.rt
        sched.end_outage(f"reset@step{step}")
        _ = old.ledger.generation  # the run's process started before the operator acted
        fresh = self._runtime(old.pipeline, old.home, old.faults, old.shards or 1)
        kafka = fresh.log.chaos.producers_own  # e.g. a topic: never deleted by a reset
        try:
            try:
                reset_pipeline(fresh, source=not kafka)
                sched.result.events.append(f"reset@step{step}")
            except PipelineBusyError:  # a run holds a live lease: the operator insists
                reset_pipeline(fresh, force=True, source=not kafka)
                sched.result.events.append(f"reset-forced@step{step}")
        except ReplicationError:  # not on a replica: the operator waits for it, resets again
            assert self.cluster is not None and sched.lagging is not None
            self.cluster.release_replication(sched.lagging[0])
            sched.lagging = None
            reset_pipeline(fresh, force=True, source=not kafka)
            sched.result.events.append(f"reset-after-replication-wait@step{step}")
        if not kafka:  # a reset reader of Kafka reads the whole topic again
            sched.produced.clear()
        sched.committed_changes.clear()  # a new lineage: its streams start anew
        self._expect_refused(sched, old, run_id, next_step, "after a reset", (GenerationError,))
        old.client.close()
        sched.rt = fresh
        sched.was_reset = True

    def _rewind_in_flight(self, sched: _Schedule, run_id: str, next_step: str, step: int) -> None:
        """An operator rewinds the pipeline while ``run_id`` is in flight (``--force``: it
        holds a live lease) to a txid the undo logs retain - or to the committed one, which
        drops the pending txids: the only one allowed before they retain any, and the
        operator's fallback when a stream sink already wrote past the first choice. Half the
        time the rewind is killed part-way (``mid-rewind``: raise or crash); the run's next
        step is then refused too, and the operator runs the same rewind again. Afterwards the
        run's next step must be refused (GenerationError in its own process; a new process of
        the run finds its txid rewound); the replay must count every record once (the final
        checks)."""
        from tridentflow.ops.rewind import RewindRefused, rewind_pipeline
        from tridentflow.steps.runs import RunNotBoundError

        old, rng, events = sched.rt, sched.rewind_rng, sched.result.events
        sched.end_outage(f"rewind@step{step}")
        _ = old.ledger.generation  # the run's process started before the operator acted
        sched.rewinds += 1
        committed = old.ledger.committed_txid()
        kept = retained(old.client, old.keyspace)
        target = committed if kept is None else rng.randint(kept.oldest, kept.newest)
        # family: a sink of several parts judged as one - right below a txid an exporter left
        # on some of its parts (it died between them), most of the time (a generator of its
        # own: the other draws stay as they were)
        torn = sched.torn_since_rewind()
        sched.rewound_at_event = len(events)
        below = [t - 1 for t in torn if kept is not None and kept.oldest <= t - 1 <= kept.newest]
        if below and random.Random(f"torn-{sched.seed}-{step}").random() < 0.7:
            target = max(below)

        carried: list[tuple[str, ...]] = []  # the tables each finished rewind carried back

        def rewind(to: int, faults: FaultPlan | None = None) -> Runtime:
            fresh = self._runtime(old.pipeline, old.home, faults, old.shards or 1)
            try:
                report = rewind_pipeline(fresh, to, force=True)
            except ReplicationError:  # not on a replica: the operator waits, runs it again
                assert self.cluster is not None and sched.lagging is not None
                self.cluster.release_replication(sched.lagging[0])
                sched.lagging = None
                fresh.client.close()
                fresh = self._runtime(old.pipeline, old.home, FaultPlan(), old.shards or 1)
                report = rewind_pipeline(fresh, to, force=True)
                events.append(f"rewind-after-replication-wait@step{step}")
            carried.append(report.tables_rewound)
            return fresh

        bound = old.ledger.txid_of_run(run_id)
        kept_txid = bound is not None and bound <= committed  # e.g. cut short after its mark

        def refused(rt: Runtime, what: str) -> None:
            if kept_txid and bound <= target and what != "during a rewind cut short":
                return  # the rewind keeps the run's committed txid: its step is a no-op
            refusals = (GenerationError, RunNotBoundError)
            self._expect_refused(sched, rt, run_id, next_step, what, refusals)

        last = old.ledger.last_txid()
        lake = [f for f in old.pipeline.feeds if isinstance(f.sink, (DeltaSink, IcebergSink))]
        faults = FaultPlan()
        if lake and rng.random() < 0.5:  # after the states, before the first table, or in them
            action = rng.choice(("raise", "crash"))
            at = target if last == target or rng.random() < 0.5 else rng.randint(target + 1, last)
            faults = FaultPlan((Fault("mid-rewind", at, 1, action),))
        elif not lake and last > target and rng.random() < 0.5:
            action = rng.choice(("raise", "crash"))
            faults = FaultPlan((Fault("mid-rewind", rng.randint(target + 1, last), 1, action),))
        killed = f"({faults.faults[0]})" if faults.faults else ""
        events.append(f"rewind-to:{target}@step{step}{killed}")
        try:
            try:
                fresh = rewind(target, faults)
            except (InjectedFault, SimulatedCrash):
                events.append("rewind-cut-short")
                refused(old, "during a rewind cut short")
                fresh = rewind(target)  # the operator runs it again: it finishes
        except RewindRefused:  # a stream sink wrote past it: the operator keeps what it has
            events.append("rewind-refused:sink")
            target = committed
            fresh = rewind(committed)
        sched.forget_changes_after(target)  # taken back: the replay commits them anew
        if lake:  # a table holding a version of the target is carried back, not reloaded
            from tridentflow.steps.export import table_versions

            had = {f.name for f in lake if target in table_versions(old, f)}
            if had - set(carried[-1]) and not sched.result.difference:
                sched.result.difference = (
                    f"the rewind to txid {target} did not carry back the tables of "
                    f"{sorted(had - set(carried[-1]))} (they have a version of it)"
                )
        refused(old, "after a rewind")
        if next_step != "coordinate":
            other = self._runtime(old.pipeline, old.home, FaultPlan(), old.shards or 1)
            refused(other, "after a rewind, in a new process")
            other.client.close()
        old.client.close()
        fresh.faults = old.faults
        sched.rt = fresh

    def _expect_refused(
        self,
        sched: _Schedule,
        rt: Runtime,
        run_id: str,
        next_step: str,
        what: str,
        refusals: tuple[type[BaseException], ...],
    ) -> None:
        """Run ``run_id``'s ``next_step`` with ``rt``: anything but one of ``refusals`` (an
        error, or the step going through) is the schedule's difference."""
        from tridentflow.steps.runs import commit_run

        try:
            if next_step == "coordinate":
                coordinate_run(rt, run_id, lease_ms=60_000)
            elif next_step == "emit":
                emit_run(rt, run_id, self.engine, lease_ms=60_000)
            else:
                commit_run(rt, run_id)
        except refusals:
            pass
        except (InjectedFault, SimulatedCrash) as exc:  # a fault point past every check
            sched.result.difference = (
                f"{next_step} of {run_id} {what} was not refused (it got as far as {exc})"
            )
        except BaseException as exc:
            sched.result.difference = f"{next_step} {what} failed with {exc!r}"
        else:
            sched.result.difference = f"{next_step} of {run_id} {what} was not refused"

    def _commit_race(self, rt: Runtime, run_id: str, racers: int) -> None:
        from tridentflow.steps.runs import commit_run

        if racers == 1:
            commit_run(rt, run_id)
            return
        errors: list[BaseException] = []
        results: list[str] = []

        def attempt() -> None:
            other = self._runtime(rt.pipeline, rt.home, rt.faults, rt.shards or 1)
            try:
                results.append(commit_run(other, run_id)["status"])
            except BaseException as exc:  # collected; re-raised below if no racer landed
                errors.append(exc)
            finally:
                other.client.close()

        at_once(attempt, racers)
        if "committed" not in results and "already-committed" not in results and errors:
            raise errors[0]

    # -- sinks ----------------------------------------------------------------------------
    def _pipeline(self, name: str, seed: int):
        """A fresh pipeline ``name`` with this schedule's sinks on every state."""
        pipeline = load_pipeline(name)
        if hasattr(pipeline.source, "topic_name"):  # a topic on the harness's broker
            if self.kafka is None:
                raise TridentflowError(f"chaos: pipeline {name} needs a broker (kafka=)")
            pipeline.source = replace(
                pipeline.source,
                topic=f"chaos-{seed}",
                config={"bootstrap.servers": self.kafka.bootstrap},
                timeout_s=0.5,  # a frozen broker fails each call within half a second
            )
        parts = sink_parts(seed)
        for state in sorted(pipeline.states):
            changes = pipeline.state(state).new_values_stream().map(_canonical, ["key", "value"])
            stream = f"chaos-{seed}-{state}" + ("-{partition}" if parts > 1 else "")
            changes.sink(
                RedisStreamSink(stream, partitions=parts, name=f"stream-{state}", key=["key"])
            )
            if self.postgres_dsn:
                table = f"chaos_{seed}_{state}".replace("-", "_")
                changes.sink(
                    PostgresSink(table, dsn=self.postgres_dsn, key=["key"],
                                 name=f"postgres-{state}", columns=CHAOS_COLUMNS)
                )  # fmt: skip
            if lakehouse_schedule(seed):
                lake = self.workdir / f"lake-{seed}"
                lake.mkdir(parents=True, exist_ok=True)  # the SQLite catalog's directory
                as_json = (
                    pipeline.state(state).new_values_stream().map(_canonical_json, ["key", "value"])
                )
                if lakehouse_format(seed) == "delta":
                    as_json.sink(
                        DeltaSink(lake / f"delta-{state}", name=f"delta-{state}", key=["key"])
                    )
                    continue
                catalog = {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db",
                           "warehouse": f"file://{lake}/warehouse"}  # fmt: skip
                name = state.replace("-", "_")
                as_json.sink(
                    IcebergSink(f"chaos.s{seed}_{name}", catalog, name=f"iceberg-{state}",
                                key=["key"])
                )  # fmt: skip
        return pipeline

    def _drop_sink_targets(self, rt: Runtime, seed: int) -> None:
        shutil.rmtree(self.workdir / f"lake-{seed}", ignore_errors=True)
        if lakehouse_schedule(seed):  # the SQLite catalog's directory, for the next tables
            (self.workdir / f"lake-{seed}").mkdir(parents=True)
        for feed in rt.pipeline.feeds:
            if isinstance(feed.sink, RedisStreamSink):
                for stream in feed.sink.streams():
                    rt.client.delete(stream, companion_key(stream))
        if self.postgres_dsn:
            import psycopg

            with psycopg.connect(self.postgres_dsn, autocommit=True) as conn:
                for state in rt.pipeline.states:
                    table = f"chaos_{seed}_{state}".replace("-", "_")
                    conn.execute(f'DROP TABLE IF EXISTS "{table}"')
                conn.execute(
                    "DELETE FROM tridentflow_progress WHERE pipeline = %s"
                    if _has_progress(conn)
                    else "SELECT %s",
                    (rt.pipeline.name,),
                )

    def _kill_session(self, feed, point: str, txid: int, rng: random.Random, events) -> None:
        """At a sink's mid-export point: now and then, PostgreSQL ends the sink's session in
        the middle of its transaction (as a server restart would)."""
        conn = getattr(feed.sink, "_conn", None)
        if conn is None or rng.random() >= 0.3:
            return
        if self.postgres is not None and rng.random() < 0.5:
            self.postgres.restart()  # the server crashes mid-transaction, and comes back
            events.append(f"pg-restart@{txid}")
            return
        import psycopg

        with psycopg.connect(self.postgres_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        events.append(f"pg-session-killed@{txid}")

    def _maybe_export(self, sched: _Schedule, when: str) -> None:
        """Now and then, the sinks catch up: one exporter, or two at once (each a process of
        its own), or an operator's ``export --resync``. A failing export leaves its sink
        behind; the commits never wait for it."""
        rng, rt = sched.sink_rng, sched.rt
        roll = rng.random()
        if roll >= 0.6:
            return
        racers = 2 if roll < 0.12 else 1
        resync = 0.12 <= roll < 0.16
        events = sched.result.events
        if racers > 1:
            events.append(f"duplicate-export@{when}")
        if resync:
            events.append(f"export-resync@{when}")

        def hook(feed, point, txid):
            if self.postgres_dsn and isinstance(feed.sink, PostgresSink) and point == "mid-export":
                self._kill_session(feed, point, txid, rng, events)
            sink_misbehaves(sched.sink_edge_rng, point, txid, events)

        def exporter() -> None:
            try:  # the schedule's pipeline as it was given (a bundled name or module:attribute)
                other = self._runtime(self._pipeline(sched.result.pipeline, sched.seed),
                                      rt.home, rt.faults, rt.shards or 1)  # fmt: skip
            except Exception as exc:  # a thread's exception is lost unless it is noted
                if not sched.result.difference:
                    sched.result.difference = f"an exporter did not start: {one_line(exc)}"
                return
            try:
                names = [f.name for f in other.pipeline.feeds if not resync or
                         f.sink.resyncable]  # fmt: skip
                export(other, names, resync=resync, hook=hook)
            except (SimulatedCrash, SinkError) as exc:  # a kill, or the sink's one line
                events.append(f"export-failed:{type(exc).__name__}@{when}")
            except Exception as exc:  # every failure of a sink must be its SinkError line
                if not sched.result.difference:
                    sched.result.difference = (
                        f"an export let {type(exc).__name__} through instead of a SinkError "
                        f"(the commits would stop): {exc}"
                    )
            finally:
                other.client.close()

        at_once(exporter, racers)
        failed = any(e.endswith(f"@{when}") and "failed" in e for e in events)
        if racers == 1 and not failed and rt.ledger.committed_txid() > 0:
            # nothing commits in between here: each table must be the state as of now (a
            # commit cut short half-way must not show through). Before a fresh generation's
            # first txid a table still holds what the old one wrote (replaced at that txid)
            self._compare_sinks(rt, sched.result, only_postgres=True)

    def _check_sinks(
        self,
        rt: Runtime,
        result: ScheduleResult,
        committed_changes: dict[str, dict[int, dict[str, str]]] | None = None,
    ) -> None:
        """After the drain: every sink exported up to the committed txid equals the state,
        and every stream entry is what its txid's commit wrote (``committed_changes``)."""
        for attempt in range(3):
            try:
                export(rt)
                break
            except (TridentflowError, StateError, redis.RedisError) as exc:
                if attempt == 2 and not result.difference:
                    result.difference = f"the final export failed: {exc}"
                    return
        self._compare_sinks(rt, result, committed_changes=committed_changes)

    def _compare_sinks(
        self,
        rt: Runtime,
        result: ScheduleResult,
        only_postgres: bool = False,
        committed_changes: dict[str, dict[int, dict[str, str]]] | None = None,
    ) -> None:
        committed_changes = committed_changes or {}
        committed = rt.ledger.committed_txid()
        for feed in rt.pipeline.feeds:
            if only_postgres and not isinstance(feed.sink, PostgresSink):
                continue
            persist = rt.pipeline.states[feed.state]
            page = list_state(rt, persist, limit=1_000_000)
            want = {encode_key(k): _jsonish(v) for k, v in page.items}
            if isinstance(feed.sink, PostgresSink):
                got = _table(self.postgres_dsn, feed.sink.table)
            elif isinstance(feed.sink, DeltaSink | IcebergSink):
                got = _lake_table(feed.sink)
            else:
                got, problem = _stream_view(
                    rt, feed.sink, rt.ledger.lineage(), committed_changes.get(feed.name, {})
                )
                if problem and not result.difference:
                    result.difference = f"sink {feed.name}: {problem}"
                    return
            if got != want and not result.difference:
                first = sorted(set(got.items()) ^ set(want.items()), key=str)[:1]
                result.difference = (
                    f"sink {feed.name} at txid {committed}: {len(got)} rows vs {len(want)} keys "
                    f"in the state; first difference {first}"
                )
                return

    def _check(self, rt: Runtime, produced: list[str], result: ScheduleResult) -> None:
        left = backlog(rt)
        if left and not result.difference:
            result.difference = f"{left} records were never committed"
        garbage = staging_left(rt)
        if garbage and not result.difference:
            result.difference = (
                f"staging left behind once every txid committed: {garbage[0]}"
                + f" and {len(garbage) - 1} more" * (len(garbage) > 1)
            )
        report = audit(rt)
        result.lost, result.doubled = report.lost, report.doubled
        if report.unreadable and rt.log.chaos.removals_lose_records:
            # entries this schedule deleted or trimmed after they were read cannot be
            # recomputed from: the exact counts below are the check then
            result.events.append("audit:stream-entries-removed")
            report.unreadable = {}
        if (report.mismatched or report.unreadable) and not result.difference:
            if report.unreadable:
                result.difference = report.line()
            else:
                name, key, exp, act = report.mismatched[0]
                result.difference = f"{name} {key}: expected {exp!r}, stored {act!r}"
        for state_name, size, slide in WINDOWS.get(rt.pipeline.name, ()):
            problem = _window_problem(rt, state_name, size, slide, len(produced))
            if problem and not result.difference:
                result.difference = problem
        for state_name, values in _expected(rt, produced).items():
            persist = rt.pipeline.states[state_name]
            keys = sorted(values)
            _committed, got = query(rt, persist, [decode_key(k) for k in keys])
            for key, want, have in zip(keys, (values[k] for k in keys), got, strict=True):
                if want != have and not result.difference:
                    result.difference = f"{state_name} {key}: produced {want}, stored {have}"


def staging_left(rt: Runtime) -> list[str]:
    """What is still staged for ``rt``'s pipeline - its manifests, blocks and block indexes in
    Redis, any generation; attempt directories under its home - sorted. Once every txid is
    committed and its step retried as an orchestrator retries, nothing may be: every path
    that abandons an attempt deletes its staging (tridentflow.steps.emitter, committer)."""
    found = []
    for pattern in (rt.keyspace.pattern, rt.keyspace.shard_pattern):
        for raw in rt.client.scan_iter(match=pattern, count=1000):
            key = raw.decode("utf-8", "surrogatepass") if isinstance(raw, bytes) else raw
            if ":staged:" in key or ":block:" in key:
                found.append(key)
    if rt.staging_root.exists():
        found += [str(p) for p in rt.staging_root.glob("g-*/tx-*/attempt-*")]
    return sorted(found)


WINDOWS = {"wordcount-windowed": (("per_window", 10, 10), ("sliding", 10, 5))}
"""Count-window states of the bundled pipelines: (state, size, slide)."""


def _window_problem(rt: Runtime, name: str, size: int, slide: int, produced: int) -> str | None:
    """What is wrong with a count-window state of ``produced`` good records: every record
    is in size/slide windows (bad records hold positions too, so a window may hold fewer than
    ``size``, never more)."""
    page = list_state(rt, rt.pipeline.states[name], limit=1_000_000)
    windows = {key[0]: value for key, value in page.items}
    if sum(windows.values()) != produced * size // slide:
        return f"{name}: {sum(windows.values())} window memberships for {produced} records"
    over = [(w, n) for w, n in windows.items() if n > size or w % slide]
    return f"{name}: window {over[0][0]} holds {over[0][1]}" if over else None


def _expected(rt: Runtime, produced: list[str]) -> dict[str, dict[str, int]]:
    """Exact counts of everything produced, by encoded key, for the bundled pipelines."""
    if rt.pipeline.name in ("mutating", "mutating-opaque"):
        return expected_counts(produced)
    expected: dict[str, dict[str, int]] = {}
    windowed = {state for state, _size, _slide in WINDOWS.get(rt.pipeline.name, ())}
    for name, persist in rt.pipeline.states.items():
        if name in windowed:
            continue  # see _window_problem
        if persist.group_fields:
            counter = Counter(encode_key((w,)) for line in produced for w in line.split())
            expected[name] = dict(counter)
        else:
            expected[name] = {encode_key(()): len(produced)}
    return expected


def at_once(work: Callable[[], None], n: int) -> None:
    """Run ``work`` in ``n`` threads at once (racing processes); wait for all of them."""
    threads = [threading.Thread(target=work) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _canonical(*row):
    """A new-values tuple as (the key's canonical encoding, the value): keys that are equal
    in Python but not in tridentflow (1, 1.0, true) stay apart in every sink."""
    return (encode_key(row[:-1]), row[-1])


def _canonical_json(*row):
    """A new-values tuple as (the key's canonical encoding, the value as JSON text; None for
    a removed key): one column type whatever values the state holds (a lakehouse table)."""
    return (encode_key(row[:-1]), None if row[-1] is None else _jsonish(row[-1]))


def lakehouse_schedule(seed: int) -> bool:
    """Whether schedule ``seed`` exports its states to lakehouse tables too (three in ten:
    each table write costs)."""
    return random.Random(f"lakehouse-{seed}").random() < 0.3


def lakehouse_format(seed: int) -> str:
    """The table format of a lakehouse schedule: Delta or Iceberg, half of them each."""
    return random.Random(f"lakehouse-format-{seed}").choice(("delta", "iceberg"))


def _lake_table(sink: DeltaSink | IcebergSink) -> dict[str, str]:
    """A lakehouse sink's table as {key: value}; {} if it does not exist yet."""
    if isinstance(sink, DeltaSink):
        table = sink._table()
        rows = [] if table is None else table.to_pyarrow_table().to_pylist()
    else:
        found = sink._table()
        rows = [] if found is None else found.scan().to_arrow().to_pylist()
    return {r["key"]: r["value"] for r in rows}


def _jsonish(value) -> str:
    return json.dumps(value, sort_keys=True)


def _has_progress(conn) -> bool:
    return bool(
        conn.execute("SELECT to_regclass('tridentflow_progress') IS NOT NULL").fetchone()[0]
    )


def _table(dsn: str, table: str) -> dict[str, str]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]
        if not exists:
            return {}
        rows = conn.execute(f'SELECT key, value FROM "{table}"').fetchall()
    return {key: _jsonish(value) for key, value in rows}


def _stream_view(
    rt: Runtime,
    sink: RedisStreamSink,
    lineage: str,
    committed: dict[int, dict[str, str]] | None = None,
):
    """(key -> value by the last entry per key over the sink's streams, of this lineage, or
    a problem): one entry per key and txid, never twice, each key in one stream only, and
    every entry of a txid in ``committed`` (txid -> key -> value text, what its commit
    wrote) exactly that - an entry left by a rewound txid is caught even when later txids
    wrote the key again."""
    committed = committed or {}
    sink_id = f"{rt.pipeline.name}/{sink.name}"
    latest: dict[str, str] = {}
    home: dict[str, str] = {}
    for stream in sink.streams():
        meta = rt.client.hgetall(companion_key(stream))
        if meta.get(f"{sink_id}:generation".encode(), b"").decode() != lineage:
            continue  # nothing exported to this stream in this lineage
        base = int(meta[f"{sink_id}:base".encode()])
        seen: set[tuple[int, str]] = set()
        for entry_id, fields in rt.client.xrange(stream, f"{base + 1}-0", "+"):
            ms = int(entry_id.decode().split("-")[0])
            key, value = fields[b"key"].decode(), fields[b"value"].decode()
            if (ms, key) in seen:
                return {}, f"key {key} has two entries for txid {ms - base} in {stream}"
            if home.setdefault(key, stream) != stream:
                return {}, f"key {key} is in two streams ({home[key]}, {stream})"
            wrote = committed.get(ms - base)
            if wrote is not None and wrote.get(key) != value:
                return {}, (
                    f"{stream}'s entry of txid {ms - base} for key {key} holds {value}, but "
                    f"that txid's commit wrote {wrote.get(key, 'nothing for it')}"
                )
            seen.add((ms, key))
            latest[key] = value
    view = {}
    for key, text in latest.items():
        if text != "null":
            view[key] = _jsonish(json.loads(text)) if _is_json(text) else _jsonish(text)
    return view, None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


FOREIGN_ERRORS: tuple[type[Exception], ...] = (
    KeyError,
    OverflowError,
    RuntimeError,
    ZeroDivisionError,
    UnicodeError,
    ConnectionResetError,
)
"""What a sink's driver or a bug of its own may raise that is none of tridentflow's errors."""


def sink_parts(seed: int) -> int:
    """How many streams each stream sink of schedule ``seed`` spreads its keys over."""
    return random.Random(f"sink-parts-{seed}").choice((1, 2, 3))


def sink_misbehaves(rng: random.Random, point: str, txid: int, events: list[str]) -> None:
    """At a sink's point inside a txid (``mid-export``, ``between-parts``), now and then: it
    raises an error of no tridentflow type, or - between its parts - the process dies."""
    if rng.random() >= 0.12:
        return
    if point == "between-parts" and rng.random() < 0.5:
        events.append(f"sink-died-between-parts@{txid}")
        raise SimulatedCrash(f"the exporter died between a sink's parts of txid {txid}")
    kind = rng.choice(FOREIGN_ERRORS)
    events.append(f"sink-raised:{kind.__name__}@{txid}")
    raise kind(f"a foreign error at {point} of txid {txid}")


def _sink_faults(rng: random.Random, runs: int, events: list[str]) -> tuple[Fault, ...]:
    """Faults inside exports (``mid-export``), drawn by the sinks' own generator."""
    faults = []
    for txid in range(1, runs + 1):
        if rng.random() < 0.4:
            fault = Fault("mid-export", txid, rng.choice((1, 2)), rng.choice(("raise", "crash")))
            faults.append(fault)
            events.append(str(fault))
    return tuple(faults)


class _Schedule:
    """What one schedule changes as it goes: its runtime (replaced after a reset), the lines
    produced since the last reset, and a real outage in progress."""

    def __init__(self, rng: random.Random, rt: Runtime, result: ScheduleResult, aside: Path):
        self.rng, self.rt, self.result, self.aside = rng, rt, result, aside
        self.rewound_at_event = 0
        """How many events there were at the last rewind (``torn_since_rewind``)."""
        self.produced: list[str] = []
        self.was_reset = False
        self.outage: tuple[str, int, bytes] | None = None
        self.lagging: tuple[int, int] | None = None
        """(master port, steps left) while a master's replication is held (gated clusters)."""
        self.sink_rng = random.Random(0)
        """The sinks' own generator (exports, their faults): the steps' draws stay as they
        were before sinks existed."""
        self.sink_edge_rng = random.Random(0)
        """Foreign errors and deaths between parts inside sinks: the other draws stay."""
        self.lake = False
        """Whether the schedule exports to Delta or Iceberg tables (``lakehouse_schedule``)."""
        self.committed_changes: dict[str, dict[int, dict[str, str]]] = {}
        """Stream sink -> txid -> key -> value text: what each commit wrote to the change
        log (read right after it), which every stream entry of that txid must hold."""

        self.seed = 0
        self.kafka: LocalKafka | None = None
        self.kafka_rng = random.Random(0)
        """Kafka schedules' own generator (mid-emit freezes, transactions, bad records)."""
        self.rewind_rng = random.Random(0)
        """The operator's rewinds' own generator: the steps' draws stay as they were."""
        self.parallel_rng = random.Random(0)
        """Parallel runs' own generator (when, how many): the steps' draws stay."""
        self.rewinds = 0
        self.unsent: list[str] = []
        """Lines produced while the broker was frozen: sent when it is back."""
        self.freeze: threading.Timer | None = None

    def note_changes(self, txid: int | None) -> None:
        """Note what committed txid ``txid`` wrote for each stream sink (from its change log,
        read now: the export has not dropped it yet)."""
        from tridentflow.plan import compile_chain
        from tridentflow.sinks.redisstream import _text
        from tridentflow.steps.export import changes_of, stream_rows

        rt = self.rt
        if txid is None or txid > rt.ledger.committed_txid():
            return
        for feed in rt.pipeline.feeds:
            if not isinstance(feed.sink, RedisStreamSink):
                continue
            items = changes_of(rt, feed, txid)
            if items is None:
                continue  # already exported and dropped: noted when it committed
            rows = stream_rows(items, compile_chain(feed.node))
            noted = {str(row[0]): _text(row[1]) for row in rows}
            self.committed_changes.setdefault(feed.name, {})[txid] = noted

    def forget_changes_after(self, target: int) -> None:
        """A rewind to ``target`` took the later txids back: their replays commit anew."""
        for by_txid in self.committed_changes.values():
            for txid in [t for t in by_txid if t > target]:
                del by_txid[txid]

    def torn_since_rewind(self) -> list[int]:
        """Txids an exporter left on some of a sink's parts (it died between them) since the
        last rewind: the operator's next rewind aims right below them most of the time."""
        events = self.result.events[self.rewound_at_event :]
        return [int(e.rsplit("@", 1)[1]) for e in events if e.startswith("sink-died-between")]

    def append(self, n: int, during: str | None = None) -> None:
        rng = self.rng
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5))) for _ in range(n)]
        log = self.rt.log
        disturb = log.chaos.disturb
        if disturb == "freeze-broker":  # the producers' log: sent by a producer of its own
            self._produce_kafka(lines)
            if during:
                self.result.events.append(f"append+{n}@{during}")
            return
        self.rt.source_scan()
        if disturb == "remove-entries":
            try:
                log.append_spread(lines)
            except SourceError:  # refused: a stream it read was deleted; the operator resets
                self.operator_resets_reader(f"produce-refused@{during or 'append'}")
                log.append_spread(lines)
        elif disturb == "dark-partition":
            log.append_spread(lines, skip_unavailable=True)
        else:  # a source that declares no disturbance: appended through its own produce
            encoded = [encode_record(line) for line in lines]
            p = self.rt.pipeline
            log.produce(p.name, encoded, None, p.source.partitions)
        self.produced.extend(lines)
        if during:
            self.result.events.append(f"append+{n}@{during}")
        if disturb != "none" and rng.random() < 0.15:  # records that cannot be decoded
            log = self.rt.log
            if disturb == "remove-entries":  # bytes that are not UTF-8, a wrong field
                bad = rng.choice(BAD_ENTRIES)
                self.rt.client.xadd(log.stream_keys[rng.randrange(log.partitions())], bad)
                self.result.events.append(f"bad-entry{BAD_ENTRIES.index(bad)}")
                return
            bad = rng.choice(BAD_LINES)
            readable = sorted(log.scan().heads)
            if readable:
                log.append_lines(rng.choice(readable), [bad])
                self.result.events.append(f"bad-record{BAD_LINES.index(bad)}")

    def _produce_kafka(self, lines: list[str]) -> None:
        """Send lines (held while the broker is frozen: a producer retries until it is back),
        now and then in a transaction (its commit marker takes an offset), now and then with
        an undecodable record beside them."""
        self.produced.extend(lines)
        if self.outage is not None:
            self.unsent.extend(lines)
            return
        source, rng = self.rt.log, self.kafka_rng
        assert source.chaos.disturb == "freeze-broker" and self.kafka is not None
        from confluent_kafka import Producer

        # a producer of its own: the source's short timeout is the reader's, not a producer's
        log = type(source)(source.topic, source.config, source.pipeline, timeout_s=30)
        quiet = logging.getLogger("tridentflow.kafka.client")
        try:
            if rng.random() < 0.3:
                producer = Producer(
                    {"bootstrap.servers": self.kafka.bootstrap, "transactional.id": log.topic},
                    logger=quiet,
                )
                producer.init_transactions(30)
                producer.begin_transaction()
                n = log.partitions()
                for i, line in enumerate(lines):
                    producer.produce(log.topic, json.dumps(line).encode(), partition=i % n)
                producer.commit_transaction(30)
                self.result.events.append("kafka-transaction")
            else:
                log.append_spread(lines)
            if rng.random() < 0.15:
                bad = rng.choice(BAD_KAFKA_VALUES)
                producer = Producer({"bootstrap.servers": self.kafka.bootstrap}, logger=quiet)
                producer.produce(log.topic, bad, partition=rng.randrange(log.partitions()))
                producer.flush(30)
                self.result.events.append(f"bad-kafka-record{BAD_KAFKA_VALUES.index(bad)}")
        finally:
            log.close()

    def toggle_broker(self, when: str) -> None:
        """The broker stops answering (frozen: nothing lost), or answers again."""
        if self.outage is not None:
            self.end_outage(when)
            return
        assert self.kafka is not None
        self.kafka.pause()
        self.outage = ("broker-frozen", -1, b"")
        self.result.events.append(f"outage:broker-frozen@{when}")

    def maybe_late_block_writer(self, run_id: str, step: int) -> None:
        """Schedules staging in Redis: now and then, right after an emit staged, another writer
        overwrites one of its blocks - a speculative duplicate task finishing late with other
        content, or a torn rewrite. Loading the attempt, as the commit does before it writes
        anything, must refuse it (its SHA-1 and line count differ from the manifest's); a
        staged batch that loads anyway is the schedule's first difference. Then the block is
        put back, so the schedule goes on as drawn (its own generator: no other draw moves)."""
        rt = self.rt
        if random.Random(f"late-writer-{self.seed}-{step}").random() >= 0.12:
            return
        txid = rt.ledger.txid_of_run(run_id)
        attempt = rt.ledger.staged_attempt(txid) if txid else None
        if txid is None or attempt is None or txid <= rt.ledger.committed_txid():
            return
        area = rt.staging_of(txid, attempt)
        if not isinstance(area, RedisStagingArea):
            return
        staged = area.load(txid, attempt)
        refs = [r for name in rt.pipeline.states for r in staged.blocks(name) or []]
        if not refs:
            return
        ref = random.Random(f"late-writer-block-{self.seed}-{step}").choice(refs)
        key = staged.space.key(ref)
        original = rt.client.get(key) or b""
        lines = original.decode().split("\n")
        field_, _tab, partial = lines[0].partition("\t")
        if partial.lstrip("-").isdigit():  # the same key, another partial
            lines[0] = f"{field_}\t{int(partial) + 1}"
        else:  # one line twice (a torn rewrite)
            lines.append(lines[0])
        rt.client.set(key, "\n".join(lines), keepttl=True)
        try:
            area.load(txid, attempt)
            self.result.difference = (
                f"txid {txid} attempt {attempt} loaded with block {ref.name} overwritten by a "
                "late writer: a commit would apply what no emit staged"
            )
        except IncompleteBatchError:
            self.result.events.append(f"late-block-writer-refused@{run_id}:txid{txid}")
        finally:
            rt.client.set(key, original, keepttl=True)

    def maybe_freeze_mid_emit(self, run_id: str) -> None:
        """Kafka schedules: now and then the broker freezes a few milliseconds into an emit
        (while its read tasks read, or just after)."""
        if self.kafka is None or self.outage is not None or self.kafka_rng.random() >= 0.15:
            return
        delay = self.kafka_rng.uniform(0.0, 0.05)
        self.outage = ("broker-frozen", -1, b"")
        self.freeze = threading.Timer(delay, self.kafka.pause)
        self.freeze.start()
        self.result.events.append(f"outage:broker-frozen-mid-emit@{run_id}")

    def mutate_stream(self, when: str) -> None:
        """What another client does to the streams (see the module doc). Those that remove
        entries nobody read are reported by ``status``; the drain (or a failing run) makes
        the operator reset the reader."""
        rng, log, client = self.rng, self.rt.log, self.rt.client
        assert log.chaos.disturb == "remove-entries"
        committed = self.rt.ledger.committed_offsets()
        p = rng.randrange(log.partitions())
        key = log.stream_keys[p]
        read, unread = log.split_at(p, committed.get(p, 0))
        entries = read + unread
        kind = rng.choice(("xdel-read", "xdel-read", "trim-read", "xdel-unread",
                           "maxlen-unread", "delete", "recreate"))  # fmt: skip
        if kind == "xdel-read" and read:
            client.xdel(key, *rng.sample(read, rng.randint(1, len(read))))
        elif kind == "trim-read" and read:
            log.trim(committed)
        elif kind == "xdel-unread" and unread:
            client.xdel(key, rng.choice(unread))
        elif kind == "maxlen-unread" and len(unread) > 1:
            client.xtrim(key, maxlen=rng.randrange(len(unread)), approximate=False)
        elif kind == "delete" and entries:
            client.delete(key)
        elif kind == "recreate" and entries:
            client.delete(key)
            fresh = [" ".join(rng.choice(WORDS) for _ in range(2)) for _ in range(3)]
            for line in fresh:
                client.xadd(key, {"sentence": line})
        else:
            return
        self.result.events.append(f"stream-{kind}:{p}@{when}")

    def operator_resets_reader(self, when: str) -> None:
        """``status`` names a stream that lost entries before they were read: the operator
        resets the reader (not the source); from now on exactly what the streams hold
        counts."""
        rt = self.rt
        reset_pipeline(rt, force=True)
        self.committed_changes.clear()  # a new lineage: its streams start anew
        log = rt.log
        assert log.chaos.disturb == "remove-entries"
        self.produced = [
            fields[b"sentence"].decode()
            for key in log.stream_keys
            for _entry, fields in rt.client.xrange(key)
            if set(fields) == {b"sentence"} and _decodes(fields[b"sentence"])
        ]
        self.result.events.append(f"reader-reset@{when}")

    def toggle_outage(self, when: str) -> None:
        if self.outage is not None:
            self.end_outage(when)
            return
        log = self.rt.log
        if not log.exists():
            return
        partition = self.rng.randrange(log.partitions())
        pdir = log.root / f"p-{partition:04d}"
        if not (pdir / "HEAD").exists():
            return
        if self.rng.random() < 0.7:  # the mount drops: the directory is gone
            self.aside.mkdir(parents=True, exist_ok=True)
            pdir.rename(self.aside / pdir.name)
            self.outage = ("unmount", partition, b"")
        else:  # a torn HEAD (an I/O error mid-write on the storage)
            head = (pdir / "HEAD").read_bytes()
            (pdir / "HEAD").write_bytes(head[: len(head) // 2])
            self.outage = ("torn-head", partition, head)
        self.result.events.append(f"outage:{self.outage[0]}:{partition}@{when}")

    def end_outage(self, when: str) -> None:
        if self.outage is None:
            return
        kind, partition, head = self.outage
        if kind == "broker-frozen":
            assert self.kafka is not None
            if self.freeze is not None:  # a freeze timed mid-emit: fired, or never will
                self.freeze.cancel()
                self.freeze.join()
                self.freeze = None
            self.kafka.resume()
            self.outage = None
            unsent, self.unsent = self.unsent, []
            self.produced = self.produced[: len(self.produced) - len(unsent)]
            if unsent:
                self._produce_kafka(unsent)
            self.result.events.append(f"outage-over:broker@{when}")
            return
        pdir = self.rt.log.root / f"p-{partition:04d}"
        if kind == "unmount":
            (self.aside / pdir.name).rename(pdir)
        else:
            (pdir / "HEAD").write_bytes(head)
        self.outage = None
        self.result.events.append(f"outage-over:{partition}@{when}")


def _decodes(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def schedule_staging(seed: int) -> str:
    """Where a schedule's emits stage: files or Redis, from a generator of its own (the faults
    and shards a seed draws stay what they were)."""
    return random.Random(f"staging-{seed}").choice(("files", "redis"))


def schedule_shards(seed: int) -> int:
    """The state shards a schedule runs with: 1, 2 or 3, drawn from the seed by a generator of
    its own (the faults a seed draws stay what they were before shards existed)."""
    return random.Random(f"state-shards-{seed}").choice(SHARD_CHOICES)


def run_chaos(
    schedules: int,
    seed: int = 0,
    pipelines: Sequence[str] = PIPELINES,
    on_result: Callable[[ScheduleResult], None] | None = None,
    redis_restarts: bool = True,
    engine: Engine | None = None,
    redis_url: str | None = None,
    cluster: LocalCluster | None = None,
    postgres_dsn: str | None = None,
    postgres: LocalPostgres | None = None,
    kafka: LocalKafka | None = None,
) -> list[ScheduleResult]:
    """Run ``schedules`` schedules with seeds seed, seed+1, ...; stop at the first failure."""
    results = []
    with Chaos(
        pipelines=pipelines,
        redis_restarts=redis_restarts,
        engine=engine,
        redis_url=redis_url,
        cluster=cluster,
        postgres_dsn=postgres_dsn,
        postgres=postgres,
        kafka=kafka,
    ) as chaos:
        for s in range(seed, seed + schedules):
            outcome = chaos.run_schedule(s)
            results.append(outcome)
            if on_result is not None:
                on_result(outcome)
            if not outcome.ok:
                break
    return results
