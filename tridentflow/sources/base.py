"""What a source log is: the interface a newcomer reads first, and what a new source
implements (README: Writing your own source; tests/test_source_contract.py is the suite every
source passes).

A source is partitioned; each partition is an append-only sequence of records at increasing
integer offsets. Everything else (the coordinator's batch metadata, the engines' read tasks,
the audit) talks to it through this interface only:

* ``root``: what a read task on a Spark executor opens the log from (``open_log``): a path
  every worker mounts, or a locator string (``redis-stream:...``, ``kafka:...``);
* ``partitions()`` / ``exists()``: how many partitions there are; whether the log exists yet;
* ``scan(committed)``: every partition's head (the offset after its last record), and the
  partitions that cannot be read now, with the reason (an opaque batch skips them; a
  transactional one waits). ``committed``: the reader's committed offsets - a partition whose
  head is behind them lost records and is unavailable, never read as new;
* ``probe(p, start, end)``: fail (PartitionUnavailable, SourceError if records are gone for
  good) unless [start, end) can be read now; the emitter compares ranges with the heads itself;
* ``read_raw(p, start, end)``: (offset, raw record bytes) for every record in [start, end),
  in offset order, the same on every call (a transactional replay reads exactly what it read
  before), and the range split anywhere reads the same records. It fails rather than return
  early: a read that returns has covered the whole range;
* ``acknowledge(committed)``: after a commit, the reader's new positions (a shared log keeps
  what this reader still needs; Kafka's consumer group shows them); best effort.

``dense``: whether every offset holds a record (default True). A log whose offsets may hold
none (Kafka's transaction markers, aborted or compacted records) sets it False: its read tasks
account for the whole range once ``read_raw`` returned, and ``position_field`` (which numbers
records by offset) is refused for it.

``tridentflow.sources.filelog.FileLog`` (segments, sparse index, flock, fsync),
``tridentflow.sources.redisstream.RedisStreamLog`` and ``tridentflow.sources.kafka.KafkaLog``
implement it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class LogScan:
    """Every partition's head, and the partitions that cannot be read now, with the reason."""

    heads: dict[int, int]
    unavailable: dict[int, str] = field(default_factory=dict)

    @property
    def partitions(self) -> list[int]:
        return sorted([*self.heads, *self.unavailable])


class SourceLog(Protocol):
    root: object
    dense: bool = True

    def exists(self) -> bool: ...

    def partitions(self) -> int: ...

    def scan(self, committed: dict[int, int] | None = None) -> LogScan: ...

    def probe(self, partition: int, start: int, end: int) -> None: ...

    def read_raw(self, partition: int, start: int, end: int) -> Iterator[tuple[int, bytes]]: ...

    def acknowledge(self, committed: dict[int, int]) -> None: ...
