"""DataFrame and SQL steps (Stream.spark, Stream.sql) on Spark, classic or over Connect: the
batch-operation graph on DataFrames (``frames.FrameBackend``) plus two things only Spark does.

* ``frame``: a step's input tuples (pickled chunks) become a typed DataFrame in one
  ``mapInArrow`` (``input_schema``); the user's function - or their SQL over a view named
  ``batch`` - transforms it; the output is held to its declared schema (one line naming the
  column, before any write) and, feeding a transactional state, to Spark's own verdict on its
  determinism (``engines.determinism``). For the steps after it the output becomes chunks
  again - hash-partitioned and sorted by every column, so each partition's tuples and their
  order depend only on the rows, never on how Spark scheduled the step.
* ``aggregate``: a Count, Sum, Min, Max or Mean state fed straight by a step is Spark's
  ``groupBy().agg()`` (code-generated, no Python per row) wherever that is exact: keys of
  strings, integers or booleans (Spark's groupBy merges 0.0 with -0.0, which are two keys
  here), sums of integers (as two bigint sums, of each value's high and low 32 bits, added
  exactly in Python: never a silent overflow, and without decimal arithmetic). Its (key, partial)
  pairs are encoded on the executors, as the graph's would be, so staging and the commit are
  the same. Anything else goes through the graph, as Python.
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Iterator
from typing import Any

from tridentflow.aggregators import Count, Max, Mean, Min, Sum
from tridentflow.engines.determinism import nondeterminism
from tridentflow.engines.frames import (
    SCHEMA,
    Frame,
    FrameBackend,
    chunk_rows,
    materialized,
    runs,
    to_batch,
)
from tridentflow.errors import DataFrameStepError, PipelineError, one_line
from tridentflow.nodes import FrameNode, Persist
from tridentflow.schemas import FieldType, Schema
from tridentflow_state.codec import encode_key

_NAMES = ("part", "seq", "n", "data")
SPARK_KEYS = frozenset({"string", "boolean", "tinyint", "smallint", "int", "bigint"})
"""Key types Spark's groupBy groups exactly as tridentflow's keys compare (by encoding)."""
SPARK_AGGREGATORS = (Count, Sum, Min, Max, Mean)
LOW_BITS = 0xFFFFFFFF
SPLIT_SUM_ROWS = 1 << 31
"""A Sum of integers is two bigint sums: of each value's high 32 bits (``x >> 32``, at most
2^31 in size) and of its low 32 bits (``x & LOW_BITS``, below 2^32), joined in Python as
``(high << 32) + low`` - exact for fewer than this many rows of a key in one txid (neither sum
can reach 2^63), which the pairs check; Spark's decimal(38,0) sum is about twice as slow."""


