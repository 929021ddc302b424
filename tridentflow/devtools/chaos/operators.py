"""The operator's acts mid-run: reset, rewind, failover; the refusals they must cause."""

from __future__ import annotations

import contextlib
import copy
import random
from dataclasses import replace

from tridentflow.devtools.chaos.config import (
    DEPLOY_CHANCE,
    DEPLOYED_STATE,
    MAINTENANCE_CHANCE,
    SHARD_CHOICES,
)
from tridentflow.devtools.chaos.schedule import Schedule
from tridentflow.devtools.chaos.sinks import tables_ahead
from tridentflow.errors import (
    ReplicationError,
)
from tridentflow.faults import Fault, FaultPlan, InjectedFaultError, SimulatedCrash
from tridentflow.ops.reset import reset_pipeline
from tridentflow.pipeline import Feed
from tridentflow.sinks import DeltaSink, IcebergSink
from tridentflow.steps.export import export
from tridentflow.steps.runs import (
    coordinate_run,
    emit_run,
)
from tridentflow.steps.runtime import Runtime
from tridentflow_state.errors import GenerationError, PipelineBusyError
from tridentflow_state.undo import retained

PATIENT_MS = 5000
"""How long the operator's second try waits for a replica's acknowledgement: the CLI's default
(TRIDENTFLOW_WAIT_TIMEOUT_MS), not the harness's 300 ms that makes a held replica fail fast."""


