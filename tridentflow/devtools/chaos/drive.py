"""The drive loop: a schedule's runs, retried and raced as an orchestrator would, then the
drain on events and the checks."""

from __future__ import annotations

import contextlib
import logging
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import tridentflow.faults
from tridentflow.devtools.chaos.checks import (
    WINDOWS,
    at_once,
    expected_by_key,
    repeated_history_entries,
    staging_left,
    stale_tx_hashes,
    unindexed_blocks,
    window_problem,
)
from tridentflow.devtools.chaos.config import (
    DRAIN_POLLS,
    DRAIN_REFIRE_S,
    ENGINE,
    PARALLEL_WAITS,
    PIPELINES,
    RESHARD_CHANCE,
    RETAIN_TXIDS,
    RETRIES,
    STEP_FAILURES,
    RedisServer,
    ScheduleResult,
)
from tridentflow.devtools.chaos.draws import (
    expiry_events,
    schedule_clock,
    schedule_compacting,
    schedule_shards,
    schedule_staging,
)
from tridentflow.devtools.chaos.fault_draws import schedule_faults
from tridentflow.devtools.chaos.operators import OperatorActs
from tridentflow.devtools.chaos.pauses import (
    PAUSE_CHANCE,
    PAUSED_LEASE_MS,
    PAUSED_SOCKET_TIMEOUT_S,
    STALL_ADOPTERS,
    STALL_INTO_PAUSE_CHANCE,
    Pauser,
    adopter,
    paused_redis,
)
from tridentflow.devtools.chaos.reader import ConcurrentReader
from tridentflow.devtools.chaos.schedule import Schedule
from tridentflow.devtools.chaos.sinks import SinkChecks
from tridentflow.devtools.chaos.tasks import RunTasks
from tridentflow.devtools.chaos.typed import TYPED_PIPELINE
from tridentflow.devtools.devcluster import LocalCluster
from tridentflow.devtools.devkafka import LocalKafka
from tridentflow.devtools.devpostgres import LocalPostgres
from tridentflow.engines.base import Engine
from tridentflow.errors import (
    NotReadyError,
)
from tridentflow.faults import Fault, FaultPlan
from tridentflow.ops.audit import audit
from tridentflow.ops.reset import reset_pipeline
from tridentflow.ops.status import status
from tridentflow.steps.driver import backlog
from tridentflow.steps.query import query
from tridentflow.steps.runs import (
    RunState,
    commit_run,
    coordinate_run,
    emit_run,
    ready_to_emit,
    release_run,
)
from tridentflow.steps.runtime import Runtime, connect
from tridentflow.steps.watch import Watch, work_waiting
from tridentflow_state.codec import decode_key
from tridentflow_state.expiry import compacting_eagerly


