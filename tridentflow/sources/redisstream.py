"""A source log over Redis Streams: one stream per partition (``XADD``), read by ``XRANGE``.

Offsets stay dense integers, as every other part of tridentflow expects: the offset of an entry
is its *ordinal*, the number of entries added to its stream before it (Redis 7's
``entries-added`` counter is the head). A stream entry ID cannot be found from an ordinal, so
the log keeps, per partition, an index hash in the pipeline's keyspace: ordinal ``n`` -> the ID
of entry ``n - 1`` (``tf:{pipeline}:stream-index:P``), written by every read for the ordinal
where it stopped. A batch [start, end) is then ``XRANGE key (ID COUNT end-start``, with ID the
index entry of ``start`` ("-" at ordinal 0). Both are facts of the stream (an entry's ordinal
and ID never change), so a transactional replay reads exactly the same entries, and any reader
(a Spark executor too) may write them.

Reading never deletes; ``trim`` removes entries only up to the committed position
(``XTRIM MINID``). Before every read the stream is checked against its counters: entries
trimmed beyond the read's start, deleted (``XDEL``) after it, or a stream deleted and
recreated (its entry at ``start - 1`` gone while earlier ones remain, or its counter behind the
committed position) fail the read with a clear reason instead of skipping records silently;
``scan`` reports such a partition unavailable, like a dark partition (an opaque batch skips it
and catches up once it is readable again; a transactional one waits).

Several readers share a stream the way Redis Streams are meant to be shared: each tridentflow
reader (pipeline and namespace) keeps a *consumer group* on every stream it reads, positioned
at its committed entry (``acknowledge``, after each commit; ``XINFO GROUPS`` shows each
reader's lag). The group is the reader's registration: ``trim`` deletes only entries every
group has read (a foreign group's pending entries included), ``delete`` (``reset --source``)
refuses while another reader's group is on a stream, and a stream whose group vanished was
deleted (and maybe recreated) behind the reader: unavailable, with the reason, never read as
new. Entries deleted behind the reader (``XDEL`` of what was read, the last one included) do
not matter; entries removed before it read them (``XDEL``, ``XTRIM MAXLEN`` by another
producer) make the partition unavailable with the reason until an operator resets the reader,
which then counts what the stream still holds.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import redis

from tridentflow.errors import PartitionUnavailableError, SourceError
from tridentflow.sources.base import ChaosTraits, LogScan, Produced
from tridentflow.sources.filelog import encode_record
from tridentflow_state.keys import KeySpace

LOCATOR_PREFIX = "redis-stream:"
GROUP_PREFIX = "tridentflow:"
"""Consumer groups of tridentflow readers start with this (``tridentflow:[NAMESPACE/]PIPELINE``)."""
GROUP_MARK = "group"
ACCOUNTED_FIELD = "deleted-before-start"
"""Field of a partition's index hash: the stream's max-deleted-entry-id when a reset started
this reader at what the stream held (deletions up to it happened before; not a loss)."""
"""Field of a partition's index hash: set once the reader's group was created on the stream
(a group missing after that means the stream was deleted)."""
"""A stream log's locator (what the engines' read tasks open) starts with this."""

XADD_CHUNK = 5000
"""Entries per pipelined round trip when producing."""


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _id(raw: bytes | str) -> tuple[int, int]:
    ms, _dash, seq = _s(raw).partition("-")
    return int(ms), int(seq or 0)


def _after(entry_id: str) -> str:
    """The smallest ID greater than ``entry_id`` (XTRIM MINID keeps IDs >= it)."""
    ms, seq = _id(entry_id)
    return f"{ms + 1}-0" if seq >= MAX_SEQ else f"{ms}-{seq + 1}"


MAX_SEQ = 2**64 - 1
"""The greatest sequence part of a stream entry ID."""


def _before(entry_id: str) -> str:
    """The greatest ID smaller than ``entry_id`` ("0-0" for the smallest): ``XRANGE (ID``
    from it starts at ``entry_id``."""
    ms, seq = _id(entry_id)
    if seq > 0:
        return f"{ms}-{seq - 1}"
    return f"{ms - 1}-{MAX_SEQ}" if ms > 0 else "0-0"


def _decoded(raw: bytes | str) -> str:
    """A field name or value as text; bytes that are not UTF-8 stay as lone surrogates (the
    record then fails the Unicode check and is quarantined, never a crash)."""
    return raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw


@dataclass(frozen=True)
class StreamInfo:
    """What one ``XINFO STREAM`` tells about a partition's stream."""

    length: int
    entries_added: int
    max_deleted: tuple[int, int]

    @property
    def first_ordinal(self) -> int:
        """Ordinal of the first entry left (exact unless entries were deleted by XDEL)."""
        return self.entries_added - self.length


def stream_entry(record: Any, fields: tuple[str, ...], what: str = "record") -> dict[str, str]:
    """A record as a stream entry's fields: a JSON object by name, a list by position, a
    scalar as the one field of a one-field source. Values are strings in a stream: a string
    stays itself, anything else becomes its JSON text."""
    encode_record(record, what)  # JSON, one line, valid Unicode
    if isinstance(record, dict):
        named = record
    elif isinstance(record, list) and len(record) == len(fields):
        named = dict(zip(fields, record, strict=True))
    elif not isinstance(record, (dict, list)) and len(fields) == 1:
        named = {fields[0]: record}
    else:
        raise SourceError(f"{what}: expected the fields {list(fields)}, got {record!r:.60}")
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in named.items()}


