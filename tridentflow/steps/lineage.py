"""What one step of a txid read and wrote - OpenLineage's inputs and outputs - from the
pipeline and its ledger. Plain data (tridentflow_airflow.lineage makes OpenLineage's classes
of it); a few Redis reads, no writes, so reporting lineage never changes a run.

* coordinate, emit: the source (each dataset with the txid's offset ranges once known);
* commit: the source, and the states it applied the txid to;
* export: the states that feed sinks, and every sink.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tridentflow.datasets import LineageDataset, redis_namespace
from tridentflow.sinks.base import LineageContext
from tridentflow.steps.runtime import Runtime

STEPS = ("coordinate", "emit", "commit", "export")
HISTORY_SCAN = 200
"""How far back in the commit history the ranges of a committed txid are looked for."""


@dataclass(frozen=True)
class StepLineage:
    """One step's lineage. ``replayed``: the step found its txid committed already (a retry
    or a cleared task after the commit: it changed nothing). ``ranges``: the txid's offsets
    per source partition, [start, end) - empty until known (an opaque source's are fixed by
    its emit)."""

    pipeline: str
    step: str
    guarantee: str
    txid: int | None
    replayed: bool
    inputs: tuple[LineageDataset, ...]
    outputs: tuple[LineageDataset, ...]
    ranges: dict[int, tuple[int, int]]
    records: int | None = None

    def ranges_of(self, dataset: LineageDataset) -> dict[int, tuple[int, int]]:
        """The txid's ranges of the partitions ``dataset`` holds."""
        if dataset.partitions is None:
            return dict(self.ranges)
        return {p: r for p, r in self.ranges.items() if p in dataset.partitions}


def step_lineage(
    rt: Runtime, step: str, run_id: str, result: Mapping[str, Any] | None = None
) -> StepLineage:
    """The lineage of ``step`` of run ``run_id``; ``result`` is what the step returned (None:
    it has not finished, or it failed)."""
    if step not in STEPS:
        raise ValueError(f"step must be one of {', '.join(STEPS)}, got {step!r}")
    txid = _txid(rt, run_id, result)
    pipeline = rt.pipeline
    states = {name: state_dataset(rt, name) for name in sorted(pipeline.states)}
    if step == "export":
        inputs = tuple(states[name] for name in pipeline.fed_states)
        outputs = tuple(sink_datasets(rt))
    else:
        inputs = tuple(pipeline.source.lineage_datasets(rt.source_context))
        outputs = tuple(states.values()) if step == "commit" else ()
    return StepLineage(
        pipeline=pipeline.name,
        step=step,
        guarantee=pipeline.guarantee.value,
        txid=txid,
        replayed=result is not None and replayed(step, result),
        inputs=inputs,
        outputs=outputs,
        ranges=txid_ranges(rt, txid, result) if txid is not None and step != "export" else {},
        records=_int_or_none((result or {}).get("records")),
    )


def state_dataset(rt: Runtime, name: str) -> LineageDataset:
    """State ``name``: its hash on the pipeline's Redis."""
    return LineageDataset(redis_namespace(rt.redis_url), rt.keyspace.state(name))


def sink_datasets(rt: Runtime) -> list[LineageDataset]:
    """Every sink's datasets, in the pipeline's order."""
    ctx = LineageContext(rt.pipeline.name, rt.redis_url, rt.connections)
    found: list[LineageDataset] = []
    for feed in rt.pipeline.feeds:
        found.extend(feed.sink.lineage_datasets(ctx))
    return found


def replayed(step: str, result: Mapping[str, Any]) -> bool:
    """Whether the step's ``result`` says it found its txid done already."""
    if step == "coordinate":
        return bool(result.get("committed"))
    if step == "export":
        return not any(sink.get("applied") for sink in result.get("sinks", ()))
    return result.get("status") == "already-committed"


def txid_ranges(
    rt: Runtime, txid: int, result: Mapping[str, Any] | None = None
) -> dict[int, tuple[int, int]]:
    """``txid``'s offsets per partition: from the step's result, else the txid's batch
    metadata (a transactional source's, fixed by the coordinator), else its commit record."""
    raw = (result or {}).get("ranges")
    if raw is None:
        meta = rt.ledger.metadata(txid) or {}
        raw = meta.get("ranges")
    if raw is None and txid <= rt.ledger.committed_txid():
        raw = next(
            (e.get("ranges") for e in rt.ledger.history(HISTORY_SCAN) if e.get("txid") == txid),
            None,
        )
    return {int(p): (int(r[0]), int(r[1])) for p, r in (raw or {}).items()}


def _txid(rt: Runtime, run_id: str, result: Mapping[str, Any] | None) -> int | None:
    if result is not None and result.get("txid") is not None:
        return int(result["txid"])
    return rt.ledger.txid_of_run(run_id)


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
