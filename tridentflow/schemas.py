"""Typed fields for DataFrame and SQL steps, without a JVM: Spark's DDL (``"word string, n
bigint"``, as ``applyInPandas`` takes it) parsed here, so a pipeline's fields and their types
are known when it is built - validated before a txid is bound - and turned into Spark and
Arrow schemas only where Spark runs (pyspark is imported lazily).

``Schema`` is an ordered tuple of (name, ``FieldType``); ``parse_schema`` takes DDL text, a
pyspark ``StructType`` or a ``Schema``. ``RecordCheck`` is the record-stage step that holds a
source record's values to their declared types (a value that does not fit is a bad record,
quarantined like any other, never a failed Spark job)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tridentflow.errors import BadRecordError, PipelineError

INTEGRAL = {"tinyint": 8, "smallint": 16, "int": 32, "bigint": 64}
FLOATING = frozenset({"float", "double"})
ALIASES = {
    "byte": "tinyint",
    "short": "smallint",
    "integer": "int",
    "long": "bigint",
    "real": "float",
    "bool": "boolean",
    "varchar": "string",
    "char": "string",
    "text": "string",
    "dec": "decimal",
    "numeric": "decimal",
    "timestamp_ltz": "timestamp",
}
SCALARS = frozenset(
    {*INTEGRAL, *FLOATING, "string", "boolean", "binary", "date", "timestamp", "timestamp_ntz"}
)


@dataclass(frozen=True)
class FieldType:
    """One Spark type: ``kind`` (a scalar's canonical name, or decimal, array, map, struct)
    and its arguments: decimal (precision, scale); array (element,); map (key, value);
    struct ((name, type), ...)."""

    kind: str
    args: tuple[Any, ...] = ()

    def ddl(self) -> str:
        if self.kind == "decimal":
            return f"decimal({self.args[0]},{self.args[1]})"
        if self.kind == "array":
            return f"array<{self.args[0].ddl()}>"
        if self.kind == "map":
            return f"map<{self.args[0].ddl()},{self.args[1].ddl()}>"
        if self.kind == "struct":
            return "struct<" + ",".join(f"{n}:{t.ddl()}" for n, t in self.args) + ">"
        return self.kind

    @property
    def integral(self) -> bool:
        return self.kind in INTEGRAL

    @property
    def numeric(self) -> bool:
        return self.kind in INTEGRAL or self.kind in FLOATING or self.kind == "decimal"

    @property
    def json_like(self) -> bool:
        """Whether Python's value of it (from Arrow) is a JSON value tridentflow can key and
        stage: strings, numbers, booleans and their arrays, string-keyed maps and structs."""
        if self.kind in ("string", "boolean") or self.kind in INTEGRAL or self.kind in FLOATING:
            return True
        if self.kind == "array":
            return self.args[0].json_like
        if self.kind == "map":
            return self.args[0].kind == "string" and self.args[1].json_like
        if self.kind == "struct":
            return all(t.json_like for _n, t in self.args)
        return False

    def to_spark(self) -> Any:
        from pyspark.sql import types as T

        simple = {
            "tinyint": T.ByteType,
            "smallint": T.ShortType,
            "int": T.IntegerType,
            "bigint": T.LongType,
            "float": T.FloatType,
            "double": T.DoubleType,
            "string": T.StringType,
            "boolean": T.BooleanType,
            "binary": T.BinaryType,
            "date": T.DateType,
            "timestamp": T.TimestampType,
            "timestamp_ntz": T.TimestampNTZType,
        }
        if self.kind in simple:
            return simple[self.kind]()
        if self.kind == "decimal":
            return T.DecimalType(*self.args)
        if self.kind == "array":
            return T.ArrayType(self.args[0].to_spark())
        if self.kind == "map":
            return T.MapType(self.args[0].to_spark(), self.args[1].to_spark())
        return T.StructType([T.StructField(n, t.to_spark()) for n, t in self.args])


@dataclass(frozen=True)
class Schema:
    """Named, typed fields, in order."""

    fields: tuple[tuple[str, FieldType], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _type in self.fields)

    def type_of(self, name: str) -> FieldType:
        return dict(self.fields)[name]

    def ddl(self) -> str:
        return ", ".join(f"{_quoted(n)} {t.ddl()}" for n, t in self.fields)

    def select(self, names: tuple[str, ...]) -> Schema:
        types = dict(self.fields)
        return Schema(tuple((n, types[n]) for n in names))

    def to_spark(self) -> Any:
        """The pyspark StructType (every field nullable)."""
        return FieldType("struct", self.fields).to_spark()

    def to_arrow(self) -> Any:
        """The Arrow schema Spark's ``mapInArrow`` expects for it."""
        from pyspark.sql.pandas.types import to_arrow_schema

        return to_arrow_schema(self.to_spark())


def _quoted(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) else f"`{name}`"


_TOKEN = re.compile(r"\s*(`(?:[^`]|``)*`|[A-Za-z_][A-Za-z0-9_]*|\d+|[<>(),:])")


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[str] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            match = _TOKEN.match(text, pos)
            if match is None:
                self.fail(f"unexpected {text[pos:].strip()[:20]!r}")
            self.tokens.append(match.group(1))
            pos = match.end()
        self.at = 0

    def fail(self, why: str) -> Any:
        raise PipelineError(
            f"schema {self.text!r}: {why} (expected Spark DDL, e.g. 'word string, n bigint')"
        )

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token.lower() != expected):
            self.fail(f"expected {expected or 'more'}, got {token or 'the end'}")
        self.at += 1
        return token  # type: ignore[return-value]

    def name(self) -> str:
        token = self.take()
        if token.startswith("`"):
            return token[1:-1].replace("``", "`")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", token):
            self.fail(f"{token!r} is not a field name")
        return token

    def fields(self, closing: str | None) -> tuple[tuple[str, FieldType], ...]:
        out: list[tuple[str, FieldType]] = []
        while True:
            name = self.name()
            if self.peek() == ":":
                self.take()
            out.append((name, self.type()))
            if self.peek() == ",":
                self.take()
                continue
            if self.peek() == closing:
                return tuple(out)
            self.fail(f"expected ',' after field {name}, got {self.peek() or 'the end'}")

    def type(self) -> FieldType:
        word = self.take().lower()
        kind = ALIASES.get(word, word)
        if kind == "string" and self.peek() == "(":  # varchar(n), char(n): strings
            self.take("(")
            self.take()
            self.take(")")
        if kind in SCALARS:
            return FieldType(kind)
        if kind == "decimal":
            precision, scale = 10, 0
            if self.peek() == "(":
                self.take("(")
                precision = int(self.take())
                if self.peek() == ",":
                    self.take(",")
                    scale = int(self.take())
                self.take(")")
            return FieldType("decimal", (precision, scale))
        if kind == "array":
            self.take("<")
            element = self.type()
            self.take(">")
            return FieldType("array", (element,))
        if kind == "map":
            self.take("<")
            key = self.type()
            self.take(",")
            value = self.type()
            self.take(">")
            return FieldType("map", (key, value))
        if kind == "struct":
            self.take("<")
            members = self.fields(">")
            self.take(">")
            return FieldType("struct", members)
        return self.fail(f"unknown type {word!r}")


