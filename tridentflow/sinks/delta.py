"""DeltaSink: a new-values stream written to a Delta Lake table, exactly once per txid, with
delta-rs (``deltalake``: no JVM; local paths and object stores through ``storage_options``).

Each exported txid is **exactly one Delta commit** carrying one ``txn`` action (Delta's
SetTransaction) whose ``appId`` is ``tridentflow:PIPELINE:SINK:GENERATION`` and whose
``version`` is the txid - Delta's own idempotency protocol, as Spark's ``txnAppId`` /
``txnVersion``: any Delta reader or writer sees how far the table is
(``DeltaTable.transaction_version(app_id)``), a replayed export finds ``version >= txid`` and
writes nothing, and two exporters of one txid at once conflict inside Delta's commit (the
loser finds the txid applied). ``upsert`` is one MERGE (matched keys updated, new ones
inserted, removed keys deleted); ``append`` one append (a change log); the first txid of a
generation - a reset - or a reload replaces the table's content in one overwrite commit.

**Whose table it is.** A sink writes only a table it created (its commits carry a ``txn``
of app ``tridentflow:PIPELINE:SINK:writer``) or one that holds no rows; a table with rows
another writer made - another tool, another pipeline - is refused in one line naming who
wrote it, unless the sink says ``adopt=True`` (its rows are then replaced by the state at
the first export). A version another writer commits on top of the sink's (a row appended
by hand, a MERGE by Spark) is found at the next export and refused in one line (the table
no longer equals the state): ``tridentflow export --resync`` reloads it from the state.
Maintenance that changes no row (OPTIMIZE, VACUUM, table properties) is not a write.

``rewind_to`` restores the table to the version whose ``txn`` is the target txid, as a new
version whose commit carries the rewound generation's ``txn`` (one commit: a reader never
sees half a rewind; later exports continue from the target). ``vacuum`` lists and removes
files no version references any more - those of a writer killed before its commit included.

Needs ``pip install 'tridentflow[delta]'``.
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Sequence
from typing import Any

from tridentflow.datasets import LineageDataset, location_dataset
from tridentflow.sinks.base import (
    ExportContext,
    LineageContext,
    ReloadNeededError,
    Row,
    Sink,
    SinkError,
    SinkRefusedError,
)
from tridentflow.sinks.lakehouse import (
    TXID_COLUMN,
    LakehouseRows,
    app_id,
    check_mode,
    check_retention,
    columns_line,
    foreign_table_line,
    later_writer_line,
    to_write,
    untyped,
)

UNCHANGED_ROWS = frozenset(
    {
        "OPTIMIZE",
        "VACUUM START",
        "VACUUM END",
        "SET TBLPROPERTIES",
        "UNSET TBLPROPERTIES",
        "ADD CONSTRAINT",
        "DROP CONSTRAINT",
        "ADD FEATURE",
        "DROP FEATURE",
        "UPDATE FIELD METADATA",
        "UPDATE TABLE METADATA",
        "CHECKPOINT",
        "REORG",
    }
)
"""Delta operations that change no row of the table (maintenance): not another writer's."""


def _deltalake() -> Any:
    try:
        import deltalake
    except ImportError:
        raise SinkRefusedError(
            "DeltaSink needs deltalake: pip install 'tridentflow[delta]'"
        ) from None
    return deltalake


