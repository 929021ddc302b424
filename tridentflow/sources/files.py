"""Files where the data already lands (``FileSource``): Parquet, CSV or JSON lines in a local
directory or an object-store prefix, each file taken by exactly one committed txid.

How it keeps that promise: a listing (the coordinator's ``scan``) never compares files with a
time. Every file it finds that it has not taken is appended, atomically (``TAKE_FILES``), to a
**manifest** in the pipeline's Redis - one list per partition, the file's index in it its
offset - with the identity it had when taken (size and modification time). A txid's batch is
a range of offsets, as for every source, so it is an explicit list of files: a retry, a
clear or a zombie reads exactly those files, and a file that lands late with an old mtime is
still taken (it is simply not in the manifest yet). A file already taken that is listed with
another identity was overwritten: ``on_overwrite`` decides (``"fail"``: the listing refuses
in one line; ``"ignore"``; ``"reingest"``: taken again at a new offset).

A read (``read_raw``, on the driver or a Spark executor) checks each file against the
identity it was taken with before reading it: a file deleted, truncated or rewritten since is
never read half - the read fails in one line naming it (a transactional source waits, as for
an unavailable partition; an opaque one skips it: one quarantined bad record naming it). A
file that cannot be parsed (a corrupt Parquet footer) is one bad record naming its path,
quarantined as every bad record is. Offsets hold a file each, records are many per offset:
the log is not ``dense`` (a read task accounts for the whole range).
"""

from __future__ import annotations

import fnmatch
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from tridentflow.errors import (
    FileOverwrittenError,
    PartitionUnavailableError,
    SourceError,
    one_line,
)
from tridentflow.sources.base import ChaosTraits, LogScan, Produced
from tridentflow_state.keys import KeySpace
from tridentflow_state.scripts import NOW_MS, LuaScript

LOCATOR_PREFIX = "files:"
FORMATS = ("parquet", "csv", "json")
ON_OVERWRITE = ("fail", "ignore", "reingest")
LIST_CHUNK = 1000
"""Paths compared with the manifest per Redis call."""
COUNTED_BYTES = 16 << 20
"""A batch of files up to this size has its records counted before the emit (Parquet
footers, lines): whether it is small enough for the local engine. Past it, it is big."""

PRUNE_MAX = 1000
"""Files one TAKE_FILES call forgets at most (the rest at the next listing): a short script
(and within Lua's unpack limit)."""

