"""A source of your own, end to end: a SQLite table as a partitioned log (README: Writing your
own source). ``wordcount-sqlite`` counts the words of table ``records`` in
``HOME/sqlite-source.db`` (or ``TRIDENTFLOW_SQLITE_SOURCE``).

The table: ``records(part INTEGER, seq INTEGER, value TEXT, PRIMARY KEY (part, seq))`` - each
partition's rows numbered 0, 1, 2, ... (``seq`` is the offset), ``value`` a JSON record. Rows
are only appended (a producer takes ``MAX(seq) + 1`` in the same transaction), so a range
reads the same rows on every call. It passes tests/test_source_contract.py like the bundled
sources.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tridentflow.aggregators import Count
from tridentflow.errors import SourceError
from tridentflow.examples.wordcount import split
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import Pipeline
from tridentflow.sources import custom_locator
from tridentflow.sources.base import LogScan
from tridentflow.sources.filelog import encode_record
from tridentflow.sources.specs import CustomSource, SourceMode
from tridentflow_state.maps import StateKind

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS records ("
    "part INTEGER NOT NULL, seq INTEGER NOT NULL, value TEXT NOT NULL, PRIMARY KEY (part, seq))"
)


class SqliteLog:
    """The source interface over one SQLite file (dense offsets: ``seq``)."""

    def __init__(self, path: str, partitions: int) -> None:
        self.path = str(path)
        self.n = int(partitions)

    @property
    def root(self) -> str:
        return custom_locator("tridentflow.examples.sqlite_source:open_log", [self.path, self.n])

    def _db(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30)
        db.execute(SCHEMA)
        return db

    def exists(self) -> bool:
        return Path(self.path).exists()

    def partitions(self) -> int:
        return self.n

    def scan(self, committed: dict[int, int] | None = None) -> LogScan:
        with self._db() as db:
            found = dict(db.execute("SELECT part, MAX(seq) + 1 FROM records GROUP BY part"))
        heads = {p: int(found.get(p, 0)) for p in range(self.n)}
        behind = {
            p: f"head {heads[p]} is behind the committed offset {o} (rows deleted?)"
            for p, o in (committed or {}).items()
            if p in heads and heads[p] < o
        }
        return LogScan({p: h for p, h in heads.items() if p not in behind}, behind)

    def probe(self, partition: int, start: int, end: int) -> None:
        with self._db() as db:
            (count,) = db.execute(
                "SELECT COUNT(*) FROM records WHERE part = ? AND seq >= ? AND seq < ?",
                (partition, start, end),
            ).fetchone()
        if end > start and count < end - start:
            raise SourceError(
                f"{self.path}: partition {partition} holds {count} of the rows [{start}, {end})"
            )

    def read_raw(self, partition: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        with self._db() as db:
            rows = db.execute(
                "SELECT seq, value FROM records WHERE part = ? AND seq >= ? AND seq < ? "
                "ORDER BY seq",
                (partition, start, end),
            ).fetchall()
        if len(rows) != end - start:
            raise SourceError(f"{self.path}: partition {partition} lost rows in [{start}, {end})")
        for seq, value in rows:
            yield seq, value.encode("utf-8")

    def acknowledge(self, committed: dict[int, int]) -> None:
        """Nothing to do: the table keeps every row."""

    def append_spread(self, records: Iterable[Any]) -> dict[int, tuple[int, int]]:
        """Append records round robin over the partitions, in one transaction."""
        lines = [encode_record(r, f"record {i + 1}") for i, r in enumerate(records)]
        with self._db() as db:
            heads = dict(db.execute("SELECT part, MAX(seq) + 1 FROM records GROUP BY part"))
            added: dict[int, tuple[int, int]] = {}
            for i, line in enumerate(lines):
                p = i % self.n
                seq = int(heads.get(p, 0))
                heads[p] = seq + 1
                db.execute("INSERT INTO records VALUES (?, ?, ?)", (p, seq, line))
                added[p] = (added.get(p, (seq, seq))[0], seq + 1)
        return added


def open_log(spec: list[Any]) -> SqliteLog:
    """What read tasks call with the locator's spec."""
    path, partitions = spec
    return SqliteLog(path, partitions)


def build_log(source: CustomSource, pipeline: str) -> SqliteLog:
    """What ``CustomSource(log=...)`` names: the log for ``pipeline``."""
    options = dict(source.options)
    home = os.environ.get("TRIDENTFLOW_HOME", str(Path.home() / ".tridentflow"))
    path = options.get("path") or os.environ.get(
        "TRIDENTFLOW_SQLITE_SOURCE", str(Path(home) / "sqlite-source.db")
    )
    return SqliteLog(path, source.partitions)


def wordcount_sqlite() -> Pipeline:
    source = CustomSource(
        fields=("sentence",),
        mode=SourceMode.TRANSACTIONAL,
        partitions=4,
        batch_size=1000,
        log="tridentflow.examples.sqlite_source:build_log",
    )
    pipeline = Pipeline("wordcount-sqlite", source, description="word count of a SQLite table")
    (
        pipeline.stream.each("sentence", split, "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    return pipeline
