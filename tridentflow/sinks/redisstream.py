"""RedisStreamSink: a new-values stream appended to Redis Streams, exactly once per txid.

Entry IDs come from the txid: the rows of txid T go to ``(base + T)-0``, ``(base + T)-1``, ...
(per partition stream, rows in a fixed order), so an export retried after a crash part-way
re-adds the same IDs, which Redis refuses as not new: nothing is written twice. ``base`` is
fixed per pipeline lineage (above every ID the stream held when the lineage first exported;
a reset starts a new lineage, a rewind does not - it is refused below the sink's
position), kept with the sink's position in a companion hash in the stream's slot
(``<stream>:tridentflow-sink``, hash-tagged), which APPEND_TXID moves in the same script as
the txid's last entries. A downstream pipeline reading the stream with a RedisStreamSource
therefore sees every change exactly once: chained pipelines are exactly-once end to end.

A stream sink cannot take back what it appended: a sink further behind than the change log
keeps fails with one line (resync is refused); removals are entries whose value is null.
One sink per stream: two writers of one stream would collide on IDs.
"""

from __future__ import annotations

import copy
import json
import re
import zlib
from collections.abc import Sequence
from typing import Any

import redis

from tridentflow.datasets import LineageDataset, redis_namespace
from tridentflow.sinks.base import (
    ExportContext,
    LineageContext,
    Row,
    Sink,
    SinkError,
    SinkRefusedError,
)
from tridentflow_state.scripts import LuaScript

APPEND_CHUNK = 2000
"""Entries per APPEND_TXID call (keeps each script short)."""

APPEND_TXID = LuaScript(
    "append_txid",
    """
-- Append one chunk of a txid's entries to a stream, with IDs derived from the txid.
-- KEYS[1] the stream  KEYS[2] its companion hash (same slot)
-- ARGV[1] sink id  ARGV[2] generation  ARGV[3] txid  ARGV[4] '1' if this chunk is the txid's
-- last  ARGV[5] fields per entry (F)  ARGV[6] sequence number of the first entry
-- ARGV[7..] F field/value pairs per entry
-- A new generation (or the first use) takes as base the stream's last generated ID's
-- milliseconds, so its IDs are above everything there. An entry whose ID exists (or is
-- below the last one: an earlier attempt wrote it) is skipped. Returns the entries added,
-- or -1 if the txid was already complete (nothing done).
local sink, gen, txid = ARGV[1], ARGV[2], tonumber(ARGV[3])
local gen_field, base_field, pos_field = sink .. ':generation', sink .. ':base', sink .. ':txid'
if redis.call('HGET', KEYS[2], gen_field) ~= gen then
  local base = 0
  if redis.call('EXISTS', KEYS[1]) == 1 then
    local info = redis.call('XINFO', 'STREAM', KEYS[1])
    for i = 1, #info, 2 do
      if info[i] == 'last-generated-id' then
        base = tonumber(string.match(info[i + 1], '^(%d+)-'))
      end
    end
  end
  redis.call('HSET', KEYS[2], gen_field, gen, base_field, base, pos_field, 0)
end
if tonumber(redis.call('HGET', KEYS[2], pos_field)) >= txid then return -1 end
local ms = tonumber(redis.call('HGET', KEYS[2], base_field)) + txid
local width = tonumber(ARGV[5]) * 2
local seq = tonumber(ARGV[6])
local added = 0
for i = 7, #ARGV, width do
  local entry = {'XADD', KEYS[1], string.format('%d-%d', ms, seq)}
  for j = i, i + width - 1 do entry[#entry + 1] = ARGV[j] end
  local ok = redis.pcall(unpack(entry))
  if type(ok) == 'table' and ok.err then
    if not string.find(ok.err, 'equal or smaller') then return redis.error_reply(ok.err) end
  else
    added = added + 1
  end
  seq = seq + 1
end
if ARGV[4] == '1' then redis.call('HSET', KEYS[2], pos_field, txid) end
return added
""",
)


RESERVED_PREFIX = "tf:"
"""What tridentflow's own keys start with (tridentflow_state.keys.KeySpace.prefix)."""
COMPANION_SUFFIX = ":tridentflow-sink"


def companion_key(stream: str) -> str:
    """The hash beside ``stream`` (same cluster slot) holding the sinks' bases and positions."""
    start = stream.find("{")
    if start >= 0:
        end = stream.find("}", start + 1)
        if end > start + 1:  # the stream has a hash tag: share it
            return f"{stream}{COMPANION_SUFFIX}"
    return f"{{{stream}}}{COMPANION_SUFFIX}"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