# Take the files a listing found that the manifest does not hold, atomically: two
# coordinators listing at once cannot take a file twice. With forget_after, remember each
# file taken by its mtime, move the frontier (the newest mtime taken, capped at the Redis
# clock) and the watermark behind it (it never moves back), and forget, oldest first, at most
# PRUNE_MAX files below the watermark: what the source remembers stays bounded.
# KEYS[1] the taken hash (files_taken); KEYS[2] files_meta; KEYS[3] files_forget; KEYS[4..]
# the manifest lists, one per partition.
# ARGV[1] on_overwrite ('fail' | 'ignore' | 'reingest'); ARGV[2] forget_after in ms ('' for
# never); then, per file, five values: path, version (its identity, JSON), partition
# (0-based), the manifest entry (JSON), mtime in ms. A file below the watermark is neither
# compared nor taken (forgotten files are listed again for ever: that is the rule's price).
# Returns {0, conflicts...} where conflicts are path, taken-JSON pairs of files taken with
# another version (with 'fail', nothing is taken then), or {1, taken, forgotten}.
TAKE_FILES = LuaScript(
    "take_files",
    NOW_MS
    + """
local mode, forget_ms = ARGV[1], tonumber(ARGV[2])
local meta = KEYS[2]
local watermark = tonumber(redis.call('HGET', meta, 'watermark_ms') or '-1')
local conflicts = {}
for i = 3, #ARGV, 5 do
  if tonumber(ARGV[i + 4]) >= watermark then
    local taken = redis.call('HGET', KEYS[1], ARGV[i])
    if taken and cjson.decode(taken)['version'] ~= ARGV[i + 1] then
      table.insert(conflicts, ARGV[i])
      table.insert(conflicts, taken)
    end
  end
end
if mode == 'fail' and #conflicts > 0 then
  local out = {0}
  for _, v in ipairs(conflicts) do table.insert(out, v) end
  return out
end
local count = 0
local now = now_ms()
local frontier = tonumber(redis.call('HGET', meta, 'frontier_ms') or '-1')
for i = 3, #ARGV, 5 do
  local path, version, partition = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local mtime = tonumber(ARGV[i + 4])
  local taken = mtime >= watermark and redis.call('HGET', KEYS[1], path)
  local again = taken and cjson.decode(taken)['version'] ~= version and mode == 'reingest'
  if mtime >= watermark and (not taken or again) then
    local base = tonumber(redis.call('HGET', meta, 'base:' .. partition) or '0')
    local ordinal = base + redis.call('RPUSH', KEYS[4 + partition], ARGV[i + 3]) - 1
    redis.call('HSET', KEYS[1], path, cjson.encode(
      {version = version, partition = partition, ordinal = ordinal}))
    if forget_ms then
      redis.call('ZADD', KEYS[3], mtime, path)
      frontier = math.max(frontier, math.min(mtime, now))
    end
    count = count + 1
  end
end
local forgotten = 0
if forget_ms and frontier >= 0 then
  redis.call('HSET', meta, 'frontier_ms', frontier)
  local mark = frontier - forget_ms
  if mark > watermark then
    redis.call('HSET', meta, 'watermark_ms', mark)
    watermark = mark
  end
  local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. watermark, 'LIMIT', 0,
    PRUNE_MAX)
  if #old > 0 then
    redis.call('HDEL', KEYS[1], unpack(old))
    redis.call('ZREM', KEYS[3], unpack(old))
    redis.call('HINCRBY', meta, 'forgotten', #old)
  end
  forgotten = #old
end
return {1, count, forgotten}
""".replace("PRUNE_MAX", str(PRUNE_MAX)),
)

# Trim a partition's manifest: drop its entries before offset ARGV[2] and move its base there.
# Idempotent (a trim to an offset at or before the base removes nothing).
# KEYS[1] files_meta; KEYS[2] the partition's manifest list.
# ARGV[1] the partition; ARGV[2] the first offset to keep. Returns the entries removed.
TRIM_MANIFEST = LuaScript(
    "trim_manifest",
    """
local field = 'base:' .. ARGV[1]
local base = tonumber(redis.call('HGET', KEYS[1], field) or '0')
local keep = math.min(tonumber(ARGV[2]), base + redis.call('LLEN', KEYS[2]))
if keep <= base then return 0 end
redis.call('LTRIM', KEYS[2], keep - base, -1)
redis.call('HSET', KEYS[1], field, keep)
return keep - base
""",
)


@dataclass(frozen=True)
class FoundFile:
    """A file a listing found: its path in the filesystem, size and modification time."""

    path: str
    size: int
    mtime_ns: int

    @property
    def mtime_ms(self) -> int:
        return self.mtime_ns // 1_000_000

    @property
    def version(self) -> str:
        """The identity a later listing or read compares (the store's size and mtime)."""
        return json.dumps([self.size, self.mtime_ns])


def filesystem(uri: str, storage_options: dict[str, str] | None = None) -> tuple[Any, str]:
    """A pyarrow filesystem for ``uri`` (a local directory, ``file://``, ``s3://bucket/prefix``)
    and the path in it. ``storage_options`` takes delta-rs's object-store keys
    (``endpoint_url``, ``aws_access_key_id``, ``aws_secret_access_key``, ``region``,
    ``allow_http``), so one dict serves a pipeline's FileSource and its DeltaSink; without
    them the standard ``AWS_*`` environment applies."""
    from pyarrow import fs

    options = {str(k).lower(): str(v) for k, v in (storage_options or {}).items()}
    if uri.startswith("s3://"):
        endpoint = options.get("endpoint_url") or options.get("aws_endpoint_url")
        kwargs: dict[str, Any] = {}
        if endpoint:
            scheme, _, host = endpoint.partition("://")
            kwargs["endpoint_override"] = host or scheme
            kwargs["scheme"] = scheme if host else "https"
        if (options.get("allow_http") or options.get("aws_allow_http") or "").lower() == "true":
            kwargs["scheme"] = "http"
        for ours, theirs in (
            ("aws_access_key_id", "access_key"),
            ("aws_secret_access_key", "secret_key"),
            ("aws_session_token", "session_token"),
            ("region", "region"),
            ("aws_region", "region"),
        ):
            if ours in options:
                kwargs[theirs] = options[ours]
        return fs.S3FileSystem(**kwargs), uri[len("s3://") :].rstrip("/")
    path = uri[len("file://") :] if uri.startswith("file://") else uri
    return fs.LocalFileSystem(), path.rstrip("/") or "/"


