"""Batch operations as pure per-partition functions, shared by every engine.

Each callable here takes ``(partition index, rows)`` and returns rows, so an engine only has to
run it once per partition (Spark's mapPartitionsWithIndex, or a loop). The semantics live here
once:

* **Exchange** (every repartition): ``Exchange.send`` routes a sender partition's tuples to
  target partitions and ends with one count report per target (Trident's ``[id, count]``
  coordination tuple); ``receive`` orders what a target got sender by sender, in send order, and
  checks it against the reports (Trident's expectedTaskReports / expectedTupleCount). So every
  stage sees its tuples in a deterministic order, and a lost or extra tuple is detected.
* **Aggregation** (``PartitionAggregate``): per partition, per group, with Combiner, Reducer and
  full Aggregator, chained; ``PHASE_PARTIAL`` / ``PHASE_COMBINE`` split a Combiner-only aggregate
  around its repartition.
* **Join**, **state query** and the keyed steps that feed a persisted state.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from tridentflow.aggregators import (
    Aggregator,
    BatchInfo,
    Combiner,
    Persistable,
    Reducer,
)
from tridentflow.nodes import AggSpec, Repartition
from tridentflow.plan import as_rows
from tridentflow_state.codec import encode_key
from tridentflow_state.keys import KeySpace
from tridentflow_state.maps import GLOBAL_KEY

Row = tuple[Any, ...]
REPORT = -1
"""The sequence number that marks a count report instead of a tuple."""


def stable_hash(values: Row) -> int:
    """A hash of key values that is the same in every process (Python's hash() of str is
    salted per process). Equal keys by tridentflow's key codec hash alike: 1 and 1.0 differ."""
    return zlib.crc32(encode_key(values).encode("utf-8"))


# -- exchange -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StageReport:
    """What one target partition of one exchange received, against what was announced."""

    stage: str
    partition: int
    senders: int
    reports: int
    expected: int
    received: int

    @property
    def ok(self) -> bool:
        return self.reports == self.senders and self.received == self.expected

    def to_json(self) -> list[Any]:
        return [
            self.stage,
            self.partition,
            self.senders,
            self.reports,
            self.expected,
            self.received,
        ]

    @classmethod
    def from_json(cls, raw: Sequence[Any]) -> StageReport:
        return cls(str(raw[0]), *(int(v) for v in raw[1:]))

    def describe(self) -> str:
        return (
            f"stage {self.stage} partition {self.partition}: {self.reports} of {self.senders} "
            f"sender reports, {self.received} of {self.expected} announced tuples"
        )


@dataclass(frozen=True)
class Exchange:
    """One repartition: how tuples are routed to ``n`` target partitions.

    ``key_idx`` is the key for PARTITION_BY; a join exchanges (side, row) pairs and routes each
    side by its own key (``right_key_idx``). ``encoded_key``: the rows are (encoded key, value)
    pairs (a state's exchange by key), routed by the encoded key itself - the same target for
    equal keys, without encoding them again."""

    stage: str
    how: Repartition
    n: int
    key_idx: tuple[int, ...] = ()
    right_key_idx: tuple[int, ...] | None = None
    encoded_key: bool = False

    def targets(self, row: Row, seq: int, sender: int) -> Iterable[int]:
        how = self.how
        if self.encoded_key:
            return (zlib.crc32(row[0].encode("utf-8")) % self.n,)
        if how is Repartition.PARTITION_BY:
            if self.right_key_idx is not None:  # a join: row is (side, tuple)
                side, values = row
                idx = self.key_idx if side == 0 else self.right_key_idx
            else:
                values, idx = row, self.key_idx
            return (stable_hash(tuple([values[i] for i in idx])) % self.n,)
        if how is Repartition.SHUFFLE:
            return ((sender + seq) % self.n,)
        if how is Repartition.BROADCAST:
            return range(self.n)
        return (0,)  # GLOBAL, BATCH_GLOBAL

    def send(self, sender: int, rows: Iterable[Row]) -> Iterator[tuple[int, tuple[int, int, Any]]]:
        """(target, (sender, seq, row)) for every routed tuple, then one report per target."""
        counts = [0] * self.n
        for seq, row in enumerate(rows):
            for target in self.targets(row, seq, sender):
                counts[target] += 1
                yield target, (sender, seq, row)
        for target, count in enumerate(counts):
            yield target, (sender, REPORT, count)


def receive(
    stage: str, senders: int, partition: int, items: Iterable[tuple[int, int, Any]], lose: bool
) -> tuple[list[Row], StageReport]:
    """A target partition's tuples in (sender, send order), and its report. ``lose`` drops its
    first tuple (the ``lose-tuple`` fault: a tuple lost in transit, to prove the check)."""
    data: list[tuple[int, int, Any]] = []
    reports = expected = 0
    for sender, seq, payload in items:
        if seq == REPORT:
            reports += 1
            expected += payload
        else:
            data.append((sender, seq, payload))
    data.sort(key=_order)
    if lose and data:
        data.pop(0)
    rows = [payload for _sender, _seq, payload in data]
    return rows, StageReport(stage, partition, senders, reports, expected, len(rows))


