"""A partitioned, append-only log of JSON records on the local file system.

Layout under ``root``::

    partitions.json                 {"partitions": P}
    p-0003/seg-000000000000.jsonl   one JSON record per line; file named by its first offset
    p-0003/seg-000000000000.idx     sparse index: "relative_offset byte_position" every INDEX_EVERY
    p-0003/HEAD                     {"offset": next offset, "segment": base, "size": bytes}
    p-0003/.lock                    flock taken by appenders

Contracts:
* Appends to one partition are serialised by an flock and become visible atomically: readers
  see records only below HEAD, which is replaced (write, fsync, rename) after the data is fsynced.
  A crash mid-append leaves bytes past HEAD; the next append truncates them.
* ``read(p, start, end)`` costs one index lookup and at most INDEX_EVERY skipped lines, whatever
  the log's length (no rescans as the log grows).
* The partition count can grow, never shrink.
"""

from __future__ import annotations

import bisect
import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tridentflow.errors import SourceError

SEGMENT_RECORDS = 100_000
INDEX_EVERY = 512


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class FileLog:
    def __init__(self, root: str | os.PathLike[str], segment_records: int = SEGMENT_RECORDS):
        self.root = Path(root)
        self.segment_records = segment_records

    # -- layout -----------------------------------------------------------------------------
    def exists(self) -> bool:
        return (self.root / "partitions.json").exists()

    def partitions(self) -> int:
        try:
            return int(json.loads((self.root / "partitions.json").read_text())["partitions"])
        except FileNotFoundError:
            raise SourceError(f"no source log at {self.root} (produce records first)") from None
        except (ValueError, KeyError) as exc:
            raise SourceError(f"{self.root}/partitions.json is malformed: {exc}") from exc

    def ensure(self, partitions: int) -> int:
        """Create the log with ``partitions`` partitions, or grow it to that many."""
        if partitions < 1:
            raise SourceError(f"a log needs at least one partition, got {partitions}")
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock(self.root / ".lock"):
            current = self.partitions() if self.exists() else 0
            if partitions < current:
                raise SourceError(
                    f"the log at {self.root} has {current} partitions; it cannot shrink to "
                    f"{partitions}"
                )
            for p in range(partitions):
                self._pdir(p).mkdir(exist_ok=True)
            if partitions != current:
                meta = json.dumps({"partitions": partitions})
                _write_atomic(self.root / "partitions.json", meta)
        return partitions

    def _pdir(self, partition: int) -> Path:
        return self.root / f"p-{partition:04d}"

    @contextmanager
    def _lock(self, path: Path) -> Iterator[None]:
        with open(path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _head(self, partition: int) -> dict[str, int]:
        try:
            return json.loads((self._pdir(partition) / "HEAD").read_text())
        except FileNotFoundError:
            return {"offset": 0, "segment": 0, "size": 0}

    def head(self, partition: int) -> int:
        self._check_partition(partition)
        return int(self._head(partition)["offset"])

    def heads(self) -> dict[int, int]:
        """Head offset of every partition (partitions.json is read once)."""
        return {p: int(self._head(p)["offset"]) for p in range(self.partitions())}

    def _check_partition(self, partition: int) -> None:
        n = self.partitions()
        if not 0 <= partition < n:
            raise SourceError(f"partition {partition} does not exist (the log has {n})")

    # -- append -----------------------------------------------------------------------------
    def append(self, partition: int, records: Iterable[Any]) -> tuple[int, int]:
        """Append ``records`` to ``partition``; return the offset range [start, end) they got."""
        encoded = [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in records]
        return self.append_lines(partition, encoded)

    def append_lines(self, partition: int, encoded: list[str]) -> tuple[int, int]:
        """Append pre-encoded lines as they are (tests use it to plant undecodable records)."""
        self._check_partition(partition)
        pdir = self._pdir(partition)
        for line in encoded:
            if "\n" in line:
                raise SourceError("a record must be a single line")
        with self._lock(pdir / ".lock"):
            head = self._head(partition)
            start = offset = int(head["offset"])
            base, size = int(head["segment"]), int(head["size"])
            self._drop_torn_index(pdir, base, offset - base)
            done = 0
            while done < len(encoded):
                if offset - base >= self.segment_records:
                    base, size = offset, 0
                chunk = encoded[done : done + self.segment_records - (offset - base)]
                size = self._write_segment(pdir, base, size, offset - base, chunk)
                offset += len(chunk)
                done += len(chunk)
            head = {"offset": offset, "segment": base, "size": size}
            _write_atomic(pdir / "HEAD", json.dumps(head))
        return start, offset

    @staticmethod
    def _write_segment(pdir: Path, base: int, size: int, rel: int, lines: list[str]) -> int:
        """Append ``lines`` to segment ``base`` (cut back to ``size`` bytes first, dropping a
        torn append); fsync; return the new size."""
        with (
            open(pdir / f"seg-{base:012d}.jsonl", "ab") as seg,
            open(pdir / f"seg-{base:012d}.idx", "a" if size else "w") as idx,
        ):
            seg.truncate(size)
            for line in lines:
                if rel % INDEX_EVERY == 0:
                    idx.write(f"{rel} {size}\n")
                data = line.encode("utf-8") + b"\n"
                seg.write(data)
                size += len(data)
                rel += 1
            seg.flush()
            os.fsync(seg.fileno())
        return size

    @staticmethod
    def _drop_torn_index(pdir: Path, base: int, head_rel: int) -> None:
        """Remove index entries a torn append left at or past the head."""
        path = pdir / f"seg-{base:012d}.idx"
        try:
            lines = path.read_text().splitlines()
        except FileNotFoundError:
            return
        keep = [ln for ln in lines if len(ln.split()) == 2 and int(ln.split()[0]) < head_rel]
        if len(keep) != len(lines):
            _write_atomic(path, "".join(f"{ln}\n" for ln in keep))

    def append_spread(self, records: Iterable[Any]) -> dict[int, tuple[int, int]]:
        """Append records round-robin over all partitions, continuing where the log stands."""
        n = self.partitions()
        total = sum(self.heads().values())
        buckets: dict[int, list[Any]] = {p: [] for p in range(n)}
        for i, record in enumerate(records):
            buckets[(total + i) % n].append(record)
        return {p: self.append(p, recs) for p, recs in buckets.items() if recs}

    # -- read -------------------------------------------------------------------------------
    def _segments(self, partition: int) -> list[int]:
        return sorted(
            int(f.name[4:16])
            for f in self._pdir(partition).glob("seg-*.jsonl")
            if len(f.name) == 22
        )

    def read(self, partition: int, start: int, end: int) -> Iterator[tuple[int, Any]]:
        """Yield (offset, record) for offsets in [start, end). ``end`` must not pass HEAD.

        A line that is not JSON raises SourceError; use read_raw to handle it per record."""
        for offset, raw in self.read_raw(partition, start, end):
            try:
                yield offset, json.loads(raw)
            except ValueError as exc:
                where = f"partition {partition} offset {offset}"
                raise SourceError(f"{where}: not JSON ({exc})") from exc

    def read_raw(self, partition: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        """Yield (offset, line without its newline) for offsets in [start, end)."""
        if start < 0 or end < start:
            raise SourceError(f"partition {partition}: bad range [{start}, {end})")
        if start == end:
            return
        head = self.head(partition)
        if end > head:
            raise SourceError(f"partition {partition}: range end {end} is past the head {head}")
        segments = self._segments(partition)
        i = bisect.bisect_right(segments, start) - 1
        if i < 0:
            raise SourceError(f"partition {partition}: no segment holds offset {start}")
        offset = start
        pdir = self._pdir(partition)
        while offset < end and i < len(segments):
            base = segments[i]
            limit = segments[i + 1] if i + 1 < len(segments) else head
            pos, at = self._seek(pdir, base, offset - base)
            with open(pdir / f"seg-{base:012d}.jsonl", "rb") as fh:
                fh.seek(pos)
                current = base + at
                for raw in fh:
                    if current >= min(end, limit):
                        break
                    if current >= offset:
                        yield current, raw.rstrip(b"\n")
                    current += 1
            if current < min(end, limit):
                raise SourceError(
                    f"partition {partition}: segment {base} ends at offset {current}, "
                    f"before {min(end, limit)} (truncated log?)"
                )
            offset = current
            i += 1

    @staticmethod
    def _seek(pdir: Path, base: int, rel: int) -> tuple[int, int]:
        """Byte position and relative offset of the index entry at or before ``rel``."""
        best_rel, best_pos = 0, 0
        try:
            with open(pdir / f"seg-{base:012d}.idx") as fh:
                for line in fh:
                    parts = line.split()
                    if len(parts) != 2:
                        continue
                    r, p = int(parts[0]), int(parts[1])
                    if r > rel:
                        break
                    best_rel, best_pos = r, p
        except FileNotFoundError:
            pass
        return best_pos, best_rel
