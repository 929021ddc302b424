"""What one step of a txid read and wrote - OpenLineage's inputs and outputs - from the
pipeline and its ledger. Plain data (tridentflow_airflow.lineage makes OpenLineage's classes
of it); a few Redis reads, no writes, so reporting lineage never changes a run.

* coordinate, emit: the source (each dataset with the txid's offset ranges once known);
* commit: the source, and the states it applied the txid to (a sharded state: one dataset per
  shard, each a hash that exists);
* export: the states that feed sinks, and every sink.

A step's START and FAIL say what its COMPLETE would: the txid's ranges (frozen by the
coordinator, or - an opaque source - read by the emit attempt the commit applies) and whether
it replays a committed txid; a replay's record count is what its txid committed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tridentflow.datasets import LineageDataset, redis_namespace
from tridentflow.errors import TridentflowError
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
    states = {name: state_datasets(rt, name) for name in sorted(pipeline.states)}
    if step == "export":
        inputs = tuple(d for name in pipeline.fed_states for d in states[name])
        outputs = tuple(sink_datasets(rt))
    else:
        inputs = tuple(pipeline.source.lineage_datasets(rt.source_context))
        outputs = tuple(d for found in states.values() for d in found) if step == "commit" else ()
    if result is not None:
        again = replayed(step, result)
    else:  # START, FAIL: a step of a committed txid finds it so (export: its result tells)
        again = step != "export" and txid is not None and txid <= rt.ledger.committed_txid()
    records = _int_or_none((result or {}).get("records"))
    if again and txid is not None and step != "export":  # what the txid committed
        records = _int_or_none((commit_entry(rt, txid) or {}).get("records"))
    return StepLineage(
        pipeline=pipeline.name,
        step=step,
        guarantee=pipeline.guarantee.value,
        txid=txid,
        replayed=again,
        inputs=inputs,
        outputs=outputs,
        ranges=txid_ranges(rt, txid, result) if txid is not None and step != "export" else {},
        records=records,
    )


def state_datasets(rt: Runtime, name: str) -> list[LineageDataset]:
    """State ``name`` on the pipeline's Redis: its hash, or each shard's hash when the state
    is stored in shards (the keys that exist)."""
    namespace = redis_namespace(rt.redis_url)
    ks = rt.keyspace
    if not ks.sharded:
        return [LineageDataset(namespace, ks.state(name))]
    return [LineageDataset(namespace, ks.shard(i).state(name)) for i in range(ks.shards)]


def commit_entry(rt: Runtime, txid: int) -> dict[str, Any] | None:
    """``txid``'s entry in the commit history (None once older than HISTORY_SCAN commits)."""
    return next((e for e in rt.ledger.history(HISTORY_SCAN) if e.get("txid") == txid), None)


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
    metadata (a transactional source's, fixed by the coordinator), else its commit record,
    else - pending, an opaque source - what its staged emit attempt read."""
    raw = (result or {}).get("ranges")
    if raw is None:
        meta = rt.ledger.metadata(txid) or {}
        raw = meta.get("ranges")
    if raw is None and txid <= rt.ledger.committed_txid():
        raw = (commit_entry(rt, txid) or {}).get("ranges")
    if raw is None:
        raw = _staged_ranges(rt, txid)
    return {int(p): (int(r[0]), int(r[1])) for p, r in (raw or {}).items()}


def _staged_ranges(rt: Runtime, txid: int) -> dict[str, Any] | None:
    """The ranges the txid's recorded emit attempt read (what its commit applies)."""
    attempt = rt.ledger.staged_attempt(txid)
    if attempt is None:
        return None
    try:
        return rt.staging_of(txid, attempt).manifest(txid, attempt).get("ranges")
    except TridentflowError:  # discarded meanwhile (committed): the history has it then
        return None


def _txid(rt: Runtime, run_id: str, result: Mapping[str, Any] | None) -> int | None:
    if result is not None and result.get("txid") is not None:
        return int(result["txid"])
    return rt.ledger.txid_of_run(run_id)


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
