"""Engines compute a batch's per-key partial aggregates and per-partition record counts.

Both engines run the same compiled plan (tridentflow.plan) in two parts: the record stage
(``read_task``: one task per slice of a source range, with quarantine and partial aggregation)
and the batch-operation graph (tridentflow.graph) over its output. ``LocalEngine`` runs them in
plain Python (the reference, used by ``audit`` and for quick local runs), ``SparkEngine``
(tridentflow.spark_engine) on a SparkSession.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tridentflow.batchops import StageReport
from tridentflow.errors import IncompleteBatchError
from tridentflow.filelog import FileLog
from tridentflow.graph import ExecContext, GraphBuilder, LocalBackend
from tridentflow.plan import BadRecord, KeyEncoder, Plan, Row, bad_record, evaluate

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
    """state name -> (encoded group key, staged value) pairs, one per key; consumed once,
    lazily. The staged value is a Combiner's partial or a Reducer's/updater's tuples."""
    bad: list[BadRecord]
    """Records that could not be processed (quarantined)."""
    stages: list[StageReport] = field(default_factory=list)
    """Every exchange's per-partition count reports (Trident's completeness check)."""


class Engine(Protocol):
    name: str

    def compute(
        self, plan: Plan, log_root: str, ranges: Ranges, ctx: ExecContext
    ) -> ComputeResult: ...


TASK_RECORDS = 50_000


def split_ranges(ranges: Ranges, task_records: int = TASK_RECORDS) -> list[tuple[int, int, int]]:
    """The batch's read tasks: each range split every ``task_records`` records, and at least
    one task per partition read (an empty one too), so the source stage's partitions do not
    depend on the engine."""
    tasks = []
    for partition, (start, end) in sorted(ranges.items()):
        tasks.append((partition, start, min(end, start + task_records)))
        for s in range(start + task_records, end, task_records):
            tasks.append((partition, s, min(end, s + task_records)))
    return tasks


@dataclass
class TaskOutput:
    """What one read task makes of one range: its record count, its bad records, per
    fast-path state the partial aggregate of every key (combined within the task: Trident's
    partial aggregation per partition), and per edge the tuples it produced, in order."""

    partition: int
    count: PartitionCount
    bad: list[BadRecord]
    partials: list[dict[str, Any]]
    edges: list[list[Row]]


def read_task(log_root: str, plan: Plan, partition: int, start: int, end: int) -> TaskOutput:
    """Read [start, end) of one partition and run the record stage on it. Runs on Spark
    executors too.

    A record is all or nothing: everything it makes is computed before any of it is kept, so a
    bad record (quarantined) contributes to no state and no edge."""
    combines = [pp.aggregator.combine for pp in plan.persists]
    partials: list[dict[str, Any]] = [{} for _ in plan.persists]
    edges: list[list[Row]] = [[] for _ in plan.edges]
    encode = KeyEncoder()
    bad: list[BadRecord] = []
    n, first, last = 0, None, None
    for offset, raw in FileLog(log_root).read_raw(partition, start, end):
        n += 1
        first = offset if first is None else first
        last = offset
        try:
            pairs, edge_rows = evaluate(plan, raw, encode)
        except Exception as exc:
            bad.append(bad_record(partition, offset, raw, exc))
            continue
        for acc, combine, state_pairs in zip(partials, combines, pairs, strict=True):
            for key, part in state_pairs:
                acc[key] = combine(acc[key], part) if key in acc else part
        for rows, produced in zip(edges, edge_rows, strict=True):
            rows.extend(produced)
    return TaskOutput(partition, PartitionCount(n, first, last), bad, partials, edges)


def merge_counts(
    ranges: Ranges, counts: Iterable[tuple[int, PartitionCount]]
) -> dict[int, PartitionCount]:
    merged = {p: PartitionCount(0, None, None) for p in ranges}
    for partition, count in counts:
        merged[partition] = PartitionCount.merge(merged[partition], count)
    return merged


def build_states(plan: Plan, builder: GraphBuilder, task_partials: list[Any]) -> dict[str, Any]:
    """Every state's dataset of (key, staged value): fast-path partials exchanged by key and
    combined; graph states built by the graph."""
    datasets: dict[str, Any] = {}
    for pp, data in zip(plan.persists, task_partials, strict=True):
        datasets[pp.state.name] = builder.stage_by_key(data, pp.state.name, pp.aggregator)
    for persist in plan.graph_persists:
        datasets[persist.state.name] = builder.persist(persist)
    return datasets


def check_stages(txid: int, reports: Iterable[StageReport]) -> None:
    """Fail (IncompleteBatchError) if any exchange lost or gained tuples or reports."""
    failed = [r for r in reports if not r.ok]
    if failed:
        raise IncompleteBatchError(
            f"txid {txid}: batch is incomplete, it must not commit: "
            + "; ".join(r.describe() for r in failed[:5])
            + (f" (and {len(failed) - 5} more)" if len(failed) > 5 else "")
        )


class LocalEngine:
    """Single-process engine: the plain-Python reference of every operation."""

    name = "local"

    def compute(
        self, plan: Plan, log_root: str, ranges: Ranges, ctx: ExecContext | None = None
    ) -> ComputeResult:
        ctx = ctx or ExecContext(0, "")
        outputs = [read_task(log_root, plan, *task) for task in split_ranges(ranges)]
        counts = merge_counts(ranges, ((o.partition, o.count) for o in outputs))
        bad = [b for o in outputs for b in o.bad]
        backend = LocalBackend(ctx.lose_tuple)
        edges = [[o.edges[e] for o in outputs] for e in range(len(plan.edges))]
        builder = GraphBuilder(plan, backend, edges, ctx)
        task_partials = [
            [list(o.partials[i].items()) for o in outputs] for i in range(len(plan.persists))
        ]
        datasets = build_states(plan, builder, task_partials)
        partials = {
            name: [pair for partition in data for pair in partition]
            for name, data in datasets.items()
        }
        return ComputeResult(counts, partials, bad, backend.reports)