def merge_predicate(key_fields: Sequence[str]) -> str:
    """The MERGE's match of a target row ``t`` with a source row ``s``: every key field
    equal, None with None (in SQL ``NULL = NULL`` is not true: a None key field would get a
    new row at every txid that changes its key)."""
    return " AND ".join(f"(t.{_quoted(k)} IS NOT DISTINCT FROM s.{_quoted(k)})" for k in key_fields)


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class DeltaSink(Sink):
    """A Delta table at ``table_uri`` (a path, ``s3://bucket/path``, ...) - see the module
    doc. ``partition_by``: columns to partition the table by (fields of the stream);
    ``storage_options``: delta-rs's object store settings (S3 endpoint, credentials);
    ``key``: the stream's fields that key a row (default: the state's key fields);
    ``adopt``: take over a table with rows that tridentflow did not write (they are replaced
    by the state at the first export; without it such a table is refused);
    ``change_data_feed``: create the table with Delta's change data feed on
    (``delta.enableChangeDataFeed``), so that readers - another pipeline's ``DeltaSource``,
    Spark's ``readChangeFeed`` - see each txid's updates and deletes, not only its rows."""

    resyncable = True
    takes_arrow = True

    def __init__(
        self,
        table_uri: str | os.PathLike[str],
        mode: str = "upsert",
        partition_by: Sequence[str] | None = None,
        storage_options: dict[str, str] | None = None,
        name: str | None = None,
        key: Sequence[str] | None = None,
        adopt: bool = False,
        change_data_feed: bool = False,
    ) -> None:
        self.adopt = adopt
        self.change_data_feed = change_data_feed
        self.table_uri = str(table_uri)
        self.key = tuple(key) if key is not None else None
        self.name = name or f"delta-{os.path.basename(self.table_uri.rstrip('/')) or 'table'}"
        self.mode = check_mode(self.name, mode)
        self.partition_by = list(partition_by or [])
        self.storage_options = dict(storage_options or {})
        self.rows: LakehouseRows | None = None

    # -- the sink contract ------------------------------------------------------------------
    def bind(self, fields: tuple[str, ...], key_fields: tuple[str, ...]) -> DeltaSink:
        key_fields = self.key if self.key is not None else key_fields
        rows = LakehouseRows(self.name, fields, key_fields, widens_by_reload=self.mode == "upsert")
        unknown = [c for c in self.partition_by if c not in rows.columns]
        if unknown:
            raise ValueError(
                f"sink {self.name}: partition_by {unknown} are not columns of {fields}"
            )
        if self.mode == "upsert" and not key_fields:
            raise ValueError(
                f"sink {self.name}: mode 'upsert' needs a keyed state (a group_by); use "
                "mode='append' for a global one"
            )
        bound = copy.copy(self)  # every setting, a new one included (never listed twice)
        bound.rows = rows
        return bound

    def _table(self, version: int | None = None) -> Any | None:
        """The Delta table (at ``version``), None if there is none yet."""
        deltalake = _deltalake()
        try:
            return deltalake.DeltaTable(
                self.table_uri, version=version, storage_options=self.storage_options or None
            )
        except deltalake.exceptions.TableNotFoundError:
            return None
        except Exception as exc:
            raise SinkError(
                f"sink {self.name}: cannot open {self.describe()}: {_line(exc)}"
            ) from None

    def position(self, ctx: ExportContext) -> int:
        table = self._table()
        if table is None:
            return 0
        return delta_position(table, app_id(ctx, self.name))

    def apply(
        self, ctx: ExportContext, txid: int, rows: Sequence[Row] | Any, replace_all: bool = False
    ) -> bool:
        assert self.rows is not None, "bind() first"
        with ctx.exclusive():  # one exporter at a time: a table's creation is not fenced
            try:
                return self._apply(ctx, txid, rows, replace_all)
            except ReloadNeededError:
                raise  # the export reloads the sink
            except SinkError as exc:  # one line: the sink, its table, the txid, the cause
                raise type(exc)(
                    f"sink {self.name} ({self.describe()}): txid {txid} not written: {exc}"
                ) from None

    def _apply(
        self, ctx: ExportContext, txid: int, rows: Sequence[Row] | Any, replace_all: bool
    ) -> bool:
        assert self.rows is not None
        deltalake = _deltalake()
        table = self._table()
        app = app_id(ctx, self.name)
        position = delta_position(table, app) if table is not None else 0
        if not to_write(ctx, txid, position, table is not None, replace_all):
            return False
        ours = table is None or self._check_writers(ctx, table, app, position, replace_all)
        replace = replace_all or (position == 0 and table is not None)  # a new generation
        batch, schema = self._batch(ctx, table, txid, rows, replace, ours)
        data = batch.live if self.mode == "upsert" or replace else batch.every
        if table is None and untyped(data):
            return True  # nothing to write yet, and no table to stamp: the next rows create it
        commit = self._commit_properties(ctx, table, app, txid, replace_all)
        ctx.fire("mid-export", txid)
        try:
            nothing = batch.every.num_rows == 0  # a txid that changed no key: its txn alone
            if table is None or replace or self.mode == "append" or nothing:
                mode = "error" if table is None else "overwrite" if replace else "append"
                self._write(table, data, mode, commit, schema)
            else:
                before = table.version()
                self._merge(table, batch.live, batch.removed, commit)
                if table.version() == before:  # it matched no row: delta-rs commits nothing
                    self._write(table, batch.every.slice(0, 0), "append", commit, schema)
        except (deltalake.exceptions.CommitFailedError, deltalake.exceptions.DeltaError) as exc:
            again = self._table()
            if again is not None and int(again.transaction_version(app) or 0) >= txid:
                return False  # another exporter committed this txid first
            raise SinkError(_line(exc)) from None
        except SinkError:
            raise
        except Exception as exc:
            raise SinkError(_line(exc)) from None
        written = table if table is not None else self._table()  # a write updates it in place
        if written is not None:
            ctx.note_version(txid, written.version())
        return True

    def _batch(
        self,
        ctx: ExportContext,
        table: Any | None,
        txid: int,
        rows: Sequence[Row] | Any,
        replace: bool,
        ours: bool,
    ) -> tuple[Any, Any]:
        """The txid's rows fitted to the table's schema, and that schema (None: the write
        sets it). A replacement writes the stream's columns, and - in a table the sink wrote
        or adopts - the types the state's values need where the table's cannot hold them (a
        column widened); a table made beforehand keeps the types its maker chose."""
        assert self.rows is not None
        schema = _arrow_schema(table) if table is not None else None
        if schema is not None and not replace:
            self._check_columns(schema, ctx)
        if replace and schema is not None and set(schema.names) != set(self.rows.columns):
            schema = None
        try:
            return self.rows.batch(rows, txid, schema), schema
        except SinkError:
            if not replace or schema is None or not (ours or self.adopt):
                raise
            return self.rows.batch(rows, txid, None), None

    def _commit_properties(
        self, ctx: ExportContext, table: Any | None, app: str, txid: int, replace_all: bool
    ) -> Any:
        """The commit's txns (the txid, the writer, the version it makes; a reload's mark)
        and its commitInfo."""
        deltalake = _deltalake()
        return deltalake.CommitProperties(
            app_transactions=[deltalake.Transaction(app, txid), writer_txn(app),
                              at_txn(app, table),
                              *([deltalake.Transaction(f"{app}:reloaded", txid)]
                                if replace_all else [])],
            custom_metadata={**self._metadata(ctx), "tridentflow.txid": str(txid),
                             **({"tridentflow.reload": "true"} if replace_all else {})},
        )  # fmt: skip

    def _write(self, table: Any | None, data: Any, mode: str, commit: Any, schema: Any) -> None:
        """One write commit against ``table`` as loaded (so that Delta's conflict check sees
        a racing exporter's commit since), or creating the table (``mode`` "error": a racing
        creator wins, this one fails and finds the txid). An overwrite writes the stream's
        columns (the table's schema replaced, as the state's content is)."""
        deltalake = _deltalake()
        deltalake.write_deltalake(
            table if table is not None else self.table_uri,
            data,
            mode=mode,
            partition_by=self.partition_by or None,
            storage_options=None if table is not None else self.storage_options or None,
            commit_properties=commit,
            schema_mode="overwrite" if mode == "overwrite" else None,
            configuration=(
                {"delta.enableChangeDataFeed": "true"}
                if table is None and self.change_data_feed
                else None
            ),
        )

    def _metadata(self, ctx: ExportContext) -> dict[str, str]:
        """What every commit of the sink says of its writer (Delta's commitInfo)."""
        return {"tridentflow.pipeline": ctx.pipeline, "tridentflow.sink": self.name}

    def _ours(self, entry: dict[str, Any], ctx: ExportContext) -> bool:
        """Whether history ``entry`` is a commit of this sink (a rewind's commit of before
        the writer was named in it: the ``rewound_to`` mark alone)."""
        if "tridentflow.sink" in entry:
            return bool(
                entry.get("tridentflow.sink") == self.name
                and entry.get("tridentflow.pipeline") == ctx.pipeline
            )
        return "tridentflow.rewound_to" in entry

    def _check_writers(
        self, ctx: ExportContext, table: Any, app: str, position: int, replace_all: bool
    ) -> bool:
        """Whether the sink wrote ``table`` before; SinkError (one line) for a table with rows
        this sink never wrote (unless ``adopt``), and for one another writer changed rows of
        since the sink's last commit (unless the export replaces its content)."""
        if table.transaction_version(writer_txn(app).app_id) is None:
            rows = table.count()
            if not rows:
                return False  # nothing to lose: a table made beforehand, or left empty
            history = table.history()  # a table of before the writer txn names its sink
            if not any(self._ours(entry, ctx) for entry in history):
                if not self.adopt:
                    raise SinkRefusedError(foreign_table_line(rows, _writer_of(history[0])))
                return False
        if position == 0 or replace_all:
            return True  # a new generation, or a reload: the content is replaced anyway
        if table.transaction_version(at_txn(app, None).app_id) == table.version():
            return True  # the newest commit is the sink's own
        entry = self._foreign_since_ours(table, ctx)
        if entry is not None:
            writer = f"{_writer_of(entry)} ({entry.get('operation')})"
            what = f"version {entry.get('version')}"
            raise SinkRefusedError(later_writer_line(what, writer, position, ctx, self.name))
        return True

    def _foreign_since_ours(self, table: Any, ctx: ExportContext) -> dict[str, Any] | None:
        """The newest commit since the sink's own last one that changed rows (another
        writer's), None if none did. Reads the newest few commits, the whole history only
        when the sink's last one is not among them (only when the newest commit is not the
        sink's: ``at_txn``)."""
        for limit in (4, None):
            history = table.history(limit)  # newest first
            found = None
            for entry in history:
                if self._ours(entry, ctx):
                    return found
                if found is None and entry.get("operation") not in UNCHANGED_ROWS:
                    found = entry
            if limit is None or len(history) < limit:
                return None  # none of the sink's own commits names it: nothing to compare
        return None

    def _check_columns(self, schema: Any, ctx: ExportContext) -> None:
        """SinkError (one line) when the table's columns are not the stream's."""
        assert self.rows is not None
        if set(schema.names) != set(self.rows.columns):
            raise SinkRefusedError(columns_line(schema.names, self.rows.columns, ctx, self.name))

    def _merge(self, table: Any, live: Any, removed: Any, commit: Any) -> None:
        """One MERGE: the txid's live rows upserted, its removed keys' rows deleted."""
        pa = __import__("pyarrow")
        assert self.rows is not None
        flag = "_tridentflow_removed"
        source = pa.concat_tables(
            [
                live.append_column(flag, pa.array([False] * live.num_rows, pa.bool_())),
                removed.append_column(flag, pa.array([True] * removed.num_rows, pa.bool_())),
            ]
        )
        on = merge_predicate(self.rows.key_fields)
        columns = {c: f"s.{_quoted(c)}" for c in self.rows.columns}
        (
            table.merge(source, on, source_alias="s", target_alias="t", commit_properties=commit)
            .when_matched_delete(f"s.{flag}")
            .when_matched_update(columns, f"NOT s.{flag}")
            .when_not_matched_insert(columns, f"NOT s.{flag}")
            .execute()
        )

    def written_through(self, ctx: ExportContext) -> int:
        return self.position(ctx)

    def claims(self) -> tuple[str, ...]:
        return (f"delta:{self.table_uri.rstrip('/')}",)

    def describe(self) -> str:
        return f"Delta table {self.table_uri} ({self.mode})"

    def lineage_datasets(self, ctx: LineageContext) -> list[LineageDataset]:
        """As the OpenLineage naming spec names a table on a file system or an object store:
        the scheme and authority as namespace, the path as name."""
        return [location_dataset(self.table_uri)]

    # -- rewind, time travel, housekeeping ---------------------------------------------------
    def version_of(self, stamp: str, txid: int) -> int | None:
        """The table version whose commit brought ``stamp``'s txn to ``txid`` (None: not in
        the log any more, or never, or below a later reload of ``stamp`` - what came before a
        reload may be a timeline Redis lost): found by bisection over the versions (the txn
        only grows along them)."""
        latest = self._table()
        if latest is None or int(latest.transaction_version(stamp) or 0) < txid:
            return None
        if int(latest.transaction_version(f"{stamp}:reloaded") or 0) > txid:
            return None  # below a reload: what came before may be a timeline Redis lost
        low, high = 0, latest.version()
        while low < high:
            middle = (low + high) // 2
            table = self._table(middle)
            reached = int(table.transaction_version(stamp) or 0) if table is not None else 0
            if reached >= txid:
                high = middle
            else:
                low = middle + 1
        table = self._table(low)
        found = int(table.transaction_version(stamp) or 0) if table is not None else 0
        return low if found == txid else None

    def rewind_to(
        self, ctx: ExportContext, old_generation: str, target: int, known: Any = None
    ) -> int | None:
        """Bring the table back to its content as of txid ``target`` of ``old_generation``
        (the pipeline was rewound there; ``ctx`` is in the rewind's new generation): one
        RESTORE commit that carries the new generation's txn at ``target``. ``known``: the
        version the txid -> version mirror names for ``target``, used when
        ``old_generation``'s stamps do not reach back to it (an earlier rewind carried the
        table to a later txid). Idempotent (a second call finds the txn); None if
        ``target``'s version is gone from the log, or its files are (a VACUUM) - the next
        export then reloads the table from the state. The new version."""
        deltalake = _deltalake()
        app = app_id(ctx, self.name)
        table = self._table()
        if table is None:
            return None
        if int(table.transaction_version(app) or 0) >= target:
            return table.version()  # done already (a rewind run again)
        old = f"{app.rsplit(':', 1)[0]}:{old_generation}"
        version = 0 if target == 0 else self.version_of(old, target)
        if version is None and known is not None:
            version = self._readable_version(int(known), table.version())
        if version is None:
            return None
        commit = deltalake.CommitProperties(
            app_transactions=[
                deltalake.Transaction(app, target),
                writer_txn(app),
                at_txn(app, table),
            ],
            custom_metadata={
                **self._metadata(ctx),
                "tridentflow.txid": str(target),
                "tridentflow.rewound_to": str(target),
            },
        )
        if version == table.version():  # its content is the target's: the stamp alone
            empty = _arrow_schema(table).empty_table()
            self._write(table, empty, "append", commit, None)
        else:
            try:
                table.restore(version, commit_properties=commit)
            except Exception as exc:
                if "missing file" in str(exc).lower():
                    return None  # a VACUUM took the version's files: the next export reloads
                raise
        restored = self._table()
        if restored is not None:
            ctx.note_version(target, restored.version())
        return restored.version() if restored is not None else None

    def _readable_version(self, version: int, latest: int) -> int | None:
        """``version`` if the table's log still holds it (not vacuumed, not checkpointed
        away), else None."""
        if not 0 <= version <= latest:
            return None
        try:
            _deltalake().DeltaTable(
                self.table_uri, version=version, storage_options=self.storage_options or None
            )
        except Exception:
            return None
        return version

    def vacuum(
        self,
        retention_hours: float = 168,
        dry_run: bool = True,
        keep_versions: Sequence[int] = (),
    ) -> list[str]:
        """Files the table's log does not reference - a killed writer's data files - and
        those of versions older than ``retention_hours`` but ``keep_versions`` (the versions
        of the txids a rewind may still reach), listed, and deleted unless ``dry_run``
        (delta-rs's full VACUUM)."""
        retention_hours = check_retention(retention_hours)
        table = self._table()
        if table is None:
            return []
        return list(
            table.vacuum(
                retention_hours=int(retention_hours),
                dry_run=dry_run,
                enforce_retention_duration=False,
                full=True,
                keep_versions=list(keep_versions) or None,
            )
        )

    def compact(self) -> dict[str, Any]:
        """Small files rewritten into few (delta-rs OPTIMIZE compact: a new version of the
        same rows; the txid stamps are untouched); its metrics."""
        table = self._table()
        return {} if table is None else dict(table.optimize.compact())


