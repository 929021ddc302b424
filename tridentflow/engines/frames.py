"""The batch-operation graph on Spark DataFrames: what runs on classic Spark and over Spark
Connect alike (Connect has no RDDs).

A dataset is a DataFrame ``part int, seq int, n int, data binary``: ``part`` is the logical
partition (what ``PartitionFn`` gets as its index), ``data`` a pickled chunk of at most
``CHUNK`` tuples, ``seq`` the chunk's position in its partition, ``n`` its length. Every
operation keeps one invariant: each logical partition's chunks sit in one Spark partition,
contiguous and in order, and every logical partition has at least one chunk (an empty one if
it holds nothing). So a partition function is one ``mapInArrow`` that runs it on each run of
chunks, and no logical partition is skipped; consecutive partition functions wait on the frame
(``Frame.pending``) and run together in the next pass over it, an exchange's send included.

An exchange is a ``mapInArrow`` that runs ``batchops.Exchange.send`` per sender (every sender
reports to every target, so every target receives something), a ``repartition`` on a routing
column whose Spark hash is the target's own Spark partition (``route_values``: one target per
Spark partition, none idle), a sort by (target, sender, chunk), and a ``mapInArrow`` that runs
``batchops.receive`` per target: its tuples in deterministic order, and its count report as
a chunk with ``seq`` -1, collected with every other report in one job at the end.
"""

from __future__ import annotations

import functools
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from tridentflow.engines.batchops import Exchange, StageReport, receive
from tridentflow.engines.graph import PartitionFn

CHUNK = 4096
"""Tuples per pickled chunk (one DataFrame row)."""

SCHEMA = "part int, seq int, n int, data binary"
SENT_SCHEMA = "route int, target int, sender int, seq int, data binary"
REPORT_SEQ = -1


@dataclass(frozen=True)
class Frame:
    """A dataset: the DataFrame, its number of logical partitions, and the partition
    functions still to run on it (``pending``): they run in the next Python pass over it (an
    exchange's send, or ``materialized``), so a run of operations costs one ``mapInArrow``."""

    df: Any
    partitions: int
    pending: tuple[PartitionFn, ...] = ()
    typed: Any = None
    """A DataFrame step's output as Spark has it (typed columns), beside ``df``, its chunks:
    what a state fed straight by the step aggregates with Spark's own groupBy (Spark is
    lazy: the chunks are never computed if nothing reads them). With ``df`` None, the
    source's files read in columns (``engines.columnar``): only DataFrame steps read it."""


class Fused:
    """Partition functions run one after the other on a partition, as one (picklable)."""

    def __init__(self, fns: tuple[PartitionFn, ...]) -> None:
        self.fns = fns

    def __call__(self, part: int, items: Iterable[Any]) -> list[Any]:
        out = list(items)
        for fn in self.fns:  # each gets a list, as the local engine hands it one
            out = list(fn(part, out))
        return out


def materialized(frame: Frame) -> Frame:
    """``frame`` with its pending functions run (one ``mapInArrow``); itself if none."""
    if not frame.pending:
        return frame
    body = functools.partial(_map_body, Fused(frame.pending))
    return Frame(frame.df.mapInArrow(body, SCHEMA), frame.partitions)


def chunk_rows(part: int, items: Iterable[Any]) -> Iterator[tuple[int, int, int, bytes]]:
    """(part, seq, n, pickled chunk) for ``items``: at least one, empty if there are none."""
    chunk: list[Any] = []
    seq = 0
    for item in items:
        chunk.append(item)
        if len(chunk) == CHUNK:
            yield part, seq, len(chunk), pickle.dumps(chunk, pickle.HIGHEST_PROTOCOL)
            chunk, seq = [], seq + 1
    if chunk or seq == 0:
        yield part, seq, len(chunk), pickle.dumps(chunk, pickle.HIGHEST_PROTOCOL)


def to_batch(rows: list[tuple], names: tuple[str, ...]) -> Any:
    """An Arrow batch of ``rows``: every column int32 but the last, ``data`` (binary)."""
    import pyarrow as pa

    schema = pa.schema([(name, pa.int32()) for name in names[:-1]] + [(names[-1], pa.binary())])
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in names]
    return pa.RecordBatch.from_arrays(
        [pa.array(list(c), type=f.type) for c, f in zip(columns, schema, strict=True)],
        schema=schema,
    )


def runs(batches: Iterator[Any], key: str) -> Iterator[tuple[int, list[Any]]]:
    """(key value, its chunks' tuples in order) for each run of rows with one ``key`` value. A
    value that comes back after its run ended breaks the invariant: an internal error."""
    seen: set[int] = set()
    current: int | None = None
    items: list[Any] = []
    for batch in batches:
        keys = batch.column(key).to_pylist()
        datas = batch.column("data").to_pylist()
        for value, data in zip(keys, datas, strict=True):
            if value != current:
                if current is not None:
                    yield current, items
                if value in seen:
                    raise RuntimeError(f"internal: logical partition {value} is split")
                seen.add(value)
                current, items = value, []
            items.extend(pickle.loads(data))
    if current is not None:
        yield current, items