class RedisStreamLog:
    """SourceLog over the streams ``stream_keys`` (one per partition) on ``client``; the
    ordinal index under ``keyspace``. ``url`` is what other processes (Spark executors)
    connect with."""

    chaos = ChaosTraits(disturb="remove-entries", fresh="delete-source", removals_lose_records=True)

    def __init__(
        self,
        client: redis.Redis,
        url: str,
        keyspace: KeySpace,
        stream_keys: list[str],
        fields: tuple[str, ...] = (),
        owns_client: bool = False,
    ) -> None:
        """``owns_client``: ``close`` closes the client (a log ``open`` made for a read
        task); otherwise the client is the caller's."""
        self.client = client
        self.url = url
        self.keyspace = keyspace
        self.stream_keys = list(stream_keys)
        self.fields = tuple(fields)
        """The source's fields (what ``append_spread`` maps a list or a scalar record to)."""
        self._owns_client = owns_client

    # -- identity -----------------------------------------------------------------------------
    @property
    def root(self) -> str:
        return self.locator

    @property
    def locator(self) -> str:
        spec = {
            "url": self.url,
            "pipeline": self.keyspace.pipeline,
            "namespace": self.keyspace.namespace,
            "streams": self.stream_keys,
        }
        return LOCATOR_PREFIX + json.dumps(spec, sort_keys=True)

    @classmethod
    def open(cls, locator: str) -> RedisStreamLog:
        """The log a locator names (in a read task: its own connection)."""
        from tridentflow.redisconn import connect

        spec = json.loads(locator[len(LOCATOR_PREFIX) :])
        keyspace = KeySpace(spec["pipeline"], spec["namespace"])
        return cls(connect(spec["url"]), spec["url"], keyspace, spec["streams"], owns_client=True)

    def close(self) -> None:
        """Close the connection ``open`` made (a log handed its client leaves it alone)."""
        if self._owns_client:
            self.client.close()

    def index_key(self, partition: int) -> str:
        return self.keyspace.stream_index(partition)

    @property
    def group(self) -> str:
        """This reader's consumer group on each of its streams."""
        ks = self.keyspace
        return (
            f"{GROUP_PREFIX}{ks.namespace}/{ks.pipeline}"
            if ks.namespace
            else (f"{GROUP_PREFIX}{ks.pipeline}")
        )

    def groups(self, partition: int) -> dict[str, dict[str, Any]]:
        """Every consumer group on the partition's stream, by name ({} if it has none or
        does not exist)."""
        try:
            raw = self.client.xinfo_groups(self.stream_keys[partition])
        except redis.exceptions.ResponseError as exc:
            if "no such key" in str(exc).lower():
                return {}
            raise
        return {_s(g["name"]): g for g in raw}

    def _registered(self, partition: int) -> bool:
        return self.client.hget(self.index_key(partition), GROUP_MARK) is not None

    def _check_group(self, partition: int, start: int, info: StreamInfo | None) -> None:
        """PartitionUnavailableError if the stream was deleted behind this reader (its group, once
        created, is gone); else make sure the group exists, at ``start`` if new."""
        key = self.stream_keys[partition]
        if info is not None and self.group in self.groups(partition):
            return
        if self._registered(partition):
            what = "is missing" if info is None else "was deleted and recreated"
            raise PartitionUnavailableError(
                partition,
                f"unavailable: stream {key} {what} (the consumer group {self.group} of this "
                f"reader is gone; it stood at ordinal {start}): records may be lost; "
                f"`tridentflow reset {self.keyspace.pipeline}` counts what it holds now",
            )
        if info is None and start > 0:
            raise PartitionUnavailableError(
                partition, f"unavailable: stream {key} is missing (deleted?); it stood at {start}"
            )
        self._create_group(partition, start)

    def _create_group(self, partition: int, start: int) -> None:
        """Create this reader's group at ordinal ``start`` (MKSTREAM: a stream nothing was
        added to yet exists from now on, so its deletion is noticed) and mark it created."""
        after = "0" if start == 0 else (self._index_id(partition, start) or "0")
        try:
            self.client.execute_command(
                "XGROUP", "CREATE", self.stream_keys[partition], self.group, after,
                "MKSTREAM", "ENTRIESREAD", start,
            )  # fmt: skip
        except redis.exceptions.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self.client.hset(self.index_key(partition), GROUP_MARK, "1")

    def split_at(self, partition: int, position: int) -> tuple[list[str], list[str]]:
        """The IDs of the partition's entries this reader has read, up to ordinal ``position``
        (its committed position), and of those it has not, in stream order."""
        last = self._index_id(partition, position) if position > 0 else None
        read, unread = [], []
        for raw, _fields in self.client.xrange(self.stream_keys[partition]):
            entry = _s(raw)
            (read if last is not None and _id(entry) <= _id(last) else unread).append(entry)
        return read, unread

    def _index_id(self, partition: int, ordinal: int) -> str | None:
        return self._index_field(partition, str(ordinal))

    def _index_field(self, partition: int, name: str) -> str | None:
        raw = self.client.hget(self.index_key(partition), name)
        return None if raw is None else _s(raw)

    # -- layout -------------------------------------------------------------------------------
    def exists(self) -> bool:
        return True

    def partitions(self) -> int:
        return len(self.stream_keys)

    def ensure(self, partitions: int) -> int:
        if partitions != len(self.stream_keys):
            raise SourceError(
                f"the stream source has {len(self.stream_keys)} partitions, not {partitions}"
            )
        return partitions

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < len(self.stream_keys):
            raise SourceError(f"partition {partition} does not exist (0..{self.partitions() - 1})")

    # -- heads --------------------------------------------------------------------------------
    def info(self, partition: int) -> StreamInfo | None:
        """The stream's counters; None if it does not exist (nothing added yet, or deleted).
        PartitionUnavailableError if Redis cannot tell."""
        key = self.stream_keys[partition]
        try:
            raw = self.client.xinfo_stream(key)
        except redis.exceptions.ResponseError as exc:
            if "no such key" in str(exc).lower():
                return None
            raise PartitionUnavailableError(
                partition, f"unavailable: stream {key}: {exc}"
            ) from None
        except redis.exceptions.RedisError as exc:
            raise PartitionUnavailableError(
                partition, f"unavailable: stream {key}: {exc}"
            ) from None
        if "entries-added" not in raw:
            raise SourceError("a Redis Streams source needs Redis 7.0 or newer (entries-added)")
        return StreamInfo(
            int(raw["length"]),
            int(raw["entries-added"]),
            _id(raw.get("max-deleted-entry-id") or "0-0"),
        )

    def head(self, partition: int) -> int:
        self._check_partition(partition)
        info = self.info(partition)
        return 0 if info is None else info.entries_added

    def scan(self, committed: dict[int, int] | None = None) -> LogScan:
        """Every partition's head (entries ever added to its stream; 0 for a stream that does
        not exist yet), and why each other one cannot be read now. With ``committed`` (this
        reader's positions), a partition is also unavailable if reading on from there would
        miss entries (deleted or trimmed before they were read, the stream recreated)."""
        heads: dict[int, int] = {}
        unavailable: dict[int, str] = {}
        for p in range(self.partitions()):
            try:
                info = self.info(p)
                heads[p] = 0 if info is None else info.entries_added
                if committed is None:
                    continue
                start = committed.get(p, 0)
                if self._registered(p) and (info is None or self.group not in self.groups(p)):
                    self._check_group(p, start, info)  # deleted behind the reader: raises
                if start < heads[p] or (info is None and start > 0):
                    self._position(p, start)
            except PartitionUnavailableError as exc:
                heads.pop(p, None)
                unavailable[p] = exc.reason
        return LogScan(heads, unavailable)

    # -- read ---------------------------------------------------------------------------------
    def _indexed(self, partition: int, start: int) -> tuple[int, str]:
        """The indexed ordinal b <= ``start`` nearest to it and the ID of entry b-1 ("-" for
        b = 0): ``start`` itself once any read stopped there (every batch boundary is)."""
        index = self.index_key(partition)
        if start == 0:
            return 0, "-"
        raw = self.client.hget(index, str(start))
        if raw is not None:
            return start, _s(raw)
        below = [
            int(f) for f in map(_s, self.client.hkeys(index)) if f.isdigit() and int(f) < start
        ]
        if not below:
            return 0, "-"
        base = max(below)
        return base, _s(self.client.hget(index, str(base)))

    def _position(self, partition: int, start: int, check_group: bool = False) -> str | None:
        """The ID of entry ``start - 1`` ("-" for ordinal 0; None if the stream has no entry
        yet), checked against the stream; PartitionUnavailableError if reading from ``start`` could
        skip or misplace entries. ``check_group``: also check (and create) this reader's
        consumer group (the driver does; read tasks on executors need not)."""
        key = self.stream_keys[partition]
        info = self.info(partition)
        if check_group:
            self._check_group(partition, start, info)
        if info is None:
            if start == 0:
                return None  # nothing added yet
            raise PartitionUnavailableError(
                partition, f"unavailable: stream {key} is missing (deleted?); it stood at {start}"
            )
        base, after = self._indexed(partition, start)
        accounted = _id(self._index_field(partition, ACCOUNTED_FIELD) or "0-0")
        if after != "-" and info.max_deleted > max(_id(after), accounted):
            raise PartitionUnavailableError(
                partition,
                f"unavailable: entries of stream {key} after {after} (ordinal {base}) were "
                "deleted (XDEL) before this reader read them: they are lost to it; "
                f"`tridentflow reset {self.keyspace.pipeline}` counts what the stream holds now",
            )
        if info.entries_added < start:
            raise PartitionUnavailableError(
                partition,
                f"unavailable: stream {key} holds {info.entries_added} entries ever added, "
                f"behind ordinal {start} (deleted and recreated?)",
            )
        if info.first_ordinal > base:
            raise PartitionUnavailableError(
                partition,
                f"unavailable: stream {key} was trimmed to ordinal {info.first_ordinal}, beyond "
                f"ordinal {base} where reading resumes: entries {base}..{info.first_ordinal - 1}"
                " were removed before this reader read them (trim only with `tridentflow trim`,"
                f" up to what every reader committed); `tridentflow reset "
                f"{self.keyspace.pipeline}` counts what the stream holds now",
            )
        if base < start:  # inside a batch (a read task of its own): skip to it
            lower = "-" if after == "-" else f"({after}"
            skipped = self.client.xrange(key, lower, "+", count=start - base)
            if len(skipped) < start - base:
                raise SourceError(f"stream {key} ends before ordinal {start}")
            after = _s(skipped[-1][0])
            self.client.hset(self.index_key(partition), str(start), after)
        return after

    def probe(self, partition: int, start: int, end: int) -> None:
        if end > start:
            self._check_partition(partition)
            self._position(partition, start, check_group=True)

    def read_raw(self, partition: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        """(ordinal, the entry's fields as a JSON object) for ordinals [start, end); the ID
        where it stopped is indexed for the next read. SourceError if fewer entries come back
        than the range holds (the stream changed while it was read)."""
        if end <= start:
            return
        self._check_partition(partition)
        key = self.stream_keys[partition]
        after = self._position(partition, start)
        lower = "-" if after in (None, "-") else f"({after}"  # after entry start - 1
        entries = self.client.xrange(key, lower, "+", count=end - start)
        if len(entries) < end - start:
            raise SourceError(
                f"stream {key} returned {len(entries)} entries for ordinals [{start}, {end}): "
                "it changed while being read (trimmed or deleted?)"
            )
        self.client.hset(self.index_key(partition), str(end), _s(entries[-1][0]))
        for ordinal, (_entry_id, fields) in enumerate(entries, start):
            record = {_decoded(k): _decoded(v) for k, v in fields.items()}
            yield ordinal, json.dumps(record).encode("utf-8", "surrogatepass")

    def read(self, partition: int, start: int, end: int) -> Iterator[tuple[int, Any]]:
        for ordinal, raw in self.read_raw(partition, start, end):
            yield ordinal, json.loads(raw)

    # -- write --------------------------------------------------------------------------------
    def append_spread(self, records: Iterable[Any]) -> dict[int, tuple[int, int]]:
        """XADD records (see ``stream_entry``, with the source's fields) round robin over the
        partitions' streams, continuing where they stand. Every record is checked before
        anything is added."""
        fields = self.fields
        entries = [stream_entry(r, fields, f"record {i + 1}") for i, r in enumerate(records)]
        return self.append_fields_spread(entries)

    def append_fields_spread(self, entries: list[dict[str, str]]) -> dict[int, tuple[int, int]]:
        for p, key in enumerate(self.stream_keys):  # never recreate a stream read before
            if self._registered(p) and self.info(p) is None:
                raise SourceError(
                    f"stream {key} no longer exists (deleted?) but pipeline "
                    f"{self.keyspace.pipeline} read it: adding would recreate it, and the "
                    f"reader would not count what it adds; `tridentflow reset "
                    f"{self.keyspace.pipeline}` first"
                )
        scan = self.scan()
        n = self.partitions()
        total = sum(scan.heads.values())
        added: dict[int, tuple[int, int]] = {}
        for j in range(0, len(entries), XADD_CHUNK):
            pipe = self.client.pipeline(transaction=False)
            for i, fields in enumerate(entries[j : j + XADD_CHUNK], j):
                pipe.xadd(self.stream_keys[(total + i) % n], fields)
            pipe.execute()
        for p in range(n):
            count = len(range((p - total) % n, len(entries), n))
            if count:
                head = scan.heads.get(p, 0)
                added[p] = (head, head + count)
                if not self._registered(p):  # from now on a deletion of it is noticed
                    self._create_group(p, 0)
        return added

    # -- readers ------------------------------------------------------------------------------
    def acknowledge(self, committed: dict[int, int]) -> None:
        """After a commit: this reader's group on each stream moves to its committed entry
        (XGROUP SETID ... ENTRIESREAD), so ``trim`` of any reader keeps what this one has not
        committed, and ``XINFO GROUPS`` shows its lag. Best effort: a lagging group only
        keeps entries longer."""
        for p, position in committed.items():
            entry = self._index_id(p, position) if position > 0 else "0"
            if entry is None or not self._registered(p):
                continue
            with contextlib.suppress(redis.exceptions.ResponseError):  # gone: a read says so
                self.client.execute_command(
                    "XGROUP", "SETID", self.stream_keys[p], self.group, entry,
                    "ENTRIESREAD", position,
                )  # fmt: skip

    def _safe_point(self, partition: int, own: str) -> tuple[str, str]:
        """(the newest entry ID every reader of the stream is done with, the reader that
        holds it there): this reader at ``own``; another tridentflow reader at its group's
        committed entry; any other consumer group at its last delivered entry, or before its
        oldest pending one."""
        safe, holder = own, self.group
        key = self.stream_keys[partition]
        for name, group in self.groups(partition).items():
            if name == self.group:
                continue
            point = _s(group.get("last-delivered-id") or "0-0")
            if not name.startswith(GROUP_PREFIX) and int(group.get("pending") or 0) > 0:
                oldest = self.client.xpending(key, name).get("min")
                if oldest is not None:
                    point = min(point, _before(_s(oldest)), key=_id)
            if _id(point) < _id(safe):
                safe, holder = point, name
        return safe, holder

    # -- maintenance --------------------------------------------------------------------------
    def trim(self, committed: dict[int, int]) -> dict[int, tuple[int, str]]:
        """Remove, per stream, the entries every reader is done with: up to this reader's
        ``committed`` ordinal and no further than any other reader's group (XTRIM MINID);
        this reader's index entries below its position go too. Returns (entries removed, the
        reader that limited it) per partition. Never removes an entry a reader still needs."""
        removed: dict[int, tuple[int, str]] = {}
        for p, position in sorted(committed.items()):
            if position <= 0:
                continue
            last = self._index_id(p, position)
            if last is None:
                continue  # nothing read up to there through this index
            safe, holder = self._safe_point(p, last)
            n = 0
            if safe != "0-0":
                n = int(
                    self.client.xtrim(self.stream_keys[p], minid=_after(safe), approximate=False)
                )
            removed[p] = (n, holder)
            stale = [
                f for f in self.client.hkeys(self.index_key(p))
                if _s(f).isdigit() and int(f) < position
            ]  # fmt: skip
            if stale:
                self.client.hdel(self.index_key(p), *stale)
        return removed

    def trimmed(self, partition: int, removed: int, holder: str, committed: int) -> str:
        limit = (
            f"up to ordinal {committed}, committed"
            if holder == self.group
            else f"kept what reader {holder} has not read yet"
        )
        return f"{self.stream_keys[partition]}: {removed} entries removed ({limit})"

    def other_readers(self) -> dict[str, list[str]]:
        """Stream -> the consumer groups on it other than this reader's."""
        found: dict[str, list[str]] = {}
        for p, key in enumerate(self.stream_keys):
            others = sorted(g for g in self.groups(p) if g != self.group)
            if others:
                found[key] = others
        return found

    def check_unshared(self) -> None:
        """SourceError while another reader's consumer group is on one of the streams."""
        shared = self.other_readers()
        if shared:
            key, groups = next(iter(shared.items()))
            raise SourceError(
                f"stream {key} is read by {', '.join(groups)} too: --source would delete their "
                "records; reset without --source (this reader alone starts again), or remove "
                "those readers first (XGROUP DESTROY)"
            )

    def produce(
        self,
        pipeline: str,
        lines: list[str],
        asked_partitions: int | None,
        source_partitions: int,
        skip_unavailable: bool = False,
    ) -> Produced:
        """XADD every record round robin to the pipeline's streams; what it did."""
        if asked_partitions:
            raise SourceError("--partitions: a stream source's partitions are its streams")
        records = [json.loads(line) for line in lines]
        added = self.append_spread(records)  # every record checked before any is added
        scan = self.scan()
        return Produced(
            len(records),
            f"the streams of {pipeline}",
            self.partitions(),
            written=len(added),
            notes=(f"{sum(scan.heads.values())} ever added",),
            verb="added",
            unit="entries",
            partition_word="streams",
        )

    def check_delete(self) -> None:
        """``reset --source`` may delete the streams: no other reader's group is on one."""
        self.check_unshared()

    def delete(self) -> int:
        """Delete every partition's stream and index (``reset --source``). SourceError, with
        nothing deleted, while another reader's consumer group is on one of the streams."""
        self.check_unshared()
        keys = [*self.stream_keys, *(self.index_key(p) for p in range(self.partitions()))]
        return sum(int(self.client.delete(k)) for k in keys)

    def rebase(self) -> dict[int, int]:
        """After a reset that kept the streams: start this reader at what each stream still
        holds. A stream trimmed (or XDELed) before the reset starts at the ordinal of its
        first entry left (``entries-added - length``, the surviving entries numbered densely
        up to the head), indexed there; the group is set to it. Returns the start ordinal per
        partition where it is not 0 (the new generation's first committed position)."""
        starts: dict[int, int] = {}
        for p, key in enumerate(self.stream_keys):
            info = self.info(p)
            start = 0 if info is None else info.first_ordinal
            if start > 0:
                (first_id, _fields), *_rest = self.client.xrange(key, "-", "+", count=1) or [
                    (f"{info.max_deleted[0]}-{info.max_deleted[1] + 1}", {})
                ]
                self.client.hset(self.index_key(p), str(start), _before(_s(first_id)))
                starts[p] = start
            if info is not None and info.max_deleted > (0, 0):
                ms, seq = info.max_deleted
                self.client.hset(self.index_key(p), ACCOUNTED_FIELD, f"{ms}-{seq}")
            if info is not None:
                with contextlib.suppress(redis.exceptions.ResponseError):
                    self.client.execute_command("XGROUP", "DESTROY", key, self.group)
                self._create_group(p, start)
        return starts
