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
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import redis

from state.keys import KeySpace
from tridentflow.errors import PartitionUnavailable, SourceError
from tridentflow.sources.base import LogScan
from tridentflow.sources.filelog import encode_record

LOCATOR_PREFIX = "redis-stream:"
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
    return f"{ms}-{seq + 1}"


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
        return f"{self.keyspace.base}:stream-index:{int(partition)}"

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
        PartitionUnavailable if Redis cannot tell."""
        key = self.stream_keys[partition]
        try:
            raw = self.client.xinfo_stream(key)
        except redis.exceptions.ResponseError as exc:
            if "no such key" in str(exc).lower():
                return None
            raise PartitionUnavailable(partition, f"unavailable: stream {key}: {exc}") from None
        except redis.exceptions.RedisError as exc:
            raise PartitionUnavailable(partition, f"unavailable: stream {key}: {exc}") from None
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

    def scan(self) -> LogScan:
        """Every partition's head (entries ever added to its stream; 0 for a stream that does
        not exist yet), and why each other one cannot be read now."""
        heads: dict[int, int] = {}
        unavailable: dict[int, str] = {}
        for p in range(self.partitions()):
            try:
                heads[p] = self.head(p)
            except PartitionUnavailable as exc:
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
        below = [int(f) for f in self.client.hkeys(index) if int(f) < start]
        if not below:
            return 0, "-"
        base = max(below)
        return base, _s(self.client.hget(index, str(base)))

    def _position(self, partition: int, start: int) -> str | None:
        """The ID of entry ``start - 1`` ("-" for ordinal 0; None if the stream has no entry
        yet), checked against the stream; PartitionUnavailable if reading from ``start`` could
        skip or misplace entries."""
        key = self.stream_keys[partition]
        info = self.info(partition)
        if info is None:
            if start == 0:
                return None  # nothing added yet
            raise PartitionUnavailable(
                partition, f"unavailable: stream {key} is missing (deleted?); it stood at {start}"
            )
        base, after = self._indexed(partition, start)
        if after != "-" and info.max_deleted > _id(after):
            raise PartitionUnavailable(
                partition,
                f"unavailable: entries of stream {key} after {after} (ordinal {base}) were "
                "deleted (XDEL): records would be lost without notice",
            )
        if info.entries_added < start:
            raise PartitionUnavailable(
                partition,
                f"unavailable: stream {key} holds {info.entries_added} entries ever added, "
                f"behind ordinal {start} (deleted and recreated?)",
            )
        if info.first_ordinal > base:
            raise PartitionUnavailable(
                partition,
                f"unavailable: stream {key} was trimmed to ordinal {info.first_ordinal}, beyond "
                f"ordinal {base} where reading resumes: entries {base}..{info.first_ordinal - 1}"
                " are gone (trim only with `tridentflow trim`, up to what is committed)",
            )
        if after != "-" and info.first_ordinal < base and not self.client.xrange(key, after, after):
            raise PartitionUnavailable(
                partition,
                f"unavailable: stream {key} no longer holds entry {after} (ordinal {base - 1}) "
                "while it holds earlier ones: deleted and recreated?",
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
            self._position(partition, start)

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
            record = {_s(k): v.decode("utf-8", "surrogateescape") for k, v in fields.items()}
            yield ordinal, json.dumps(record).encode()

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
        return added

    # -- maintenance --------------------------------------------------------------------------
    def trim(self, committed: dict[int, int]) -> dict[int, int]:
        """Remove every entry up to the ``committed`` ordinal of each partition (XTRIM MINID
        just past the last committed entry's ID); the index entries below it go too. Returns
        entries removed per partition. Never removes an uncommitted entry."""
        removed: dict[int, int] = {}
        for p, position in sorted(committed.items()):
            if position <= 0:
                continue
            last = self.client.hget(self.index_key(p), str(position))
            if last is None:
                continue  # nothing read up to there through this index
            removed[p] = int(
                self.client.xtrim(self.stream_keys[p], minid=_after(_s(last)), approximate=False)
            )
            stale = [f for f in self.client.hkeys(self.index_key(p)) if int(f) < position]
            if stale:
                self.client.hdel(self.index_key(p), *stale)
        return removed

    def delete(self) -> int:
        """Delete every partition's stream and index (``reset --source``)."""
        keys = [*self.stream_keys, *(self.index_key(p) for p in range(self.partitions()))]
        return sum(int(self.client.delete(k)) for k in keys)
