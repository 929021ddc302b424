"""Engines compute a batch's per-key partial aggregates and per-partition record counts.

Both engines run the same compiled plan (tridentflow.plan): ``LocalEngine`` in plain Python
(the reference, used by ``audit`` and for quick local runs) and ``SparkEngine``
(tridentflow.spark_engine) on a SparkSession.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tridentflow.filelog import FileLog
from tridentflow.plan import BadRecord, KeyEncoder, Plan, bad_record, evaluate

Ranges = Mapping[int, tuple[int, int]]
"""partition -> [start, end) offsets to read."""


@dataclass(frozen=True)
class PartitionCount:
    """Records actually read from one partition: how many, and the first and last offset."""

    n: int
    first: int | None
    last: int | None

    def to_json(self) -> list[Any]:
        return [self.n, self.first, self.last]

    @classmethod
    def merge(cls, a: PartitionCount, b: PartitionCount) -> PartitionCount:
        firsts = [x for x in (a.first, b.first) if x is not None]
        lasts = [x for x in (a.last, b.last) if x is not None]
        return cls(a.n + b.n, min(firsts, default=None), max(lasts, default=None))


@dataclass
class ComputeResult:
    counts: dict[int, PartitionCount]
    """Records read per partition, bad ones included."""
    partials: dict[str, Iterable[tuple[str, Any]]]
    """state name -> (encoded group key, partial) pairs, one per key; consumed once, lazily."""
    bad: list[BadRecord]
    """Records that could not be processed (quarantined)."""


class Engine(Protocol):
    name: str

    def compute(self, plan: Plan, log_root: str, ranges: Ranges) -> ComputeResult: ...


@dataclass
class TaskOutput:
    """What one task makes of one range: its record count, its bad records, and per persisted
    state the partial aggregate of every key (combined within the task: Trident's partial
    aggregation per partition)."""

    partition: int
    count: PartitionCount
    bad: list[BadRecord]
    partials: list[dict[str, Any]]


def aggregate_range(log_root: str, plan: Plan, partition: int, start: int, end: int) -> TaskOutput:
    """Read [start, end) of one partition and pre-aggregate it. Runs on Spark executors too.

    A record is all or nothing: every pair it makes is computed before any is combined, so a
    bad record (quarantined) contributes to no state."""
    combines = [pp.aggregator.combine for pp in plan.persists]
    partials: list[dict[str, Any]] = [{} for _ in plan.persists]
    encode = KeyEncoder()
    bad: list[BadRecord] = []
    n, first, last = 0, None, None
    for offset, raw in FileLog(log_root).read_raw(partition, start, end):
        n += 1
        first = offset if first is None else first
        last = offset
        try:
            pairs = evaluate(plan, raw, encode)
        except Exception as exc:
            bad.append(bad_record(partition, offset, raw, exc))
            continue
        for acc, combine, state_pairs in zip(partials, combines, pairs, strict=True):
            for key, part in state_pairs:
                acc[key] = combine(acc[key], part) if key in acc else part
    return TaskOutput(partition, PartitionCount(n, first, last), bad, partials)


def merge_outputs(plan: Plan, ranges: Ranges, outputs: Iterable[TaskOutput]) -> ComputeResult:
    """Combine task outputs (driver side, for the local engine)."""
    counts = {p: PartitionCount(0, None, None) for p in ranges}
    partials: list[dict[str, Any]] = [{} for _ in plan.persists]
    combines = [pp.aggregator.combine for pp in plan.persists]
    bad: list[BadRecord] = []
    for out in outputs:
        counts[out.partition] = PartitionCount.merge(counts[out.partition], out.count)
        bad.extend(out.bad)
        for acc, combine, task_partials in zip(partials, combines, out.partials, strict=True):
            for key, part in task_partials.items():
                acc[key] = combine(acc[key], part) if key in acc else part
    names = [pp.state.name for pp in plan.persists]
    return ComputeResult(counts, {n: a.items() for n, a in zip(names, partials, strict=True)}, bad)


class LocalEngine:
    """Single-process engine: the plain-Python reference of every operation."""

    name = "local"

    def compute(self, plan: Plan, log_root: str, ranges: Ranges) -> ComputeResult:
        return merge_outputs(
            plan,
            ranges,
            (aggregate_range(log_root, plan, p, s, e) for p, (s, e) in sorted(ranges.items())),
        )
