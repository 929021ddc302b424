"""IcebergSink: a new-values stream written to an Apache Iceberg table, exactly once per txid,
with pyiceberg (no JVM; any catalog pyiceberg loads: SQL on SQLite for one host, on PostgreSQL
for many, REST, Glue...).

Each exported txid is **exactly one snapshot** whose summary holds ``tridentflow.txid``,
``tridentflow.pipeline``, ``tridentflow.sink`` and ``tridentflow.app`` (the pipeline, the sink
and its generation), as Spark's and Flink's Iceberg committers stamp theirs: a replayed
export finds its txid in the current snapshot's ancestry and writes nothing, and two
exporters of one txid at once conflict in the catalog's commit (the loser finds the txid
there). ``append`` is a fast append (a change log); ``upsert`` one overwrite snapshot that
rewrites the data files holding the txid's keys (copy-on-write: those files' other rows kept,
the keys' new rows added, removed keys gone); the first txid of a generation - a reset - or a
reload replaces every data file, in one snapshot too. Data files are written before the
snapshot is committed: a writer killed in between leaves files no snapshot references, which
``vacuum`` lists and removes.

**Whose table it is**, as for DeltaSink: a table with rows whose snapshots no generation of
this sink stamped is refused in one line unless ``adopt=True``; a snapshot another writer
committed on top of the sink's that changed rows (an append, an overwrite, a delete - not a
``replace``, which compaction makes) is found at the next export and refused in one line:
``tridentflow export --resync`` reloads the table from the state.

``rewind_to`` replaces the table's files with those of the snapshot stamped with the target
txid, as a new snapshot stamped with the rewound generation (a reader never sees half a
rewind; later exports continue from the target).

Needs ``pip install 'tridentflow[iceberg]'``.
"""

from __future__ import annotations

import contextlib
import copy
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from tridentflow.datasets import LineageDataset, iceberg_location, location_dataset
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
    STAMP,
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

TXID = f"{STAMP}.txid"
APP = f"{STAMP}.app"
RELOAD = f"{STAMP}.reload"
KEYS_FOR_A_FILTER = 10_000
"""A txid changing more keys rewrites every data file (a filter of more keys costs more than
it saves)."""


def _pyiceberg() -> Any:
    try:
        import pyiceberg.catalog
    except ImportError:
        raise SinkRefusedError(
            "IcebergSink needs pyiceberg: pip install 'tridentflow[iceberg]'"
        ) from None
    return pyiceberg


CATALOG_OPEN_TRIES = 3
"""Openings of a catalog whose creation of its own tables raced another process's."""


