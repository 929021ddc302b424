"""What the lakehouse sinks (DeltaSink, IcebergSink) share: a txid's rows as an Arrow table
checked against the table's schema, the two modes, and the identity each table commit carries.

* **One table commit per txid**, stamped with the txid by the table format's own protocol (a
  Delta ``txn`` action, an Iceberg snapshot's summary), so any reader or writer of the table
  can tell how far it is, and a replayed export finds its txid there and writes nothing. The
  stamp names the pipeline, the sink and the pipeline's generation: a reset or a rewind starts
  a new one, and the first txid of a generation replaces what an older one wrote (a rewind
  carries the table instead: ``rewind_to``).
* ``mode="upsert"``: one row per key - the key fields as columns, the stream's value fields
  as it names them, and ``txid`` (the txid that last changed the row); a removed key's row
  is deleted. ``mode="append"``: one row per changed key per txid (a change log); a removed
  key is a row whose values are null.
* Schema: the table is created from the first txid whose rows give every column a type (the
  txids before it - none, or only removals - have nothing to write and nothing to stamp: the
  table does not exist yet, and its first commit is that txid's); later rows must fit it. A
  column whose
  type differs, or a value no column type can hold, is refused in one line with the way out -
  never cast silently.
* Each applied txid's table version (Delta) or snapshot id (Iceberg) is mirrored in the
  pipeline's Redis (``ExportContext.note_version``): ``status`` shows it, ``query``-free time
  travel reads the table as of a txid with it. The table is the truth; the mirror may lag.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from tridentflow.sinks.base import (
    ExportContext,
    ReloadNeededError,
    Row,
    SinkError,
    SinkRefusedError,
)

MODES = ("upsert", "append")
TXID_COLUMN = "txid"
STAMP = "tridentflow"
"""The prefix of every stamp a lakehouse sink writes (Delta app ids, Iceberg properties)."""


def _pyarrow() -> Any:
    import pyarrow as pa

    return pa


class LakehouseRows:
    """A bound lakehouse sink's columns and how a txid's rows become an Arrow table."""

    def __init__(
        self,
        sink: str,
        fields: tuple[str, ...],
        key_fields: tuple[str, ...],
        widens_by_reload: bool = False,
    ):
        if TXID_COLUMN in fields:
            raise ValueError(
                f"sink {sink}: the stream has a field named {TXID_COLUMN!r}, the column the "
                "sink writes each row's txid to: rename it with .map(...)"
            )
        missing = [k for k in key_fields if k not in fields]
        if missing:
            raise ValueError(f"sink {sink}: key field(s) {missing} are not in the stream {fields}")
        self.sink = sink
        self.widens_by_reload = widens_by_reload
        """Whether the sink can rewrite its table with a value column widened (integers to
        floats): a txid that needs it raises ReloadNeededError instead of a refusal."""
        self.fields = fields
        self.key_fields = key_fields
        self.value_fields = tuple(f for f in fields if f not in key_fields)
        self.columns = (*fields, TXID_COLUMN)

    def batch(self, rows: Sequence[Row] | Any, txid: int, schema: Any = None) -> Batch:
        """The txid's rows - Python tuples of the stream's fields, or an Arrow table of them
        (the export hands one to a sink that ``takes_arrow``) - as Arrow tables of ``schema``
        (the table's) when given, every row with its txid, and split into the rows that set
        a key and those that remove one (every value null). Columnar all through; SinkError
        (one line) for a value that does not fit a column, never a cast."""
        pa = _pyarrow()
        if isinstance(rows, pa.Table):
            arrays = self._columns_of_table(rows, schema)
        else:
            arrays = self._columns_of_rows(rows, schema)
        count = len(rows) if not isinstance(rows, pa.Table) else rows.num_rows
        arrays[TXID_COLUMN] = pa.repeat(pa.scalar(txid, pa.int64()), count)
        every = pa.table(arrays)
        if not self.key_fields or not self.value_fields or not count:
            return Batch(every, every, every.slice(0, 0))
        if any(every[name].null_count == 0 for name in self.value_fields):
            return Batch(every, every, every.slice(0, 0))  # no row has every value null
        import pyarrow.compute as pc

        removed = pc.is_null(every[self.value_fields[0]])
        for name in self.value_fields[1:]:
            removed = pc.and_(removed, pc.is_null(every[name]))
        return Batch(every, every.filter(pc.invert(removed)), every.filter(removed))

    def _columns_of_rows(self, rows: Sequence[Row], schema: Any) -> dict[str, Any]:
        widths = set(map(len, rows))
        if widths - {len(self.fields)}:
            raise SinkRefusedError(
                f"a row has {max(widths - {len(self.fields)})} values, the stream "
                f"{len(self.fields)} fields {self.fields}"
            )
        columns = [list(map(itemgetter(i), rows)) for i in range(len(self.fields))]
        return {
            name: _finite(
                name,
                self._fit(
                    name, column_array(name, values, name in self.key_fields), _want(schema, name)
                ),
            )
            for name, values in zip(self.fields, columns, strict=True)
        }

    def _columns_of_table(self, table: Any, schema: Any) -> dict[str, Any]:
        if tuple(table.column_names) != self.fields:
            raise SinkRefusedError(
                f"an Arrow batch has the columns {table.column_names}, the stream the fields "
                f"{list(self.fields)}"
            )
        return {
            name: _finite(name, self._fit(name, table[name].combine_chunks(), _want(schema, name)))
            for name in self.fields
        }

    def _fit(self, name: str, array: Any, want: Any) -> Any:
        """``array`` as the table's column type ``want`` (None: no table yet) where that
        loses nothing - all null; another layout of strings; integers into a wider or a
        narrower integer column they fit; a value column's integers into a floating one that
        holds each exactly (a JSON ``3`` beside ``12.5``), float32 into float64 - and
        SinkError (one line) where it would lose information. A key column never takes its
        integers as floats: ``1`` and ``1.0`` are two keys of the state."""
        pa = _pyarrow()
        if want is None or array.type == want:
            return array
        if pa.types.is_null(array.type):  # all None: the table's type, nothing to cast
            return pa.nulls(len(array), want)
        if _same_family(array.type, want):  # string / large_string: the same values
            return array.cast(want)
        if _widens(array.type, want, key=name in self.key_fields):
            try:
                return array.cast(want, safe=True)  # Arrow refuses a value it cannot hold
            except (pa.ArrowInvalid, OverflowError) as exc:
                raise SinkRefusedError(
                    f"column {name} is {want} in the table, and a value of this txid does not "
                    f"fit it ({str(exc).splitlines()[0]}): write to a new table whose column "
                    "is wider"
                ) from None
        if (
            self.widens_by_reload
            and name not in self.key_fields
            and pa.types.is_integer(want)
            and pa.types.is_floating(array.type)
        ):
            raise ReloadNeededError(
                f"column {name} is {want} in the table, the txid's {array.type}"
            )
        raise SinkRefusedError(
            f"column {name} is {want} in the table, but this txid's values "
            f"are {array.type}: map the stream to {want} (new_values_stream().map(...)), "
            "or write to a new table"
        )


def column_array(name: str, values: Sequence[Any], key: bool = False) -> Any:
    """Column ``name``'s ``values`` as the Arrow array of the type they infer; SinkError (one
    line) if no one type holds them - or, for a ``key`` column, if its values mix integers and
    floats (``1`` and ``1.0`` are two keys of the state; one float column would make them one
    row). A value column's integers beside floats are floats where each is exact (Arrow
    refuses one that is not)."""
    pa = _pyarrow()
    try:
        array = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        kinds = sorted({type(v).__name__ for v in values if v is not None})
        raise SinkRefusedError(
            f"column {name} gets values of types {', '.join(kinds)} that "
            f"no one column type holds ({str(exc).splitlines()[0]}): map the stream to "
            "one type (new_values_stream().map(...))"
        ) from None
    if not pa.types.is_floating(array.type):
        return array  # (Arrow itself refuses a bool beside integers)
    kinds = set(map(type, values))
    if bool in kinds:  # Arrow takes True beside floats as 1.0: never the same value
        raise SinkRefusedError(
            f"column {name} gets booleans beside numbers (True would be written as 1.0): map "
            "the stream to one type (new_values_stream().map(...))"
        )
    if key:
        whole = next((v for v in values if type(v) is int), None) if int in kinds else None
        if whole is not None:
            raise SinkRefusedError(
                f"key column {name} gets integers and floats ({whole!r} beside a float): they "
                f"are different keys of the state, and one float column would make {whole!r} "
                f"and {float(whole)!r} one row; map the key to one type "
                "(new_values_stream().map(...))"
            )
        negative_zero = next((v for v in values if v == 0 and math.copysign(1, v) < 0), None)
        if negative_zero is not None:
            raise SinkRefusedError(
                f"key column {name} gets -0.0: a key of the state apart from 0.0, which a "
                "table's equality cannot tell from it; map the key (e.g. to 0.0 or a string)"
            )
    return array


def _want(schema: Any, name: str) -> Any:
    """The type of column ``name`` in ``schema`` (None: no schema, or no such column)."""
    return schema.field(name).type if schema is not None and name in schema.names else None


def _same_family(got: Any, want: Any) -> bool:
    """Whether Arrow types ``got`` and ``want`` hold the same values in other layouts (the
    32- and 64-bit offsets of strings and binaries): a cast between them loses nothing."""
    pa = _pyarrow()
    families = (
        (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view),
        (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view),
    )
    return any(any(f(got) for f in fam) and any(f(want) for f in fam) for fam in families)


def _widens(got: Any, want: Any, key: bool) -> bool:
    """Whether values of Arrow type ``got`` may go into a column of type ``want`` when each
    value fits (the cast checks each): integer to integer, float32 to float64, and - for a
    value column only - integer to floating. Delta's and Iceberg's own promotions (int to
    long, float to double) are among them."""
    pa = _pyarrow()
    if pa.types.is_integer(got) and pa.types.is_integer(want):
        return True
    if pa.types.is_float32(got) and pa.types.is_float64(want):
        return True
    return not key and pa.types.is_integer(got) and pa.types.is_floating(want)


def _finite(column: str, array: Any) -> Any:
    """``array`` unless it holds NaN or an infinity (they compare equal to nothing: a reader
    could not find the key), refused like everywhere in tridentflow."""
    pa = _pyarrow()
    import pyarrow.compute as pc

    if not pa.types.is_floating(array.type) or not len(array):
        return array
    bad = pc.or_(pc.is_nan(array), pc.is_inf(array))
    if pc.any(bad).as_py():
        value = array.filter(bad)[0].as_py()
        raise SinkRefusedError(
            f"column {column} gets {value!r}: a value that is not a finite number; map it to "
            "null or a string"
        )
    return array


@dataclass(frozen=True)
class Batch:
    """One txid's rows as Arrow tables (``LakehouseRows.batch``)."""

    every: Any
    """Every row, with the txid column."""
    live: Any
    """The rows that set a key."""
    removed: Any
    """The rows that remove a key (their values null)."""