class DataFrameBackend(FrameBackend):
    """FrameBackend with DataFrame and SQL steps and Spark's own aggregation (module doc)."""

    def __init__(self, spark: Any, lose_tuple: bool = False) -> None:
        super().__init__(lose_tuple)
        self.spark = spark
        self.views: list[str] = []

    def frame(self, data: Frame, node: FrameNode, partitions: int, strict: str | None) -> Frame:
        if data.df is None:  # the source's files read in columns (engines.columnar)
            typed = data.typed
        else:
            source = materialized(data)
            body = functools.partial(_typed_body, node.input_schema, node.label)
            typed = source.df.mapInArrow(body, node.input_schema.to_spark())
        out = _conformed(self._apply(node, typed), node)
        if strict is not None:
            reason = nondeterminism(out)
            if reason is not None:
                raise DataFrameStepError(
                    f"{node.label} feeds transactional state {strict}, but {reason}: a replay "
                    "of the txid could compute other values and the state would keep parts of "
                    "each; make the state opaque (StateKind.OPAQUE), or the step deterministic "
                    "(an orderBy before a limit, a hash such as xxhash64 instead of rand)"
                )
        return Frame(_to_chunks(out, node.schema, partitions), partitions, typed=out)

    def _apply(self, node: FrameNode, typed: Any) -> Any:
        if node.transform is None:
            view = f"tridentflow_batch_{uuid.uuid4().hex}"
            typed.createOrReplaceTempView(view)
            self.views.append(view)
            try:
                return typed.sparkSession.sql(with_batch_view(node.query or "", view))
            except Exception as exc:
                raise DataFrameStepError(f"sql step: {one_line(exc)}") from None
        try:
            out = node.transform(typed)
        except PipelineError:
            raise
        except Exception as exc:
            raise DataFrameStepError(f"{node.label}: {one_line(exc)}") from None
        if not hasattr(out, "mapInArrow") or not hasattr(out, "schema"):
            raise DataFrameStepError(
                f"{node.label} returned {type(out).__name__}, not a DataFrame (return the "
                "transformed df)"
            )
        return out

    def aggregate(self, data: Frame, persist: Persist) -> Frame | None:
        node = persist.node
        assert isinstance(node, FrameNode)
        if data.typed is None or not spark_aggregable(persist, node.schema):
            return None
        from pyspark.sql import functions as F

        aggregator = _inner(persist.aggregator)
        rows = F.count(F.lit(1)).alias("rows")
        values: list[Any] = []
        if not isinstance(aggregator, Count):
            arg = F.col(_quoted(persist.in_fields[0]))
            if isinstance(aggregator, (Sum, Mean)):  # exact: SPLIT_SUM
                wide = arg.cast("bigint")
                values = [
                    F.sum(F.shiftright(wide, 32)).alias("high"),
                    F.sum(wide.bitwiseAND(F.lit(LOW_BITS))).alias("low"),
                    F.count(arg).alias("c"),
                ]
            else:
                values = [(F.min if isinstance(aggregator, Min) else F.max)(arg).alias("v")]
        keys = [F.col(_quoted(f)) for f in persist.group_fields]
        grouped = data.typed.groupBy(*keys).agg(rows, *values)
        body = functools.partial(
            _pairs_body, type(aggregator).__name__, len(keys), persist.state.name, persist.in_fields
        )
        return Frame(grouped.mapInArrow(body, SCHEMA), data.partitions)

    def release(self) -> None:
        super().release()
        catalog = self.spark.catalog
        for view in self.views:
            try:
                catalog.dropTempView(view)
            except Exception:  # a lost Connect server has dropped them with its session
                break
        self.views.clear()


def spark_aggregable(persist: Persist, schema: Schema) -> bool:
    """Whether Spark's groupBy().agg() computes ``persist``'s partials exactly (module doc)."""
    aggregator = _inner(persist.aggregator)
    if type(aggregator) not in SPARK_AGGREGATORS:
        return False
    if not all(schema.type_of(f).kind in SPARK_KEYS for f in persist.group_fields):
        return False
    if isinstance(aggregator, Count):
        return True
    (arg,) = persist.in_fields
    kind = schema.type_of(arg)
    if isinstance(aggregator, (Sum, Mean)):
        return kind.integral
    return kind.kind in SPARK_KEYS


def _inner(aggregator: Any) -> Any:
    return getattr(aggregator, "inner", aggregator)


def with_batch_view(query: str, view: str) -> str:
    """``query`` with ``batch`` defined as the temporary view ``view`` (a CTE; spliced into
    the query's own WITH if it has one)."""
    cte = f"batch AS (SELECT * FROM {view})"
    head = re.match(r"\s*WITH\s+(RECURSIVE\s+)?", query, re.IGNORECASE)
    if head:
        return f"{query[: head.end()]}{cte}, {query[head.end() :]}"
    return f"WITH {cte} {query}"


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _conformed(out: Any, node: FrameNode) -> Any:
    """``out``'s declared columns, in order; DataFrameStepError (one line) if one is missing
    or has another type than its schema says."""
    actual = {f.name: f.dataType for f in out.schema.fields}
    missing = [n for n in node.schema.names if n not in actual]
    if missing:
        raise DataFrameStepError(
            f"{node.label} returned columns {list(actual)}: no {', '.join(missing)}, which "
            f"its schema declares ({node.schema.ddl()}); select or alias it in the step"
        )
    for name, kind in node.schema.fields:
        got = actual[name].simpleString()
        want = kind.to_spark().simpleString()
        if got != want:
            raise DataFrameStepError(
                f"{node.label}: column {name} is {got}, its schema declares {want}; cast it "
                f"in the step (F.col({name!r}).cast({want!r})) or declare it {got}"
            )
    if list(actual) == list(node.schema.names):
        return out
    return out.select(*[_quoted(n) for n in node.schema.names])


