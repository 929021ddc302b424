"""What a source log is: the interface a newcomer reads first.

A source is partitioned; each partition is an append-only sequence of records at dense
integer offsets. Everything else (the coordinator's batch metadata, the engines' read tasks,
the audit) talks to it through this interface only:

* ``scan()``: every partition's head (next offset), and the partitions that cannot be read
  now, with the reason (an opaque batch skips them; a transactional one waits);
* ``probe(p, start, end)``: fail (PartitionUnavailable) unless [start, end) can be read now;
* ``read_raw(p, start, end)``: (offset, raw record bytes) for every offset in [start, end),
  the same bytes on every call (a transactional replay reads exactly what it read before);
* ``acknowledge(committed)``: after a commit, the reader's new positions (a shared log keeps
  what this reader still needs; best effort).

``tridentflow.sources.filelog.FileLog`` (segments, sparse index, flock, fsync) and
``tridentflow.sources.redisstream.RedisStreamLog`` implement it; Spark executors open a log
by its ``root`` (a path, or a stream log's locator).
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

    def partitions(self) -> int: ...

    def scan(self, committed: dict[int, int] | None = None) -> LogScan: ...

    def probe(self, partition: int, start: int, end: int) -> None: ...

    def read_raw(self, partition: int, start: int, end: int) -> Iterator[tuple[int, bytes]]: ...

    def acknowledge(self, committed: dict[int, int]) -> None: ...