def _order(item: tuple[int, int, Any]) -> tuple[int, int]:
    return item[0], item[1]


# -- aggregation --------------------------------------------------------------------------------

PHASE_FULL = "full"
PHASE_PARTIAL = "partial"
PHASE_COMBINE = "combine"


@dataclass(frozen=True)
class CompiledAgg:
    aggregator: Combiner | Reducer | Aggregator
    in_idx: tuple[int, ...]
    width: int

    def start(self, txid: int, partition: int) -> Any:
        agg = self.aggregator
        if isinstance(agg, Combiner):
            return agg.zero()
        if isinstance(agg, Reducer):
            return agg.init()
        return agg.init(BatchInfo(txid, partition))

    def add(self, acc: Any, row: Row) -> Any:
        agg = self.aggregator
        values = [row[i] for i in self.in_idx]
        if isinstance(agg, Combiner):
            return agg.combine(acc, agg.init(*values))
        if isinstance(agg, Reducer):
            return agg.reduce(acc, *values)
        return agg.aggregate(acc, *values)

    def outputs(self, acc: Any) -> list[Row]:
        agg = self.aggregator
        if isinstance(agg, Aggregator):
            return as_rows(agg.complete(acc), self.width, f"{agg!r}.complete")
        return [(acc,)]


def compile_specs(specs: Sequence[AggSpec], fields: Sequence[str]) -> tuple[CompiledAgg, ...]:
    fields = list(fields)
    return tuple(
        CompiledAgg(s.aggregator, tuple(fields.index(f) for f in s.in_fields), len(s.out_fields))
        for s in specs
    )


@dataclass(frozen=True)
class PartitionAggregate:
    """Aggregates one partition, per group (``group_idx``) or whole.

    * PHASE_FULL: every aggregator folds the partition's tuples; the outputs of a chain are
      the cross product of each aggregator's outputs, after the group's values.
    * PHASE_PARTIAL (Combiners only): emits group + one partial per aggregator.
    * PHASE_COMBINE (Combiners only): rows are group + partials; combines them per group.

    Ungrouped with ``emit_empty``, an empty partition still emits (zero(), init(), or the
    Aggregator's complete(init())), as Trident does. Groups come out in first-seen order.
    """

    aggs: tuple[CompiledAgg, ...]
    group_idx: tuple[int, ...]
    phase: str
    emit_empty: bool
    txid: int

    def _groups(self, rows: Iterable[Row]) -> dict[Row, list[Row]]:
        groups: dict[Row, list[Row]] = {}
        idx = self.group_idx
        for row in rows:
            key = tuple([row[i] for i in idx])
            bucket = groups.get(key)
            if bucket is None:
                groups[key] = [row]
            else:
                bucket.append(row)
        return groups

    def __call__(self, partition: int, rows: Iterable[Row]) -> list[Row]:
        groups = self._groups(rows)
        if not groups and not self.group_idx and self.emit_empty:
            groups = {(): []}
        out: list[Row] = []
        for key, members in groups.items():
            if self.phase == PHASE_COMBINE:
                out.append(key + self._combine(key, members))
            elif self.phase == PHASE_PARTIAL:
                out.append(key + self._partials(members))
            else:
                per_agg = [self._fold(agg, partition, members) for agg in self.aggs]
                out.extend(key + sum(combo, ()) for combo in itertools.product(*per_agg))
        return out

    def _fold(self, agg: CompiledAgg, partition: int, members: list[Row]) -> list[Row]:
        acc = agg.start(self.txid, partition)
        for row in members:
            acc = agg.add(acc, row)
        return agg.outputs(acc)

    def _partials(self, members: list[Row]) -> Row:
        return tuple(self._fold(agg, 0, members)[0][0] for agg in self.aggs)

    def _combine(self, key: Row, members: list[Row]) -> Row:
        width = len(key)
        values = []
        for j, agg in enumerate(self.aggs):
            combiner = agg.aggregator
            assert isinstance(combiner, Combiner)
            acc = combiner.zero()
            for row in members:
                acc = combiner.combine(acc, row[width + j])
            values.append(acc)
        return tuple(values)


# -- join ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tag:
    """Marks a stream's tuples with its side of a join (0 left, 1 right)."""

    side: int

    def __call__(self, partition: int, rows: Iterable[Row]) -> list[tuple[int, Row]]:
        return [(self.side, row) for row in rows]