def parse_schema(schema: str | Schema | Any) -> Schema:
    """``schema`` (DDL text, a pyspark StructType, or a Schema) as a Schema; PipelineError in
    one line if it is not one, is empty, or repeats a name."""
    if isinstance(schema, Schema):
        return schema
    if not isinstance(schema, str):
        simple = getattr(schema, "simpleString", None)
        if simple is None or not callable(simple):
            raise PipelineError(
                f"schema {schema!r:.80}: expected Spark DDL text ('word string, n bigint') "
                "or a pyspark StructType"
            )
        text = simple()
        if text.startswith("struct<") and text.endswith(">"):
            text = text[len("struct<") : -1]
        return parse_schema(text)
    parser = _Parser(schema)
    if not parser.tokens:
        parser.fail("no fields")
    fields = parser.fields(None)
    names = [n for n, _t in fields]
    if len(set(names)) != len(names):
        parser.fail(f"a field name repeats in {names}")
    return Schema(fields)


# -- the record stage: a record's values held to their declared types ------------------------


def _checker(kind: FieldType) -> Callable[[Any], bool]:
    """A predicate: whether a JSON-decoded value fits ``kind`` (None fits every type)."""
    if kind.kind == "string":
        return lambda v: v is None or type(v) is str
    if kind.kind == "boolean":
        return lambda v: v is None or type(v) is bool
    if kind.integral:
        bits = INTEGRAL[kind.kind]
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        return lambda v: v is None or (type(v) is int and low <= v <= high)
    if kind.kind in FLOATING:
        return lambda v: v is None or type(v) in (int, float)
    if kind.kind == "array":
        element = _checker(kind.args[0])
        return lambda v: v is None or (type(v) is list and all(element(x) for x in v))
    if kind.kind == "map":
        value = _checker(kind.args[1])
        return lambda v: (
            v is None
            or (type(v) is dict and all(type(k) is str and value(x) for k, x in v.items()))
        )
    if kind.kind == "struct":
        members = [(n, _checker(t)) for n, t in kind.args]
        return lambda v: (
            v is None or (type(v) is dict and all(check(v.get(n)) for n, check in members))
        )
    raise PipelineError(
        f"a source field of type {kind.ddl()} cannot come from a JSON record; declare it as "
        "a string and convert it in the step (e.g. F.to_date(...), CAST(... AS DECIMAL))"
    )


def check_source_types(schema: Schema) -> None:
    """PipelineError (one line) unless every field's type can hold a JSON record's value."""
    for _name, kind in schema.fields:
        _checker(kind)


@dataclass(frozen=True)
class RecordCheck:
    """A per-tuple step (tridentflow.plan's Step contract): the tuple itself if each value
    fits its field's declared type; a BadRecordError naming the field otherwise."""

    schema: Schema

    def __call__(self, row: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        checks = _checks(self.schema)
        for value, (name, check, kind) in zip(row, checks, strict=True):
            if not check(value):
                raise BadRecordError(
                    f"field {name} is declared {kind}, got {value!r:.80} ({type(value).__name__})"
                )
        return [row]


_CHECKS: dict[Schema, list[tuple[str, Callable[[Any], bool], str]]] = {}


def _checks(schema: Schema) -> list[tuple[str, Callable[[Any], bool], str]]:
    found = _CHECKS.get(schema)
    if found is None:
        found = _CHECKS[schema] = [(n, _checker(t), t.ddl()) for n, t in schema.fields]
    return found
