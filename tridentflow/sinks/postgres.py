"""PostgresSink: a new-values stream upserted into a PostgreSQL table, exactly once per txid.

Each txid is one SQL transaction: its rows are COPYed into temporary tables, upserted into the
table (``INSERT ... ON CONFLICT (key) DO UPDATE``) and removed keys deleted, and the sink's
progress row (``tridentflow_progress``: pipeline, sink, generation, txid) moves to the txid -
all or nothing. The progress row is read ``FOR UPDATE`` first: an export of a txid already
applied does nothing, one out of order is refused, and of two exporters of the same txid at
once the second waits for the first and then finds it applied. A reader of the table sees
whole txids, never part of one (PostgreSQL's MVCC).

The table belongs to the sink: created on first use (typed columns from the first rows, or
``columns``; ``fillfactor`` 50 by default, so that rewriting a row's values is a HOT update
that leaves the key's index alone: updates run about twice as fast), emptied and refilled in
one transaction when the pipeline was reset (a new generation) or the sink fell behind the
change log (a reload of the whole state). A table that already holds rows the sink did not
write is refused, never emptied.

Needs psycopg 3 (``pip install 'tridentflow[postgres]'``). The DSN: ``dsn``, else
``TRIDENTFLOW_POSTGRES_DSN``, else the Airflow connection ``conn_id`` (under Airflow).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tridentflow.connections import NONE, Connections
from tridentflow.datasets import LineageDataset, postgres_dataset
from tridentflow.sinks.base import (
    ExportContext,
    LineageContext,
    Row,
    Sink,
    SinkError,
    SinkRefusedError,
)

DSN_ENV = "TRIDENTFLOW_POSTGRES_DSN"
PROGRESS_TABLE = "tridentflow_progress"


_PY_TYPES: list[tuple[type, str]] = [
    (bool, "boolean"),  # before int: bool is an int
    (int, "bigint"),
    (float, "double precision"),
    (str, "text"),
]


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        raise SinkRefusedError(
            "PostgresSink needs psycopg 3: pip install 'tridentflow[postgres]'"
        ) from None
    return psycopg


def sql_type_of(values: Sequence[Any]) -> str:
    """The column type for a column's first values: boolean, bigint, double precision (ints
    and floats mixed too), text, else jsonb."""
    seen = {type(v) for v in values if v is not None}
    if not seen:
        return "jsonb"
    if seen <= {int, float}:
        return "bigint" if seen == {int} else "double precision"
    if len(seen) == 1:
        kind = seen.pop()
        for py, sql in _PY_TYPES:
            if kind is py:
                return sql
    return "jsonb"


_ACCEPTS: dict[str, tuple[type, ...]] = {
    "boolean": (bool,),
    "bigint": (int,),
    "integer": (int,),
    "smallint": (int,),
    "double precision": (int, float),
    "real": (int, float),
    "numeric": (int, float),
    "text": (str,),
    "character varying": (str,),
}
"""Python types a column of a typed SQL type takes (bool is refused where int is meant);
jsonb and types not listed take anything psycopg can write."""


_EXACT: dict[str, frozenset[type]] = {
    kind: frozenset({*types, type(None)}) - ({bool} if bool not in types else set())
    for kind, types in _ACCEPTS.items()
}
"""The exact Python types each typed column takes without a closer look (fast path)."""


_KEY_ACCEPTS: dict[str, tuple[type, ...]] = {
    **_ACCEPTS,
    "double precision": (float,),
    "real": (float,),
    "numeric": (int,),
}
"""A key column takes one Python type: 1 and 1.0 are one key to SQL, two to tridentflow."""
_KEY_EXACT: dict[str, frozenset[type]] = {
    kind: frozenset({*types, type(None)}) - ({bool} if bool not in types else set())
    for kind, types in _KEY_ACCEPTS.items()
}


def check_value(column: str, kind: str, value: Any, key: bool = False) -> str | None:
    """Why ``value`` cannot go into ``column`` of SQL type ``kind`` (None: it can). Strict, so
    that keys equal to Python but not to the store (1, 1.0, True) are never written as one."""
    accepted = (_KEY_ACCEPTS if key else _ACCEPTS).get(kind)
    if value is None or accepted is None:
        return None
    if isinstance(value, bool) and bool not in accepted:
        return f"column {column} is {kind}, but the value {value!r} is a bool"
    if not isinstance(value, accepted) or (key and type(value) not in accepted):
        return f"column {column} is {kind}, but the value {value!r:.40} is a {type(value).__name__}"
    return None


_INT_BITS = {"smallint": 16, "integer": 32, "bigint": 64}
REAL_MAX = 3.4028234663852886e38
"""The largest finite ``real`` (float4)."""
_WRAPPED = ("smallint", "integer", "real")
"""Types psycopg's binary COPY writes past their range without a word (40000 into a
smallint lands as -25536, 1e39 into a real as Infinity): checked before the write. Past
``bigint`` it raises, and the failed write is diagnosed (``value_problem``): a bigint or
double precision column costs nothing."""


EXACT_IN_A_DOUBLE = 2**53
"""The largest magnitude below which every integer is exact as a double."""
_INEXACT_INTS = ("double precision",)
"""Types psycopg's COPY writes an integer into as a float, rounding one past 2^53 without a
word: checked before the write."""
INFERRED_COLUMN = "tridentflow: typed from the first rows; widened when a value needs it"
"""The comment on a value column whose type the sink chose (not ``columns=``): such a
column is widened from bigint to double precision when a float comes (``_widened``)."""


def value_problem(column: str, kind: str, value: Any, key: bool = False) -> str | None:
    """Why PostgreSQL (or psycopg) refuses ``value`` in ``column`` of type ``kind``: a wrong
    type (``check_value``), an integer out of the column's range, a string it cannot store
    (NUL, a lone surrogate), a value jsonb cannot hold (NaN, Infinity, not JSON). None: no
    known reason. The slow, thorough check, run on a txid whose write failed. A None in a
    key column: a primary key holds no NULL."""
    if value is None:
        return f"key column {column} gets None, and a primary key holds no NULL" if key else None
    problem = check_value(column, kind, value, key)
    if problem:
        return problem
    bits = _INT_BITS.get(kind)
    if bits and isinstance(value, int) and not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1):
        return f"column {column} is {kind}, but {value} is outside its range (±2^{bits - 1})"
    if kind in ("jsonb", "json"):
        try:
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            return f"column {column} is {kind}, but {value!r:.40} is not JSON ({exc})"
        if "\\u0000" in text:
            return f"column {column} is {kind}, but {value!r:.40} holds a NUL character"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return f"column {column} is {kind}, but {value!r:.40} holds a lone surrogate"
    inexact = kind in _INEXACT_INTS and type(value) is int and abs(value) > EXACT_IN_A_DOUBLE
    if inexact and int(float(value)) != value:
        return f"column {column} is {kind}, but the integer {value} is not exact as a double"
    real = kind == "real" and isinstance(value, (int, float))
    if real and math.isfinite(value) and abs(value) > REAL_MAX:
        return f"column {column} is real, but {value!r:.40} is outside its range (±3.4e38)"
    if isinstance(value, str):
        if "\x00" in value:
            return f"column {column} is {kind}, but {value!r:.40} holds a NUL character"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"column {column} is {kind}, but {value!r:.40} holds a lone surrogate"
    return None


def way_out(table: str, column: str, kind: str, value: Any, key: bool = False) -> str:
    """What to do about a value ``column`` (of SQL type ``kind``) of ``table`` (quoted)
    cannot take."""
    if value is None and key:
        return (
            "map the key's None to a value in the new-values stream (.map(...)), or export to "
            "a DeltaSink or IcebergSink, whose tables keep a None key field as a key"
        )
    if check_value(column, kind, value, key):  # another type than the column's
        return (
            f"declare the column's type (columns={{{column!r}: 'jsonb'}} takes any JSON; an "
            f"existing table: ALTER TABLE {table} ALTER COLUMN {quoted_parts((column,))} TYPE "
            "...), or map the stream's values to one type"
        )
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and (kind in _INT_BITS or kind in _INEXACT_INTS)
    ):
        return (
            f"widen the column (ALTER TABLE {table} ALTER COLUMN {quoted_parts((column,))} "
            f"TYPE numeric; for a new table, columns={{{column!r}: 'numeric'}})"
        )
    if isinstance(value, str) or kind in ("jsonb", "json"):
        return (
            "map the values in the new-values stream (.map(...)) to ones PostgreSQL can "
            "store, e.g. without NUL characters"
        )
    return "map the values in the new-values stream (.map(...)) to ones the column takes"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


MAX_IDENTIFIER_BYTES = 63
"""PostgreSQL's NAMEDATALEN - 1: a longer name is cut silently, so two names could meet."""
STAGE_PREFIX = "tridentflow_stage_"
"""The temporary tables each txid's rows are staged in (session-local, dropped at commit):
PostgreSQL looks temporary tables up first, so no table of the user's may share a name."""
UPSERTS, REMOVALS = STAGE_PREFIX + "upsert", STAGE_PREFIX + "remove"
_TYPE_NAME = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*( [A-Za-z_][A-Za-z0-9_]*)*(\(\d+(, ?\d+)?\))?(\[\])?$"
)
"""A SQL type as ``columns=`` may name it: ``bigint``, ``double precision``, ``numeric(38, 0)``,
``varchar(64)``, ``text[]`` (a type name, never SQL)."""