class IcebergSink(Sink):
    """An Iceberg table ``identifier`` ("namespace.table") of the catalog pyiceberg's
    ``load_catalog(**catalog)`` opens - see the module doc. ``key``: the stream's fields
    that key a row (default: the state's key fields); ``adopt``: take over a table with rows
    that tridentflow did not write (replaced by the state at the first export)."""

    resyncable = True
    takes_arrow = True

    def __init__(
        self,
        identifier: str,
        catalog: dict[str, str] | None = None,
        mode: str = "upsert",
        name: str | None = None,
        key: Sequence[str] | None = None,
        adopt: bool = False,
    ) -> None:
        self.adopt = adopt
        if identifier.count(".") < 1:
            raise ValueError(f"IcebergSink: the table is 'namespace.table', got {identifier!r}")
        self.identifier = identifier
        self.catalog_properties = dict(catalog or {})
        self.name = name or f"iceberg-{identifier}"
        self.mode = check_mode(self.name, mode)
        self.key = tuple(key) if key is not None else None
        self.rows: LakehouseRows | None = None
        self._catalog: Any = None
        self._location: str | None = None  # the table's location, once loaded or created

    def bind(self, fields: tuple[str, ...], key_fields: tuple[str, ...]) -> IcebergSink:
        key_fields = self.key if self.key is not None else key_fields
        rows = LakehouseRows(self.name, fields, key_fields, widens_by_reload=self.mode == "upsert")
        if self.mode == "upsert" and not key_fields:
            raise ValueError(
                f"sink {self.name}: mode 'upsert' needs a keyed state (a group_by); use "
                "mode='append' for a global one"
            )
        bound = copy.copy(self)  # every setting, a new one included (never listed twice)
        bound._catalog, bound._location = None, None
        bound.rows = rows
        return bound

    # -- the catalog and the table -----------------------------------------------------------
    def catalog(self) -> Any:
        """The sink's catalog, opened once. A SQL catalog's first opening creates its tables;
        two processes opening a new one at once (an exporter and ``tables compact``, say) race
        there and the loser fails with "already exists" - the winner made them, so it opens
        again (CATALOG_OPEN_TRIES in all); any other failure is one line."""
        if self._catalog is None:
            pyiceberg = _pyiceberg()
            props = dict(self.catalog_properties)
            name = props.pop("name", "tridentflow")
            for tries_left in reversed(range(CATALOG_OPEN_TRIES)):
                try:
                    self._catalog = pyiceberg.catalog.load_catalog(name, **props)
                    break
                except Exception as exc:
                    if tries_left and "already exists" in str(exc):
                        continue  # a racing opener created the catalog's tables
                    raise SinkError(
                        f"sink {self.name}: cannot open its catalog: {_line(exc)}"
                    ) from None
        return self._catalog

    def _table(self) -> Any | None:
        """The table (None if there is none yet), its commits never retried by pyiceberg: a
        retry re-applies a snapshot on a base that may hold the same txid from a racing
        exporter; the loser must look at the stamps instead (``apply``)."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self._seen(self.catalog().load_table(self.identifier))
        except NoSuchTableError:
            return None
        except Exception as exc:
            raise SinkError(
                f"sink {self.name}: cannot load {self.describe()}: {_line(exc)}"
            ) from None

    def _create(self, schema: Any) -> Any:
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, TableAlreadyExistsError

        namespace = self.identifier.rsplit(".", 1)[0]
        catalog = self.catalog()
        with contextlib.suppress(NamespaceAlreadyExistsError):
            catalog.create_namespace(namespace)
        try:
            return self._seen(catalog.create_table(self.identifier, schema=schema))
        except TableAlreadyExistsError:  # another exporter created it meanwhile
            return self._seen(catalog.load_table(self.identifier))

    def _seen(self, table: Any) -> Any:
        """``table`` with pyiceberg's commit retries off; its location remembered (lineage)."""
        self._location = table.location()
        return _no_retries(table)

    def position(self, ctx: ExportContext) -> int:
        table = self._table()
        if table is None:
            return 0
        return stamped(table, app_id(ctx, self.name))

    def apply(
        self, ctx: ExportContext, txid: int, rows: Sequence[Row] | Any, replace_all: bool = False
    ) -> bool:
        assert self.rows is not None, "bind() first"
        with ctx.exclusive():  # one exporter at a time (the catalog fences the rest)
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
        from pyiceberg.exceptions import CommitFailedException

        app = app_id(ctx, self.name)
        table = self._table()
        position = stamped(table, app) if table is not None else 0
        if not to_write(ctx, txid, position, table is not None, replace_all):
            return False
        ours = table is None or self._check_writers(ctx, table, app, position, replace_all)
        replace = replace_all or (position == 0 and table is not None and has_data(table))
        schema = table.schema().as_arrow() if table is not None else None
        reshape = schema is not None and set(schema.names) != set(self.rows.columns)
        if reshape and not replace:
            raise SinkRefusedError(columns_line(schema.names, self.rows.columns, ctx, self.name))
        batch, retype = self._batch(table, txid, rows, schema, replace, ours)
        data = batch.live if self.mode == "upsert" or replace else batch.every
        if table is None and untyped(data):
            return True  # nothing to write yet, and no table to stamp: the next rows create it
        if table is None:
            table = self._create(data.schema)
        props = {TXID: str(txid), APP: app, f"{STAMP}.pipeline": ctx.pipeline,
                 f"{STAMP}.sink": self.name,
                 **({RELOAD: "true"} if replace_all else {})}  # fmt: skip
        try:
            if reshape or retype:  # a replacement in the stream's columns and the state's types
                self._overwrite(ctx, table, data, None, props, txid, reshape=True)
            else:
                self._commit(ctx, table, batch, data, replace, props, txid)
        except CommitFailedException as exc:
            again = self._table()
            if again is not None and stamped(again, app) >= txid:
                return False  # another exporter committed this txid first
            raise SinkError(_line(exc)) from None
        except SinkError:
            raise
        except Exception as exc:
            raise SinkError(_line(exc)) from None
        snapshot = table.current_snapshot()  # the commit refreshed the table in place
        if snapshot is not None:
            ctx.note_version(txid, snapshot.snapshot_id)
        return True

    def _commit(
        self,
        ctx: ExportContext,
        table: Any,
        batch: Any,
        data: Any,
        replace: bool,
        props: dict[str, str],
        txid: int,
    ) -> None:
        """The txid's one snapshot: a fast append (a change log), else one overwrite - an
        upsert's files of the touched keys rewritten, a replacement of every file, or an
        append that changed nothing (its stamp)."""
        assert self.rows is not None
        if self.mode == "append" and not replace and data.num_rows:
            with table.transaction() as tx:
                ctx.fire("mid-export", txid)
                tx.append(data, snapshot_properties=props)
            return
        keys = list(self.rows.key_fields)
        touched = (
            None
            if replace
            else batch.every.select(keys)
            if self.mode == "upsert"
            else batch.every.slice(0, 0).select(keys)
        )
        self._overwrite(ctx, table, data, touched, props, txid)

    def _check_writers(
        self, ctx: ExportContext, table: Any, app: str, position: int, replace_all: bool
    ) -> bool:
        """Whether a generation of this sink wrote ``table``; SinkError (one line) for a
        table with rows no generation of it stamped (unless ``adopt``), and for one whose
        current snapshot descends from the sink's last through another writer's row change
        (unless the export replaces its content)."""
        family = app.rsplit(":", 1)[0] + ":"
        ours = any(str(_props(s).get(APP, "")).startswith(family) for s in table.snapshots())
        if not ours:
            if has_data(table) and not self.adopt:
                snapshot = table.current_snapshot()
                rows = int(_props(snapshot).get("total-records", "0") or 0)
                raise SinkRefusedError(foreign_table_line(rows, _writer_of(snapshot)))
            return False
        if position == 0 or replace_all:
            return True  # a new generation, or a reload: the content is replaced anyway
        foreign = None
        snapshot = table.current_snapshot()
        while snapshot is not None and not str(_props(snapshot).get(APP, "")).startswith(family):
            operation = getattr(getattr(snapshot.summary, "operation", None), "value", "")
            if foreign is None and operation != "replace":
                foreign = snapshot
            parent = snapshot.parent_snapshot_id
            snapshot = table.snapshot_by_id(parent) if parent is not None else None
        if foreign is not None:
            what = f"snapshot {foreign.snapshot_id}"
            raise SinkRefusedError(
                later_writer_line(what, _writer_of(foreign), position, ctx, self.name)
            )
        return True

    def _batch(
        self,
        table: Any | None,
        txid: int,
        rows: Sequence[Row] | Any,
        schema: Any,
        replace: bool,
        ours: bool,
    ) -> tuple[Any, bool]:
        """The txid's rows fitted to the table's ``schema``, and whether the table's column
        types must change to hold them: a replacement of a table the sink wrote (or adopts)
        takes the types the state's values need where the table's cannot hold them (a column
        of integers widened to floats: ReloadNeededError asked for this replacement); a
        table made beforehand keeps the types its maker chose."""
        assert self.rows is not None
        try:
            return self.rows.batch(rows, txid, schema), False
        except SinkError:
            if not replace or table is None or not (ours or self.adopt):
                raise
            return self.rows.batch(rows, txid, None), True

    def _reshape(self, tx: Any, data: Any) -> Any:
        """``data`` in the table's columns once a schema update staged in ``tx`` made them the
        stream's: columns the stream lacks dropped, its new ones added, a kept one whose type
        cannot hold the state's values retyped (a replacement only - every data file is
        rewritten in the same snapshot: adopting a table of other columns, a reload after the
        stream changed or a value column widened)."""
        converted = self.catalog()._convert_schema_if_needed(data.schema)  # ids unassigned
        wanted = {field.name: field.field_type for field in converted.fields}
        with tx.update_schema(allow_incompatible_changes=True) as update:
            for field in tx.table_metadata.schema().fields:
                if field.name not in wanted:
                    update.delete_column(field.name)
                elif field.field_type != wanted[field.name]:
                    update.update_column(field.name, wanted[field.name])
            update.union_by_name(data.schema)
        arrow = tx.table_metadata.schema().as_arrow()
        return data.select(arrow.names).cast(arrow)

    def _overwrite(
        self,
        ctx: ExportContext,
        table: Any,
        data: Any,
        touched: Any,
        props: dict[str, str],
        txid: int,
        reshape: bool = False,
    ) -> None:
        """One overwrite snapshot: the data files that may hold ``touched``'s keys (an Arrow
        table of the key columns; None: every file) rewritten without those keys, ``data``
        added; with ``reshape`` (every file replaced), the schema made ``data``'s in the
        same commit (``_reshape``)."""
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyiceberg.io.pyarrow import _dataframe_to_data_files

        assert self.rows is not None
        keys = self.rows.key_fields
        files = list(self._files_holding(table, touched))
        kept = []
        if touched is not None and files:
            changed = touched
            for data_file in files:
                old = _read(table, data_file.file_path)
                if not keys:
                    continue
                hit = _membership(old, changed, keys)
                rest = old.filter(pc.invert(hit))
                if rest.num_rows:
                    kept.append(rest.cast(data.schema) if rest.schema != data.schema else rest)
        new = pa.concat_tables([*kept, data]) if kept else data
        with table.transaction() as tx:
            if reshape:
                new = self._reshape(tx, new)
            written = (
                list(_dataframe_to_data_files(tx.table_metadata, new, table.io, uuid.uuid4()))
                if new.num_rows
                else []
            )
            ctx.fire("mid-export", txid)  # files written, the snapshot not committed yet
            with tx.update_snapshot(snapshot_properties=props).overwrite() as snapshot:
                for data_file in files:
                    snapshot.delete_data_file(data_file)
                for data_file in written:
                    snapshot.append_data_file(data_file)

    def _files_holding(self, table: Any, touched: Any) -> Iterator[Any]:
        """The current data files that may hold a row of ``touched``'s keys (an Arrow table
        of the key columns; their statistics cannot rule it out); every file for None or
        too many keys."""
        from pyiceberg.expressions import AlwaysTrue, In

        if table.current_snapshot() is None or (touched is not None and not touched.num_rows):
            return
        assert self.rows is not None
        row_filter: Any = AlwaysTrue()
        if (
            touched is not None
            and len(self.rows.key_fields) == 1
            and touched.num_rows <= KEYS_FOR_A_FILTER
        ):
            values = set(touched[self.rows.key_fields[0]].to_pylist())
            if None not in values and all(isinstance(v, str | int) for v in values):
                row_filter = In(self.rows.key_fields[0], values)
        for task in table.scan(row_filter=row_filter).plan_files():
            yield task.file

    def written_through(self, ctx: ExportContext) -> int:
        return self.position(ctx)

    def claims(self) -> tuple[str, ...]:
        uri = self.catalog_properties.get("uri", "")
        return (f"iceberg:{uri}:{self.identifier}",)

    def describe(self) -> str:
        kind = self.catalog_properties.get("type", "catalog")
        return f"Iceberg table {self.identifier} ({kind} catalog, {self.mode})"

    def lineage_datasets(self, ctx: LineageContext) -> list[LineageDataset]:
        """The table's physical location, as the OpenLineage naming spec names an Iceberg
        table: its scheme and authority as namespace, its path as name. No I/O: the location
        this sink last loaded or created the table at, else where pyiceberg's catalogs put a
        new table (``warehouse/namespace/table``)."""
        location = self._location or iceberg_location(
            self.catalog_properties.get("warehouse", ""), self.identifier
        )
        return [location_dataset(location)]

    def close(self) -> None:
        self._catalog = None

    # -- rewind, time travel, housekeeping ---------------------------------------------------
    def snapshot_of(self, stamp: str, txid: int) -> Any | None:
        """The snapshot ``stamp`` stamped with ``txid`` in the table's current ancestry (None:
        expired, or never, or below a later reload of ``stamp``: what came before a reload
        may be a timeline Redis lost - the same stamps, other rows)."""
        table = self._table()
        snapshot = table.current_snapshot() if table is not None else None
        while snapshot is not None:
            props = _props(snapshot)
            if props.get(APP) == stamp:
                if props.get(TXID) == str(txid):
                    return snapshot
                if props.get(RELOAD) and int(props.get(TXID, 0)) > txid:
                    return None
            parent = snapshot.parent_snapshot_id
            snapshot = table.snapshot_by_id(parent) if parent is not None else None
        return None

    def rewind_to(
        self, ctx: ExportContext, old_generation: str, target: int, known: Any = None
    ) -> int | None:
        """The table's files replaced by those of the snapshot ``old_generation`` stamped with
        ``target``, as one snapshot stamped with ``ctx``'s (the rewind's) generation at
        ``target``. ``known``: the snapshot id the txid -> version mirror names for
        ``target``, used when ``old_generation``'s stamps do not reach back to it (an earlier
        rewind carried the table to a later txid). Idempotent; None if that snapshot expired -
        the next export then reloads the table from the state. The new snapshot's id."""
        table = self._table()
        if table is None:
            return None
        app = app_id(ctx, self.name)
        if stamped(table, app) >= target and table.current_snapshot() is not None:
            return table.current_snapshot().snapshot_id
        old = f"{app.rsplit(':', 1)[0]}:{old_generation}"
        files: list[Any] = []
        if target > 0:
            source = self.snapshot_of(old, target)
            if source is None and known is not None and str(known).isdigit():
                source = table.snapshot_by_id(int(known))  # None if expired
            if source is None:
                return None
            files = [t.file for t in table.scan(snapshot_id=source.snapshot_id).plan_files()]
        props = {TXID: str(target), APP: app, f"{STAMP}.rewound_to": str(target)}
        current = list(self._files_holding(table, None))
        with (
            table.transaction() as tx,
            tx.update_snapshot(snapshot_properties=props).overwrite() as snapshot,
        ):
            for data_file in current:
                snapshot.delete_data_file(data_file)
            for data_file in files:
                snapshot.append_data_file(data_file)
        latest = self._table()
        snapshot_id = latest.current_snapshot().snapshot_id if latest is not None else None
        if snapshot_id is not None:
            ctx.note_version(target, snapshot_id)
        return snapshot_id

    def vacuum(
        self, retention_hours: float = 168, dry_run: bool = True, keep_versions: Any = ()
    ) -> list[str]:
        """Data files under the table's location that no snapshot references and older than
        ``retention_hours`` - those of a writer killed before its snapshot's commit -
        listed, and deleted unless ``dry_run`` (pyiceberg has no orphan-file removal). Every
        snapshot's files are kept (``keep_versions`` is moot: expire snapshots to let go)."""
        from pyarrow import fs

        retention_hours = check_retention(retention_hours)
        table = self._table()
        if table is None:
            return []
        referenced = set()
        for snapshot in table.snapshots():
            for manifest in snapshot.manifests(table.io):
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                    referenced.add(_path(entry.data_file.file_path))
        filesystem, root = _filesystem(table, f"{table.location().rstrip('/')}/data")
        try:
            infos = filesystem.get_file_info(fs.FileSelector(root, recursive=True))
        except FileNotFoundError:
            return []
        cutoff = time.time() - retention_hours * 3600
        orphans = [
            i.path for i in infos
            if i.type == fs.FileType.File and _path(i.path) not in referenced
            and (i.mtime is None or i.mtime.timestamp() <= cutoff)
        ]  # fmt: skip
        if not dry_run:
            for path in orphans:
                filesystem.delete_file(path)
        return sorted(orphans)

    def compact(self) -> dict[str, Any]:
        """Every data file rewritten into as few as the writer makes, in one overwrite
        snapshot that keeps the current stamp (the txid a reader and a replay see stays); the
        files before and after."""
        table = self._table()
        if table is None or table.current_snapshot() is None:
            return {"files_before": 0, "files_after": 0}
        from pyiceberg.io.pyarrow import _dataframe_to_data_files

        files = list(self._files_holding(table, None))
        data = table.scan().to_arrow()
        props = {k: v for k, v in _props(table.current_snapshot()).items() if k.startswith(STAMP)}
        with table.transaction() as tx:
            written = list(_dataframe_to_data_files(tx.table_metadata, data, table.io))
            with tx.update_snapshot(snapshot_properties=props).overwrite() as snapshot:
                for data_file in files:
                    snapshot.delete_data_file(data_file)
                for data_file in written:
                    snapshot.append_data_file(data_file)
        return {"files_before": len(files), "files_after": len(written)}