_NAMES = ("part", "seq", "n", "data")


def _map_body(fn: PartitionFn, batches: Iterator[Any]) -> Iterator[Any]:
    for part, items in runs(batches, "part"):
        yield to_batch(list(chunk_rows(part, fn(part, items))), _NAMES)


def _send_body(
    exchange: Exchange, routes: list[int], before: Fused | None, batches: Iterator[Any]
) -> Iterator[Any]:
    names = ("route", "target", "sender", "seq", "data")
    for sender, items in runs(batches, "part"):
        if before is not None:  # the sender's pending operations, in the same pass
            items = before(sender, items)
        by_target: list[list[Any]] = [[] for _ in range(exchange.n)]
        for target, item in exchange.send(sender, items):
            by_target[target].append(item)
        rows = [
            (routes[target], target, sender, seq, data)
            for target, sent in enumerate(by_target)
            for _part, seq, _n, data in chunk_rows(target, sent)
        ]
        yield to_batch(rows, names)


def _receive_body(
    exchange: Exchange, senders: int, lose: bool, batches: Iterator[Any]
) -> Iterator[Any]:
    for target, items in runs(batches, "target"):
        rows, report = receive(exchange.stage, senders, target, items, lose)
        out = list(chunk_rows(target, rows))
        out.append((target, REPORT_SEQ, 0, pickle.dumps(report.to_json())))
        yield to_batch(out, _NAMES)


class FrameBackend:
    """``tridentflow.engines.graph.Backend`` on DataFrames (classic Spark or Spark Connect)."""

    def __init__(self, lose_tuple: bool = False) -> None:
        self._lose = lose_tuple
        self.received: list[Any] = []
        self.cached: list[Any] = []

    def map_partitions(self, data: Frame, fn: PartitionFn) -> Frame:
        return Frame(data.df, data.partitions, (*data.pending, fn))  # runs in the next pass

    def exchange(self, data: Frame, exchange: Exchange) -> Frame:
        routes = route_values(exchange.n)
        before = Fused(data.pending) if data.pending else None
        send = functools.partial(_send_body, exchange, routes, before)
        sent = data.df.mapInArrow(send, SENT_SCHEMA)
        moved = sent.repartition(exchange.n, "route").sortWithinPartitions(
            "target", "sender", "seq"
        )
        received = moved.mapInArrow(
            functools.partial(_receive_body, exchange, data.partitions, self._lose), SCHEMA
        )
        self._lose = False  # the lose-tuple fault hits the first exchange only
        received = self.cache(received)
        self.received.append(received)
        return Frame(received.where(f"seq <> {REPORT_SEQ}"), exchange.n)

    def union(self, parts: list[Frame]) -> Frame:
        from pyspark.sql import functions as F

        offset = 0
        frames = []
        for part in parts:
            df = materialized(part).df
            if offset:
                df = df.withColumn("part", F.col("part") + F.lit(offset))
            frames.append(df)
            offset += part.partitions
        return Frame(functools.reduce(lambda a, b: a.unionAll(b), frames), offset)

    def num_partitions(self, data: Frame) -> int:
        return data.partitions

    def cache(self, df: Any) -> Any:
        df = df.persist()
        self.cached.append(df)
        return df

    def reports(self) -> list[StageReport]:
        """Every exchange's reports, in one job (the exchanges are cached)."""
        if not self.received:
            return []
        reports = functools.reduce(
            lambda a, b: a.unionAll(b),
            (r.where(f"seq = {REPORT_SEQ}").select("data") for r in self.received),
        )
        return [StageReport.from_json(pickle.loads(row["data"])) for row in reports.collect()]

    def release(self) -> None:
        for df in self.cached:
            df.unpersist()
        self.cached.clear()


def items_of(rows: Iterable[Any]) -> Iterator[Any]:
    """The tuples of collected chunk rows, in order."""
    for row in rows:
        yield from pickle.loads(row["data"])


# -- routing: Spark's hash partitioning, inverted --------------------------------------------


def murmur3_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash()`` of an int column (Murmur3_x86_32.hashInt, seed 42), as a signed int."""
    mask = 0xFFFFFFFF

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & mask

    k1 = (value & mask) * 0xCC9E2D51 & mask
    k1 = rotl(k1, 15) * 0x1B873593 & mask
    h1 = rotl(seed ^ k1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & mask
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & mask
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & mask
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


@functools.lru_cache(maxsize=64)
def route_values(n: int) -> list[int]:
    """For each target t < n, the smallest int whose Spark hash partition among n is t: rows
    routed by it land one target per Spark partition."""
    routes: dict[int, int] = {}
    value = 0
    while len(routes) < n:
        routes.setdefault(murmur3_int(value) % n, value)
        value += 1
    return [routes[t] for t in range(n)]