@dataclass(frozen=True)
class JoinPartition:
    """Inner join of the (side, row) pairs of one partition: join key, left's other fields,
    right's other fields; left tuples in order, each with the matching right ones in order."""

    left_key: tuple[int, ...]
    right_key: tuple[int, ...]
    left_rest: tuple[int, ...]
    right_rest: tuple[int, ...]

    def __call__(self, partition: int, rows: Iterable[tuple[int, Row]]) -> list[Row]:
        left: dict[Row, list[Row]] = {}
        right: dict[Row, list[Row]] = {}
        for side, row in rows:
            if side == 0:
                left.setdefault(tuple([row[i] for i in self.left_key]), []).append(row)
            else:
                right.setdefault(tuple([row[i] for i in self.right_key]), []).append(row)
        out: list[Row] = []
        for key, lefts in left.items():
            matches = right.get(key)
            if not matches:
                continue
            rests = [tuple([r[i] for i in self.right_rest]) for r in matches]
            for lrow in lefts:
                head = key + tuple([lrow[i] for i in self.left_rest])
                out.extend(head + rest for rest in rests)
        return out


# -- per-tuple steps after the record stage -----------------------------------------------------


@dataclass(frozen=True)
class RowsStep:
    """A per-tuple step (tridentflow.plan) applied to a whole partition."""

    step: Callable[[Row], list[Row]]

    def __call__(self, partition: int, rows: Iterable[Row]) -> list[Row]:
        step = self.step
        return [out for row in rows for out in step(row)]


QUERY_CHUNK = 1000


@dataclass(frozen=True)
class StateQuery:
    """Trident's stateQuery + MapGet: appends each tuple's committed value (None if absent).
    One Redis round trip per partition per QUERY_CHUNK distinct keys; each chunk is an atomic
    snapshot of the committed view (a pending commit is not seen)."""

    redis_url: str
    keyspace: KeySpace
    state_name: str
    persisted: Persistable
    key_idx: tuple[int, ...]
    read_state: Callable[[str, str, list[str]], list[Any]] | None = None
    """Read committed values here instead of Redis (ExecContext.read_state)."""

    def __call__(self, partition: int, rows: Iterable[Row]) -> list[Row]:
        rows = list(rows)
        if not rows:
            return []
        keys = [encode_key(tuple([row[i] for i in self.key_idx])) for row in rows]
        distinct = list(dict.fromkeys(keys))
        if self.read_state is not None:
            values = self.read_state(self.keyspace.pipeline, self.state_name, distinct)
            found = dict(zip(distinct, values, strict=True))
        else:
            found = self._from_redis(distinct)
        present = self.persisted.present
        return [
            (*row, None if found[key] is None else present(found[key]))
            for row, key in zip(rows, keys, strict=True)
        ]

    def _from_redis(self, distinct: list[str]) -> dict[str, Any]:
        from tridentflow.redisconn import connect
        from tridentflow_state.shards import query_state, with_stored_layout

        client = connect(self.redis_url)
        found: dict[str, Any] = {}
        try:
            keyspace = with_stored_layout(client, self.keyspace)
            for start in range(0, len(distinct), QUERY_CHUNK):
                chunk = distinct[start : start + QUERY_CHUNK]
                _txid, values = query_state(client, keyspace, self.state_name, chunk)
                found.update(zip(chunk, values, strict=True))
        finally:
            client.close()
        return found


# -- feeding a persisted state ------------------------------------------------------------------


@dataclass(frozen=True)
class KeyedValues:
    """Per tuple (encoded key, value): a Combiner's init(values) or the Reducer's / updater's
    argument tuple. With ``combine``, pre-aggregates per key within the partition (Combiner)."""

    key_idx: tuple[int, ...]
    arg_idx: tuple[int, ...]
    combiner: Combiner | None

    def __call__(self, partition: int, rows: Iterable[Row]) -> list[tuple[str, Any]]:
        key_idx, arg_idx = self.key_idx, self.arg_idx
        combiner = self.combiner
        if combiner is None:
            return [(_key(key_idx, row), tuple([row[i] for i in arg_idx])) for row in rows]
        partials: dict[str, Any] = {}
        for row in rows:
            key = _key(key_idx, row)
            value = combiner.init(*[row[i] for i in arg_idx])
            partials[key] = combiner.combine(partials[key], value) if key in partials else value
        return list(partials.items())


def _key(key_idx: tuple[int, ...], row: Row) -> str:
    if not key_idx:
        return GLOBAL_KEY
    return encode_key(tuple([row[i] for i in key_idx]))


@dataclass(frozen=True)
class StageByKey:
    """After the exchange by key: one (key, staged value) per key, in first-seen order - the
    Combiner's partials combined in order, or the list of argument tuples in order."""

    combiner: Combiner | None

    def __call__(self, partition: int, rows: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
        staged: dict[str, Any] = {}
        combiner = self.combiner
        for key, value in rows:
            if combiner is None:
                staged.setdefault(key, []).append(value)
            elif key in staged:
                staged[key] = combiner.combine(staged[key], value)
            else:
                staged[key] = value
        return list(staged.items())
