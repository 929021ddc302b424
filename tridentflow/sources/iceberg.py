"""An Iceberg table as a source (``IcebergSource``): the snapshots of the table's main branch,
by their **sequence number**, are the offsets of its one partition, so a txid's batch is a
range of sequence numbers - snapshots are immutable, hence what a transactional source needs.
No JVM: pyiceberg's incremental append scan reads what each snapshot appended.

What a snapshot gives: an ``append`` its new rows (each with ``_change_type`` ``insert``,
``_snapshot_id``, ``_sequence_number``, ``_commit_timestamp``); a ``replace`` (a compaction:
the same rows in other files) nothing. An ``overwrite`` or a ``delete`` removed rows, which
pyiceberg cannot read as changes (it has no changelog scan): the read fails in one line naming
the snapshot and the way out, never skipped. So does a range whose snapshots expired, or one
holding a snapshot the branch no longer has (a rollback). Sequence numbers need format
version 2 (pyiceberg's default); gaps between them (a commit to another branch) read as
nothing. Rows within a snapshot come in one fixed order (sorted), so a replay reads what the
first read read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from tridentflow.errors import SourceError, one_line
from tridentflow.sources.base import ChaosTraits, LogScan

LOCATOR_PREFIX = "iceberg:"
CATALOG_NAME = "tridentflow"
"""The catalog's name when ``catalog`` gives none (as IcebergSink's)."""


def _record(row: dict[str, Any]) -> bytes:
    return json.dumps(row, default=str, sort_keys=True).encode()


class IcebergLog:
    """SourceLog over the main branch of Iceberg table ``identifier`` of the catalog that
    pyiceberg's ``load_catalog(**catalog)`` opens: one partition; offset S is the snapshot
    with sequence number S (those before ``starting_sequence`` read as empty)."""

    dense = False
    chaos = ChaosTraits(disturb="none", fresh="ledger-only", producers_own=True)

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.identifier = str(spec["identifier"])
        self.catalog_properties = dict(spec.get("catalog") or {})
        self.starting_sequence = int(spec.get("starting_sequence") or 0)
        self._catalog: Any = None

    # -- identity -----------------------------------------------------------------------------
    @property
    def root(self) -> str:
        return LOCATOR_PREFIX + json.dumps(self.spec, sort_keys=True)

    @classmethod
    def open(cls, locator: str) -> IcebergLog:
        return cls(json.loads(locator[len(LOCATOR_PREFIX) :]))

    def describe(self) -> str:
        return f"Iceberg table {self.identifier}"

    # -- the interface ------------------------------------------------------------------------
    def exists(self) -> bool:
        """Whether the table exists (a pipeline may be deployed before its upstream writes)."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            self._catalog_of().load_table(self.identifier)
        except NoSuchTableError:
            return False
        return True

    def require(self) -> None:
        """SourceError (one line) unless the table exists: its writers make it."""
        self._table()

    def partitions(self) -> int:
        return 1

    def scan(self, committed: dict[int, int] | None = None) -> LogScan:
        """The head: the current snapshot's sequence number + 1 (0 for a table without
        snapshots); unavailable if it is behind the committed offset (a rollback)."""
        table = self._table()
        current = table.current_snapshot()
        head = 0 if current is None else int(current.sequence_number) + 1
        if committed and head < int(committed.get(0, 0)):
            return LogScan(
                {},
                {0: f"the table's current snapshot has sequence number {head - 1}, behind the "
                    f"committed {int(committed[0]) - 1}: it was rolled back; reset the pipeline"},
            )  # fmt: skip
        return LogScan({0: head})

    def probe(self, partition: int, start: int, end: int) -> None:
        self._snapshots(self._table(), start, end)

    def read_raw(self, partition: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        """Every row the snapshots with sequence numbers in [start, end) appended, snapshot by
        snapshot, each one's rows in one fixed order."""
        table = self._table()
        for snapshot in self._snapshots(table, start, end):
            for row in self._snapshot_rows(table, snapshot):
                yield int(snapshot.sequence_number), row

    def acknowledge(self, committed: dict[int, int]) -> None:
        return None

    def offset_unit(self) -> str:
        return "sequence numbers"

    def waiting(self, committed: dict[int, int], limit: int = 10) -> list[str]:
        """The snapshots not committed yet, oldest first, as ``snapshot ID (seq N, op)``."""
        table = self._table()
        current = table.current_snapshot()
        if current is None:
            return []
        start = int(committed.get(0, 0))
        try:
            found = self._snapshots(table, start, int(current.sequence_number) + 1)
        except SourceError as exc:
            return [str(exc)]
        return [
            f"snapshot {s.snapshot_id} (sequence {s.sequence_number}, {_operation(s)})"
            for s in found[:limit]
        ]

    def names(self, partition: int, start: int, end: int, limit: int = 10) -> list[str]:
        try:
            found = self._snapshots(self._table(), start, end)
        except SourceError:  # expired or rolled back: nothing to name
            return []
        return [f"snapshot {s.snapshot_id} (sequence {s.sequence_number})" for s in found[:limit]]

    def records_in(self, ranges: dict[int, tuple[int, int]]) -> int | None:
        """The rows the snapshots in ``ranges`` appended (their summaries' ``added-records``),
        or None when a summary does not say."""
        table = self._table()
        total = 0
        for start, end in ranges.values():
            try:
                snapshots = self._snapshots(table, start, end)
            except SourceError:
                return None
            for snapshot in snapshots:
                summary = snapshot.summary
                added = summary.get("added-records") if summary is not None else None
                if _operation(snapshot) == "append":
                    if added is None:
                        return None
                    total += int(added)
        return total

    def check_delete(self) -> None:
        """``reset --source`` is refused: the table is its writers'."""
        raise SourceError(
            f"reset --source: {self.describe()} is its writers', and tridentflow never deletes "
            "it; reset without --source (every snapshot is read again)"
        )

    # -- reading ------------------------------------------------------------------------------
    def _catalog_of(self) -> Any:
        if self._catalog is None:
            try:
                from pyiceberg.catalog import load_catalog
            except ImportError:
                raise SourceError(
                    "IcebergSource needs pyiceberg: pip install 'tridentflow[iceberg]'"
                ) from None
            props = dict(self.catalog_properties)
            name = props.pop("name", CATALOG_NAME)
            try:
                self._catalog = load_catalog(name, **props)
            except Exception as exc:
                raise SourceError(
                    f"{self.describe()}: cannot open its catalog: {one_line(exc)}"
                ) from None
        return self._catalog

    def _table(self) -> Any:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            table = self._catalog_of().load_table(self.identifier)
        except NoSuchTableError:
            raise SourceError(
                f"IcebergSource {self.identifier}: no such table in its catalog: create it, or "
                "fix the identifier ('namespace.table') or catalog="
            ) from None
        if int(table.metadata.format_version) < 2:
            raise SourceError(
                f"{self.describe()} is format version 1, whose snapshots have no sequence "
                "numbers: upgrade it (table.transaction().upgrade_table_version(2))"
            )
        return table

    def _snapshots(self, table: Any, start: int, end: int) -> list[Any]:
        """The main branch's snapshots with sequence numbers in [start, end), oldest first.
        SourceError (one line) if the range holds a snapshot the branch no longer has (a
        rollback) or reaches before its oldest snapshot still kept (expired)."""
        first = max(start, self.starting_sequence)
        if first >= end:
            return []
        current = table.current_snapshot()
        ancestry: list[Any] = []
        snapshot = current
        while snapshot is not None:
            ancestry.append(snapshot)
            parent = snapshot.parent_snapshot_id
            snapshot = table.snapshot_by_id(parent) if parent is not None else None
            if (
                parent is not None
                and snapshot is None
                and int(ancestry[-1].sequence_number) > first
            ):
                raise SourceError(
                    f"{self.describe()}: the snapshots before sequence number "
                    f"{ancestry[-1].sequence_number} expired, and the batch reads from "
                    f"{first}: skip them on purpose with IcebergSource(starting_sequence="
                    f"{ancestry[-1].sequence_number})"
                )
        on_branch = {s.snapshot_id for s in ancestry}
        for other in table.metadata.snapshots:
            seq = int(other.sequence_number)
            if first <= seq < end and other.snapshot_id not in on_branch:
                raise SourceError(
                    f"{self.describe()}: snapshot {other.snapshot_id} (sequence {seq}) is in "
                    "the batch but no longer on the main branch (a rollback): reset the pipeline"
                )
        return sorted(
            (s for s in ancestry if first <= int(s.sequence_number) < end),
            key=lambda s: int(s.sequence_number),
        )

    def _snapshot_rows(self, table: Any, snapshot: Any) -> list[bytes]:
        operation = _operation(snapshot)
        if operation == "replace":
            return []  # a compaction: the same rows in other files
        if operation != "append":
            raise SourceError(
                f"{self.describe()}: snapshot {snapshot.snapshot_id} (sequence "
                f"{snapshot.sequence_number}) is an {operation}, which removed rows, and "
                "pyiceberg reads no changes but appends: write the table by appends only, or "
                "skip it on purpose with IcebergSource(starting_sequence="
                f"{int(snapshot.sequence_number) + 1})"
            )
        try:
            data = table.incremental_append_scan(
                from_snapshot_id_exclusive=snapshot.parent_snapshot_id,
                to_snapshot_id_inclusive=snapshot.snapshot_id,
            ).to_arrow()
        except Exception as exc:  # a data file gone (removed orphans), a catalog error
            raise SourceError(
                f"{self.describe()}: snapshot {snapshot.snapshot_id}'s rows cannot be read "
                f"({one_line(exc)})"
            ) from None
        stamp = datetime.fromtimestamp(int(snapshot.timestamp_ms) / 1000, UTC).replace(tzinfo=None)
        extra = {
            "_change_type": "insert",
            "_snapshot_id": snapshot.snapshot_id,
            "_sequence_number": int(snapshot.sequence_number),
            "_commit_timestamp": stamp,
        }
        return sorted(_record({**row, **extra}) for row in data.to_pylist())


def _operation(snapshot: Any) -> str:
    summary = snapshot.summary
    operation = summary.operation if summary is not None else None
    return str(getattr(operation, "value", operation) or "append")