def _has_map(kind: FieldType) -> bool:
    if kind.kind == "map":
        return True
    if kind.kind == "array":
        return _has_map(kind.args[0])
    if kind.kind == "struct":
        return any(_has_map(t) for _n, t in kind.args)
    return False


def _to_chunks(out: Any, schema: Schema, partitions: int) -> Any:
    """``out``'s rows as chunk rows of ``partitions`` logical partitions: by a hash of every
    column, sorted by every column (maps, which Spark neither hashes nor orders, as JSON)."""
    from pyspark.sql import functions as F

    keys = [
        F.to_json(F.col(_quoted(n))) if _has_map(t) else F.col(_quoted(n)) for n, t in schema.fields
    ]
    moved = out.repartition(partitions, *keys).sortWithinPartitions(*keys)
    return moved.mapInArrow(_chunk_body, SCHEMA)


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def _typed_body(schema: Schema, label: str, batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body: each logical partition's tuples as one Arrow batch of ``schema``."""
    for _part, items in runs(batches, "part"):
        yield typed_batch(schema, label, items)


def typed_batch(schema: Schema, label: str, items: list[tuple[Any, ...]]) -> Any:
    """``items`` (tuples of ``schema``'s fields) as one Arrow batch of it; DataFrameStepError
    (one line) for a value that does not fit its field's type."""
    import pyarrow as pa

    arrow = schema.to_arrow()
    columns = list(zip(*items, strict=True)) if items else [() for _ in schema.fields]
    arrays = []
    for values, field in zip(columns, arrow, strict=True):
        try:
            arrays.append(pa.array(list(values), type=field.type))
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise DataFrameStepError(
                f"{label}: field {field.name} does not fit its declared type "
                f"{schema.type_of(field.name).ddl()} ({one_line(exc)}); declare the type "
                "its values have (input_schema=)"
            ) from None
    return pa.RecordBatch.from_arrays(arrays, schema=arrow)


def _chunk_body(batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow body: a Spark partition's rows (tuples, in order) as its chunk rows."""

    def rows() -> Iterator[tuple[Any, ...]]:
        for batch in batches:
            yield from zip(*(column.to_pylist() for column in batch.columns), strict=True)

    for chunk in chunk_rows(_partition_id(), rows()):
        yield to_batch([chunk], _NAMES)


def _pairs_body(
    kind: str, width: int, state: str, in_fields: tuple[str, ...], batches: Iterator[Any]
) -> Iterator[Any]:
    """mapInArrow body: Spark's grouped rows (keys..., rows, [v, c]) as (encoded key, partial)
    chunk rows - the partials Count, Sum, Min, Max and Mean make (tridentflow.aggregators)."""

    def pairs() -> Iterator[tuple[str, Any]]:
        for batch in batches:
            columns = [column.to_pylist() for column in batch.columns]
            keys, counts, rest = columns[:width], columns[width], columns[width + 1 :]
            for i, rows in enumerate(counts):
                if not rows:  # an empty batch's global group
                    continue
                key = encode_key(tuple(column[i] for column in keys))
                if kind == "Count":
                    yield key, rows
                    continue
                value = rest[0][i]
                if kind in ("Sum", "Mean"):
                    if rest[2][i] != rows:
                        raise DataFrameStepError(
                            f"state {state}: {kind}({in_fields[0]}) got null in "
                            f"{rows - rest[2][i]} row(s) of key {key}; filter or coalesce it "
                            "in the step"
                        )
                    if rows >= SPLIT_SUM_ROWS:
                        raise DataFrameStepError(
                            f"state {state}: {kind}({in_fields[0]}) of key {key} over {rows} "
                            "rows in one txid: more than Spark sums exactly here; take "
                            "fewer records a txid (batch_size)"
                        )
                    total = (value << 32) + rest[1][i]
                    yield key, (total if kind == "Sum" else [total, rows])
                else:
                    yield key, value

    for chunk in chunk_rows(_partition_id(), pairs()):
        yield to_batch([chunk], _NAMES)