def untyped(table: Any) -> bool:
    """Whether a column of ``table`` has no type yet (every value null): a table cannot be
    created from it - the first txid whose rows type every column creates it."""
    pa = _pyarrow()
    return any(pa.types.is_null(field.type) for field in table.schema)


def app_id(ctx: ExportContext, sink: str) -> str:
    """The stamp of ``sink``'s commits in ``ctx``'s generation: stable across exports and
    replays, another after a reset or a rewind."""
    return stamp_of(ctx.pipeline, sink, ctx.generation)


def stamp_of(pipeline: str, sink: str, generation: str) -> str:
    """``app_id`` from its parts: what a reader of the table looks the txid up by (Delta's
    ``transaction_version(stamp)``, Iceberg's ``tridentflow.app``); ``status`` shows it."""
    return f"{STAMP}:{pipeline}:{sink}:{generation}"


def to_write(ctx: ExportContext, txid: int, position: int, exists: bool, replace_all: bool) -> bool:
    """Whether a lakehouse sink at ``position`` writes ``txid`` (False: applied already, or a
    racing exporter's reload got there); SinkError for a txid out of order,
    ReloadNeededError for a txid past the generation's first with no table yet (the txids
    before it wrote nothing: their rows are not there)."""
    if replace_all:
        return ctx.resync or position < txid
    if txid <= position:
        return False
    if exists and txid != position + 1:
        raise SinkError(f"the table is at txid {position}, refusing txid {txid} out of order")
    if not exists and txid > 1:
        raise ReloadNeededError(f"no table yet, and txid {txid} is not the generation's first")
    return True


