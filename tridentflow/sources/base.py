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
* ``probe(p, start, end)``: fail (PartitionUnavailableError, SourceError if records are gone for
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

**How a pipeline's log is made.** A source specification (``LogSource`` and its subclasses in
``specs``, or your own) opens its log with ``open_log(ctx: SourceContext)``: the built-in
sources do it exactly as a source of yours does, and nothing outside this package asks which
source a pipeline has. A read task reopens a log from its ``root`` through ``open_log(locator)``
of this package (a path, a registered locator prefix, or ``custom_locator``).

**Optional capabilities**, each a ``typing.Protocol`` below (``isinstance(log, Trims)``; a log
without one is refused in one line where it is needed, never guessed at):

* ``ensure(partitions)``: the reader may create the log, or grow it to ``partitions`` (the
  file log, streams). A log without it is its producers' (Kafka): the reader never creates it,
  and it is scanned with the committed offsets;
* ``produce(pipeline, lines, asked_partitions, source_partitions, skip_unavailable) ->
  Produced``: ``tridentflow produce`` appends ``lines`` (checked JSON records, one per line)
  through it and prints what it did (a log of your own may return the line itself); else
  ``append_spread(records)``;
* ``rebase() -> {partition: offset}``: a reset without ``--source`` starts at what the log
  still holds (streams trimmed, Kafka retention);
* ``check_delete()`` and ``delete()``: ``reset --source`` calls the first before anything is
  reset (it refuses, in one line, a log others read or a producer owns) and the second after;
  a log without ``delete`` is refused;
* ``trim(committed)``: ``tridentflow trim`` removes what every reader committed (and
  ``trimmed(...)`` says it per partition);
