"""A schedule's steps (mixed into Chaos): at each, an operator's or the weather's action
when one is drawn - in a fixed order of draws, so a seed replays - else the current run's
next task, and what a failed task leads to (an outage, a clear, a run that gives up)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from tridentflow.devtools.chaos.config import (
    PARALLEL_CHANCE,
    RETRIES,
    REWIND_CHANCE,
    STEP_FAILURES,
)
from tridentflow.devtools.chaos.schedule import Schedule
from tridentflow.errors import PartitionUnavailableError
from tridentflow.faults import Dark, FaultPlan
from tridentflow.steps.runs import release_run

RUN_STEPS = ("coordinate", "emit", "commit")
"""A run's tasks, in order."""

WEATHER: tuple[tuple[float, str], ...] = (
    (0.08, "redis-restart"),
    (0.15, "append"),
    (0.19, "disturb"),
    (0.20, "reset"),
)
"""What else may happen at a step, as a ladder of one draw: the first rung above it that the
schedule has (a Redis restart only with ``redis_restarts``; one reset a schedule) - records
appended, the source disturbed (entries removed, a broker frozen, a partition dark), an
operator's reset."""


@dataclass
class RunCursor:
    """Where the schedule's orchestrator stands: its current run, that run's failed tries,
    the task it is at, and the tries that met a dark partition."""

    run_no: int = 0
    failures: int = 0
    step_index: int = 0
    dark_failures: int = 0
    rt: Any = None
    """The runtime the run's tasks go on with (a task may hand the next another)."""

    @property
    def run_id(self) -> str:
        return f"run-{self.run_no}"

    def next_run(self, run_no: int | None = None) -> None:
        """The next run (``run_no``: that one) starts, from its first task."""
        self.run_no = self.run_no + 1 if run_no is None else run_no
        self.failures = self.step_index = 0