def _filesystem(table: Any, location: str) -> tuple[Any, str]:
    """A pyarrow filesystem for ``location`` configured as the table's FileIO is (the
    catalog's ``s3.endpoint``, credentials, ...), and the path in it."""
    from pyarrow import fs

    io = table.io
    if callable(getattr(io, "fs_by_scheme", None)):
        scheme, netloc, path = io.parse_location(location, io.properties)
        return io.fs_by_scheme(scheme, netloc), path
    return fs.FileSystem.from_uri(location)


def _no_retries(table: Any) -> Any:
    """``table`` whose commits pyiceberg does not retry (``commit.retry.num-retries`` 0 in
    this process's copy of its metadata; nothing is written to the table's properties)."""
    from pyiceberg.table import Table, TableProperties

    properties = {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
    metadata = table.metadata.model_copy(update={"properties": properties})
    return Table(table._identifier, metadata, table.metadata_location, table.io, table.catalog)


def stamped(table: Any, stamp: str) -> int:
    """The txid of the newest snapshot in the table's current ancestry stamped ``stamp``; 0 if
    a snapshot of the same sink in another generation came after it (Redis went back to an
    older generation, its last writes lost: the table holds another timeline's rows)."""
    family = stamp.rsplit(":", 1)[0] + ":"
    snapshot = table.current_snapshot()
    while snapshot is not None:
        props = _props(snapshot)
        if props.get(APP) == stamp:
            return int(props.get(TXID, 0))
        if str(props.get(APP, "")).startswith(family):
            return 0
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return 0


def has_data(table: Any) -> bool:
    snapshot = table.current_snapshot()
    return snapshot is not None and int(_props(snapshot).get("total-records", "0") or 0) > 0


def _props(snapshot: Any) -> dict[str, str]:
    summary = getattr(snapshot, "summary", None)
    return dict(summary.additional_properties) if summary is not None else {}


def _writer_of(snapshot: Any) -> str:
    """Who committed an Iceberg snapshot, from its summary."""
    props = _props(snapshot)
    if f"{STAMP}.sink" in props:
        return (
            f"tridentflow pipeline {props.get(f'{STAMP}.pipeline')}'s sink {props[f'{STAMP}.sink']}"
        )
    operation = getattr(getattr(snapshot.summary, "operation", None), "value", "a write")
    engine = props.get("engine-name") or props.get("spark.app.id") or "another writer"
    return f"{engine} ({operation}, snapshot {snapshot.snapshot_id})"


def _read(table: Any, location: str) -> Any:
    import pyarrow.parquet as pq

    with table.io.new_input(location).open() as stream:
        return pq.read_table(stream)


def _membership(old: Any, changed: Any, keys: tuple[str, ...]) -> Any:
    """A boolean mask of ``old``'s rows whose key is among ``changed``'s."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if len(keys) == 1:  # is_in matches a null with a null (skip_nulls=False)
        return pc.fill_null(pc.is_in(old[keys[0]], value_set=changed[keys[0]]), False)
    # A join never matches a null key field: each field as its code in one dictionary of
    # both sides' values, a null a code of its own
    codes_old, codes_changed = {}, {}
    for key in keys:
        held = old[key].combine_chunks()
        both = pa.concat_arrays([held, changed[key].combine_chunks().cast(held.type)])
        codes = pc.dictionary_encode(both, null_encoding="encode").indices
        codes_old[key] = codes.slice(0, old.num_rows)
        codes_changed[key] = codes.slice(old.num_rows)
    old, changed = pa.table(codes_old), pa.table(codes_changed)
    marker = "_tridentflow_hit"
    joined = old.select(list(keys)).append_column(
        "_tridentflow_row", pa.array(range(old.num_rows), pa.int64())
    ).join(
        changed.append_column(marker, pa.array([True] * changed.num_rows, pa.bool_())),
        keys=list(keys), join_type="left outer",
    ).sort_by("_tridentflow_row")  # fmt: skip
    return pc.fill_null(joined[marker], False)


def _path(location: str) -> str:
    """A file's path without its scheme (the filesystem lists them so)."""
    parts = urlsplit(location)
    return f"{parts.netloc}{parts.path}" if parts.scheme not in ("", "file") else parts.path


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