def check_identifier(what: str, name: Any) -> str:
    """``name`` if PostgreSQL takes it exactly as given (quoted: capitals, spaces, dots and
    quotes are all kept); ValueError (one line) otherwise."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"PostgresSink: {what} must be a non-empty string, got {name!r}")
    if "\x00" in name:
        raise ValueError(f"PostgresSink: {what} {name!r} holds a NUL character")
    if len(name.encode("utf-8", "surrogatepass")) > MAX_IDENTIFIER_BYTES:
        raise ValueError(
            f"PostgresSink: {what} {name[:40]!r}... is longer than PostgreSQL's "
            f"{MAX_IDENTIFIER_BYTES} bytes (it would be cut, and could meet another name); "
            "give a shorter one"
        )
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"PostgresSink: {what} {name!r} is not valid UTF-8") from None
    return name


def split_table(table: Any, what: str = "table") -> tuple[str, ...]:
    """``table`` as (name,) or (schema, name); a tuple is taken part by part (a part may then
    hold a dot). ValueError (one line) if PostgreSQL cannot take it."""
    if isinstance(table, tuple):
        parts = table
    elif isinstance(table, str):
        parts = tuple(table.split("."))
    else:
        raise ValueError(f"PostgresSink: {what} must be 'NAME', 'SCHEMA.NAME' or a tuple")
    if not 1 <= len(parts) <= 2:
        raise ValueError(
            f"PostgresSink: {what} {table!r} is not NAME or SCHEMA.NAME (a name holding a dot: "
            "give (schema, name) as a tuple)"
        )
    for part, label in zip(parts, ("schema", what)[-len(parts) :], strict=True):
        check_identifier(label, part)
    return parts


def check_sql_type(column: str, kind: Any) -> str:
    """``kind`` if it reads as a SQL type name; ValueError (one line) otherwise."""
    if not isinstance(kind, str) or not _TYPE_NAME.match(kind.strip()):
        raise ValueError(
            f"PostgresSink: columns={{{column!r}: {kind!r}}} is not a SQL type name (e.g. "
            "'bigint', 'numeric', 'double precision', 'text', 'jsonb')"
        )
    return kind.strip()


def quoted_parts(parts: Sequence[str]) -> str:
    """Parts of a qualified name, each quoted, joined by dots."""
    return ".".join('"' + part.replace('"', '""') + '"' for part in parts)


def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password replaced by ***."""
    try:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        parts = conninfo_to_dict(dsn)
    except Exception:
        return "<unparsable DSN>"
    if parts.get("password"):
        parts["password"] = "***"
    return make_conninfo(**{k: v for k, v in parts.items() if v is not None})