class RunTasks:
    """How Chaos drives a schedule, step by step (its helpers - the operator's acts, the
    runs in parallel, ``_step`` - are Chaos's)."""

    def _drive(self, sched: Schedule, runs: int, batch_size: int) -> None:
        """The schedule's steps until ``runs`` txids are committed: each step an operator's
        or the weather's action when one is drawn (in a fixed order of draws, so a seed
        replays), else the current run's next task."""
        at = RunCursor()
        steps = RUN_STEPS
        for step in range(runs * 10):
            self.pauser.wait()  # the harness's own reads wait for Redis to go on
            if self.cluster is not None and self._failover_step(sched, step):
                continue
            if sched.lost_rng is not None and self._lost_writes_step(sched, step):
                at.next_run()  # its run died with Redis
                batch_size = sched.batch_after_loss or batch_size
                continue
            rt = sched.rt
            if rt.ledger.committed_txid() >= runs:
                if at.failures:  # the run's failed step is retried, as Airflow does
                    self._finish_run(rt, at.run_id, steps[at.step_index :])
                return
            if self._operator_acted(sched, at, step, batch_size):
                continue
            at.rt = rt
            try:
                self._run_tasks(sched, at, step, batch_size)
                at.next_run()
            except PartitionUnavailableError:
                self._dark_failure(sched, at, step)
            except STEP_FAILURES:
                self._step_failure(sched, at)

    def _operator_acted(self, sched: Schedule, at: RunCursor, step: int, batch_size: int) -> bool:
        """Whether an operator's action (a rewind, a reshard, table maintenance, runs in
        parallel) or one of ``WEATHER``'s was drawn for this step, and done."""
        rt, run_id, next_step = sched.rt, at.run_id, RUN_STEPS[at.step_index]
        torn = sched.torn_since_rewind()  # an exporter died between a sink's parts
        soon = torn and random.Random(f"torn-{sched.seed}-{step}-go").random() < 0.3
        chance = REWIND_CHANCE * (3 if sched.lake else 1)  # and the tables go back too
        if sched.rewinds < 2 and (sched.rewind_rng.random() < chance or soon):
            self._rewind_in_flight(sched, run_id, next_step, step)
            at.next_run()
            return True
        if self._reshard_drawn(sched, rt):
            self._reshard_in_flight(sched, run_id, next_step, step)
            return True
        if self._maintenance_drawn(sched):
            self._maintain_tables(sched, step)
            return True
        if at.step_index == 0 and sched.parallel_rng.random() < PARALLEL_CHANCE:
            at.next_run(self._parallel_runs(sched, at.run_no, batch_size))
            return True
        roll = sched.rng.random()
        for below, action in WEATHER:
            if roll < below and self._weather(sched, at, step, action):
                return True
        return False

    def _weather(self, sched: Schedule, at: RunCursor, step: int, action: str) -> bool:
        """Do one of ``WEATHER``'s actions; False where this schedule has none of it (the
        draw then falls to the next rung, as a cumulative ladder does)."""
        rng, rt, events = sched.rng, sched.rt, sched.result.events
        if action == "redis-restart":
            if not self.redis_restarts:
                return False
            self.redis.restart()
            events.append(f"redis-restart@step{step}")
        elif action == "append":
            sched.append(rng.randint(1, 10), during=f"step{step}")
            self._maybe_export(sched, f"step{step}")
        elif action == "disturb":
            disturb = rt.log.chaos.disturb
            if disturb == "remove-entries":
                sched.mutate_stream(f"step{step}")
            elif disturb == "freeze-broker":
                sched.toggle_broker(f"step{step}")
            elif disturb == "dark-partition":
                sched.toggle_outage(f"step{step}")
        elif action == "reset":
            if sched.was_reset:
                return False
            self._reset_in_flight(sched, at.run_id, RUN_STEPS[at.step_index], step)
            at.next_run()
        return True

    def _run_tasks(self, sched: Schedule, at: RunCursor, step: int, batch_size: int) -> None:
        """The current run's tasks from the one it is at to its commit (records appended
        between them now and then; an export after the commit)."""
        rng, run_id = sched.rng, at.run_id
        for index in range(at.step_index, len(RUN_STEPS)):
            at.step_index = index
            with self._maybe_paused(sched, run_id, RUN_STEPS[index], batch_size):
                at.rt = self._step(sched, at.rt, run_id, RUN_STEPS[index], step, batch_size)
            if RUN_STEPS[index] == "commit":  # an exporter starts once Redis answers
                self.pauser.wait()
                self._maybe_export(sched, f"after-commit:{run_id}")
            if index < 2 and rng.random() < 0.15:
                sched.append(rng.randint(1, 5), during=f"{run_id}:after-{RUN_STEPS[index]}")

    def _dark_failure(self, sched: Schedule, at: RunCursor, step: int) -> None:
        """A task met a dark partition; at the third, the operator repairs it."""
        self.pauser.wait()
        at.dark_failures += 1
        if at.dark_failures < 3:
            return
        rt = sched.rt = at.rt.with_(faults=FaultPlan(at.rt.faults.faults, ()))
        sched.end_outage(f"step{step}")
        sched.result.events.append(f"repaired-dark@step{step}")
        if rt.log.chaos.removals_lose_records:
            sched.operator_resets_reader(f"step{step}")
            at.dark_failures = 0
            at.next_run()

    def _step_failure(self, sched: Schedule, at: RunCursor) -> None:
        """A task failed: an outage may start meanwhile, a person may clear the run, and a
        run whose retries are spent gives up (the next run adopts its txid)."""
        self.pauser.wait()  # a step that gave up on a paused Redis: it goes on first
        rng, rt, result, run_id = sched.rng, at.rt, sched.result, at.run_id
        at.failures += 1
        if rng.random() < 0.3:  # an outage starts while the txid is being retried
            txid = rt.ledger.committed_txid() + 1
            dark = Dark(rng.randrange(rt.pipeline.source.partitions), txid, txid)
            darks = (*rt.faults.darks, dark)  # the retry: a new process sees it
            sched.rt = rt = rt.with_(faults=FaultPlan(rt.faults.faults, darks))
            result.events.append(f"dark:{dark.partition}@{txid}(mid-txid)")
        if rng.random() < 0.4:  # a person clears the whole run: from coordinate again
            at.step_index = 0
            result.events.append(f"clear:{run_id}")
        spent = sched.retries_spent()  # its task's retries were spent: no retry
        if at.failures >= RETRIES or spent:
            release_run(rt, run_id)
            result.events.append(f"{'spent' if spent else 'gave-up'}:{run_id}")
            left = sched.zombie_staging_left(rt)
            if left and not result.difference:
                result.difference = f"a zombie's last try left its staging: {left}"
            at.next_run()