def _arrow_schema(table: Any) -> Any:
    """The table's schema as a pyarrow schema (delta-rs gives an arro3 one: converted through
    the Arrow C interface)."""
    import pyarrow as pa

    schema = table.schema()
    to_arrow = getattr(schema, "to_arrow", None) or schema.to_pyarrow
    arrow = to_arrow()
    return arrow if isinstance(arrow, pa.Schema) else pa.schema(arrow)


def _writer_of(entry: dict[str, Any]) -> str:
    """Who made a Delta commit, from its commitInfo."""
    if "tridentflow.sink" in entry:
        return (
            f"tridentflow pipeline {entry.get('tridentflow.pipeline')}'s sink "
            f"{entry.get('tridentflow.sink')}"
        )
    return str(entry.get("engineInfo") or entry.get("clientVersion") or "another writer")


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def writer_txn(app: str) -> Any:
    """The second txn of every commit of the sink: app ``<sink's stamp>:writer``, its version a
    number naming the generation that wrote (the log keeps the newest: the last writer)."""
    family, generation = app.rsplit(":", 1)
    number = int(hashlib.sha1(generation.encode()).hexdigest()[:13], 16)  # < 2**52
    return _deltalake().Transaction(f"{family}:writer", number)


def at_txn(app: str, table: Any | None) -> Any:
    """The third txn of every commit of the sink: app ``<sink's stamp family>:at``, its version
    the table version the commit makes (``table``'s next; 0 for a new table). While it equals
    the table's version, the newest commit is the sink's: no other writer's to look for (a
    commit delta-rs retried at a later version just sends the check to the history)."""
    family = app.rsplit(":", 1)[0]
    return _deltalake().Transaction(f"{family}:at", 0 if table is None else table.version() + 1)


def delta_position(table: Any, app: str) -> int:
    """The txid ``app``'s txn holds in ``table`` (as loaded); 0 if the sink's last commit was
    another generation's (Redis went back to an older generation, its last writes lost: the
    table holds another timeline's rows; the next export rebuilds it). A table from before
    the writer was recorded: the txn decides alone."""
    writer = writer_txn(app)
    last = table.transaction_version(writer.app_id)
    if last is not None and int(last) != writer.version:
        return 0
    return int(table.transaction_version(app) or 0)


__all__ = ["TXID_COLUMN", "DeltaSink"]
