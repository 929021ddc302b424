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
* The partition count can grow, never shrink. A partition's directory and HEAD are created
  only when the log is created or grown (``ensure``): a partition that ``partitions.json``
  lists but whose directory or HEAD is missing or unreadable (a dropped mount, a permission or
  I/O error) is *unavailable* (PartitionUnavailableError), never silently empty, and nothing
  recreates it. ``scan`` reports every partition's head or why it cannot be read.
"""

from __future__ import annotations

import bisect
import fcntl
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tridentflow.errors import NON_FINITE, PartitionUnavailableError, SourceError
from tridentflow.fileio import write_atomic
from tridentflow.sources.base import ChaosTraits, LogScan, Produced
from tridentflow_state.codec import check_unicode
from tridentflow_state.errors import KeyEncodingError

SEGMENT_RECORDS = 100_000
INDEX_EVERY = 512


EMPTY_HEAD = {"offset": 0, "segment": 0, "size": 0}


def encode_record(record: Any, what: str = "record") -> str:
    """One record as its log line: compact JSON, one line, valid Unicode; SourceError if not."""
    try:
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError as exc:
        if "Out of range float" in str(exc):
            raise SourceError(f"{what} holds {NON_FINITE}") from None
        raise SourceError(f"{what} is not JSON-serialisable: {exc}") from None
    except TypeError as exc:
        raise SourceError(f"{what} is not JSON-serialisable: {exc}") from None
    check_line(line, what)
    return line


def check_line(line: str, what: str = "record") -> None:
    if "\n" in line:
        raise SourceError(f"{what} must be a single line")
    try:
        check_unicode(line, what)
    except KeyEncodingError as exc:
        raise SourceError(str(exc)) from None


class FileLog:
    chaos = ChaosTraits(disturb="dark-partition", fresh="ledger-only")

    def __init__(self, root: str | os.PathLike[str], segment_records: int = SEGMENT_RECORDS):
        self.root = Path(root)
        self.segment_records = segment_records

    # -- what tridentflow produce and reset do with it ----------------------------------------
    def produce(
        self,
        pipeline: str,
        lines: list[str],
        asked_partitions: int | None,
        source_partitions: int,
        skip_unavailable: bool = False,
    ) -> Produced:
        """Append ``lines`` (checked JSON records) spread over the partitions, creating the
        log or growing it to ``asked_partitions`` / the source's; what it did."""
        current = self.partitions() if self.exists() else 0
        self.ensure(max(asked_partitions or 0, source_partitions, current))
        self.append_lines_spread(lines, skip_unavailable=skip_unavailable)
        scan = self.scan()
        skipped = sorted(scan.unavailable)
        notes = [f"{sum(scan.heads.values())} in the readable log"]
        if skipped:
            notes.append(f"skipped unavailable partitions {skipped}")
        return Produced(len(lines), pipeline, len(scan.partitions), notes=tuple(notes))

    def delete(self) -> None:
        """Delete the whole log (``reset --source``)."""
        shutil.rmtree(self.root, ignore_errors=True)

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
        """Create the log with ``partitions`` partitions, or grow it to that many. Only the new
        partitions' directories are created: an existing partition that has gone missing is
        left alone (it is unavailable until it comes back), never recreated empty."""
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
            for p in range(current, partitions):
                pdir = self._pdir(p)
                pdir.mkdir(exist_ok=True)
                if not (pdir / "HEAD").exists():
                    write_atomic(pdir / "HEAD", json.dumps(EMPTY_HEAD))
            if partitions != current:
                meta = json.dumps({"partitions": partitions})
                write_atomic(self.root / "partitions.json", meta)
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
        """The partition's HEAD; PartitionUnavailableError if its directory or HEAD is missing or
        cannot be read (both are created with the partition, so either missing means the
        storage under it went away)."""
        pdir = self._pdir(partition)
        try:
            head = json.loads((pdir / "HEAD").read_text())
            offset, segment, size = int(head["offset"]), int(head["segment"]), int(head["size"])
        except FileNotFoundError:
            what = "HEAD is missing" if pdir.is_dir() else f"directory {pdir.name} is missing"
            raise PartitionUnavailableError(
                partition, f"unavailable: {what} (storage not mounted?)"
            ) from None
        except OSError as exc:
            raise PartitionUnavailableError(
                partition, f"unavailable: cannot read {pdir.name}/HEAD: {exc.strerror or exc}"
            ) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise PartitionUnavailableError(
                partition, f"unavailable: {pdir.name}/HEAD is torn or unreadable ({exc})"
            ) from None
        if min(offset, segment, size) < 0 or segment > offset:
            raise PartitionUnavailableError(partition, f"unavailable: {pdir.name}/HEAD is corrupt")
        return {"offset": offset, "segment": segment, "size": size}

    def head(self, partition: int) -> int:
        self._check_partition(partition)
        return int(self._head(partition)["offset"])

    def heads(self) -> dict[int, int]:
        """Head offset of every partition (partitions.json is read once); PartitionUnavailableError
        if any cannot be read (see ``scan`` to go on without it)."""
        return {p: int(self._head(p)["offset"]) for p in range(self.partitions())}

    def scan(self, committed: dict[int, int] | None = None) -> LogScan:
        """Head of every readable partition, and why each other one cannot be read
        (``committed`` is for logs that check positions; a file's head says it all)."""
        heads: dict[int, int] = {}
        unavailable: dict[int, str] = {}
        for p in range(self.partitions()):
            try:
                heads[p] = int(self._head(p)["offset"])
            except PartitionUnavailableError as exc:
                unavailable[p] = exc.reason
        return LogScan(heads, unavailable)

    def _check_partition(self, partition: int) -> None:
        n = self.partitions()
        if not 0 <= partition < n:
            raise SourceError(f"partition {partition} does not exist (the log has {n})")

    # -- append -----------------------------------------------------------------------------
    def append(self, partition: int, records: Iterable[Any]) -> tuple[int, int]:
        """Append ``records`` to ``partition``; return the offset range [start, end) they got.
        Every record is checked before any is written."""
        encoded = [encode_record(r, f"record {i + 1}") for i, r in enumerate(records)]
        return self._append_checked(partition, encoded)

    def acknowledge(self, committed: dict[int, int]) -> None:
        """A commit moved the reader to ``committed``: nothing to tell a file."""

    def append_lines(self, partition: int, encoded: list[str]) -> tuple[int, int]:
        """Append pre-encoded lines as they are (tests use it to plant undecodable records).
        Refused before anything is written if a line is not one valid-Unicode line, or if the
        partition is unavailable (it is never recreated here)."""
        for i, line in enumerate(encoded):
            check_line(line, f"record {i + 1}")
        return self._append_checked(partition, encoded)

    def _append_checked(self, partition: int, encoded: list[str]) -> tuple[int, int]:
        """append_lines for lines already checked (encode_record / check_line)."""
        self._check_partition(partition)
        pdir = self._pdir(partition)
        self._head(partition)  # PartitionUnavailableError before the lock file could recreate pdir
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
            write_atomic(pdir / "HEAD", json.dumps(head))
        return start, offset

    @staticmethod
    def _write_segment(pdir: Path, base: int, size: int, rel: int, lines: list[str]) -> int:
        """Append ``lines`` to segment ``base`` (cut back to ``size`` bytes first, dropping a
        torn append) with an index entry at every INDEX_EVERY-th relative offset; fsync;
        return the new size. Lines are encoded a run of INDEX_EVERY at a time (one join and
        one encode per index entry, not per line)."""
        with (
            open(pdir / f"seg-{base:012d}.jsonl", "ab") as seg,
            open(pdir / f"seg-{base:012d}.idx", "a" if size else "w") as idx,
        ):
            seg.truncate(size)
            done = 0
            while done < len(lines):
                if rel % INDEX_EVERY == 0:
                    idx.write(f"{rel} {size}\n")
                run = INDEX_EVERY - rel % INDEX_EVERY  # up to the next indexed offset
                data = ("\n".join(lines[done : done + run]) + "\n").encode("utf-8")
                seg.write(data)
                size += len(data)
                taken = min(run, len(lines) - done)
                done += taken
                rel += taken
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
            write_atomic(path, "".join(f"{ln}\n" for ln in keep))

    def append_spread(
        self, records: Iterable[Any], skip_unavailable: bool = False
    ) -> dict[int, tuple[int, int]]:
        """Append records round-robin over all partitions, continuing where the log stands.

        All records are encoded and every target partition checked before anything is
        written: a bad record or an unavailable partition appends nothing (SourceError /
        PartitionUnavailableError). With ``skip_unavailable`` the records go round-robin over the
        readable partitions only."""
        encoded = [encode_record(r, f"record {i + 1}") for i, r in enumerate(records)]
        return self.append_lines_spread(encoded, skip_unavailable)

    def append_lines_spread(
        self, encoded: list[str], skip_unavailable: bool = False
    ) -> dict[int, tuple[int, int]]:
        """append_spread for lines made by encode_record (checked there, not again here)."""
        scan = self.scan()
        if scan.unavailable and not skip_unavailable:
            partition, reason = min(scan.unavailable.items())
            raise PartitionUnavailableError(
                partition,
                reason + "; nothing appended (produce --skip-unavailable "
                "spreads over the readable partitions)",
            )
        targets = sorted(scan.heads)
        if not targets:
            raise SourceError(f"no partition of {self.root} is readable; nothing appended")
        total, n = sum(scan.heads.values()), len(targets)
        # round robin continuing where the log stands: line i goes to targets[(total + i) % n]
        buckets = {p: encoded[(j - total) % n :: n] for j, p in enumerate(targets)}
        return {p: self._append_checked(p, lines) for p, lines in buckets.items() if lines}

    # -- read -------------------------------------------------------------------------------
    def probe(self, partition: int, start: int, end: int) -> None:
        """Check that [start, end) can be read now: every segment file it needs (and its index)
        opens and yields bytes. PartitionUnavailableError if not. Cheap: a few opens, no scan."""
        if end <= start:
            return
        pdir = self._pdir(partition)
        try:
            segments = self._segments(partition)
            first = bisect.bisect_right(segments, start) - 1
            if first < 0:
                raise PartitionUnavailableError(
                    partition, f"unavailable: no segment holds offset {start} (files missing?)"
                )
            for base in segments[first:]:
                if base >= end:
                    break
                with open(pdir / f"seg-{base:012d}.jsonl", "rb") as fh:
                    fh.read(1)
                index = pdir / f"seg-{base:012d}.idx"
                if index.exists():
                    with open(index, "rb") as fh:
                        fh.read(1)
        except OSError as exc:
            raise PartitionUnavailableError(
                partition, f"unavailable: {exc.strerror or exc} reading [{start}, {end})"
            ) from None

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
        """Yield (offset, line without its newline) for offsets in [start, end).

        A partition whose files cannot be read (missing, permission denied, I/O error) raises
        PartitionUnavailableError, a torn segment SourceError."""
        try:
            yield from self._read_raw(partition, start, end)
        except OSError as exc:
            raise PartitionUnavailableError(
                partition, f"unavailable: {exc.strerror or exc} reading [{start}, {end})"
            ) from None

    def _read_raw(self, partition: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
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