class PostgresSink(Sink):
    """Upserts each txid's new values into ``table`` (``schema.table`` allowed).

    ``key``: the key columns (default: the state's group fields); every other field of the
    stream is a value column. ``columns``: SQL types by column, overriding the inferred ones.
    """

    resyncable = True

    def __init__(
        self,
        table: str,
        *,
        dsn: str | None = None,
        conn_id: str = "postgres_default",
        key: Sequence[str] | None = None,
        columns: Mapping[str, str] | None = None,
        name: str | None = None,
        progress_table: str = PROGRESS_TABLE,
        fillfactor: int = 50,
    ) -> None:
        parts = split_table(table)
        if parts[-1].startswith(STAGE_PREFIX):
            raise ValueError(
                f"PostgresSink: table names starting with {STAGE_PREFIX!r} are tridentflow's "
                "staging tables; give another name"
            )
        self.progress_parts = split_table(progress_table, "progress_table")
        self.table_parts = parts
        self.table = table if isinstance(table, str) else ".".join(table)
        self._quoted_table = quoted_parts(parts)
        self.dsn = dsn
        self.conn_id = conn_id
        self.key = tuple(key) if key is not None else None
        self.columns = {c: check_sql_type(c, k) for c, k in (columns or {}).items()}
        self.name = name or "postgres-" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.table)
        self.progress_table = progress_table
        if not isinstance(fillfactor, int) or not 10 <= fillfactor <= 100:
            raise ValueError(f"PostgresSink: fillfactor must be 10..100, got {fillfactor!r}")
        self.fillfactor = fillfactor
        self.fields: tuple[str, ...] = ()
        self.key_fields: tuple[str, ...] = ()
        self._conn: Any = None
        self._progress_ready = False
        self._types: dict[str, str] = {}
        self._canonical: dict[str, str] = {}
        """``columns=`` types by their canonical names (``int8`` -> ``bigint``), looked up once."""

    def __repr__(self) -> str:
        return f"PostgresSink({self.table!r}, name={self.name!r})"

    # -- configuration ------------------------------------------------------------------------
    def bind(self, fields: tuple[str, ...], key_fields: tuple[str, ...]) -> PostgresSink:
        key = self.key if self.key is not None else key_fields
        what = f"PostgresSink({self.table})"
        if not key:
            raise ValueError(
                f"{what}: needs key column(s); the state is a global value: map it to a "
                "constant key, or pass key=..."
            )
        missing = [k for k in key if k not in fields]
        if missing:
            raise ValueError(
                f"{what}: key column(s) {missing} are not fields of the stream {list(fields)}; "
                "pass key=..."
            )
        if not [f for f in fields if f not in key]:
            raise ValueError(f"{what}: the stream {list(fields)} has no value column")
        unknown = [c for c in self.columns if c not in fields]
        if unknown:
            raise ValueError(f"{what}: columns={unknown} are not fields of {list(fields)}")
        for field in fields:
            check_identifier("column", field)
        bound = PostgresSink(
            self.table_parts,
            dsn=self.dsn,
            conn_id=self.conn_id,
            key=key,
            columns=self.columns,
            name=self.name,
            progress_table=self.progress_table,
            fillfactor=self.fillfactor,
        )
        bound.fields, bound.key_fields = tuple(fields), tuple(key)
        return bound

    @property
    def value_fields(self) -> tuple[str, ...]:
        return tuple(f for f in self.fields if f not in self.key_fields)

    def resolve_dsn(self, connections: Connections = NONE) -> str:
        """The sink's own ``dsn``, else ``TRIDENTFLOW_POSTGRES_DSN``, else the deployment's
        connection ``conn_id`` (under Airflow: Airflow's); SinkError (one line) if none."""
        if self.dsn:
            return self.dsn
        env = os.environ.get(DSN_ENV)
        if env:
            return env
        found = connections.uri(self.conn_id)
        if found:
            return dsn_of_uri(found)
        raise SinkRefusedError(
            f"sink {self.name}: no PostgreSQL to write to: set {DSN_ENV} (e.g. "
            f"postgresql://postgres@127.0.0.1:5432/postgres), pass dsn=..., or under Airflow "
            f"define the connection {self.conn_id}"
        )

    def claims(self) -> tuple[str, ...]:
        if self.dsn:  # named by a digest: a claim may be shown, the DSN may hold a password
            where = "dsn " + hashlib.sha256(self.dsn.encode()).hexdigest()[:12]
        else:
            where = f"{DSN_ENV} or connection {self.conn_id}"
        return (f"PostgreSQL table {self._quoted_table} ({where})",)

    def lineage_datasets(self, ctx: LineageContext) -> list[LineageDataset]:
        """The table, as its database's dataset (``postgres://HOST:PORT``,
        ``DATABASE.SCHEMA.TABLE``)."""
        return [postgres_dataset(self.resolve_dsn(ctx.connections), self.table_parts)]

    def describe(self) -> str:
        try:
            where = redact_dsn(self.resolve_dsn())
        except SinkError:
            where = "no DSN"
        return f"PostgreSQL table {self.table} ({where})"

    # -- connection ---------------------------------------------------------------------------
    def _connection(self, ctx: ExportContext) -> Any:
        psycopg = _psycopg()
        if self._conn is not None and not self._conn.closed:
            return self._conn
        dsn = self.resolve_dsn(ctx.connections)
        try:
            self._conn = psycopg.connect(dsn, connect_timeout=10)
            self._progress_ready = False
        except psycopg.Error as exc:
            raise SinkError(
                f"sink {self.name}: cannot connect to PostgreSQL at {redact_dsn(dsn)}: "
                f"{self._scrub(str(exc).strip().splitlines()[0], dsn)}"
            ) from None
        return self._conn

    @staticmethod
    def _scrub(text: str, dsn: str) -> str:
        from psycopg.conninfo import conninfo_to_dict

        try:
            password = conninfo_to_dict(dsn).get("password")
        except Exception:
            password = None
        return text.replace(str(password), "***") if password else text

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- SQL ----------------------------------------------------------------------------------
    @staticmethod
    def _ident(parts: Sequence[str]) -> Any:
        from psycopg import sql

        return sql.Identifier(*parts)

    @staticmethod
    def _table_exists(cur: Any, parts: Sequence[str]) -> bool:
        """Whether the table exists, looked up exactly as it is created (quoted)."""
        cur.execute("SELECT to_regclass(%s) IS NOT NULL", (quoted_parts(parts),))
        return bool(cur.fetchone()[0])

    def _ensure_progress(self, conn: Any) -> None:
        from psycopg import sql

        if self._progress_ready:
            return
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('tridentflow-ddl'))")
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (pipeline text NOT NULL, sink text NOT NULL,"
                    " generation text NOT NULL, txid bigint NOT NULL, rows_total bigint NOT "
                    "NULL DEFAULT 0, updated_at timestamptz NOT NULL DEFAULT now(), "
                    "PRIMARY KEY (pipeline, sink))"
                ).format(self._ident(self.progress_parts))
            )
        self._progress_ready = True

    def _create_table(self, cur: Any, rows: Sequence[Row]) -> None:
        from psycopg import sql

        defs = []
        for i, field in enumerate(self.fields):
            kind = self.columns.get(field) or sql_type_of([r[i] for r in rows[:1000]])
            kinds = sorted({type(r[i]).__name__ for r in rows[:1000] if r[i] is not None})
            if field in self.key_fields and field not in self.columns and len(kinds) > 1:
                raise SinkRefusedError(
                    f"sink {self.name}: key column {field} holds {'/'.join(kinds)} values: a "
                    "key column needs one type (PostgreSQL's jsonb takes 1 and 1.0 for one "
                    "key); map the keys to strings in the new-values stream, or declare "
                    f"columns={{{field!r}: ...}}"
                )
            null = " NOT NULL" if field in self.key_fields else ""
            defs.append(
                sql.SQL("{} {}{}").format(sql.Identifier(field), sql.SQL(kind), sql.SQL(null))
            )
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in self.key_fields)
        cur.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({})) WITH (fillfactor = {})"
            ).format(
                self._ident(self.table_parts),
                sql.SQL(", ").join(defs),
                keys,
                sql.Literal(self.fillfactor),
            )
        )
        for field in self.value_fields:
            if field not in self.columns:  # the sink chose the type: it may widen it
                cur.execute(
                    sql.SQL("COMMENT ON COLUMN {}.{} IS {}").format(
                        self._ident(self.table_parts), sql.Identifier(field),
                        sql.Literal(INFERRED_COLUMN),
                    )
                )  # fmt: skip

    def _column_types(self, cur: Any) -> dict[str, str]:
        cur.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attnum > 0 AND NOT attisdropped",
            (self._quoted_table,),
        )
        return {name: kind.split("(")[0] for name, kind in cur.fetchall()}

    def position(self, ctx: ExportContext) -> int:
        psycopg = _psycopg()
        conn = self._connection(ctx)
        try:
            return self._position(conn, ctx)
        except psycopg.Error as exc:
            self._forget_if_broken(conn)
            raise SinkError(
                f"sink {self.name}: cannot read its progress in {self.progress_table}: "
                f"{type(exc).__name__}: {_first_line(exc)}"
            ) from None

    def _forget_if_broken(self, conn: Any) -> None:
        if conn.closed or conn.broken:
            self._conn = None
        else:
            conn.rollback()

    def _position(self, conn: Any, ctx: ExportContext) -> int:
        from psycopg import sql

        with conn.transaction(), conn.cursor() as cur:
            if not self._table_exists(cur, self.progress_parts):
                return 0
            cur.execute(
                sql.SQL("SELECT generation, txid FROM {} WHERE pipeline = %s AND sink = %s").format(
                    self._ident(self.progress_parts)
                ),
                (ctx.pipeline, self.name),
            )
            row = cur.fetchone()
        if row is None or row[0] != ctx.generation:
            return 0
        return int(row[1])

    def apply(
        self, ctx: ExportContext, txid: int, rows: Sequence[Row], replace_all: bool = False
    ) -> bool:
        psycopg = _psycopg()
        conn = self._connection(ctx)
        try:
            return self._apply(conn, ctx, txid, rows, replace_all)
        except SinkError:
            raise
        except Exception as exc:  # psycopg's, or Python's while encoding a value
            if isinstance(exc, psycopg.Error):
                self._forget_if_broken(conn)
            else:  # the COPY stopped half-way in Python: the session is of no more use
                self.close()
            found = self._diagnose(txid, rows)
            if found is not None:
                raise found from None
            if not isinstance(exc, psycopg.Error):
                raise
            first = _first_line(exc)
            hint = ""
            if isinstance(exc, (psycopg.errors.DataException, psycopg.errors.CardinalityViolation)):
                hint = (
                    "; check the column types (columns={...}) and that the key columns "
                    f"{list(self.key_fields)} are unique in each txid"
                )
            raise SinkError(
                f"sink {self.name}: txid {txid} not applied to {self.table}: "
                f"{type(exc).__name__}: {first}{hint}"
            ) from None

    def _apply(
        self, conn: Any, ctx: ExportContext, txid: int, rows: Sequence[Row], replace_all: bool
    ) -> bool:
        """One txid in one transaction: the table's lock, its progress row claimed, the rows
        written (over an emptied table for a reload or a new generation), the progress row
        moved. False if the progress row says the txid is applied already."""
        from psycopg import sql

        self._ensure_progress(conn)
        progress = self._ident(self.progress_parts)
        table = self._ident(self.table_parts)
        with conn.transaction(), conn.cursor() as cur:
            self._lock_table(cur, ctx)
            table_existed = self._table_exists(cur, self.table_parts)
            typed = self._keys_typed(rows)
            if not table_existed and rows and typed:  # types come from the first rows
                self._create_table(cur, rows)
            generation, applied = self._claim_progress(cur, ctx, progress, table, table_existed)
            same_generation = generation == ctx.generation
            if same_generation and applied >= txid and not (replace_all and ctx.resync):
                return False  # already applied: this transaction rolls back, nothing changed
            empty = not table_existed
            if replace_all or not same_generation:
                if table_existed:
                    cur.execute(sql.SQL("DELETE FROM {}").format(table))
                empty = True
            elif applied != txid - 1:
                raise SinkError(
                    f"sink {self.name}: table {self.table} is at txid {applied}, so txid "
                    f"{txid} cannot be applied yet: export txid {applied + 1} first"
                )
            if table_existed or typed:
                written = self._write_rows(cur, table, rows, empty, txid)
            else:  # no table yet, and these rows type no key column: removals, or refused
                written = self._untyped_rows(txid, rows)
            ctx.fire("mid-export", txid)
            self._note_progress(cur, ctx, progress, txid, written)
        return True

    def _lock_table(self, cur: Any, ctx: ExportContext) -> None:
        """Exporters of one table queue here - its creation and every txid's write, one at a
        time (the progress row then decides what is left to do); one that waited while the
        pipeline was reset or rewound writes nothing (SinkError)."""
        cur.execute(
            "SELECT pg_advisory_xact_lock(hashtext(%s))", (f"tridentflow:{self._quoted_table}",)
        )
        now = ctx.generation_now()
        if now is not None and now != ctx.generation:
            raise SinkError(
                f"sink {self.name}: pipeline {ctx.pipeline} was reset or rewound while this "
                "export waited for the table; nothing written: export again"
            )

    def _claim_progress(
        self, cur: Any, ctx: ExportContext, progress: Any, table: Any, table_existed: bool
    ) -> tuple[str, int]:
        """The sink's progress row (generation, txid), locked for this transaction; created
        if new - and then a table that already held rows is someone else's: refused in one
        line, never written over."""
        from psycopg import sql

        cur.execute(
            sql.SQL(
                "INSERT INTO {} (pipeline, sink, generation, txid) VALUES (%s, %s, '', 0) "
                "ON CONFLICT DO NOTHING RETURNING 1"
            ).format(progress),
            (ctx.pipeline, self.name),
        )
        new_progress = cur.fetchone() is not None
        cur.execute(
            sql.SQL(
                "SELECT generation, txid FROM {} WHERE pipeline = %s AND sink = %s FOR UPDATE"
            ).format(progress),
            (ctx.pipeline, self.name),
        )
        generation, applied = cur.fetchone()
        if new_progress and table_existed:
            cur.execute(sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(table))
            if cur.fetchone()[0]:
                raise SinkRefusedError(
                    f"sink {self.name}: table {self.table} already holds rows that this "
                    "sink did not write; point the sink at a new table, or empty this one"
                )
        return generation, applied

    def _note_progress(
        self, cur: Any, ctx: ExportContext, progress: Any, txid: int, written: int
    ) -> None:
        """The progress row moved to ``txid`` (in the transaction that wrote its rows)."""
        from psycopg import sql

        cur.execute(
            sql.SQL(
                "UPDATE {} SET generation = %s, txid = %s, rows_total = rows_total + %s, "
                "updated_at = now() WHERE pipeline = %s AND sink = %s"
            ).format(progress),
            (ctx.generation, txid, written, ctx.pipeline, self.name),
        )

    def _keys_typed(self, rows: Sequence[Row]) -> bool:
        """Whether ``rows`` give every key column a type (a value that is not None, or a type
        ``columns=`` declares): a key column is never made jsonb from no value - jsonb's
        equality would make 1 and 1.0, 1e16 and 10**16 one key."""
        undeclared = [self.fields.index(k) for k in self.key_fields if k not in self.columns]
        return all(any(row[i] is not None for row in rows) for i in undeclared)

    def _untyped_rows(self, txid: int, rows: Sequence[Row]) -> int:
        """A txid before the table exists whose rows type no key column: the removals have
        nothing to remove (0 rows written); a row that sets a key is refused in one line (its
        None key field: a primary key holds no NULL)."""
        values = [i for i, f in enumerate(self.fields) if f not in self.key_fields]
        for row in rows:
            if any(row[i] is not None for i in values):
                index = next(
                    self.fields.index(k) for k in self.key_fields
                    if row[self.fields.index(k)] is None
                )  # fmt: skip
                raise self._value_error(txid, row, index, "")
        return 0

    def _checked_types(self, cur: Any) -> dict[str, str]:
        """The table's column types (remembered for ``_diagnose``); SinkError (one line) if a
        field of the stream has no column, or ``columns=`` declares a type the table's column
        does not have (the table was made before the declaration)."""
        types = self._column_types(cur)
        self._types = types
        table = self._quoted_table
        for field in self.fields:
            if field not in types:
                kind = self.columns.get(field, "...")
                raise SinkRefusedError(
                    f"sink {self.name}: table {self.table} has no column {field} (the stream's "
                    f"fields are {list(self.fields)}): ALTER TABLE {table} ADD COLUMN "
                    f"{quoted_parts((field,))} {kind}, or point the sink at a new table"
                )
        for field, declared in self.columns.items():
            want = self._canonical.get(declared)
            if want is None:  # asked once per sink: a type's canonical name does not change
                cur.execute("SELECT format_type(%s::regtype, NULL)", (declared,))
                want = self._canonical[declared] = cur.fetchone()[0].split("(")[0]
            if types[field] != want:
                raise SinkRefusedError(
                    f"sink {self.name}: columns= declares {field} as {declared}, but table "
                    f"{self.table} has it as {types[field]}: ALTER TABLE {table} ALTER COLUMN "
                    f"{quoted_parts((field,))} TYPE {declared}, or point the sink at a new table"
                )
        return types

    def _value_error(self, txid: int, row: Row, index: int, kind: str) -> SinkError:
        """The one line for a value of ``row`` its column cannot take: key, txid, column, why
        and the way out."""
        field = self.fields[index]
        is_key = field in self.key_fields
        key = [row[self.fields.index(k)] for k in self.key_fields]
        problem = value_problem(field, kind, row[index], is_key)
        problem = problem or f"column {field} ({kind}) refused {row[index]!r:.40}"
        return SinkRefusedError(
            f"sink {self.name}: txid {txid} not applied to {self.table}: key {key!r:.80}: "
            f"{problem}; {way_out(self._quoted_table, field, kind, row[index], is_key)}"
        )

    def _check_range(self, txid: int, rows: Sequence[Row], index: int, kind: str) -> None:
        """SinkError (one line, the first such key) if a value of column ``index`` is past
        the range of its SQL type ``kind`` (smallint, integer, real), or an integer past 2^53
        is not exact in a double precision one: binary COPY would write 40000 into a smallint
        as -25536, 1e39 into a real as Infinity, 2^53+1 as 2^53, without a word."""
        values = [v for row in rows if (v := row[index]) is not None]
        if not values:
            return
        if kind == "real":
            if not any(math.isfinite(v) and abs(v) > REAL_MAX for v in values):
                return
        elif kind in _INEXACT_INTS:
            if not any(type(v) is int and abs(v) > EXACT_IN_A_DOUBLE for v in values):
                return
        else:
            limit = 2 ** (_INT_BITS[kind] - 1)
            if -limit <= min(values) and max(values) < limit:
                return
        for row in rows:
            if value_problem(self.fields[index], kind, row[index]):
                raise self._value_error(txid, row, index, kind)

    @staticmethod
    def _widens(rows: Sequence[Row], index: int) -> bool:
        """Whether column ``index`` of ``rows`` holds floats, each finite (NaN or Infinity
        is no number a bigint column widens for: refused as before)."""
        floats = [v for row in rows if type(v := row[index]) is float]
        return bool(floats) and all(map(math.isfinite, floats))

    def _widened(self, cur: Any, table: Any, txid: int, rows: Sequence[Row], index: int) -> str:
        """ "double precision" once value column ``index`` - bigint, a float among this txid's
        values - was widened to it in this transaction (JSON's ``3`` before ``12.5``): only a
        column whose type the sink chose from the first rows (not one ``columns=`` declares,
        or a table made beforehand), and only while every integer it holds is exact as a
        double (|v| <= 2^53); else the one line of the refusal."""
        from psycopg import sql

        field = self.fields[index]
        column = sql.Identifier(field)
        cur.execute(
            "SELECT col_description(attrelid, attnum) FROM pg_attribute "
            "WHERE attrelid = to_regclass(%s) AND attname = %s",
            (self._quoted_table, field),
        )
        found = cur.fetchone()
        if found is not None and found[0] == INFERRED_COLUMN:
            cur.execute(
                sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE abs({}) > {})").format(
                    table, column, sql.Literal(EXACT_IN_A_DOUBLE)
                )
            )
            if not cur.fetchone()[0]:
                cur.execute(
                    sql.SQL("ALTER TABLE {} ALTER COLUMN {} TYPE double precision").format(
                        table, column
                    )
                )
                return "double precision"
        row = next(row for row in rows if type(row[index]) is float)
        raise self._value_error(txid, row, index, "bigint")

    def _diagnose(self, txid: int, rows: Sequence[Row]) -> SinkError | None:
        """After a failed write: the first value PostgreSQL (or psycopg) cannot take, as the
        one line to say; None if none is known (the failure is said as it came)."""
        types = getattr(self, "_types", None)
        if not types:
            return None
        for row in rows:
            for i, field in enumerate(self.fields):
                kind = types.get(field, "")
                if value_problem(field, kind, row[i], field in self.key_fields):
                    return self._value_error(txid, row, i, kind)
        return None

    def _write_rows(self, cur: Any, table: Any, rows: Sequence[Row], empty: bool, txid: int) -> int:
        """Upsert the rows with values, delete the keys whose values are all None: COPY
        (binary) into two temporary tables, then one INSERT ... ON CONFLICT and one DELETE.
        Into a table this transaction created or emptied (``empty``), COPY straight in."""
        from psycopg import sql

        if not rows:
            return 0
        types = self._checked_columns(cur, table, rows, txid)
        upserts, removals = self._upserts_and_removals(rows, types)
        cols = sql.SQL(", ").join(sql.Identifier(f) for f in self.fields)
        if upserts and empty:
            _copy(cur, sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(table, cols),
                  [types[f] for f in self.fields], upserts)  # fmt: skip
            return len(rows)
        if upserts:
            self._upsert(cur, table, cols, types, upserts)
        if removals:
            self._delete(cur, table, types, removals)
        return len(rows)

    def _checked_columns(
        self, cur: Any, table: Any, rows: Sequence[Row], txid: int
    ) -> dict[str, str]:
        """Each column's type, every value held to it (one pass per typed column, exact types
        first); a bigint value column widened first where a value needs it. One line naming
        the txid, the key and the column for a value the column cannot take."""
        types = self._checked_types(cur)
        for i, field in enumerate(self.fields):
            kind = types.get(field, "")
            is_key = field in self.key_fields
            if kind == "bigint" and not is_key and self._widens(rows, i):
                kind = types[field] = self._widened(cur, table, txid, rows, i)
            exact = (_KEY_EXACT if is_key else _EXACT).get(kind)
            if exact is None:
                continue
            for row in rows:
                if type(row[i]) not in exact and check_value(field, kind, row[i], is_key):
                    raise self._value_error(txid, row, i, kind)
            if kind in _WRAPPED or kind in _INEXACT_INTS:  # the COPY would not say: check
                self._check_range(txid, rows, i, kind)
        return types

    def _upserts_and_removals(
        self, rows: Sequence[Row], types: dict[str, str]
    ) -> tuple[list[Row], list[tuple[Any, ...]]]:
        """The rows to upsert (JSON columns wrapped for psycopg) and the keys to delete (every
        value None)."""
        from psycopg.types.json import Jsonb

        fields = self.fields
        key_idx = [fields.index(k) for k in self.key_fields]
        value_idx = [i for i, f in enumerate(fields) if f not in self.key_fields]
        if len(value_idx) == 1:
            (v,) = value_idx
            upserts = [row for row in rows if row[v] is not None]
            removed = [row for row in rows if row[v] is None]
        else:
            upserts = [row for row in rows if any(row[i] is not None for i in value_idx)]
            removed = [row for row in rows if all(row[i] is None for i in value_idx)]
        json_idx = [i for i, f in enumerate(fields) if types.get(f) in ("jsonb", "json")]
        if json_idx:
            wrapped = []
            for row in upserts:
                values = list(row)
                for i in json_idx:
                    if values[i] is not None:
                        values[i] = Jsonb(values[i])
                wrapped.append(tuple(values))
            upserts = wrapped
        return upserts, [tuple(row[i] for i in key_idx) for row in removed]

    def _upsert(
        self, cur: Any, table: Any, cols: Any, types: dict[str, str], upserts: list[Row]
    ) -> None:
        """COPY ``upserts`` into UPSERTS, then one INSERT ... ON CONFLICT DO UPDATE."""
        from psycopg import sql

        fields = self.fields
        _stage(cur, UPSERTS, cols, table, [types[f] for f in fields], upserts)
        keys = sql.SQL(", ").join(sql.Identifier(k) for k in self.key_fields)
        updates = sql.SQL(", ").join(
            sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(f), sql.Identifier(f))
            for f in fields
            if f not in self.key_fields
        )
        cur.execute(
            sql.SQL(
                "INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) DO UPDATE SET {}"
            ).format(table, cols, cols, sql.Identifier(UPSERTS), keys, updates)
        )

    def _delete(
        self, cur: Any, table: Any, types: dict[str, str], removals: list[tuple[Any, ...]]
    ) -> None:
        """COPY the removed keys into REMOVALS, then one DELETE ... USING."""
        from psycopg import sql

        keys = sql.SQL(", ").join(sql.Identifier(k) for k in self.key_fields)
        _stage(cur, REMOVALS, keys, table, [types[k] for k in self.key_fields], removals)
        match = sql.SQL(" AND ").join(
            sql.SQL("t.{} = r.{}").format(sql.Identifier(k), sql.Identifier(k))
            for k in self.key_fields
        )
        cur.execute(
            sql.SQL("DELETE FROM {} t USING {} r WHERE {}").format(
                table, sql.Identifier(REMOVALS), match
            )
        )


def _copy(cur: Any, statement: Any, types: list[str], rows: Sequence[Row]) -> None:
    """COPY ``rows`` (binary, typed) through ``statement``."""
    with cur.copy(statement) as copy:
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)


def _stage(
    cur: Any, name: str, cols: Any, table: Any, types: list[str], rows: Sequence[Row]
) -> None:
    """A temporary table ``name`` (dropped at commit) with ``cols`` of ``table``, filled."""
    from psycopg import sql

    cur.execute(
        sql.SQL(
            "CREATE TEMPORARY TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA"
        ).format(sql.Identifier(name), cols, table)
    )
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(name), cols
    )
    _copy(cur, statement, types, rows)


def dsn_of_uri(uri: str) -> str:
    """An Airflow connection URI (``postgres://...``) as a libpq URI (``postgresql://``),
    without Airflow's extras that libpq does not know."""
    if uri.startswith("postgres://"):
        uri = "postgresql://" + uri[len("postgres://") :]
    return uri


__all__ = ["DSN_ENV", "PostgresSink", "dsn_of_uri", "redact_dsn", "sql_type_of"]
