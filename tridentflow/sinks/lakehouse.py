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
* Schema: the table is created from the first rows; later rows must fit it. A column whose
  type differs, or a value no column type can hold, is refused in one line with the way out -
  never cast silently.
* Each applied txid's table version (Delta) or snapshot id (Iceberg) is mirrored in the
  pipeline's Redis (``ExportContext.note_version``): ``status`` shows it, ``query``-free time
  travel reads the table as of a txid with it. The table is the truth; the mirror may lag.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from tridentflow.sinks.base import ExportContext, Row, SinkError

MODES = ("upsert", "append")
TXID_COLUMN = "txid"
STAMP = "tridentflow"
"""The prefix of every stamp a lakehouse sink writes (Delta app ids, Iceberg properties)."""


def _pyarrow() -> Any:
    import pyarrow as pa

    return pa


class LakehouseRows:
    """A bound lakehouse sink's columns and how a txid's rows become an Arrow table."""

    def __init__(self, sink: str, fields: tuple[str, ...], key_fields: tuple[str, ...]):
        if TXID_COLUMN in fields:
            raise ValueError(
                f"sink {sink}: the stream has a field named {TXID_COLUMN!r}, the column the "
                "sink writes each row's txid to: rename it with .map(...)"
            )
        missing = [k for k in key_fields if k not in fields]
        if missing:
            raise ValueError(f"sink {sink}: key field(s) {missing} are not in the stream {fields}")
        self.sink = sink
        self.fields = fields
        self.key_fields = key_fields
        self.value_fields = tuple(f for f in fields if f not in key_fields)
        self.columns = (*fields, TXID_COLUMN)

    def split(self, rows: Sequence[Row]) -> tuple[list[Row], list[Row]]:
        """(rows that set a key, rows that remove one: every value None)."""
        width = len(self.key_fields)
        key_at = [self.fields.index(k) for k in self.key_fields]
        value_at = [i for i in range(len(self.fields)) if i not in key_at]
        live, removed = [], []
        for row in rows:
            if len(row) != len(self.fields):
                raise SinkError(
                    f"a row has {len(row)} values, the stream {len(self.fields)} fields "
                    f"{self.fields}"
                )
            (removed if all(row[i] is None for i in value_at) and width else live).append(row)
        return live, removed

    def arrow(self, rows: Sequence[Row], txid: int, schema: Any = None) -> Any:
        """The rows and their txid as an Arrow table - of ``schema`` (the table's) when
        given: SinkError (one line) for a value that does not fit a column, never a cast."""
        pa = _pyarrow()
        columns: dict[str, list[Any]] = {name: [] for name in self.fields}
        for row in rows:
            for name, value in zip(self.fields, row, strict=True):
                columns[name].append(_checked(name, value))
        arrays = {}
        for name, values in columns.items():
            want = schema.field(name).type if schema is not None and name in schema.names else None
            arrays[name] = self._array(name, values, want)
        arrays[TXID_COLUMN] = pa.array([txid] * len(rows), pa.int64())
        return pa.table(arrays)

    def _array(self, name: str, values: list[Any], want: Any) -> Any:
        pa = _pyarrow()
        try:
            inferred = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            kinds = sorted({type(v).__name__ for v in values if v is not None})
            raise SinkError(
                f"column {name} gets values of types {', '.join(kinds)} that "
                f"no one column type holds ({str(exc).splitlines()[0]}): map the stream to "
                "one type (new_values_stream().map(...))"
            ) from None
        if want is None or inferred.type == want:
            return inferred
        if pa.types.is_null(inferred.type):  # all None: the table's type, nothing to cast
            return pa.nulls(len(values), want)
        if _same_family(inferred.type, want):  # string / large_string: the same values
            return inferred.cast(want)
        raise SinkError(
            f"column {name} is {want} in the table, but this txid's values "
            f"are {inferred.type}: map the stream to {want} (new_values_stream().map(...)), "
            "or write to a new table"
        )


def _same_family(got: Any, want: Any) -> bool:
    """Whether Arrow types ``got`` and ``want`` hold the same values in other layouts (the
    32- and 64-bit offsets of strings and binaries): a cast between them loses nothing."""
    pa = _pyarrow()
    families = (
        (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view),
        (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view),
    )
    return any(any(f(got) for f in fam) and any(f(want) for f in fam) for fam in families)


def _checked(column: str, value: Any) -> Any:
    """``value`` as a column can hold it: NaN and the infinities refused (they compare equal
    to nothing: a reader could not find the key), like everywhere in tridentflow."""
    if isinstance(value, float) and not math.isfinite(value):
        raise SinkError(
            f"column {column} gets {value!r}: a value that is not a finite "
            "number; map it to null or a string"
        )
    return value


def app_id(ctx: ExportContext, sink: str) -> str:
    """The stamp of ``sink``'s commits in ``ctx``'s generation: stable across exports and
    replays, another after a reset or a rewind."""
    return f"{STAMP}:{ctx.pipeline}:{sink}:{ctx.generation}"


def check_mode(sink: str, mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"sink {sink}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    return mode
