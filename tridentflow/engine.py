"""Engines compute a batch's per-key partial aggregates and per-partition record counts.

Both engines run the same compiled plan (tridentflow.plan): ``LocalEngine`` in plain Python
(the reference, used by ``audit`` and for quick local runs) and ``SparkEngine``
(tridentflow.spark_engine) on a SparkSession.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tridentflow.filelog import FileLog
from tridentflow.plan import BadRecord, Plan, Processed, process

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


def read_processed(
    log_root: str, plan: Plan, partition: int, start: int, end: int
) -> Iterator[Processed]:
    """Every record of one range, processed. Runs on Spark executors too."""
    for offset, raw in FileLog(log_root).read_raw(partition, start, end):
        yield process(plan, partition, offset, raw)


class LocalEngine:
    """Single-process engine: the plain-Python reference of every operation."""

    name = "local"

    def compute(self, plan: Plan, log_root: str, ranges: Ranges) -> ComputeResult:
        counts: dict[int, PartitionCount] = {}
        partials: list[dict[str, Any]] = [{} for _ in plan.persists]
        combines = [pp.aggregator.combine for pp in plan.persists]
        bad: list[BadRecord] = []
        for partition, (start, end) in sorted(ranges.items()):
            n, first, last = 0, None, None
            for _p, offset, pairs, failure in read_processed(log_root, plan, partition, start, end):
                n += 1
                first = offset if first is None else first
                last = offset
                if failure is not None:
                    bad.append(failure)
                    continue
                for acc, combine, state_pairs in zip(partials, combines, pairs, strict=True):
                    for key, part in state_pairs:
                        acc[key] = combine(acc[key], part) if key in acc else part
            counts[partition] = PartitionCount(n, first, last)
        names = [pp.state.name for pp in plan.persists]
        named = {name: acc.items() for name, acc in zip(names, partials, strict=True)}
        return ComputeResult(counts, named, bad)