class RedisStreamSink(Sink):
    """Appends each txid's new values to ``stream`` (one entry per changed key: the stream's
    fields, strings as they are and anything else as JSON - what a RedisStreamSource reads).

    ``partitions`` > 1 spreads the keys over ``stream.format(partition=P)`` by a stable hash
    of the key fields (the template must hold ``{partition}``): the state's group fields, or
    ``key`` - needed when the stream's operations renamed them (a key's changes must always
    go to one stream, or a reader of several sees them out of order). ``url``: another Redis
    than the pipeline's (default: the pipeline's own)."""

    resyncable = False

    def __init__(
        self,
        stream: str,
        *,
        partitions: int = 1,
        url: str | None = None,
        name: str | None = None,
        key: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(stream, str) or not stream.strip():
            raise ValueError(f"RedisStreamSink: the stream must be a non-empty key, got {stream!r}")
        if stream.startswith(RESERVED_PREFIX):
            raise ValueError(
                f"RedisStreamSink: stream {stream!r} starts with {RESERVED_PREFIX!r}, "
                "tridentflow's own keys; give another key"
            )
        if stream.endswith(COMPANION_SUFFIX):
            raise ValueError(
                f"RedisStreamSink: stream {stream!r} ends like the sink's companion hashes "
                f"({COMPANION_SUFFIX!r}); give another key"
            )
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise ValueError(f"RedisStreamSink: partitions must be >= 1, got {partitions!r}")
        if partitions > 1 and "{partition}" not in stream:
            raise ValueError(
                f"RedisStreamSink: {partitions} partitions need a stream template with "
                f"'{{partition}}', got {stream!r}"
            )
        self.stream = stream
        self.partitions = partitions
        self.url = url
        self.key = tuple(key) if key is not None else None
        self.name = name or "stream-" + re.sub(
            r"[^A-Za-z0-9_.-]", "_", stream.replace("{partition}", "P").replace("{", "")
        ).replace("}", "")
        self.fields: tuple[str, ...] = ()
        self.key_fields: tuple[str, ...] = ()
        self._client: redis.Redis | None = None

    def __repr__(self) -> str:
        return f"RedisStreamSink({self.stream!r}, name={self.name!r})"

    def bind(self, fields: tuple[str, ...], key_fields: tuple[str, ...]) -> RedisStreamSink:
        what = f"RedisStreamSink({self.stream})"
        key = self.key if self.key is not None else tuple(k for k in key_fields if k in fields)
        missing = [k for k in key if k not in fields]
        if missing:
            raise ValueError(
                f"{what}: key field(s) {missing} are not fields of the stream {list(fields)}; "
                "pass key=..."
            )
        if self.partitions > 1 and not key:
            raise ValueError(
                f"{what}: {self.partitions} partitions spread keys by the key fields, but the "
                f"stream's fields {list(fields)} do not hold the state's {list(key_fields)}: "
                "pass key=[...] (a key's changes must always go to one stream)"
            )
        bound = copy.copy(self)  # every setting, a new one included (never listed twice)
        bound._client = None
        bound.fields = tuple(fields)
        bound.key_fields = key or tuple(fields)
        return bound

    def streams(self) -> list[str]:
        if self.partitions == 1 and "{partition}" not in self.stream:
            return [self.stream]
        return [self.stream.replace("{partition}", str(p)) for p in range(self.partitions)]

    def stream_of(self, key: Sequence[Any]) -> str:
        """The stream a key's entries go to (``key``: the values of the sink's key fields, in
        order): a consumer following one key reads that stream only."""
        return self.streams()[self._partition_of(tuple(key), list(range(len(key))))]

    def lineage_datasets(self, ctx: LineageContext) -> list[LineageDataset]:
        """Each stream, on the Redis it is written to."""
        where = redis_namespace(self.url or ctx.redis_url)
        return [LineageDataset(where, stream) for stream in self.streams()]

    def describe(self) -> str:
        where = "the pipeline's Redis" if self.url is None else "another Redis"
        return f"Redis stream(s) {', '.join(self.streams())} ({where})"

    def _redis(self, ctx: ExportContext) -> redis.Redis:
        if self.url is None:
            return ctx.client
        if self._client is None:
            from tridentflow.redisconn import connect

            self._client = connect(self.url)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def _sink_id(self, ctx: ExportContext) -> str:
        return f"{ctx.pipeline}/{self.name}"

    def position(self, ctx: ExportContext) -> int:
        client = self._redis(ctx)
        sink = self._sink_id(ctx)
        positions = []
        for stream in self.streams():
            gen, pos = client.hmget(companion_key(stream), f"{sink}:generation", f"{sink}:txid")
            gen = gen.decode() if isinstance(gen, bytes) else gen
            lineage = ctx.lineage or ctx.generation
            positions.append(int(pos) if gen == lineage and pos is not None else 0)
        return min(positions)

    def written_through(self, ctx: ExportContext) -> int:
        """The newest txid any stream holds entries of in this lineage, whole or in part: an
        export cut short between streams (or between chunks of one) leaves the position at
        the txid before on some of them, but its readers may have read the rest."""
        client = self._redis(ctx)
        sink = self._sink_id(ctx)
        lineage = ctx.lineage or ctx.generation
        furthest = 0
        for stream in self.streams():
            gen, base, pos = client.hmget(
                companion_key(stream), f"{sink}:generation", f"{sink}:base", f"{sink}:txid"
            )
            gen = gen.decode() if isinstance(gen, bytes) else gen
            if gen != lineage or base is None:
                continue
            furthest = max(furthest, int(pos or 0))
            last = client.xrevrange(stream, "+", "-", count=1)
            if last:
                ms = int(last[0][0].decode().split("-")[0])
                furthest = max(furthest, ms - int(base))
        return furthest

    def claims(self) -> tuple[str, ...]:
        where = "" if self.url is None else f" at {self.url}"
        return tuple(f"Redis stream {stream}{where}" for stream in self.streams())

    def _partition_of(self, row: Row, key_idx: list[int]) -> int:
        if self.partitions == 1:
            return 0
        key = json.dumps([row[i] for i in key_idx], separators=(",", ":"), sort_keys=True)
        return zlib.crc32(key.encode("utf-8", "surrogatepass")) % self.partitions

    def apply(
        self, ctx: ExportContext, txid: int, rows: Sequence[Row], replace_all: bool = False
    ) -> bool:
        if replace_all:
            raise SinkRefusedError(
                f"sink {self.name}: a stream cannot replace what it already holds; the "
                "changes it missed are gone (raise change_log_limit, and reset the readers "
                "of the stream)"
            )
        client = self._redis(ctx)
        key_idx = [self.fields.index(k) for k in self.key_fields]
        by_partition: list[list[Row]] = [[] for _ in range(self.partitions)]
        for row in rows:
            by_partition[self._partition_of(row, key_idx)].append(row)
        width = len(self.fields)
        applied = False
        for stream, part in zip(self.streams(), by_partition, strict=True):
            keys = [stream, companion_key(stream)]
            chunks = [part[i : i + APPEND_CHUNK] for i in range(0, len(part), APPEND_CHUNK)]
            for n, chunk in enumerate(chunks or [[]]):
                last = "1" if n == len(chunks or [[]]) - 1 else "0"
                lineage = ctx.lineage or ctx.generation
                args: list[Any] = [self._sink_id(ctx), lineage, txid, last, width]
                args.append(n * APPEND_CHUNK)
                for row in chunk:
                    for field, value in zip(self.fields, row, strict=True):
                        args += (field, _text(value))
                try:
                    added = APPEND_TXID(client, keys, args)
                except redis.RedisError as exc:
                    raise SinkError(
                        f"sink {self.name}: txid {txid} not appended to stream {stream}: {exc}"
                    ) from None
                if int(added) == -1:
                    self._wait_replicas(ctx, client, stream, txid)
                    break  # this partition has the txid already
                if not applied:
                    ctx.fire("mid-export", txid)
                applied = True
            else:
                self._wait_replicas(ctx, client, stream, txid)
            if applied and len(by_partition) > 1:
                ctx.fire("between-parts", txid)  # a stream has the txid, others may not yet
        return applied

    def _wait_replicas(
        self, ctx: ExportContext, client: redis.Redis, stream: str, txid: int
    ) -> None:
        """With ``ctx.replicas`` > 0: SinkError unless that many replicas of the stream's
        master have the txid's entries and position (a failover would take them back)."""
        if ctx.replicas <= 0:
            return
        from tridentflow_state.replication import wait_for_replicas

        # the probe goes to the companion hash: the stream's slot, so the stream's master
        acked = wait_for_replicas(
            client, companion_key(stream), ctx.replicas, ctx.replica_timeout_ms
        )
        if acked < ctx.replicas:
            raise SinkError(
                f"sink {self.name}: txid {txid} is on the master of stream {stream} but only "
                f"{acked} of {ctx.replicas} replica(s) acknowledged it within "
                f"{ctx.replica_timeout_ms} ms; export again (nothing is added twice)"
            )
