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
from tridentflow.plan import Plan, Row

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
    partials: dict[str, Iterable[tuple[Row, Any]]]
    """state name -> (group key, partial) pairs, one per key; may be consumed once, lazily."""


class Engine(Protocol):
    name: str

    def compute(self, plan: Plan, log_root: str, ranges: Ranges) -> ComputeResult: ...


def read_rows(
    log_root: str, plan: Plan, partition: int, start: int, end: int
) -> Iterator[tuple[int, int, Row]]:
    """(partition, offset, tuple) for each record of one range. Runs on Spark executors too."""
    decode = plan.decoder
    for offset, record in FileLog(log_root).read(partition, start, end):
        yield partition, offset, decode(record)


class LocalEngine:
    """Single-process engine: the plain-Python reference of every operation."""

    name = "local"

    def compute(self, plan: Plan, log_root: str, ranges: Ranges) -> ComputeResult:
        counts: dict[int, PartitionCount] = {p: PartitionCount(0, None, None) for p in ranges}
        partials: dict[str, dict[Row, Any]] = {pp.state.name: {} for pp in plan.persists}
        for partition, (start, end) in sorted(ranges.items()):
            n, first, last = 0, None, None
            for _p, offset, row in read_rows(log_root, plan, partition, start, end):
                n += 1
                first = offset if first is None else first
                last = offset
                for pp in plan.persists:
                    acc = partials[pp.state.name]
                    combine = pp.aggregator.combine
                    for key, part in pp.pairs(row):
                        acc[key] = combine(acc[key], part) if key in acc else part
            counts[partition] = PartitionCount(n, first, last)
        return ComputeResult(counts, {name: acc.items() for name, acc in partials.items()})