def foreign_table_line(rows: int, writer: str) -> str:
    """The refusal of a table with rows that the sink did not write."""
    return (
        f"the table holds {rows} row(s) that this sink did not write (last written by "
        f"{writer}): tridentflow never writes over another writer's table; point the sink "
        "at another table, or pass adopt=True to the sink to replace its rows with the "
        "state at the next export"
    )


def later_writer_line(what: str, writer: str, position: int, ctx: ExportContext, sink: str) -> str:
    """The refusal of a table ``what`` (a version, a snapshot) another writer committed after
    the sink's txid ``position``."""
    return (
        f"{what} of the table was written by {writer} after this sink's txid {position}: the "
        "table no longer equals the state; reload it from the state with `tridentflow export "
        f"{ctx.pipeline} --sink {sink} --resync` (the other writer's rows are replaced), or "
        "point the sink at another table"
    )


def columns_line(have: Sequence[str], want: Sequence[str], ctx: ExportContext, sink: str) -> str:
    """The refusal of a table whose columns ``have`` are not the stream's ``want``."""
    return (
        f"the table's columns are {', '.join(have)}, the sink writes {', '.join(want)}: reload "
        f"the table in the stream's columns with `tridentflow export {ctx.pipeline} --sink "
        f"{sink} --resync`, or write to a new table"
    )


def check_retention(hours: Any) -> float:
    """``hours`` as a retention of ``tables vacuum``: a finite number >= 0; SinkError (one
    line) otherwise."""
    if (
        isinstance(hours, bool)
        or not isinstance(hours, int | float)
        or not math.isfinite(hours)
        or hours < 0
    ):
        raise SinkRefusedError(
            f"a vacuum's retention is a number of hours >= 0, got {hours!r}: e.g. "
            "--retention-hours 168 (a week; 0 removes every unreferenced file)"
        )
    return float(hours)


def check_mode(sink: str, mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"sink {sink}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode
