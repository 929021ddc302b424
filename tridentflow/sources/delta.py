"""A Delta Lake table as a source (``DeltaSource``): the table's versions are the offsets of its
one partition, so a txid's batch is a range of versions - immutable once committed to the
table, hence exactly what a transactional source needs. No JVM: delta-rs and pyarrow.

What a version gives:

* with the table's **change data feed** on at that version (``delta.enableChangeDataFeed``),
  its change rows as delta-rs's ``load_cdf`` reads them: every column, plus ``_change_type``
  (``insert``, ``update_preimage``, ``update_postimage``, ``delete``), ``_commit_version`` and
  ``_commit_timestamp`` - updates and deletes included;
* without it, the rows of the data files the version **added** (its commit in ``_delta_log``:
  ``add`` actions with ``dataChange``), with ``_change_type`` ``insert``. A version that
  removed rows (a DELETE, an UPDATE, a MERGE, an overwrite: ``remove`` actions with
  ``dataChange``) cannot be read exactly without the change feed: the read fails in one line
  naming it and the way out - never skipped. A version that changed no data (OPTIMIZE,
  a schema or property change, VACUUM) gives nothing.

A version whose commit left the log (``delta.logRetentionDuration``) or whose files a VACUUM
removed fails in one line too: ``starting_version`` past it skips it on purpose (versions
before it read as empty; a txid that failed on it then commits without it). Rows within a
version come in one fixed order (sorted), so a replay reads what the first read read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any
from urllib.parse import unquote

from tridentflow.errors import SourceError, one_line
from tridentflow.sources.base import ChaosTraits, LogScan, Produced
from tridentflow.sources.files import filesystem

LOCATOR_PREFIX = "delta:"
CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")
"""The columns a version's rows carry beside the table's (as Delta's change feed names them)."""


def _record(row: dict[str, Any]) -> bytes:
    return json.dumps(row, default=str, sort_keys=True).encode()


class DeltaLog:
    """SourceLog over the versions of the Delta table at ``uri``: one partition; offset V is
    table version V (versions before ``starting_version`` read as empty)."""

    dense = False
    chaos = ChaosTraits(disturb="none", fresh="ledger-only", producers_own=True)

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.uri = str(spec["uri"])
        self.storage_options = {
            str(k): str(v) for k, v in (spec.get("storage_options") or {}).items()
        }
        self.starting_version = int(spec.get("starting_version") or 0)
        self._fs: tuple[Any, str] | None = None

    # -- identity -----------------------------------------------------------------------------
    @property
    def root(self) -> str:
        return LOCATOR_PREFIX + json.dumps(self.spec, sort_keys=True)

    @classmethod
    def open(cls, locator: str) -> DeltaLog:
        return cls(json.loads(locator[len(LOCATOR_PREFIX) :]))

    def describe(self) -> str:
        return f"Delta table {self.uri}"

    @property
    def fs(self) -> tuple[Any, str]:
        """The table's filesystem and its path in it (made once: an S3 client per call costs)."""
        if self._fs is None:
            self._fs = filesystem(self.uri, self.storage_options)
        return self._fs

    # -- the interface ------------------------------------------------------------------------
    def exists(self) -> bool:
        """Whether the table exists (a pipeline may be deployed before its upstream writes):
        its log's first commit or checkpoint pointer is there. (Through pyarrow's filesystem:
        delta-rs's ``is_deltatable`` holds the GIL while it waits on the store.)"""
        from pyarrow import fs

        filesystem_, base = self.fs
        paths = [f"{base}/_delta_log/{0:020}.json", f"{base}/_delta_log/_last_checkpoint"]
        return any(info.type == fs.FileType.File for info in filesystem_.get_file_info(paths))

    def require(self) -> None:
        """SourceError (one line) unless the table exists: its writers make it."""
        self._table()

    def partitions(self) -> int:
        return 1

    def scan(self, committed: dict[int, int] | None = None) -> LogScan:
        """The head: the table's newest version + 1. SourceError (one line) if there is no
        table at the uri."""
        head = self._table().version() + 1
        if committed and head < int(committed.get(0, 0)):
            behind = (
                f"the table is at version {head - 1}, behind the committed version "
                f"{int(committed[0]) - 1}: it was replaced or restored; reset the pipeline"
            )
            return LogScan({}, {0: behind})
        return LogScan({0: head})

    def probe(self, partition: int, start: int, end: int) -> None:
        head = self._table().version() + 1
        if head < end:
            raise SourceError(
                f"{self.describe()} is at version {head - 1}, the batch needs version {end - 1}: "
                "the table was replaced or restored to an older version; reset the pipeline"
            )
        for version in range(max(start, self.starting_version), end):
            self._commit(version)  # each version's commit still in the log

    def read_raw(self, partition: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        """Every row of versions [start, end) (see the module doc), version by version, each
        version's rows in one fixed order."""
        first = max(start, self.starting_version)
        if first >= end:
            return
        table = self._table()
        schema = _pa_schema(table)
        feed: bool | None = None  # the change feed on, as of the version read
        for version in range(first, end):
            actions = self._commit(version)
            changed = next((a["metaData"] for a in actions if "metaData" in a), None)
            if changed is not None:  # the version set the table's properties: from it on
                feed = _feed_on(changed.get("configuration") or {})
            elif feed is None:  # the properties as of the first version: one load per read
                feed = _feed_on(self._table(version).metadata().configuration)
            for row in self._version_rows(table, schema, version, actions, feed):
                yield version, row

    def acknowledge(self, committed: dict[int, int]) -> None:
        return None

    def offset_unit(self) -> str:
        return "versions"

    def waiting(self, committed: dict[int, int], limit: int = 10) -> list[str]:
        """The versions not committed yet, oldest first, as ``version N (OPERATION)``."""
        table = self._table()
        start = max(int(committed.get(0, 0)), self.starting_version)
        newest = table.version()
        if start > newest:
            return []
        history = {int(h["version"]): h for h in table.history(limit=newest - start + 1)}
        return [
            f"version {v} ({history.get(v, {}).get('operation', '?')})"
            for v in range(start, min(newest + 1, start + limit))
        ]

    def names(self, partition: int, start: int, end: int, limit: int = 10) -> list[str]:
        first = max(start, self.starting_version)
        return [f"version {v}" for v in range(first, min(end, first + limit))]

    def records_in(self, ranges: dict[int, tuple[int, int]]) -> int | None:
        """The rows the versions in ``ranges`` added (their add actions' ``numRecords``), or
        None when a version's stats say nothing or it changes rows (the change feed)."""
        total = 0
        for start, end in ranges.values():
            for version in range(max(start, self.starting_version), end):
                try:
                    actions = self._commit(version)
                except SourceError:
                    return None
                for action in actions:
                    if "cdc" in action or (
                        "remove" in action and action["remove"].get("dataChange", True)
                    ):
                        return None
                    add = action.get("add")
                    if add and add.get("dataChange", True):
                        stats = json.loads(add.get("stats") or "{}")
                        if "numRecords" not in stats:
                            return None
                        total += int(stats["numRecords"])
        return total

    def produce(
        self,
        pipeline: str,
        lines: list[str],
        asked_partitions: int | None,
        source_partitions: int,
        skip_unavailable: bool = False,
    ) -> Produced:
        """``tridentflow produce``: the records (JSON objects) appended to the table as one new
        version (a table that does not exist yet is created with their schema)."""
        import pyarrow as pa
        from deltalake import write_deltalake

        if asked_partitions:
            raise SourceError("--partitions: a DeltaSource has one partition, its versions")
        fields = list(self.spec.get("fields") or [])
        rows = [json.loads(line) for line in lines]
        if len(fields) == 1:  # a scalar is the single field of a one-field source
            rows = [r if isinstance(r, dict) else {fields[0]: r} for r in rows]
        if not all(isinstance(r, dict) for r in rows):
            raise SourceError("produce into a Delta table takes JSON objects, one per line")
        write_deltalake(self.uri, pa.Table.from_pylist(rows), mode="append",
                        storage_options=self.storage_options or None)  # fmt: skip
        version = self._table().version()
        return Produced(len(rows), self.describe(), 1, notes=(f"version {version}",))

    def check_delete(self) -> None:
        """``reset --source`` is refused: the table is its writers'."""
        raise SourceError(
            f"reset --source: {self.describe()} is its writers', and tridentflow never deletes "
            "it; reset without --source (every version is read again)"
        )

    # -- reading ------------------------------------------------------------------------------
    def _table(self, version: int | None = None) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri, version=version,
                              storage_options=self.storage_options or None)  # fmt: skip
        except TableNotFoundError:
            raise SourceError(
                f"DeltaSource {self.uri}: no Delta table there: create it, or fix uri="
            ) from None

    def _commit(self, version: int) -> list[dict[str, Any]]:
        """The actions of ``version``'s commit in the table's log. SourceError (one line) if
        it left the log."""
        fs_, base = self.fs
        path = f"{base}/_delta_log/{version:020}.json"
        try:
            with fs_.open_input_stream(path) as stream:
                data = stream.read()
        except OSError:
            raise SourceError(
                f"{self.describe()}: version {version}'s commit is no longer in the table's "
                "log (delta.logRetentionDuration, or a checkpoint-only copy): skip it on "
                f"purpose with DeltaSource(starting_version={version + 1})"
            ) from None
        return [json.loads(line) for line in data.splitlines() if line.strip()]

    def _version_rows(
        self, table: Any, schema: Any, version: int, actions: list[dict[str, Any]], feed: bool
    ) -> list[bytes]:
        """Version ``version``'s rows (its commit's ``actions``), sorted: its change feed if it
        has one (``feed``: on as of this version), else the rows of the files it added
        (refused if it removed rows)."""
        if feed or any("cdc" in a for a in actions):
            return self._changes(table, version)
        if any("remove" in a and a["remove"].get("dataChange", True) for a in actions):
            operation = next((a["commitInfo"].get("operation") for a in actions
                              if "commitInfo" in a), "a rewrite")  # fmt: skip
            raise SourceError(
                f"{self.describe()}: version {version} ({operation}) removed rows, and without "
                "the table's change data feed they cannot be read exactly: turn it on "
                "(delta.enableChangeDataFeed = true; versions after that read updates and "
                f"deletes), or skip it on purpose: DeltaSource(starting_version={version + 1})"
            )
        added = [a["add"] for a in actions if "add" in a and a["add"].get("dataChange", True)]
        mapping = table.metadata().configuration.get("delta.columnMapping.mode", "none")
        if added and mapping != "none":
            raise SourceError(
                f"{self.describe()} maps its columns ({mapping} column mapping): its files' "
                "physical names are not its columns' - turn on the change data feed, which "
                "reads them by name"
            )
        rows: list[bytes] = []
        for add in added:
            rows += self._file_rows(schema, add, version, actions)
        return sorted(rows)

    def _changes(self, table: Any, version: int) -> list[bytes]:
        import pyarrow as pa

        try:
            reader = table.load_cdf(starting_version=version, ending_version=version)
            data = pa.table(reader.read_all())
        except Exception as exc:  # delta-rs's DeltaError, a vacuumed file's OSError
            raise SourceError(
                f"{self.describe()}: version {version}'s change feed cannot be read "
                f"({one_line(exc)}): "
                "if a VACUUM removed its files, skip it on purpose with "
                f"DeltaSource(starting_version={version + 1})"
            ) from None
        return sorted(_record(row) for row in data.to_pylist())

    def _file_rows(
        self, schema: Any, add: dict[str, Any], version: int, actions: list[dict[str, Any]]
    ) -> list[bytes]:
        """The rows of one added data file, its partition values as columns, with the change
        columns of an insert."""
        import pyarrow.parquet as pq

        if add.get("deletionVector"):
            raise SourceError(
                f"{self.describe()}: version {version} added a file with a deletion vector, "
                "which this reader cannot apply: turn on the table's change data feed"
            )
        fs_, base = self.fs
        path = unquote(add["path"])
        if "://" in path:  # an absolute path (a shallow clone's)
            fs_, path = filesystem(path, self.storage_options)
        else:
            path = f"{base}/{path}"
        try:
            data = pq.read_table(path, filesystem=fs_)
        except OSError as exc:
            raise SourceError(
                f"{self.describe()}: version {version}'s file {add['path']} cannot be read "
                f"({one_line(exc)}): if a VACUUM removed it, skip the version on purpose with "
                f"DeltaSource(starting_version={version + 1})"
            ) from None
        columns = {name: _partition_value(schema, name, value)
                   for name, value in (add.get("partitionValues") or {}).items()}  # fmt: skip
        columns.update(_change_type="insert", _commit_version=version,
                       _commit_timestamp=_commit_timestamp(actions))  # fmt: skip
        rows = data.to_pylist()
        for row in rows:
            row.update(columns)
        return [_record(row) for row in rows]


def _commit_timestamp(actions: list[dict[str, Any]]) -> datetime | None:
    """The version's commit time as the change feed gives it (UTC, without a zone)."""
    ms = next((a["commitInfo"].get("timestamp") for a in actions if "commitInfo" in a), None)
    if ms is None:
        return None
    return datetime.fromtimestamp(int(ms) / 1000, UTC).replace(tzinfo=None)


def _feed_on(configuration: dict[str, Any]) -> bool:
    """Whether a table configuration turns the change data feed on."""
    return str(configuration.get("delta.enableChangeDataFeed", "")).lower() == "true"


def _pa_schema(table: Any) -> Any:
    """The table's schema as a pyarrow schema."""
    import pyarrow as pa

    return pa.schema(table.schema().to_arrow())


def _partition_value(schema: Any, name: str, value: str | None) -> Any:
    """A partition column's value (a string in the log) typed as the table's ``schema``
    (pyarrow) says."""
    if value is None:
        return None
    import pyarrow as pa

    return pa.array([value]).cast(schema.field(name).type)[0].as_py()
