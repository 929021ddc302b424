"""What a schedule's seed draws of faults: the steps' raises and crashes, dark partitions, the
sinks' faults and the paused family's pauses and stalls, each family from its own stream."""

from __future__ import annotations

import random

from tridentflow.devtools.chaos.pauses import point_pauses, point_stalls
from tridentflow.devtools.chaos.schedule import Schedule
from tridentflow.devtools.chaos.sinks import sink_faults
from tridentflow.faults import STEP_POINTS, Dark, Fault, FaultPlan


def schedule_faults(sched: Schedule, runs: int) -> FaultPlan:
    """The schedule's faults over ``runs`` runs: the steps' (from its main stream), the
    sinks', then the paused family's pauses and stalls (a fault drawn at a point wins)."""
    rt, events = sched.rt, sched.result.events
    plan = step_faults(sched.rng, runs, rt.pipeline.source.partitions, events)
    plan = FaultPlan(plan.faults + sink_faults(sched.sink_rng, runs, events), plan.darks)
    if sched.pause_rng is not None:
        plan = FaultPlan(plan.faults + point_pauses(sched.pause_rng, runs, events), plan.darks)
        stalls = point_stalls(random.Random(f"stall-{sched.seed}"), runs, events, plan.faults)
        plan = FaultPlan(plan.faults + stalls, plan.darks)
    return plan


def step_faults(rng: random.Random, runs: int, partitions: int, events: list[str]) -> FaultPlan:
    """Each run's first attempt faults at a step point six times in ten, its second twice
    (``raise`` or ``crash``); half the schedules darken a partition for one to three txids."""
    faults = []
    for txid in range(1, runs + 1):
        for attempt in (1, 2):
            if rng.random() < (0.6 if attempt == 1 else 0.2):
                point = rng.choice(STEP_POINTS)
                fault = Fault(point, txid, attempt, rng.choice(("raise", "crash")))
                faults.append(fault)
                events.append(str(fault))
    darks = []
    if rng.random() < 0.5:
        first = rng.randint(1, runs)
        dark = Dark(rng.randrange(partitions), first, first + rng.randint(0, 2))
        darks.append(dark)
        events.append(f"dark:{dark.partition}@{dark.first}-{dark.last}")
    return FaultPlan(tuple(faults), tuple(darks))
