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

from tridentflow.errors import FileOverwrittenError, PartitionUnavailable, SourceError
from tridentflow.sources.base import ChaosTraits, LogScan, Produced
from tridentflow_state.keys import KeySpace
from tridentflow_state.scripts import LuaScript

LOCATOR_PREFIX = "files:"
FORMATS = ("parquet", "csv", "json")
ON_OVERWRITE = ("fail", "ignore", "reingest")
LIST_CHUNK = 1000
"""Paths compared with the manifest per Redis call."""
COUNTED_BYTES = 16 << 20
"""A batch of files up to this size has its records counted before the emit (Parquet
footers, lines): whether it is small enough for the local engine. Past it, it is big."""

# Take the files a listing found that the manifest does not hold, atomically: two
# coordinators listing at once cannot take a file twice.
# KEYS[1] the taken hash (files_taken); KEYS[2..] the manifest lists, one per partition.
# ARGV[1] on_overwrite ('fail' | 'ignore' | 'reingest'); then, per file, four values: path,
# version (its identity, JSON), partition (0-based), the manifest entry (JSON).
# Returns {0, conflicts...} where conflicts are path, taken-JSON pairs of files taken with
# another version (with 'fail', nothing is taken then), or {1, taken count}.
TAKE_FILES = LuaScript(
    "take_files",
    """
local mode = ARGV[1]
local conflicts = {}
for i = 2, #ARGV, 4 do
  local taken = redis.call('HGET', KEYS[1], ARGV[i])
  if taken and cjson.decode(taken)['version'] ~= ARGV[i + 1] then
    table.insert(conflicts, ARGV[i])
    table.insert(conflicts, taken)
  end
end
if mode == 'fail' and #conflicts > 0 then
  local out = {0}
  for _, v in ipairs(conflicts) do table.insert(out, v) end
  return out
end
local count = 0
for i = 2, #ARGV, 4 do
  local path, version, partition = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  local taken = redis.call('HGET', KEYS[1], path)
  local again = taken and cjson.decode(taken)['version'] ~= version and mode == 'reingest'
  if not taken or again then
    local list = KEYS[2 + partition]
    local ordinal = redis.call('RPUSH', list, ARGV[i + 3]) - 1
    redis.call('HSET', KEYS[1], path, cjson.encode(
      {version = version, partition = partition, ordinal = ordinal}))
    count = count + 1
  end
end
return {1, count}
""",
)