* ``offset_unit()`` and ``waiting(committed)``: what an offset is, and what waits, named, for
  ``status`` (a FileSource's files);
* ``remembered()``: how much the log remembers of what it took, for ``status``;
* ``records_in(ranges)``: the records a batch holds, for a log whose offsets are not records
  (the emit's choice of the local engine for a small batch counts records, not offsets);
* ``chaos``: a ``ChaosTraits`` saying what the chaos harness may do to the log.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from tridentflow.connections import NONE, Connections
from tridentflow_state.keys import KeySpace


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


@dataclass(frozen=True)
class Produced:
    """What ``produce`` did, in counts; the CLI prints ``str()`` of it."""

    records: int
    target: str
    """Where they went, for people: ``wordcount``, ``Kafka topic wordcount``, ..."""
    partitions: int
    written: int | None = None
    """The partitions that received some (None: not counted)."""
    notes: tuple[str, ...] = ()
    verb: str = "appended"
    unit: str = "records"
    partition_word: str = "partitions"

    def __str__(self) -> str:
        spread = f"{self.partitions} {self.partition_word}"
        if self.written is not None:
            spread = f"{self.written} of {spread}"
        details = "; ".join([spread, *self.notes])
        return f"{self.verb} {self.records} {self.unit} to {self.target} ({details})"


@runtime_checkable
class Grows(Protocol):
    """The reader may create the log, or grow it to ``partitions`` (returns how many)."""

    def ensure(self, partitions: int) -> int: ...


@runtime_checkable
class Produces(Protocol):
    """``tridentflow produce`` appends checked JSON ``lines`` through it."""

    def produce(
        self,
        pipeline: str,
        lines: list[str],
        asked_partitions: int | None,
        source_partitions: int,
        skip_unavailable: bool = False,
    ) -> Produced | str: ...


@runtime_checkable
class AppendsSpread(Protocol):
    """Records appended round robin over the partitions (tests, a log of your own)."""

    def append_spread(self, records: Iterable[Any]) -> dict[int, tuple[int, int]]: ...


@runtime_checkable
class Rebases(Protocol):
    """After a reset without ``--source``: where each partition starts now."""

    def rebase(self) -> dict[int, int]: ...


@runtime_checkable
class GuardsDelete(Protocol):
    """Refuses (SourceError) a ``reset --source`` that would delete what others read or own."""

    def check_delete(self) -> None: ...


@runtime_checkable
class Deletes(Protocol):
    """``reset --source`` deletes the whole log."""

    def delete(self) -> Any: ...


@runtime_checkable
class Trims(Protocol):
    """``tridentflow trim`` removes what every reader committed."""

    def trim(self, committed: dict[int, int]) -> dict[int, tuple[int, str]]: ...


@runtime_checkable
class DescribesTrims(Protocol):
    """A log that says, per partition, what ``trim`` removed and what limited it (else
    ``tridentflow trim`` prints the count)."""

    def trimmed(self, partition: int, removed: int, holder: str, committed: int) -> str: ...


@runtime_checkable
class Requires(Protocol):
    """The log must exist before a txid reads it (SourceError, one line, if it does not)."""

    def require(self) -> Any: ...


@runtime_checkable
class CountsRecords(Protocol):
    """A log whose offsets are not records (a FileSource's offsets are files): how many
    records ``ranges`` ({partition: (start, end)}) hold, or None when finding out would cost
    about what reading them does - the emit then treats the batch as big (Spark)."""

    def records_in(self, ranges: dict[int, tuple[int, int]]) -> int | None: ...


@runtime_checkable
class NamesWaiting(Protocol):
    """A log whose offsets name things a person knows (a FileSource's files): what waits past
    the ``committed`` offsets, for ``status`` (at most ``limit`` names, oldest first)."""

    def offset_unit(self) -> str:
        """What an offset is, plural ("files"): status says its lag in it."""
        ...

    def waiting(self, committed: dict[int, int], limit: int = 10) -> list[str]: ...

    def names(self, partition: int, start: int, end: int, limit: int = 10) -> list[str]:
        """What offsets [start, end) of ``partition`` hold, named (a committed txid's files
        or versions, for ``status``; at most ``limit``, fewer where they are gone)."""
        ...


@runtime_checkable
class Remembers(Protocol):
    """A log that remembers what it took (a FileSource's taken files): how much, for
    ``status`` - {taken, manifest, forgotten, watermark_ms, below_watermark}."""

    def remembered(self) -> dict[str, int]: ...


@runtime_checkable
class ListsOnScan(Protocol):
    """A log whose ``scan`` lists a store and takes what it finds (a FileSource: a listing of
    every file under its prefix). ``taken`` is the scan of what it already took, without a
    listing: what an emit (whose txid's files the coordinator froze) and a driver's
    look-ahead right after a coordinator's listing need."""

    def taken(self) -> LogScan: ...


@runtime_checkable
class ReadsFiles(Protocol):
    """A source spec whose records come from files (a FileSource): one file's records as its
    record stage gets them, for ``tridentflow.testing`` to run a batch of files."""

    def records_of_file(self, path: str) -> list[bytes]: ...


@runtime_checkable
class ReadsFilesInColumns(Protocol):
    """A log whose offsets are whole files Arrow reads as tables (a Parquet or CSV
    FileSource): the Spark engine may read a txid's files in columns for the DataFrame steps
    that read the source (tridentflow.engines.columnar)."""

    def tables(self) -> bool:
        """Whether its files read as Arrow tables (not JSON lines)."""
        ...

    def frozen(self, partition: int, start: int, end: int) -> list[tuple[int, dict[str, Any]]]:
        """(offset, manifest entry: path, size, mtime_ns) of each file of [start, end)."""
        ...

    def reader(self) -> Any:
        """A picklable reader of those files (``sources.files.FileReader``)."""
        ...


@runtime_checkable
class Closes(Protocol):
    """A log holding a connection of its own (a read task closes it)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class SourceContext:
    """What a source specification may use to open its pipeline's log (``open_log``). The
    runtime gives all of it; ``tridentflow produce`` gives a source that ``uses_redis`` not
    (the file log, a log of your own) no Redis at all (``client`` None)."""

    pipeline: str
    home: Path
    namespace: str = ""
    client: Any = None
    """A redis-py client of the pipeline's Redis (None: the caller has none)."""
    redis_url: str | None = None
    keyspace: KeySpace | None = None
    """The pipeline's keys as its ledger names them (where a log may keep what its reader
    needs, e.g. a topic's id)."""
    connections: Connections = NONE

    @property
    def keys(self) -> KeySpace:
        if self.keyspace is not None:
            return self.keyspace
        return KeySpace(self.pipeline, self.namespace)


@dataclass(frozen=True)
class ChaosTraits:
    """What the chaos harness (tridentflow.devtools.chaos) may do to a log, declared by the log.

    ``disturb``: its disturbance while txids run - ``"dark-partition"`` (a file-log
    partition's directory goes away or its HEAD is torn, then it comes back),
    ``"remove-entries"`` (another client deletes, trims or
    recreates what the log holds), ``"freeze-broker"`` (the server stops answering),
    ``"none"`` (records are appended through the log's ``produce``, nothing else is done);
    ``fresh``: how a schedule starts from nothing - ``"delete-source"`` (reset with
    ``--source``), ``"ledger-only"`` (the log is the schedule's own directory), ``"create"``
    (the producers' log is created, then read from its start);
    ``producers_own``: a reset never deletes it (``reset --source`` is refused);
    ``removals_lose_records``: entries removed after they were read cannot be recomputed from
    (audit's unreadable ranges are expected), and a reader that lost unread entries is reset
    by the operator."""

    disturb: str = "dark-partition"
    fresh: str = "ledger-only"
    producers_own: bool = False
    removals_lose_records: bool = False