class Chaos(RunTasks, OperatorActs, SinkChecks):
    """The harness: one Redis (own, external or a gated cluster), a scratch directory, and a
    schedule at a time (run_schedule); the operator's acts and the sinks are mixed in."""

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
        expiry: bool = False,
        lost_writes: bool = False,
        reshards: bool = False,
        reader: bool = False,
        paused: bool = False,
        deploys: bool = False,
        tables: bool = False,
    ) -> None:
        """``paused``: the family "a paused Redis" (chaos.pauses): steps run through a
        SIGSTOP of Redis longer than the runs' leases (1 s in this family) and the clients'
        socket timeout (0.3 s), half of them raced by an adopter run (own redis-server only),
        and steps stalled past their leases while other runs commit their txid and the next.
        ``reader``: the family "a concurrent reader" (chaos.reader): a thread lists the
        recountable states while each schedule runs, every listing compared afterwards with the
        recount as of the txid it names.
        ``reshards``: the family "an operator reshards mid-run" (OperatorActs.
        _reshard_in_flight): once per schedule at most, not with ``lost_writes``.
        ``deploys``: the family "a deploy between an emit and its commit" (OperatorActs.
        _deploy_in_flight): code that adds a state, once per schedule at most, not with
        ``lost_writes``.
        ``tables``: the family "table maintenance" (OperatorActs._maintain_tables): in
        schedules with lakehouse tables, ``tables compact`` and ``tables vacuum
        --retention-hours 0 --yes`` between steps, rewinds and exports around them.
        ``lost_writes``: the family "Redis loses acknowledged commits while sinks outside
        it keep them" - once per schedule at most, Redis goes back to a snapshot taken a few
        steps before (own redis-server only; sources outside Redis).
        ``kafka``: the broker the Kafka pipelines' schedules read (and freeze).
        ``expiry``: the expiry family - every schedule's states expire keys after 1, 2 or 3
        txids (drawn per schedule), checked by audit's txid-by-txid recount. Off by default:
        expired keys take with them the evidence other families' checks count on.
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
        self.batch_clock: Callable[[int], int] | None = None  # the schedule's (schedule_clock)
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
        self.expiry = expiry
        self.lost_writes = lost_writes and redis_url is None
        self.reshards = reshards
        self.deploys = deploys
        self.tables = tables
        self.reader = reader
        self.paused = paused and redis_url is None
        self.lease_ms = PAUSED_LEASE_MS if self.paused else 60_000
        """The runs' leases: a pause outlasts them in the paused family."""
        self.socket_timeout = PAUSED_SOCKET_TIMEOUT_S if self.paused else None
        self.pauser = Pauser(lambda: self._redis_pid())
        self._stalling: tuple[Schedule, int] | None = None
        """The schedule running and its batch size (what a stalled holder's adopters use)."""
        logging.getLogger("psycopg").setLevel(logging.ERROR)  # killed sessions are on purpose

    def _redis_pid(self) -> int:
        assert self.redis.proc is not None, "the harness's redis-server is not running"
        return self.redis.proc.pid

    @property
    def url(self) -> str:
        if self.cluster is not None:  # any node still up
            return f"redis://127.0.0.1:{self.cluster.announced(self.cluster.alive()[0])}/0"
        return self.external_url or self.redis.url

    def _runtime(self, pipeline, home: Path, faults: FaultPlan | None = None, shards: int = 1):
        """A runtime of its own (a new process's): against a gated cluster, its commits wait
        for one replica (a short timeout: a held replica fails them fast)."""
        waits = {"replicas": 1, "replica_timeout_ms": 300} if self.cluster is not None else {}
        return Runtime(
            pipeline,
            connect(self.url, self.socket_timeout),
            home,
            faults or FaultPlan(),
            shards=shards,
            retain=RETAIN_TXIDS,  # undo logs in every schedule: the operator's rewinds
            staging_kind=self.staging_kind,
            batch_clock=self.batch_clock,
            **waits,
        )

    def __enter__(self) -> Chaos:
        if self.external_url is None:
            self.redis.start()
        if self.paused:  # a ``pause`` fault stops this harness's redis-server
            tridentflow.faults.PAUSE_HOOK = self.pauser.pause
            tridentflow.faults.STALL_HOOK = self._stalled_holder
        return self

    def __exit__(self, *exc: object) -> None:
        if self.paused:
            tridentflow.faults.PAUSE_HOOK = tridentflow.faults.STALL_HOOK = None
            self.pauser.wait()
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
        pipeline = self._pipeline(name, seed)
        self.batch_clock = schedule_clock(seed) if pipeline.expires_in_time else None
        rt = self._runtime(pipeline, home, shards=shards)
        if shards > 1:
            result.events.append(f"state-shards:{shards}")
        result.events += expiry_events(rt.pipeline)
        if self.staging_kind != "files":
            result.events.append(f"staging:{self.staging_kind}")
        traits = rt.log.chaos  # what the source says the harness may do to it
        if traits.fresh == "delete-source":  # e.g. streams live in Redis: start from none
            reset_pipeline(rt, force=True, source=True)
        else:
            rt.ledger.reset(force=True)
        sched = Schedule(rng, rt, result, home / "aside")
        if traits.fresh == "create":  # the producers' log: made for the schedule
            rt.log.create(rt.pipeline.source.partitions)
            sched.kafka = self.kafka
            sched.kafka_rng = random.Random(f"kafka-{seed}")
        sched.seed_families(
            seed,
            reshards=self.reshards,
            paused=self.paused,
            deploys=self.deploys,
            tables=self.tables,
            lost_writes=self.lost_writes and traits.fresh != "delete-source",  # outside Redis
        )
        self._drop_sink_targets(rt, seed)
        sched.append(rng.randint(5, 60))
        runs = rng.randint(3, 8)
        sched.rt = rt = rt.with_(faults=schedule_faults(sched, runs))
        batch_size = rng.choice([1, 2, 3, 5, 20])
        self._stalling = (sched, batch_size)
        reader = self._drive_with_families(sched, runs, batch_size, home, shards)
        self._settle_after_faults(sched)
        sched.rt = rt = sched.rt.with_(faults=FaultPlan())  # resume: drain what is left
        self._drain_on_events(sched, batch_size)
        result.txids = rt.ledger.committed_txid()
        result.records = len(sched.produced)
        self._check(rt, sched.produced, result)
        if reader is not None:
            reader.report(result)
        self._check_sinks(rt, result, sched.committed_changes)
        self._drop_sink_targets(rt, seed)
        rt.client.close()
        shutil.rmtree(home, ignore_errors=True)
        result.seconds = time.monotonic() - started
        return result

    def _note_recoveries(self, sched: Schedule) -> None:
        """Once every pause is over: in the paused family, the ms from each pause's end to
        the next commit, as ``recovery-ms:N`` events (benchmarks.fault_figures)."""
        self.pauser.wait()
        if not self.paused:
            return
        history = sched.rt.ledger.history(1000)
        commits = [e["committed_ms"] for e in history if e.get("committed_ms")]
        sched.result.events += [f"recovery-ms:{ms}" for ms in self.pauser.recoveries(commits)]

    def _drive_with_families(
        self, sched: Schedule, runs: int, batch_size: int, home: Path, shards: int
    ) -> ConcurrentReader | None:
        """``_drive`` under what the opt-in families add while the schedule runs: eager
        compaction (half the expiry schedules), the concurrent reader (returned, to be asked
        for its first difference once the schedule is checked)."""
        rt, seed, reader = sched.rt, sched.seed, None
        with contextlib.ExitStack() as during:
            if rt.pipeline.expiring and schedule_compacting(seed):
                sched.result.events.append("expiry-compacting")
                during.enter_context(compacting_eagerly())
            if self.reader:  # lists the states while the schedule runs
                reader = during.enter_context(
                    ConcurrentReader(  # a pipeline of its own: its sinks' catalogs, say
                        lambda: self._runtime(
                            self._pipeline(sched.result.pipeline, seed), home, shards=shards
                        ),
                        changes=lambda: (sched.changes_lineage, sched.committed_changes),
                        postgres_dsn=self.postgres_dsn,
                    )
                )
            self._drive(sched, runs, batch_size)
        return reader

    def _drain_on_events(self, sched: Schedule, batch_size: int) -> None:
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

    def _settle_after_faults(self, sched: Schedule) -> None:
        """What an operator does once the faulty phase is over, before the drain: recoveries
        noted, an outage ended, a reader reset past partitions whose removal lost records, a
        held replica let catch up (nothing lost, nothing to fail)."""
        self._note_recoveries(sched)
        sched.end_outage("drain")
        loses = sched.rt.log.chaos.removals_lose_records
        if loses and status(sched.rt)["unavailable_partitions"]:
            sched.operator_resets_reader("drain")
        if sched.lagging is not None:
            self.cluster.release_replication(sched.lagging[0])
            sched.lagging = None

    @staticmethod
    def _reshard_drawn(sched: Schedule, rt: Runtime, weight: int = 1) -> bool:
        """Whether the operator reshards now (RESHARD_CHANCE times ``weight``; once a
        schedule at most, in ``run_chaos(reshards=True)`` only, never where Redis goes back
        to a snapshot, nor before a commit)."""
        return (
            sched.reshard
            and sched.lost_rng is None
            and sched.reshards < 1
            and sched.reshard_rng.random() < RESHARD_CHANCE * weight
            and rt.ledger.committed_txid() > 0  # before: nothing to move, refused
        )

    def _step(
        self, sched: Schedule, rt: Runtime, run_id: str, name: str, step: int, batch_size: int
    ) -> Runtime:
        """Step ``name`` of ``run_id`` (with what the families do around it); the runtime
        the run goes on with."""
        rng, result = sched.rng, sched.result
        if name == "coordinate":
            coordinate_run(rt, run_id, batch_size, lease_ms=self.lease_ms)
        elif name == "emit":
            sched.maybe_freeze_mid_emit(run_id)
            emit_run(rt, run_id, self.engine, lease_ms=self.lease_ms)
            sched.maybe_late_block_writer(run_id, step)
            if self._reshard_drawn(sched, rt, 4):  # its batch commits resharded
                self._reshard_in_flight(sched, run_id, "commit", step)
                rt = sched.rt
            if self._deploy_drawn(sched, rt):  # its batch meets other code at its commit
                self._deploy_in_flight(sched, run_id, step)
                rt = sched.rt
        else:
            racers = 2 if rng.random() < 0.2 else 1
            if racers > 1:
                result.events.append(f"duplicate-commit@{run_id}")
            self._commit_race(rt, run_id, racers)
            sched.note_changes(rt.ledger.txid_of_run(run_id))
        return rt

    @contextlib.contextmanager
    def _maybe_paused(
        self, sched: Schedule, run_id: str, name: str, batch_size: int
    ) -> Iterator[None]:
        """In the paused family, now and then: Redis stopped during the block past every
        lease and socket timeout (chaos.pauses); half of those times an adopter run, in a
        process of its own, runs the next txid to the end from the moment Redis goes on,
        racing the stale holder. The adopter's failures are those of a run (Airflow
        retries it); its commit is followed by the sinks' checks like any other."""
        if sched.pause_rng is None or sched.pause_rng.random() >= PAUSE_CHANCE:
            yield
            return
        racing = sched.pause_rng.random() < 0.5
        sched.result.events.append(f"pause@{run_id}:{name}" + ("+adopter" if racing else ""))
        other = None  # the adopter's process, started before the pause
        if racing:
            other = self._runtime(sched.rt.pipeline, sched.rt.home, FaultPlan(),
                                  sched.rt.shards or 1)  # fmt: skip
        with paused_redis(self.pauser, sched.pause_rng) as resumed:
            thread = None
            if other is not None:
                adopting = other
                thread = adopter(resumed, lambda: self._adopt(sched, adopting, run_id, batch_size))
            try:
                yield
            finally:
                if thread is not None:
                    thread.join()

    def _stalled_holder(self, fault: Fault) -> None:
        """A ``stall`` fault (chaos.pauses), in the stalled step's thread: past its lease, an
        adopter run commits the step's txid T, and two next runs - records appended first,
        over the same words - T+1 and T+2 (whose mark deletes T's tx hash: a stale write
        recreating it stays); then the stale step goes on where it stopped - now and then
        into a paused Redis (STALL_INTO_PAUSE_CHANCE): its next command goes unanswered."""
        assert self._stalling is not None
        sched, batch_size = self._stalling
        sched.result.events.append(f"stalled:{fault.point}@{fault.txid}")
        self.pauser.wait()  # a Redis paused meanwhile goes on first
        time.sleep(self.lease_ms / 1000 + 0.2)  # its lease ran out (Redis's clock: this host's)
        for n in range(STALL_ADOPTERS):
            if n:
                sched.append(sched.rng.randint(1, 5), during=f"stalled@{fault.txid}")
            other = self._runtime(sched.rt.pipeline, sched.rt.home, FaultPlan(),
                                  sched.rt.shards or 1)  # fmt: skip
            self._adopt(sched, other, f"stalled{fault.txid}-{n}", batch_size)
        if sched.spent_rng is not None and sched.spent_rng.random() < STALL_INTO_PAUSE_CHANCE:
            sched.result.events.append(f"stalled-into-pause@{fault.txid}")
            if fault.point == "in-emit":  # it stages for the committed txid, then fails
                sched.zombie_txid = fault.txid
            self.pauser.pause()  # the stale step's next command goes unanswered

    def _adopt(self, sched: Schedule, rt: Runtime, run_id: str, batch_size: int) -> None:
        """Another run's steps, from coordinate to commit, in its own process; a step that
        fails ends it (as a run Airflow would retry later)."""
        adopter_id = f"{run_id}-adopter"
        try:
            coordinate_run(rt, adopter_id, batch_size, lease_ms=self.lease_ms)
            emit_run(rt, adopter_id, self.engine, lease_ms=self.lease_ms)
            commit_run(rt, adopter_id, self.lease_ms)
            sched.note_changes(rt.ledger.txid_of_run(adopter_id))
            sched.result.events.append(f"adopted-by:{adopter_id}")
        except STEP_FAILURES as exc:
            sched.result.events.append(f"adopter-failed:{adopter_id}:{type(exc).__name__}")
            release_run(rt, adopter_id)  # it gives up: the txid goes to the next run
        except BaseException as exc:  # not a step's failure: the schedule's difference
            sched.result.difference = sched.result.difference or (
                f"the adopter of {run_id} failed with {exc!r}"
            )
        finally:
            rt.client.close()

    def _finish_run(self, rt: Runtime, run_id: str, steps: Sequence[str]) -> None:
        """The rest of a run whose txid committed while one of its steps failed (a commit cut
        short after its mark), as Airflow's retry or a person's clear runs it: every step
        finds the txid committed and does nothing but delete what it left."""
        with contextlib.suppress(*STEP_FAILURES):
            for step in steps:
                if step == "coordinate":
                    coordinate_run(rt, run_id, None, lease_ms=self.lease_ms)
                elif step == "emit":
                    emit_run(rt, run_id, self.engine, lease_ms=self.lease_ms)
                else:
                    commit_run(rt, run_id, self.lease_ms)

    def _parallel_runs(self, sched: Schedule, run_no: int, batch_size: int) -> int:
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
                    lambda r=run_id: coordinate_run(
                        runtimes[r], r, batch_size, self.lease_ms, run_state
                    )
                ):
                    give_up(run_id)
            todo = {r: ["emit", "commit"] for r in run_ids if r in live}
            first, second = run_ids[0], run_ids[1]
            if first in todo and second in todo and rng.random() < 0.3:
                self._clear_emit_between(sched, runtimes, first, second, todo, retried)
            self._interleave(sched, runtimes, todo, live, run_state, give_up)
        finally:
            for other in runtimes.values():
                other.client.close()
        self.pauser.wait()  # the harness's own reads wait for a Redis paused meanwhile
        for run_id in run_ids:
            sched.note_changes(rt.ledger.txid_of_run(run_id))
        self._maybe_export(sched, f"after-parallel:{run_ids[-1]}")
        return run_no + len(run_ids)

    def _interleave(
        self,
        sched: Schedule,
        runtimes: dict[str, Runtime],
        todo: dict[str, list[str]],
        live: set[str],
        run_state: RunState,
        give_up: Callable[[str], None],
    ) -> None:
        """The parallel runs' steps left (``todo``), one at a time in an order drawn from the
        seed, records arriving in between, until each run has taken its steps (it leaves
        ``live``) or given up: RETRIES failures, or PARALLEL_WAITS turns that had not come."""
        rng = sched.parallel_rng
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
                emit_run(rt, run_id, self.engine, lease_ms=self.lease_ms)
            else:
                if rt.ledger.committed_txid() < txid - 1:
                    return "waited"
                commit_run(rt, run_id, self.lease_ms, run_state)
            return "ran"
        except STEP_FAILURES:
            return "failed"

    def _clear_emit_between(
        self,
        sched: Schedule,
        runtimes: dict[str, Runtime],
        first: str,
        second: str,
        todo: dict[str, list[str]],
        retried: Callable[[Callable[[], object]], bool],
    ) -> None:
        """An operator clears ``first``'s emit after ``second`` emitted from where ``first``'s
        stopped - records arriving in between, so the second try of ``first`` reads on."""

        def emit(run_id: str) -> bool:
            return retried(lambda: emit_run(runtimes[run_id], run_id, self.engine, self.lease_ms))

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

    def _commit_race(self, rt: Runtime, run_id: str, racers: int) -> None:
        from tridentflow.steps.runs import commit_run

        if racers == 1:
            commit_run(rt, run_id)
            return
        errors: list[BaseException] = []
        results: list[str] = []

        def attempt() -> None:
            other = None
            try:  # connecting may fail too (Redis paused): that racer's process died
                other = self._runtime(rt.pipeline, rt.home, rt.faults, rt.shards or 1)
                results.append(commit_run(other, run_id)["status"])
            except BaseException as exc:  # collected; re-raised below if no racer landed
                errors.append(exc)
            finally:
                if other is not None:
                    other.client.close()

        at_once(attempt, racers)
        if "committed" not in results and "already-committed" not in results and errors:
            raise errors[0]

    def _check(self, rt: Runtime, produced: list[str], result: ScheduleResult) -> None:
        left = backlog(rt)
        if left and not result.difference:
            result.difference = f"{left} records were never committed"
        lost = any(e.startswith("redis-lost-writes") for e in result.events)
        garbage = staging_left(rt, rt.ledger.committed_txid() if lost else None)
        if self.paused:  # a write given up on mid-pause may land after every cleanup
            expiring = [k for k in garbage if ":" in k and rt.client.ttl(k) > 0]
            if expiring:  # bounded by the staging TTL; never a key without one
                result.events.append(f"staging-left-to-its-ttl:{len(expiring)}")
            garbage = [k for k in garbage if k not in expiring]
        if garbage and not result.difference:
            result.difference = (
                f"staging left behind once every txid committed: {garbage[0]}"
                + f" and {len(garbage) - 1} more" * (len(garbage) > 1)
            )
        stray = unindexed_blocks(rt)  # left to its TTL, but found by no cleanup meanwhile
        if stray and not result.difference:
            result.difference = f"a staged block no index lists: {stray[0]}"
        repeated = repeated_history_entries(rt)
        if repeated and not result.difference:
            result.difference = f"the history holds txid {repeated[0]} more than once"
        stale = stale_tx_hashes(rt)
        if stale and not result.difference:
            result.difference = f"txid {stale[0]}'s tx hash was written after its commit"
        report = audit(rt)
        result.lost, result.doubled = report.lost, report.doubled
        missed = sorted(set(rt.pipeline.expiring) & set(report.unaudited))
        if missed and not report.unreadable and not result.difference:
            result.difference = f"audit could not recount expiring state(s) {missed}"
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
            problem = window_problem(rt, state_name, size, slide, len(produced))
            if problem and not result.difference:
                result.difference = problem
        for state_name, values in expected_by_key(rt, produced).items():
            persist = rt.pipeline.states[state_name]
            keys = sorted(values)
            _committed, got = query(rt, persist, [decode_key(k) for k in keys])
            for key, want, have in zip(keys, (values[k] for k in keys), got, strict=True):
                if want != have and not result.difference:
                    result.difference = f"{state_name} {key}: produced {want}, stored {have}"


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
    expiry: bool = False,
    lost_writes: bool = False,
    reshards: bool = False,
    reader: bool = False,
    paused: bool = False,
    deploys: bool = False,
    tables: bool = False,
    types: bool = False,
) -> list[ScheduleResult]:
    """Run ``schedules`` schedules with seeds seed, seed+1, ...; stop at the first failure.
    ``types``: the family "tables that meet value types" - half the schedules draw the typed
    pipeline (chaos.typed), its state exported column by column to Delta, Iceberg and
    PostgreSQL."""
    results = []
    if types and TYPED_PIPELINE not in pipelines:
        pipelines = (*pipelines, *[TYPED_PIPELINE] * len(pipelines))
    with Chaos(
        pipelines=pipelines,
        redis_restarts=redis_restarts,
        engine=engine,
        redis_url=redis_url,
        cluster=cluster,
        postgres_dsn=postgres_dsn,
        postgres=postgres,
        kafka=kafka,
        expiry=expiry,
        lost_writes=lost_writes,
        reshards=reshards,
        deploys=deploys,
        tables=tables,
        reader=reader,
        paused=paused,
    ) as chaos:
        for s in range(seed, seed + schedules):
            outcome = chaos.run_schedule(s)
            results.append(outcome)
            if on_result is not None:
                on_result(outcome)
            if not outcome.ok:
                break
    return results
