"""The chaos harness's typed pipeline: the "types" family (issue 65 goal 4).

The harness's other pipelines export their states through a canonical mapping (the key's
encoding and the value as JSON text), so a table never meets a value type. This one exports
its state as it is, column by column, to a Delta table, an Iceberg table and a PostgreSQL
table, and its records draw the value types that made tables disagree with the state:

* a key field that is None (``name`` of the words ``a`` and ``1``): a MERGE that matches with
  ``=`` gives such a key a new row at every txid that changes it;
* a key field that is None for most keys (``label``: set for three words only): the column
  is all None in every txid none of them is in, the first one included;
* numbers that are sometimes ints: ``amount`` is the word's length, plus a half for four
  words, so ``total`` is an int for some keys and a float for others, and a txid whose new
  values are all ints meets a table whose column became double.

Halves add exactly in binary floating point, so a recount in another order is equal.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tridentflow.aggregators import Sum
from tridentflow.nodes import StateSpec
from tridentflow.pipeline import Pipeline
from tridentflow.sources.specs import LogSource, SourceMode
from tridentflow_state.maps import StateKind

TYPED_PIPELINE = "tridentflow.devtools.chaos.typed:typed_sums"
"""The family's pipeline, as the harness loads it."""
TYPED_NAME = "chaos-typed"
TYPED_STATE = "totals"
KEY_FIELDS = ("name", "label")
VALUE_FIELD = "total"
NO_NAME = frozenset({"a", "1"})
LABELS = {"ünï": "u", "中文": "z", "true": "t"}
HALVES = frozenset({"1.0", "0.0", "-0.0", "nice"})


def typed_fields(sentence: str) -> Iterator[tuple[str | None, str | None, int | float]]:
    """(name, label, amount) of each word of ``sentence``."""
    for word in sentence.split():
        amount: int | float = len(word) + 0.5 if word in HALVES else len(word)
        yield (None if word in NO_NAME else word), LABELS.get(word), amount


def typed_sums() -> Pipeline:
    """The sum of ``amount`` per (name, label), an opaque state over a transactional source;
    the harness adds its typed table sinks (chaos.sinks)."""
    pipeline = Pipeline(
        TYPED_NAME,
        LogSource(fields=("sentence",), mode=SourceMode.TRANSACTIONAL, partitions=4,
                  batch_size=1000),
        description="typed keys and values (None fields, ints and floats) for the chaos tables",
    )  # fmt: skip
    (
        pipeline.stream.each("sentence", typed_fields, ["name", "label", "amount"])
        .group_by(KEY_FIELDS)
        .persistent_aggregate(
            StateSpec(TYPED_STATE, StateKind.OPAQUE), Sum(), "amount", VALUE_FIELD
        )
    )
    return pipeline


def add_typed_sinks(pipeline: Pipeline, lake: Path, seed: int, postgres_dsn: str | None) -> None:
    """The family's tables on the typed state, its columns as they are (no canonical
    mapping): a Delta table, an Iceberg table (SQL catalog under ``lake``) and, given a
    database, a PostgreSQL table - every schedule, each upserted by (name, label)."""
    from tridentflow.sinks import DeltaSink, IcebergSink, PostgresSink

    lake.mkdir(parents=True, exist_ok=True)
    changes = pipeline.state(TYPED_STATE).new_values_stream()
    keys = list(KEY_FIELDS)
    changes.sink(DeltaSink(lake / "typed-delta", name="typed-delta", key=keys))
    catalog = {"type": "sql", "uri": f"sqlite:///{lake}/typed-catalog.db",
               "warehouse": f"file://{lake}/typed-warehouse"}  # fmt: skip
    changes.sink(IcebergSink(f"chaos.typed_{seed}", catalog, name="typed-iceberg", key=keys))
    if postgres_dsn:  # a primary key holds no NULL (the sink refuses one): None as ""
        changes.map(_no_null_key, [*KEY_FIELDS, VALUE_FIELD]).sink(
            PostgresSink(typed_table(seed), dsn=postgres_dsn, key=keys, name="typed-postgres")
        )


def _no_null_key(name: str | None, label: str | None, total: Any) -> tuple[str, str, Any]:
    return name or "", label or "", total


def typed_table(seed: int) -> str:
    """The PostgreSQL table of schedule ``seed``'s typed state."""
    return f"chaos_{seed}_typed"


def typed_rows(sink: Any, postgres_dsn: str | None) -> list[tuple[tuple[Any, ...], Any]]:
    """A typed table's rows as (key, total), every row (a key twice is two rows); [] while
    the table does not exist."""
    from tridentflow.sinks import DeltaSink, PostgresSink

    if isinstance(sink, PostgresSink):
        import psycopg

        with psycopg.connect(postgres_dsn or "") as conn:
            table = sink.table
            if not conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]:
                return []
            names = (*KEY_FIELDS, VALUE_FIELD)
            fields = ", ".join(f'"{f}"' for f in names)
            found = conn.execute(f'SELECT {fields} FROM "{table}"').fetchall()
            rows = [dict(zip(names, r, strict=True)) for r in found]
            for row in rows:  # "" back to None (add_typed_sinks)
                row.update({f: row[f] or None for f in KEY_FIELDS})
    elif isinstance(sink, DeltaSink):
        table = sink._table()
        rows = [] if table is None else table.to_pyarrow_table().to_pylist()
    else:
        found = sink._table()
        rows = [] if found is None else found.scan().to_arrow().to_pylist()
    return [(tuple(r[f] for f in KEY_FIELDS), r[VALUE_FIELD]) for r in rows]


def typed_difference(rows: list[tuple[tuple[Any, ...], Any]], state: dict) -> str | None:
    """How a typed table's rows differ from the state ({key tuple: total}), in one line: a
    key twice, a key missing or extra, a total another number (an int in a double column is
    the same number: widening loses nothing); None if they are equal, or if there is no table
    while a column of the state is all None (no txid has typed it yet: docs/sinks.md,
    "Types" - the export that brings a value creates the table from the whole state)."""
    if not rows and state and _untyped(state):
        return None
    seen: dict[tuple[Any, ...], Any] = {}
    for key, total in rows:
        if key in seen:
            return f"key {key!r} has two rows ({seen[key]!r}, {total!r})"
        seen[key] = total
    for key in sorted(seen.keys() | state.keys(), key=repr):
        if key not in state:
            return f"key {key!r} is in the table ({seen[key]!r}) but not in the state"
        if key not in seen:
            return f"key {key!r} of the state ({state[key]!r}) is not in the table"
        if isinstance(seen[key], bool) or float(seen[key]) != float(state[key]):
            return f"key {key!r}: the table holds {seen[key]!r}, the state {state[key]!r}"
    return None


def _untyped(state: dict) -> bool:
    """Whether a column of the state's rows (its key fields, its total) is all None."""
    columns = zip(*[(*key, total) for key, total in state.items()], strict=True)
    return any(all(value is None for value in column) for column in columns)