class OperatorActs:
    """What an operator does while a run is in flight (mixed into Chaos): a reset, a rewind,
    a failover; and what the run's next step must then be told."""

    def _failover_step(self, sched: Schedule, step: int) -> bool:
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

    def _lost_writes_step(self, sched: Schedule, step: int) -> bool:
        """Redis comes back with an older copy of itself (an AOF that lost its tail, a backup
        restored): maybe take a snapshot now; a few steps later SIGKILL Redis and start it
        from that snapshot - the commits since are gone from Redis, not from the sinks
        outside it (lakehouse tables, PostgreSQL), whose next export must notice. A new
        runtime (a new process) goes on. True if this step was spent on it (the loss: the
        run in flight died with Redis; a snapshot is taken in passing)."""
        rng = sched.lost_rng
        assert rng is not None
        if sched.snapshot_in is None:
            if sched.lost_writes or rng.random() >= 0.15:
                return False
            sched.rt.client.save()
            sched.snapshot_in = rng.randint(4, 12)
            sched.resets_at_snapshot = _resets(sched)
            sched.changes_at_snapshot = copy.deepcopy(sched.committed_changes)
            sched.result.events.append(f"snapshot@step{step}")
            return False  # the run goes on: only Redis's loss ends it
        if sched.snapshot_in > 0:
            sched.snapshot_in -= 1
            return False
        if _resets(sched) != sched.resets_at_snapshot:
            # a snapshot from before an operator deleted the source cannot be resumed by any
            # system (its offsets point into a log that is gone; refused in one line): skip it
            sched.snapshot_in, sched.lost_writes = None, True
            sched.result.events.append(f"snapshot-dropped:reset-since@step{step}")
            return False
        old = sched.rt
        with contextlib.suppress(Exception):  # the sinks take the commits since the snapshot
            export(old.with_(faults=FaultPlan()))
        self.redis.back_to_snapshot()
        sched.snapshot_in, sched.lost_writes = None, True
        sched.rt = self._runtime(old.pipeline, old.home, old.faults, old.shards or 1)
        old.client.close()
        sched.batch_after_loss = rng.choice((1, 2, 3, 5, 20))
        ahead = tables_ahead(sched.rt)
        if ahead and rng.random() < 0.5:  # the sinks wait until the pipeline recommitted past
            sched.exports_held_through = (ahead, sched.rt.ledger.current_generation())
            sched.append(rng.randint(4, 12), during="redis-down")  # the lost txids' replays
            # read records the lost ones did not: the tables' copy of them differs
        back_to = sched.rt.ledger.committed_txid()
        sched.committed_changes = sched.changes_at_snapshot  # the streams in Redis went back
        sched.forget_changes_after(back_to)
        sched.result.events.append(f"redis-lost-writes@step{step}:back-to-{back_to}")
        return True

    def _reset_in_flight(self, sched: Schedule, run_id: str, next_step: str, step: int) -> None:
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
            self._wait_for_replicas(sched)
            reset_pipeline(fresh.with_(replica_timeout_ms=PATIENT_MS), force=True, source=not kafka)
            sched.result.events.append(f"reset-after-replication-wait@step{step}")
        if not kafka:  # a reset reader of Kafka reads the whole topic again
            sched.produced.clear()
        sched.new_lineage()
        self._expect_refused(sched, old, run_id, next_step, "after a reset", (GenerationError,))
        old.client.close()
        sched.rt = fresh
        sched.was_reset = True

    def _wait_for_replicas(self, sched: Schedule) -> None:
        """What an operator refused for want of a replica's acknowledgement does: waits until
        the replicas are back. The harness may be holding one (``sched.lagging``: released), or
        one is slow on its own (a loaded host, a replica resyncing after a failover): the
        refusal is right either way."""
        assert self.cluster is not None, "a ReplicationError without replicas"
        if sched.lagging is not None:
            self.cluster.release_replication(sched.lagging[0])
            sched.lagging = None
        self.cluster.wait_linked(self.cluster.alive())

    def _rewind_in_flight(self, sched: Schedule, run_id: str, next_step: str, step: int) -> None:
        """An operator rewinds the pipeline while ``run_id`` is in flight (``--force``: it
        holds a live lease) to a txid the undo logs retain - or to the committed one, which
        drops the pending txids: the only one allowed before they retain any, and the
        operator's fallback when a stream sink already wrote past the first choice. Half the
        time the rewind is killed part-way (``mid-rewind``: raise or crash); the run's next
        step is then refused too, and the operator runs the same rewind again. Afterwards the
        run's next step must be refused (GenerationError in its own process; a new process of
        the run finds its txid rewound); the replay must count every record once (the final
        checks)."""
        from tridentflow.ops.rewind import RewindRefusedError
        from tridentflow.steps.runs import RunNotBoundError

        old, rng, events = sched.rt, sched.rewind_rng, sched.result.events
        sched.end_outage(f"rewind@step{step}")
        _ = old.ledger.generation  # the run's process started before the operator acted
        sched.rewinds += 1
        committed = old.ledger.committed_txid()
        target = _rewind_target(sched, committed, step)

        bound = old.ledger.txid_of_run(run_id)
        kept_txid = bound is not None and bound <= committed  # e.g. cut short after its mark

        def refused(rt: Runtime, what: str) -> None:
            if kept_txid and bound <= target and what != "during a rewind cut short":
                return  # the rewind keeps the run's committed txid: its step is a no-op
            refusals = (GenerationError, RunNotBoundError)
            self._expect_refused(sched, rt, run_id, next_step, what, refusals)

        lake = [f for f in old.pipeline.feeds if isinstance(f.sink, (DeltaSink, IcebergSink))]
        faults = _mid_rewind(rng, bool(lake), target, old.ledger.last_txid())
        killed = f"({faults.faults[0]})" if faults.faults else ""
        events.append(f"rewind-to:{target}@step{step}{killed}")
        try:
            try:
                fresh, carried = self._rewound(sched, target, faults, step)
            except (InjectedFaultError, SimulatedCrash):
                events.append("rewind-cut-short")
                refused(old, "during a rewind cut short")
                fresh, carried = self._rewound(sched, target, None, step)  # run again: it ends
        except RewindRefusedError:  # a stream sink wrote past it: the operator keeps what it has
            events.append("rewind-refused:sink")
            target = committed
            fresh, carried = self._rewound(sched, committed, None, step)
        sched.forget_changes_after(target)  # taken back: the replay commits them anew
        _check_carried_back(sched, old, lake, target, carried)
        refused(old, "after a rewind")
        if next_step != "coordinate":
            other = self._runtime(old.pipeline, old.home, FaultPlan(), old.shards or 1)
            refused(other, "after a rewind, in a new process")
            other.client.close()
        old.client.close()
        sched.rt = fresh.with_(faults=old.faults)

    def _rewound(
        self, sched: Schedule, to: int, faults: FaultPlan | None, step: int
    ) -> tuple[Runtime, tuple[str, ...]]:
        """The operator's ``rewind --to`` (forced) in a process of its own, armed with
        ``faults``; off a replica, it waits for them and runs it again. Its runtime and the
        tables it carried back."""
        from tridentflow.ops.rewind import rewind_pipeline

        old = sched.rt
        fresh = self._runtime(old.pipeline, old.home, faults, old.shards or 1)
        try:
            report = rewind_pipeline(fresh, to, force=True)
        except ReplicationError:  # not on a replica: the operator waits, runs it again
            self._wait_for_replicas(sched)
            fresh.client.close()
            fresh = self._runtime(old.pipeline, old.home, FaultPlan(), old.shards or 1)
            report = rewind_pipeline(fresh.with_(replica_timeout_ms=PATIENT_MS), to, force=True)
            sched.result.events.append(f"rewind-after-replication-wait@step{step}")
        return fresh, report.tables_rewound

    def _reshard_in_flight(self, sched: Schedule, run_id: str, next_step: str, step: int) -> None:
        """An operator reshards the pipeline to another count (1-3) while ``run_id`` is in
        flight; half the time the reshard is killed at one of its fault points
        (``mid-reshard``: raise or crash) and run again. While it is cut short, the run's
        commit must be refused (ReshardUnderWayError); after it, a commit by the run's process
        that read the old layout must be refused too (it is told to run again), and the run
        goes on in a new process - its batch staged before the reshard commits after it. The
        final checks count every record once."""
        from tridentflow.ops.reshard import reshard
        from tridentflow_state.errors import ReshardUnderWayError, StateError

        old, rng, events = sched.rt, sched.reshard_rng, sched.result.events
        current = old.keyspace.shards
        target = rng.choice([n for n in SHARD_CHOICES if n != current])
        sched.reshards += 1
        txid = old.ledger.committed_txid() + 1
        faults = FaultPlan()
        if rng.random() < 0.5:
            fault = Fault("mid-reshard", txid, rng.randint(1, 4), rng.choice(("raise", "crash")))
            faults = FaultPlan((fault,))
        killed = f"({faults.faults[0]})" if faults.faults else ""
        events.append(f"reshard:{current}->{target}@step{step}:before-{next_step}{killed}")
        bound = old.ledger.txid_of_run(run_id)
        pending = bound is not None and bound > old.ledger.committed_txid()
        try:
            reshard(self._runtime(old.pipeline, old.home, faults, current), target)
        except (InjectedFaultError, SimulatedCrash):
            events.append("reshard-cut-short")
            if next_step == "commit" and pending:
                waiting = self._runtime(old.pipeline, old.home, FaultPlan(), current)
                self._expect_refused(
                    sched, waiting, run_id, "commit", "during a reshard cut short",
                    (ReshardUnderWayError,),
                )  # fmt: skip
                waiting.client.close()
            reshard(self._runtime(old.pipeline, old.home, FaultPlan(), current), target)
        if next_step == "commit" and pending:
            self._expect_refused(sched, old, run_id, "commit", "after a reshard", (StateError,))
        old.client.close()
        sched.rt = self._runtime(old.pipeline, old.home, old.faults, target)

    @staticmethod
    def _deploy_drawn(sched: Schedule, rt: Runtime) -> bool:
        """Whether the operator deploys other code now, between an emit and its commit
        (DEPLOY_CHANCE; once a schedule at most, in ``run_chaos(deploys=True)`` only, never
        where Redis goes back to a snapshot: the settings would go back under the code)."""
        return (
            sched.deploy_rng is not None
            and sched.lost_rng is None
            and sched.deploys < 1
            and sched.deploy_rng.random() < DEPLOY_CHANCE
        )

    @staticmethod
    def _maintenance_drawn(sched: Schedule) -> bool:
        """Whether the operator compacts or vacuums the tables now (MAINTENANCE_CHANCE; three
        times a schedule at most, in ``run_chaos(tables=True)`` schedules with tables)."""
        return (
            sched.maintenance_rng is not None
            and bool(sched.lake)
            and sched.maintenances < 3
            and sched.maintenance_rng.random() < MAINTENANCE_CHANCE
        )

    def _deploy_in_flight(self, sched: Schedule, run_id: str, step: int) -> None:
        """An operator deploys code of another shape between ``run_id``'s emit and its commit
        (the run in flight at the deploy): one more state, DEPLOYED_STATE, counting what the
        pipeline's first state counts. The new code's commit of the batch the old code
        emitted must be refused in one line before any write (its partials lack the new
        state; docs/model.md); the run's retries - a clear, or the next run - emit it again
        with the new code and commit it. The added state counts from the txid it was first
        committed in, which audit recounts it from; the final checks count every record of
        the others once."""
        from tridentflow.errors import IncompleteBatchError

        old, events = sched.rt, sched.result.events
        sched.deploys += 1
        pipeline = self._pipeline(sched.result.pipeline, sched.seed)
        first = pipeline.persists[0]
        pipeline.persists.append(replace(first, state=replace(first.state, name=DEPLOYED_STATE)))
        events.append(f"deploy:+{DEPLOYED_STATE}@step{step}:before-commit")
        new = self._runtime(pipeline, old.home, old.faults, old.shards or 1)
        bound = old.ledger.txid_of_run(run_id)
        if bound is not None and bound > old.ledger.committed_txid():
            self._expect_refused(
                sched, new, run_id, "commit", "after a deploy", (IncompleteBatchError,)
            )
        old.client.close()
        sched.rt = new

    def _maintain_tables(self, sched: Schedule, step: int) -> None:
        """An operator compacts the lakehouse tables, vacuums them with no retention
        (``tables vacuum --retention-hours 0 --yes``), or compacts then vacuums (the files
        the compaction replaced deleted at once), between two steps - a txid possibly in
        flight, an export owed, a rewind to come. None may change what a table says: the
        final checks, the reader's snapshots and a rewind's tables after it are the state's
        as of their stamps. The event counts the files each compaction merged (an appended
        change log has a file per txid) and each vacuum deleted."""
        from tridentflow.ops.tables import compact_table, lakehouse_feeds, vacuum_table

        rt, rng = sched.rt, sched.maintenance_rng
        assert rng is not None
        sched.maintenances += 1
        action = rng.choice(("compact", "vacuum", "compact-vacuum"))
        merged = removed = 0
        for feed in lakehouse_feeds(rt):
            if action.startswith("compact"):
                merged += _files_merged(compact_table(feed))
            if action.endswith("vacuum"):
                removed += len(vacuum_table(rt, feed, 0, apply=True))
        done = f":merged-{merged}" if action.startswith("compact") else ""
        done += f":removed-{removed}" if action.endswith("vacuum") else ""
        sched.result.events.append(f"tables-{action}@step{step}{done}")

    def _expect_refused(
        self,
        sched: Schedule,
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
                coordinate_run(rt, run_id, lease_ms=self.lease_ms)
            elif next_step == "emit":
                emit_run(rt, run_id, self.engine, lease_ms=self.lease_ms)
            else:
                commit_run(rt, run_id)
        except refusals:
            pass
        except (InjectedFaultError, SimulatedCrash) as exc:  # a fault point past every check
            sched.result.difference = (
                f"{next_step} of {run_id} {what} was not refused (it got as far as {exc})"
            )
        except BaseException as exc:
            sched.result.difference = f"{next_step} {what} failed with {exc!r}"
        else:
            sched.result.difference = f"{next_step} of {run_id} {what} was not refused"


def _files_merged(metrics: dict) -> int:
    """How many files a compaction merged into fewer: delta-rs's OPTIMIZE metrics, or the
    IcebergSink's (which rewrites even a lone file: that merges none)."""
    if "numFilesRemoved" in metrics:
        return int(metrics["numFilesRemoved"] or 0)
    before = int(metrics.get("files_before", 0))
    return before if before > int(metrics.get("files_after", 0)) else 0


def _resets(sched: Schedule) -> int:
    """How many resets the operator has made in this schedule so far."""
    return sum(e.startswith("reset") for e in sched.result.events)


def _rewind_target(sched: Schedule, committed: int, step: int) -> int:
    """The txid an operator rewinds to: the committed one while the undo logs retain none,
    else one they retain - and, most of the time, right below a txid an exporter left on some
    of a sink's parts (the family: a sink of several parts judged as one; a generator of its
    own, so the other draws stay as they were)."""
    old = sched.rt
    kept = retained(old.client, old.keyspace)
    target = committed if kept is None else sched.rewind_rng.randint(kept.oldest, kept.newest)
    torn = sched.torn_since_rewind()
    sched.rewound_at_event = len(sched.result.events)
    below = [t - 1 for t in torn if kept is not None and kept.oldest <= t - 1 <= kept.newest]
    if below and random.Random(f"torn-{sched.seed}-{step}").random() < 0.7:
        target = max(below)
    return target


def _mid_rewind(rng: random.Random, lake: bool, target: int, last: int) -> FaultPlan:
    """Half the time a ``mid-rewind`` fault (raise or crash): with table sinks after the
    states, before the first table or in them; otherwise at a txid the rewind takes back."""
    if lake and rng.random() < 0.5:
        action = rng.choice(("raise", "crash"))
        at = target if last == target or rng.random() < 0.5 else rng.randint(target + 1, last)
        return FaultPlan((Fault("mid-rewind", at, 1, action),))
    if not lake and last > target and rng.random() < 0.5:
        action = rng.choice(("raise", "crash"))
        return FaultPlan((Fault("mid-rewind", rng.randint(target + 1, last), 1, action),))
    return FaultPlan()


def _check_carried_back(
    sched: Schedule, old: Runtime, lake: list[Feed], target: int, carried: tuple[str, ...]
) -> None:
    """A table holding a version of the rewind's target is carried back, not reloaded: the
    schedule's difference otherwise."""
    if not lake:
        return
    from tridentflow.steps.export import table_versions

    had = {f.name for f in lake if target in table_versions(old, f)}
    if had - set(carried) and not sched.result.difference:
        sched.result.difference = (
            f"the rewind to txid {target} did not carry back the tables of "
            f"{sorted(had - set(carried))} (they have a version of it)"
        )
