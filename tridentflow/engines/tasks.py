"""The record stage every engine shares: a batch's ranges split into read tasks, and
``read_task``, which reads one through the source log and runs the per-record plan on it
(quarantine, the per-task partial aggregation of source-fed states, the tuples batch
operations consume). Runs on Spark executors too."""

from __future__ import annotations

import os
import socket
from collections import _count_elements  # type: ignore[attr-defined]
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tridentflow.aggregators import Count
from tridentflow.engines.base import PartitionCount, Ranges
from tridentflow.engines.graph import GraphBuilder
from tridentflow.errors import SourceError
from tridentflow.plan import (
    BadRecord,
    KeyEncoder,
    PersistPlan,
    Plan,
    Row,
    bad_record,
    decode_record,
)
from tridentflow.sources import is_file_log, open_log
from tridentflow.sources.base import Closes
from tridentflow_state.codec import encode_key
from tridentflow_state.errors import KeyEncodingError

TASK_RECORDS = 50_000
"""Records per read task when the plan has edges: a task holds every tuple its records make
for batch operations."""

FOLD_TASK_RECORDS = 250_000
"""Records per read task when every state is fed straight by the source (no edges): a task
then holds one partial per distinct key, whatever its record count, and fewer, larger tasks
mean fewer partials to combine across tasks."""


def task_records(plan: Plan) -> int:
    """How finely a batch is split into read tasks: the same for every engine, so a float
    Combiner's partials are grouped, and combined, alike everywhere."""
    return TASK_RECORDS if plan.edges else FOLD_TASK_RECORDS


ReadTask = tuple[int, int, int, int]
"""(partition, start, end, position shift): a read task; a record's position (see
``LogSource.position_field``) is its offset plus the shift."""


def split_ranges(
    ranges: Ranges, task_records: int = TASK_RECORDS, position_base: int | None = None
) -> list[ReadTask]:
    """The batch's read tasks: each range split every ``task_records`` records, and at least
    one task per partition read (an empty one too), so the source stage's partitions do not
    depend on the engine.

    Positions: the records before the batch come first (``position_base``: every partition's
    start, those skipped by an opaque batch too; by default the ranges' starts, offsets being
    dense), then the batch's records partition by partition, offset by offset. So positions
    are contiguous, never reused, and the same in every replay of a transactional batch (its
    ranges are frozen); an opaque batch's are those of the attempt committed."""
    tasks = []
    if position_base is None:
        position = sum(start for start, _end in ranges.values())
    else:
        position = position_base
    for partition, (start, end) in sorted(ranges.items()):
        shift = position - start
        tasks.append((partition, start, min(end, start + task_records), shift))
        for s in range(start + task_records, end, task_records):
            tasks.append((partition, s, min(end, s + task_records), shift))
        position += max(0, end - start)
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


class TaskFold:
    """One fast-path state's partial aggregate within one read task (Trident's partial
    aggregation per partition), keyed exactly: keys that compare equal but encode differently
    (1, 1.0 and True; 0.0 and -0.0) never share a slot.

    A key of one str - the common case - is folded under the str itself (a str equals only
    the same str) and encoded once per distinct key, in ``partials``; any other key is encoded
    per tuple (the task's KeyEncoder cache), so a bad one fails its own record. A str key that
    cannot be encoded (a lone surrogate) only shows in ``partials``: then the task is read
    again with ``defer=False``, every key encoded in its own record."""

    def __init__(self, pp: PersistPlan, encode: KeyEncoder, defer: bool = True) -> None:
        self.pp = pp
        self.encode = encode
        self.defer = defer
        self.combine = pp.aggregator.combine
        self.counting = type(pp.aggregator) is Count  # every partial is 1: fold by counting
        self.single = pp.key_idx[0] if len(pp.key_idx) == 1 else None
        self.by_str: dict[str, Any] = {}
        self.by_key: dict[str, Any] = {}

    def stage(self, row: Row) -> tuple[list, list]:
        """What one record adds: (str-keyed, encoded-key-keyed) items; raises on a bad one.
        Counting states stage bare keys, others (key, partial) pairs."""
        pp, k = self.pp, self.single
        outs = pp.expand(row)
        if self.counting:
            if k is not None and self.defer:
                keys = [out[k] for out in outs]
                if set(map(type, keys)) <= RAW_KEY_TYPES:
                    return keys, []
                others = [(v,) for v in keys if type(v) not in RAW_KEY_TYPES]
                return [v for v in keys if type(v) in RAW_KEY_TYPES], [
                    self.encode(x) for x in others
                ]
            return [], [self.encode(key) for key in _keys(pp, outs)]
        init, arg_idx = pp.aggregator.init, pp.arg_idx
        parts = [init(*[out[i] for i in arg_idx]) for out in outs]
        keys = [out[k] for out in outs] if k is not None else _keys(pp, outs)
        if k is None or not self.defer:
            if k is not None:
                keys = [(v,) for v in keys]
            return [], [(self.encode(key), part) for key, part in zip(keys, parts, strict=True)]
        strs, encoded = [], []
        for v, part in zip(keys, parts, strict=True):
            if type(v) in RAW_KEY_TYPES:
                strs.append((v, part))
            else:
                encoded.append((self.encode((v,)), part))
        return strs, encoded

    def apply(self, staged: tuple[list, list]) -> None:
        strs, encoded = staged
        if self.counting:
            if strs:
                _count_elements(self.by_str, strs)
            if encoded:
                _count_elements(self.by_key, encoded)
            return
        combine = self.combine
        for acc, items in ((self.by_str, strs), (self.by_key, encoded)):
            for key, part in items:
                acc[key] = combine(acc[key], part) if key in acc else part

    def partials(self) -> dict[str, Any]:
        """encoded key -> partial; KeyEncodingError if a deferred str key cannot be encoded."""
        if not self.by_str:
            return self.by_key
        merged = {encode_key((s,)): part for s, part in self.by_str.items()}  # no cache
        merged.update(self.by_key)  # encodings are injective: no key is in both
        return merged