@dataclass(frozen=True)
class FoundFile:
    """A file a listing found: its path in the filesystem, size and modification time."""

    path: str
    size: int
    mtime_ns: int

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
    offset_unit = "files"
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
        one new JSON-lines file, written under a hidden name and renamed in whole (a listing
        never sees it half-written). A FileSource of another format is refused."""
        import uuid

        if self.format != "json":
            raise SourceError(
                f"produce writes JSON lines, and this FileSource reads {self.format} files: "
                "write them with your own tools"
            )
        if asked_partitions:
            raise SourceError("--partitions: a FileSource spreads files by their path")
        filesystem_, base = self.fs
        name = f"produced-{uuid.uuid4().hex}.jsonl"
        hidden = f"{base}/.{name}"
        filesystem_.create_dir(base, recursive=True)
        with filesystem_.open_output_stream(hidden) as out:
            out.write("".join(f"{line}\n" for line in lines).encode())
        filesystem_.move(hidden, f"{base}/{name}")
        return Produced(len(lines), f"{self.uri}/{name}", self._partitions, verb="wrote")

    def check_delete(self) -> None:
        """``reset --source`` is refused: the files are their writers', never tridentflow's."""
        raise SourceError(
            f"reset --source: the files under {self.uri} are yours, and tridentflow never "
            "deletes them; reset without --source (every file there is taken again)"
        )

    def scan(self, committed: dict[int, int] | None = None) -> LogScan:
        """Take what the listing finds that the manifest lacks (oldest first, ties by path),
        then every partition's head: the manifest's length. SourceError (one line) for a file
        taken before and overwritten since, with ``on_overwrite="fail"``."""
        self.take(self.list_files())
        heads = {p: int(self.client.llen(self.keyspace.files_manifest(p))) for p in
                 range(self._partitions)}  # fmt: skip
        return LogScan(heads)

    def probe(self, partition: int, start: int, end: int) -> None:
        head = int(self.client.llen(self.keyspace.files_manifest(partition)))
        if head < end:
            raise SourceError(
                f"files partition {partition}: the manifest holds {head} files, the batch "
                f"needs {end}: the pipeline's Redis lost what it took (reset the pipeline)"
            )

    def read_raw(self, partition: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        """Every record of the files at offsets [start, end) of ``partition``, file by file,
        each checked against the identity it was taken with first; a file that cannot be
        parsed is one bad record naming it."""
        if start >= end:
            return
        entries = self._entries(partition, start, end)
        if len(entries) < end - start:
            self.probe(partition, start, end)
        for offset, entry in enumerate(entries, start):
            try:
                self._check_unchanged(partition, entry)
            except PartitionUnavailable as exc:
                if not self.opaque:
                    raise  # a transactional replay must read what it froze: it waits
                yield offset, f"skipped by an opaque FileSource: {exc}".encode()
                continue  # quarantined as a bad record: what was skipped is said
            try:
                rows = self._rows(entry["path"])
            except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
                cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                yield offset, f"unreadable file {entry['path']}: {cause}".encode()
                continue
            for row in rows:
                yield offset, row

    def acknowledge(self, committed: dict[int, int]) -> None:
        return None

    def waiting(self, committed: dict[int, int], limit: int = 10) -> list[str]:
        """The paths of the files taken but not committed yet, oldest first per partition, at
        most ``limit`` (``status``)."""
        found: list[str] = []
        for p in range(self._partitions):
            start = int(committed.get(p, 0))
            found += [entry["path"] for entry in self._entries(p, start, start + limit)]
        return found[:limit]

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
        fewer): {path, size, mtime_ns} each."""
        if end <= start:
            return []
        raw = self.client.lrange(self.keyspace.files_manifest(partition), start, end - 1)
        return [json.loads(entry) for entry in raw]

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
        how many. Idempotent: a file is taken once (again only by ``reingest``)."""
        taken_key = self.keyspace.files_taken
        new: list[FoundFile] = []
        for i in range(0, len(found), LIST_CHUNK):
            chunk = found[i : i + LIST_CHUNK]
            held = self.client.hmget(taken_key, [f.path for f in chunk])
            for file, taken in zip(chunk, held, strict=True):
                if taken is None or json.loads(taken)["version"] != file.version:
                    new.append(file)
        count = 0
        lists = [self.keyspace.files_manifest(p) for p in range(self._partitions)]
        for i in range(0, len(new), LIST_CHUNK):
            args: list[Any] = [self.on_overwrite]
            for file in new[i : i + LIST_CHUNK]:
                entry = {"path": file.path, "size": file.size, "mtime_ns": file.mtime_ns}
                args += [file.path, file.version, self.partition_of(file.path), json.dumps(entry)]
            result = TAKE_FILES(self.client, [taken_key, *lists], args)
            if int(result[0]) == 0:
                self._refuse_overwrite(result[1:])
            count += int(result[1])
        return count

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

    # -- reading ------------------------------------------------------------------------------
    def _check_unchanged(self, partition: int, entry: dict[str, Any]) -> None:
        from pyarrow import fs

        info = self.fs[0].get_file_info(entry["path"])
        if info.type == fs.FileType.NotFound:
            raise PartitionUnavailable(partition, f"missing its file {entry['path']}")
        if int(info.size or 0) != entry["size"] or int(info.mtime_ns or 0) != entry["mtime_ns"]:
            raise PartitionUnavailable(
                partition,
                f"holding file {entry['path']} changed since it was taken ({entry['size']} "
                f"bytes then, {info.size} now): put the original back, or rewind past it",
            )

    def _rows(self, path: str) -> list[bytes]:
        """The file's records as JSON (a JSON-lines file: its lines as they are)."""
        filesystem_ = self.fs[0]
        if self.format == "json":
            with filesystem_.open_input_stream(path) as stream:
                data = stream.read()
            return [line for line in data.splitlines() if line.strip()]
        if self.format == "parquet":
            import pyarrow.parquet as pq

            table = pq.read_table(path, filesystem=filesystem_)
        else:
            import pyarrow.csv as pacsv

            with filesystem_.open_input_stream(path) as stream:
                table = pacsv.read_csv(stream)
        return [json.dumps(row, default=str).encode() for row in table.to_pylist()]