class FilesLog:
    """SourceLog over the files under ``uri`` that match ``pattern``, with a manifest in the
    pipeline's Redis (``keyspace``); ``url`` is what a read task connects with."""

    dense = False
    chaos = ChaosTraits(disturb="none", fresh="ledger-only", producers_own=True)

    def __init__(
        self,
        client: redis.Redis,
        url: str,
        keyspace: KeySpace,
        spec: dict[str, Any],
        owns_client: bool = False,
    ) -> None:
        self.client = client
        self.url = url
        self.keyspace = keyspace
        self.spec = spec
        self.uri = str(spec["uri"])
        self.format = str(spec["format"])
        self.pattern = str(spec["pattern"])
        self.storage_options = dict(spec.get("storage_options") or {})
        self.on_overwrite = str(spec.get("on_overwrite", "fail"))
        self.min_age_s = float(spec.get("min_age_s", 0.0))
        forget = spec.get("forget_after_s")
        self.forget_after_ms = int(float(forget) * 1000) if forget else None
        """Files modified this long before the newest one taken are forgotten (None: never)."""
        self.opaque = spec.get("mode") == "opaque"
        """An opaque source skips a frozen file that is gone or changed (quarantined as one
        bad record naming it); a transactional one waits for it."""
        self._partitions = int(spec["partitions"])
        self._owns_client = owns_client
        self._fs: tuple[Any, str] | None = None

    # -- identity -----------------------------------------------------------------------------
    @property
    def root(self) -> str:
        spec = {"url": self.url, "pipeline": self.keyspace.pipeline,
                "namespace": self.keyspace.namespace, "spec": self.spec}  # fmt: skip
        return LOCATOR_PREFIX + json.dumps(spec, sort_keys=True)

    @classmethod
    def open(cls, locator: str) -> FilesLog:
        """The log a locator names (in a read task: its own connection)."""
        from tridentflow.redisconn import connect

        found = json.loads(locator[len(LOCATOR_PREFIX) :])
        keyspace = KeySpace(found["pipeline"], found["namespace"])
        return cls(connect(found["url"]), found["url"], keyspace, found["spec"], owns_client=True)

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    @property
    def fs(self) -> tuple[Any, str]:
        if self._fs is None:
            self._fs = filesystem(self.uri, self.storage_options)
        return self._fs

    # -- the interface ------------------------------------------------------------------------
    def exists(self) -> bool:
        return True  # the manifest starts empty; a missing directory is found by scan

    def partitions(self) -> int:
        return self._partitions

    def produce(
        self,
        pipeline: str,
        lines: list[str],
        asked_partitions: int | None,
        source_partitions: int,
        skip_unavailable: bool = False,
    ) -> Produced:
        """``tridentflow produce`` into the landing place: ``lines`` (checked JSON records) as
        one new file of the source's format - JSON lines as they are; Parquet or CSV with a
        column per field (each record an object, or one field's bare value), typed as Arrow
        infers them - written under a hidden name and renamed in whole (a listing never sees
        it half-written)."""
        import uuid

        if asked_partitions:
            raise SourceError("--partitions: a FileSource spreads files by their path")
        filesystem_, base = self.fs
        suffix = {"json": "jsonl", "parquet": "parquet", "csv": "csv"}[self.format]
        name = f"produced-{uuid.uuid4().hex}.{suffix}"
        hidden = f"{base}/.{name}"
        data = self._encoded(lines)
        filesystem_.create_dir(base, recursive=True)
        with filesystem_.open_output_stream(hidden) as out:
            out.write(data)
        filesystem_.move(hidden, f"{base}/{name}")
        return Produced(len(lines), f"{self.uri}/{name}", self._partitions, verb="wrote")

    def _encoded(self, lines: list[str]) -> bytes:
        """``lines`` as one file of the source's format (``produce``)."""
        if self.format == "json":
            return "".join(f"{line}\n" for line in lines).encode()
        import pyarrow as pa

        fields = list(self.spec.get("fields") or ())
        rows = []
        for line in lines:
            record = json.loads(line)
            if not isinstance(record, dict):
                if len(fields) != 1:
                    raise SourceError(
                        f"produce into a {self.format} FileSource takes JSON objects (a "
                        f"column per field), got {line[:60]}"
                    )
                record = {fields[0]: record}
            rows.append(record)
        table = pa.Table.from_pylist(rows)
        sink = pa.BufferOutputStream()
        if self.format == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(table, sink)
        else:
            import pyarrow.csv as pacsv

            pacsv.write_csv(table, sink)
        return sink.getvalue().to_pybytes()

    def check_delete(self) -> None:
        """``reset --source`` is refused: the files are their writers', never tridentflow's."""
        raise SourceError(
            f"reset --source: the files under {self.uri} are yours, and tridentflow never "
            "deletes them; reset without --source (every file there is taken again)"
        )

    def scan(self, committed: dict[int, int] | None = None) -> LogScan:
        """Take what the listing finds that the manifest lacks (oldest first, ties by path),
        then every partition's head: its base plus the manifest's length. SourceError (one
        line) for a file taken before and overwritten since, with ``on_overwrite="fail"``.
        With ``forget_after``, also trims the manifest (``trim``): memory stays bounded."""
        self.take(self.list_files())
        if self.forget_after_ms is not None:
            self.trim(self._committed())
        return LogScan(self.heads())

    def taken(self) -> LogScan:
        """Every partition's head in the manifest, with no listing (ListsOnScan)."""
        return LogScan(self.heads())

    def heads(self) -> dict[int, int]:
        """Per partition, the offset after the manifest's last entry (no listing)."""
        bases = self._bases()
        return {p: bases[p] + int(self.client.llen(self.keyspace.files_manifest(p))) for p in
                range(self._partitions)}  # fmt: skip

    def probe(self, partition: int, start: int, end: int) -> None:
        base = self._bases()[partition]
        if start < base:
            raise SourceError(
                f"files partition {partition}: offsets {start}..{base - 1} were trimmed from "
                "the manifest (forget_after, or tridentflow trim): what they took cannot be "
                "read again through it"
            )
        head = base + int(self.client.llen(self.keyspace.files_manifest(partition)))
        if head < end:
            raise SourceError(
                f"files partition {partition}: the manifest holds {head} files, the batch "
                f"needs {end}: the pipeline's Redis lost what it took (reset the pipeline)"
            )

    def read_raw(self, partition: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        """Every record of the files at offsets [start, end) of ``partition``, file by file,
        each checked against the identity it was taken with first; a file that cannot be
        parsed is one bad record naming it (``FileReader.records``)."""
        reader = self.reader()
        for offset, entry in self.frozen(partition, start, end):
            yield from reader.records(partition, offset, entry)

    def frozen(self, partition: int, start: int, end: int) -> list[tuple[int, dict[str, Any]]]:
        """(offset, manifest entry) of every file at offsets [start, end) of ``partition``;
        SourceError (``probe``) if the manifest no longer holds them all."""
        if start >= end:
            return []
        entries = self._entries(partition, start, end)
        if len(entries) < end - start:
            self.probe(partition, start, end)
        return list(enumerate(entries, start))

    def tables(self) -> bool:
        """Whether its files read as Arrow tables: Parquet and CSV (ReadsFilesInColumns)."""
        return self.format in ("parquet", "csv")

    def reader(self) -> FileReader:
        """What reads this source's frozen files (on the driver or an executor)."""
        return FileReader(self.uri, self.format, self.storage_options, self.opaque)

    def acknowledge(self, committed: dict[int, int]) -> None:
        return None

    def offset_unit(self) -> str:
        return "files"

    def waiting(self, committed: dict[int, int], limit: int = 10) -> list[str]:
        """The paths of the files taken but not committed yet, oldest first per partition, at
        most ``limit`` (``status``)."""
        found: list[str] = []
        for p in range(self._partitions):
            start = int(committed.get(p, 0))
            found += [entry["path"] for entry in self._entries(p, start, start + limit)]
        return found[:limit]

    def names(self, partition: int, start: int, end: int, limit: int = 10) -> list[str]:
        return [e["path"] for e in self._entries(partition, start, min(end, start + limit))]

    def records_in(self, ranges: dict[int, tuple[int, int]]) -> int | None:
        """The records of the files at ``ranges`` (Parquet: the footers' row counts; CSV and
        JSON: their lines), or None past COUNTED_BYTES of files, or when a file cannot be
        read now (the emit says why): offsets are files here, a batch of ten may be huge."""
        entries = [e for p, (start, end) in ranges.items() for e in self._entries(p, start, end)]
        if sum(int(e["size"]) for e in entries) > COUNTED_BYTES:
            return None
        try:
            return sum(self._records_of(e["path"]) for e in entries)
        except (OSError, ValueError):
            return None

    def _entries(self, partition: int, start: int, end: int) -> list[dict[str, Any]]:
        """The manifest's entries at offsets [start, end) of ``partition`` (fewer if it holds
        fewer, or if some were trimmed: none then): {path, size, mtime_ns} each."""
        base = self._bases()[partition]
        if end <= start or start < base:
            return []
        key = self.keyspace.files_manifest(partition)
        raw = self.client.lrange(key, start - base, end - 1 - base)
        return [json.loads(entry) for entry in raw]

    def _bases(self) -> dict[int, int]:
        """Per partition, the offset of the manifest's first entry (0 until a trim)."""
        fields = [f"base:{p}" for p in range(self._partitions)]
        raw = self.client.hmget(self.keyspace.files_meta, fields)
        return {p: int(value or 0) for p, value in enumerate(raw)}

    def _committed(self) -> dict[int, int]:
        raw = self.client.hgetall(self.keyspace.offsets)
        return {int(p): int(o) for p, o in raw.items()}

    def _records_of(self, path: str) -> int:
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return int(pq.read_metadata(path, filesystem=self.fs[0]).num_rows)
        with self.fs[0].open_input_stream(path) as stream:
            lines = sum(1 for line in stream.read().splitlines() if line.strip())
        return max(0, lines - 1) if self.format == "csv" else lines

    # -- listing and taking -------------------------------------------------------------------
    def list_files(self) -> list[FoundFile]:
        """Every file under the uri that the pattern matches, oldest first, ties by path (not
        empty ones, not those modified within ``min_age_s``: still being written)."""
        from pyarrow import fs

        filesystem_, base = self.fs
        try:
            infos = filesystem_.get_file_info(fs.FileSelector(base, recursive=True))
        except FileNotFoundError:
            raise SourceError(
                f"FileSource {self.uri}: no such directory or prefix: create it, or fix uri="
            ) from None
        except OSError as exc:
            raise SourceError(f"FileSource {self.uri}: cannot list it: {exc}") from None
        seconds, micros = self.client.time()  # the pipeline's Redis clock, as every cutoff
        newest = int(seconds) * 10**9 + int(micros) * 1000 - int(self.min_age_s * 1e9)
        found = []
        for info in infos:
            if info.type != fs.FileType.File or not info.size:
                continue
            relative = info.path[len(base) :].lstrip("/")
            name = relative.rsplit("/", 1)[-1]
            if name.startswith((".", "_")) or not fnmatch.fnmatch(relative, self.pattern):
                continue  # hidden and _SUCCESS-style markers are never data
            mtime = int(info.mtime_ns or 0)
            if self.min_age_s and mtime > newest:
                continue
            found.append(FoundFile(info.path, int(info.size), mtime))
        return sorted(found, key=lambda f: (f.mtime_ns, f.path))

    def take(self, found: list[FoundFile]) -> int:
        """Append to the manifest the files of ``found`` it does not hold (TAKE_FILES);
        how many. Idempotent: a file is taken once (again only by ``reingest``). Files
        below the watermark (``forget_after``) are neither compared nor taken; how many the
        listing found is kept for ``status`` (``below_watermark``)."""
        taken_key, meta = self.keyspace.files_taken, self.keyspace.files_meta
        watermark = int(self.client.hget(meta, "watermark_ms") or -1)
        if watermark >= 0:
            kept = [f for f in found if f.mtime_ms >= watermark]
            self.client.hset(meta, "below_watermark", len(found) - len(kept))
            found = kept
        new: list[FoundFile] = []
        for i in range(0, len(found), LIST_CHUNK):
            chunk = found[i : i + LIST_CHUNK]
            held = self.client.hmget(taken_key, [f.path for f in chunk])
            for file, taken in zip(chunk, held, strict=True):
                if taken is None or json.loads(taken)["version"] != file.version:
                    new.append(file)
        count = 0
        keys = [taken_key, meta, self.keyspace.files_forget]
        keys += [self.keyspace.files_manifest(p) for p in range(self._partitions)]
        forget = "" if self.forget_after_ms is None else str(self.forget_after_ms)
        chunks = [new[i : i + LIST_CHUNK] for i in range(0, len(new), LIST_CHUNK)]
        for chunk in chunks or ([[]] if forget else []):  # with nothing new: still forget
            args: list[Any] = [self.on_overwrite, forget]
            for file in chunk:
                entry = {"path": file.path, "size": file.size, "mtime_ns": file.mtime_ns}
                args += [file.path, file.version, self.partition_of(file.path), json.dumps(entry),
                         file.mtime_ms]  # fmt: skip
            result = TAKE_FILES(self.client, keys, args)
            if int(result[0]) == 0:
                self._refuse_overwrite(result[1:])
            count += int(result[1])
        return count

    def trim(self, committed: dict[int, int]) -> dict[int, tuple[int, str]]:
        """Drop the manifest's entries every committed txid is done with: up to the
        ``committed`` offsets, and no further than a rewind within the retained range still
        needs (state.undo). The files themselves are never touched. Returns (entries removed,
        what limited it: "committed" or "rewind retention") per partition. Idempotent."""
        from tridentflow_state.undo import offsets_after, retained

        kept = retained(self.client, self.keyspace)
        needed = None  # without retention: up to the committed offsets
        if kept is not None:  # a rewind to kept.oldest reads from its offsets (none kept: 0)
            needed = offsets_after(self.client, self.keyspace, kept.oldest) or {}
        removed: dict[int, tuple[int, str]] = {}
        for p in range(self._partitions):
            upto, holder = int(committed.get(p, 0)), "committed"
            if needed is not None and needed.get(p, 0) < upto:
                upto, holder = needed.get(p, 0), "rewind retention"
            key = [self.keyspace.files_meta, self.keyspace.files_manifest(p)]
            removed[p] = (int(TRIM_MANIFEST(self.client, key, [p, upto])), holder)
        return removed

    def trimmed(self, partition: int, removed: int, holder: str, committed: int) -> str:
        limit = (
            f"up to offset {committed}, committed" if holder == "committed" else f"kept by {holder}"
        )
        return f"partition {partition}'s manifest: {removed} entries removed ({limit})"

    def remembered(self) -> dict[str, int]:
        """What the source remembers, for status and the benchmark: files taken and still
        compared, manifest entries, forgotten files, the watermark (ms; -1 for none) and how
        many files the last listing left below it."""
        meta = self.client.hgetall(self.keyspace.files_meta)
        get = {k.decode() if isinstance(k, bytes) else k: int(v) for k, v in meta.items()}
        lists = sum(int(self.client.llen(self.keyspace.files_manifest(p)))
                    for p in range(self._partitions))  # fmt: skip
        return {
            "taken": int(self.client.hlen(self.keyspace.files_taken)),
            "manifest": lists,
            "forgotten": get.get("forgotten", 0),
            "watermark_ms": get.get("watermark_ms", -1),
            "below_watermark": get.get("below_watermark", 0),
        }

    def partition_of(self, path: str) -> int:
        """A file's partition: a stable hash of its path."""
        return zlib.crc32(path.encode()) % self._partitions

    def _refuse_overwrite(self, conflicts: list[Any]) -> None:
        path = conflicts[0].decode() if isinstance(conflicts[0], bytes) else str(conflicts[0])
        taken = json.loads(conflicts[1])
        more = f" (and {len(conflicts) // 2 - 1} more)" if len(conflicts) > 2 else ""
        raise FileOverwrittenError(
            f"file {path}{more} was taken at offset {taken['ordinal']} of partition "
            f"{taken['partition']} and has been overwritten since: put the original back, or "
            "set FileSource(on_overwrite='reingest') to take it again (its rows then count "
            "twice) or 'ignore' to leave it"
        )


class FileReader:
    """Reads frozen files (manifest entries: path, size, mtime_ns) of one FileSource, on the
    driver or a Spark executor. Every read checks the file against the identity it was
    taken with first: a file deleted, truncated or rewritten since is never read half."""

    def __init__(
        self, uri: str, format: str, storage_options: dict[str, str], opaque: bool
    ) -> None:
        self.uri = uri
        self.format = format
        self.storage_options = storage_options
        self.opaque = opaque
        self._fs: Any = None

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs = filesystem(self.uri, self.storage_options)[0]
        return self._fs

    def records(
        self, partition: int, offset: int, entry: dict[str, Any]
    ) -> Iterator[tuple[int, bytes]]:
        """The file's records as JSON lines, each with the file's offset (the record stage's
        input); a file that cannot be parsed is one line naming it, and so is a file an opaque
        source skips (both quarantined as bad records); a transactional source's changed file
        raises PartitionUnavailableError (it waits)."""
        try:
            self.check_unchanged(partition, entry)
        except PartitionUnavailableError as exc:
            if not self.opaque:
                raise  # a transactional replay must read what it froze: it waits
            yield offset, f"skipped by an opaque FileSource: {exc}".encode()
            return  # quarantined as a bad record: what was skipped is said
        try:
            rows = self._rows(entry["path"])
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            yield offset, unreadable(entry["path"], exc)
            return
        for row in rows:
            yield offset, row

    def check_unchanged(self, partition: int, entry: dict[str, Any]) -> None:
        """PartitionUnavailableError unless the file is there with the size and mtime it was
        taken with."""
        from pyarrow import fs

        info = self.fs.get_file_info(entry["path"])
        if info.type == fs.FileType.NotFound:
            raise PartitionUnavailableError(partition, f"missing its file {entry['path']}")
        if int(info.size or 0) != entry["size"] or int(info.mtime_ns or 0) != entry["mtime_ns"]:
            raise PartitionUnavailableError(
                partition,
                f"holding file {entry['path']} changed since it was taken ({entry['size']} "
                f"bytes then, {info.size} now): put the original back, or rewind past it",
            )

    def table(self, path: str, columns: list[str] | None = None) -> Any:
        """A Parquet or CSV file as the Arrow table its records come from (``columns``: only
        those, Parquet only). Raises OSError or ValueError for a file that cannot be read."""
        if self.format == "parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path, filesystem=self.fs, columns=columns)
        if self.format != "csv":
            raise ValueError(f"internal: no Arrow table for a {self.format} FileSource")
        import pyarrow.csv as pacsv

        with self.fs.open_input_stream(path) as stream:
            return pacsv.read_csv(stream)

    def file_records(self, path: str) -> list[bytes]:
        """The file's records as the record stage gets them, with no identity check: its JSON
        lines, or the one line that names it unreadable (quarantined)."""
        try:
            return self._rows(path)
        except (OSError, ValueError) as exc:
            return [unreadable(path, exc)]

    def _rows(self, path: str) -> list[bytes]:
        """The file's records as JSON (a JSON-lines file: its lines as they are)."""
        if self.format == "json":
            with self.fs.open_input_stream(path) as stream:
                data = stream.read()
            return [line for line in data.splitlines() if line.strip()]
        return [json.dumps(row, default=str).encode() for row in self.table(path).to_pylist()]


def unreadable(path: str, exc: BaseException) -> bytes:
    """The record that stands for a file that cannot be parsed (quarantined: not JSON)."""
    return f"unreadable file {path}: {one_line(exc)}".encode()