RAW_KEY_TYPES = frozenset({str})
"""Types whose values a task folds one-field keys under as they are: a value of one of these
equals only values with the same encoding. Not int, float or bool: 1 == 1.0 == True."""


def _keys(pp: PersistPlan, outs: Iterable[Row]) -> list[tuple[Any, ...]]:
    key_idx = pp.key_idx
    return [tuple([out[i] for i in key_idx]) for out in outs]


def read_task(
    log_root: str,
    plan: Plan,
    partition: int,
    start: int,
    end: int,
    shift: int = 0,
    defer: bool = True,
) -> TaskOutput:
    """Read [start, end) of one partition and run the record stage on it. Runs on Spark
    executors too.

    A record is all or nothing: everything it makes is computed before any of it is kept, so a
    bad record (quarantined) contributes to no state and no edge."""
    encode = KeyEncoder()
    folds = [TaskFold(pp, encode, defer) for pp in plan.persists]
    expands = [expand for _node, expand in plan.edges]
    edges: list[list[Row]] = [[] for _ in plan.edges]
    decode_row = plan.decoder
    with_position = plan.position
    bad: list[BadRecord] = []
    n, first, last = 0, None, None
    if start < end and is_file_log(log_root) and not os.path.isdir(log_root):
        raise SourceError(
            f"the source log {log_root} is not visible on this Spark executor (host "
            f"{socket.gethostname()}): TRIDENTFLOW_HOME must be on storage every Spark worker "
            "mounts at the same path"
        )
    log = open_log(log_root)
    try:
        for offset, raw in log.read_raw(partition, start, end):
            n += 1
            first = offset if first is None else first
            last = offset
            try:
                row = decode_row(decode_record(raw))
                if with_position:
                    row += (offset + shift,)
                staged = [fold.stage(row) for fold in folds]
                edge_rows = [list(expand(row)) for expand in expands]
            except Exception as exc:
                bad.append(bad_record(partition, offset, raw, exc))
                continue
            for fold, items in zip(folds, staged, strict=True):
                fold.apply(items)
            for rows, produced in zip(edges, edge_rows, strict=True):
                rows.extend(produced)
    finally:
        if isinstance(log, Closes):  # a stream log's own connection
            log.close()
    if start < end and not getattr(log, "dense", True):
        # offsets that hold no record (Kafka's transaction markers): the read reached ``end``,
        # so the task accounts for the whole range, as a dense log's task does
        n, first, last = end - start, start, end - 1
    try:
        partials = [fold.partials() for fold in folds]
    except KeyEncodingError:  # a deferred str key was bad: find its records
        return read_task(log_root, plan, partition, start, end, shift, defer=False)
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
        datasets[pp.state.name] = builder.stage_by_key(
            data, pp.state.name, pp.aggregator, pp.parallelism
        )
    for persist in plan.graph_persists:
        datasets[persist.state.name] = builder.persist(persist)
    return datasets
