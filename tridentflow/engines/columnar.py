"""A FileSource's Parquet and CSV files read in columns on the Spark executors, for the
DataFrame and SQL steps that read the source (issue 69 goal 4): no Python per row.

The record stage (``engines.tasks.read_task``) turns a file into one JSON line per row and
back - the reference for what a txid's files give. A file is read in columns only where
that is *provably the same*: its Arrow table (the one the record stage starts from) has
every declared field in a type that holds only values the field's check accepts
(``fits``), no non-finite float anywhere (the record stage quarantines such a row: JSON
has no NaN), valid UTF-8 throughout, and unique column names. Any other file - a type
that needs a look at each value, a missing field, a file changed, skipped or unreadable -
goes through the record stage as before, its bad records quarantined as before. So the
state, the quarantine and the emit's figures are the record stage's, file for file.

Two passes a txid, over one Spark partition per *group* of files (contiguous in the
frozen order, balanced by size; at most the pipeline's default parallelism):

* the **survey** reads every file (every column, as the record stage does) - on the driver
  for a txid of at most DRIVER_SURVEY_BYTES, else on the executors - and decides its way:
  ``columns``, ``rows`` (through the record stage; its bad records come back to the
  driver), or ``none`` (nothing but bad records), with its row count;
* the **typed read** - lazy, inside the DataFrame step's own plan - reads the files again,
  only the declared columns of a ``columns`` file, and gives the step its typed batches.
  Each file's identity is checked again, and its row count must match the survey's: a file
  that changed between the two fails the attempt (a retry surveys again), never a row
  counted that the survey did not see.

``TRIDENTFLOW_FILE_READ=rows`` turns it off (every file through the record stage)."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from tridentflow.engines.base import PartitionCount, Ranges
from tridentflow.engines.tasks import merge_counts
from tridentflow.errors import SourceError, TridentflowError
from tridentflow.nodes import FrameNode, SourceNode, lineage, parents_of
from tridentflow.plan import BadRecord, Expander, Plan, RowDecoder, bad_record, decode_record
from tridentflow.schemas import INTEGRAL, FieldType, Schema
from tridentflow.settings import raw_setting

FILE_READ_ENV = "TRIDENTFLOW_FILE_READ"
"""How the Spark engine reads a FileSource's Parquet and CSV files for DataFrame steps:
``columns`` (the default: in columns where that gives the record stage's rows exactly) or
``rows`` (every file through the record stage)."""

COLUMNS, ROWS, NONE = "columns", "rows", "none"
DRIVER_SURVEY_BYTES = 16 << 20
"""A txid of at most this many bytes of files is surveyed on the driver - which reads these
batches' footers anyway, to size them (``FilesLog.records_in``) - sparing a Spark job (about
0.2 s a txid here); a bigger one on the executors."""
SURVEY_SCHEMA = "idx long, data binary"


def file_read() -> str:
    """``columns`` or ``rows`` (FILE_READ_ENV); anything else is refused in one line."""
    chosen = (raw_setting(FILE_READ_ENV) or COLUMNS).strip().lower()
    if chosen not in (COLUMNS, ROWS):
        raise TridentflowError(f"{FILE_READ_ENV}={chosen!r}: expected 'columns' or 'rows'")
    return chosen


@dataclass(frozen=True)
class FrozenFile:
    """One file of a txid: its partition, offset and manifest entry (path, size, mtime_ns),
    and - once surveyed - how it is read and how many rows that gives."""

    partition: int
    offset: int
    entry: dict[str, Any]
    way: str = ""
    rows: int = 0


@dataclass(frozen=True)
class FileRows:
    """How a source's files become a DataFrame step's rows (picklable, for the executors): the
    files' reader, the record stage's decoding and its check of each record against
    ``schema``, the step's input."""

    reader: Any
    decoder: RowDecoder
    expand: Expander
    schema: Schema


@dataclass(frozen=True)
class ColumnarRead:
    """What the survey found: every partition's count, the bad records (in the record
    stage's order), and the step's input as Spark's typed DataFrame, in ``groups`` Spark
    partitions."""

    counts: dict[int, PartitionCount]
    bad: list[BadRecord]
    typed: Any
    groups: int
    ways: dict[str, int]
    """How many files each way reads (columns, rows, none)."""


def columnar_input(plan: Plan) -> Schema | None:
    """The typed input every DataFrame step that reads the source shares, if the plan lets
    the source's files be read in columns: the source's only readers are DataFrame or SQL
    steps of one input schema (no Python step, no state fed straight by the source). None
    otherwise - the record stage reads it. (The log decides the rest: ``read_columns``.)"""
    if file_read() != COLUMNS:
        return None
    if plan.persists or plan.position or len(plan.edges) != 1:
        return None
    source = plan.edges[0][0]
    if not isinstance(source, SourceNode):
        return None
    schemas = set()
    for persist in plan.graph_persists:
        if persist.node is source:
            return None
        for node in lineage(persist.node):
            if not any(parent is source for parent in parents_of(node)):
                continue
            if not isinstance(node, FrameNode):
                return None
            schemas.add(node.input_schema)
    if len(schemas) != 1:
        return None
    (schema,) = schemas
    return schema if schema.names == plan.decoder.fields else None


def read_columns(
    spark: Any, plan: Plan, log_root: str, ranges: Ranges, schema: Schema
) -> ColumnarRead | None:
    """Survey this txid's files (one Spark job) and plan their typed read (module doc); None
    if the source's log does not hold files Arrow reads as tables (the record stage reads
    it)."""
    from tridentflow.sources import open_log
    from tridentflow.sources.base import Closes, ReadsFilesInColumns

    log = open_log(log_root)
    try:
        if not isinstance(log, ReadsFilesInColumns) or not log.tables():
            return None
        files = [
            FrozenFile(partition, offset, entry)
            for partition, (start, end) in sorted(ranges.items())
            for offset, entry in log.frozen(partition, start, end)
        ]
        reader = log.reader()
    finally:
        if isinstance(log, Closes):
            log.close()
    counts = merge_counts(  # offsets are files: a range is read whole, as read_task counts it
        ranges, ((p, PartitionCount(e - s, s, e - 1)) for p, (s, e) in ranges.items() if e > s)
    )
    groups = file_groups(files, plan.default_parallelism) or [[]]  # no files: one empty task
    n = len(groups)
    how = FileRows(reader, plan.decoder, plan.edges[0][1], schema)
    survey = functools.partial(_survey_body, how, groups)
    if sum(int(f.entry["size"]) for f in files) <= DRIVER_SURVEY_BYTES:
        batches = survey(iter([_indexes(n)]))
        results = [(b.column(0)[0].as_py(), b.column(1)[0].as_py()) for b in batches]
    else:
        rows = spark.range(0, n, 1, n).mapInArrow(survey, SURVEY_SCHEMA).collect()
        results = [(row["idx"], row["data"]) for row in rows]
    found: dict[int, tuple[list[BadRecord], list[FrozenFile]]] = {}
    for index, data in results:
        found[index] = pickle.loads(data)
    surveyed = [found[i][1] for i in range(len(groups))]
    bad = [b for i in range(len(groups)) for b in found[i][0]]
    read = functools.partial(_typed_body, how, surveyed)
    typed = spark.range(0, n, 1, n).mapInArrow(read, schema.to_spark())
    ways = {way: sum(f.way == way for g in surveyed for f in g) for way in (COLUMNS, ROWS, NONE)}
    return ColumnarRead(counts, bad, typed, n, ways)


def file_groups(files: list[FrozenFile], most: int) -> list[list[FrozenFile]]:
    """``files`` in at most ``most`` contiguous groups of about equal bytes (each one Spark
    task): deterministic, so a replay groups them alike."""
    if not files:
        return []
    total = sum(int(f.entry["size"]) for f in files)
    count = max(1, min(most, len(files)))
    groups: list[list[FrozenFile]] = [[]]
    done = 0
    for f in files:
        if groups[-1] and done >= total * len(groups) / count and len(groups) < count:
            groups.append([])
        groups[-1].append(f)
        done += int(f.entry["size"])
    return groups


# -- which files read in columns ------------------------------------------------------------


def fits(column: Any, kind: FieldType) -> bool:
    """Whether every value of Arrow ``column`` is one the record stage gives unchanged for a
    field of ``kind`` and its check accepts (``schemas.RecordCheck``): Arrow's cast to the
    field's type then gives the record stage's values."""
    import pyarrow as pa
    import pyarrow.compute as pc

    t = column.type
    if pa.types.is_null(t):
        return True
    if kind.kind == "string":
        return pa.types.is_string(t) or pa.types.is_large_string(t)
    if kind.kind == "boolean":
        return pa.types.is_boolean(t)
    if kind.kind == "double":
        return pa.types.is_float32(t) or pa.types.is_float64(t)
    if kind.kind == "float":
        return pa.types.is_float32(t)
    if kind.integral and pa.types.is_integer(t):
        bits = INTEGRAL[kind.kind]
        signed = pa.types.is_signed_integer(t)
        if t.bit_width < bits or (signed and t.bit_width == bits):
            return True
        extremes = pc.min_max(column)  # a wider type: the values must fit
        low, high = extremes["min"].as_py(), extremes["max"].as_py()
        if low is None:
            return True
        return -(1 << (bits - 1)) <= low and high <= (1 << (bits - 1)) - 1
    return False  # arrays, maps, structs: each value's check, in the record stage


def _has_floats(t: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_floating(t):
        return True
    if pa.types.is_nested(t):
        return any(_has_floats(t.field(i).type) for i in range(t.num_fields))
    return False


def same_as_records(table: Any, schema: Schema) -> bool:
    """Whether ``table`` read in columns gives exactly the rows the record stage gives it
    (module doc): every row good, each declared field's values unchanged."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = table.column_names
    if len(set(names)) != len(names) or not set(schema.names) <= set(names):
        return False
    for column in table.columns:  # any column: the record stage encodes the whole row
        t = column.type
        if pa.types.is_float32(t) or pa.types.is_float64(t):
            if column.null_count < len(column) and not pc.all(pc.is_finite(column)).as_py():
                return False
        elif _has_floats(t):
            return False  # a float16, or floats inside a list or struct: not checked here
    try:
        table.validate(full=True)  # strings: valid UTF-8, as the JSON line needs
    except pa.ArrowInvalid:
        return False
    return all(fits(table.column(name), kind) for name, kind in schema.fields)


# -- the two jobs' bodies (on executors) ----------------------------------------------------


def _indexes(n: int) -> Any:
    import pyarrow as pa

    return pa.RecordBatch.from_pydict({"id": pa.array(range(n), pa.int64())})


def _survey_body(
    how: FileRows, groups: list[list[FrozenFile]], batches: Iterator[Any]
) -> Iterator[Any]:
    """mapInArrow body: each group's (bad records, surveyed files), pickled."""
    import pyarrow as pa

    for batch in batches:
        for index in batch.column(0).to_pylist():
            bad: list[BadRecord] = []
            surveyed = [_survey(how, f, bad) for f in groups[index]]
            data = pickle.dumps((bad, surveyed))
            yield pa.RecordBatch.from_pydict({"idx": [index], "data": [data]})


def _survey(how: FileRows, f: FrozenFile, bad: list[BadRecord]) -> FrozenFile:
    """``f`` with its way and row count; its bad records appended to ``bad``."""
    from dataclasses import replace

    from tridentflow.errors import PartitionUnavailableError

    reader = how.reader
    try:
        reader.check_unchanged(f.partition, f.entry)
        table = reader.table(f.entry["path"])
    except PartitionUnavailableError:
        if not reader.opaque:
            raise  # a transactional replay waits for its file, as the record stage does
        table = None
    except (OSError, ValueError):
        table = None  # the record stage says why, as one bad record
    if table is not None and same_as_records(table, how.schema):
        return replace(f, way=COLUMNS, rows=table.num_rows)
    rows = list(_record_rows(how, f, bad))
    return replace(f, way=ROWS if rows else NONE, rows=len(rows))


def _record_rows(
    how: FileRows, f: FrozenFile, bad: list[BadRecord] | None
) -> Iterator[tuple[Any, ...]]:
    """The record stage over one file: its good tuples; its bad records into ``bad``."""
    for offset, raw in how.reader.records(f.partition, f.offset, f.entry):
        try:
            produced = list(how.expand(how.decoder(decode_record(raw))))
        except Exception as exc:
            if bad is not None:
                bad.append(bad_record(f.partition, offset, raw, exc))
            continue
        yield from produced


def _typed_body(
    how: FileRows, surveyed: list[list[FrozenFile]], batches: Iterator[Any]
) -> Iterator[Any]:
    """mapInArrow body: each group's rows as typed batches of ``schema``, file by file; a
    file that gives another row count than the survey's fails the attempt (SourceError)."""
    for batch in batches:
        for index in batch.column(0).to_pylist():
            for f in surveyed[index]:
                if f.way == NONE:
                    continue
                how.reader.check_unchanged(f.partition, f.entry)  # raises if it changed
                got, found = _typed_file(how, f)
                if got != f.rows:
                    raise SourceError(
                        f"file {f.entry['path']} gave {got} rows on a second read, {f.rows} "
                        "on the first: it changed while the txid read it (the attempt fails; "
                        "a retry reads it again)"
                    )
                yield from found


def _typed_file(how: FileRows, f: FrozenFile) -> tuple[int, list[Any]]:
    """(rows, typed batches) of one surveyed file: its declared columns cast to their Arrow
    types, or the record stage's good tuples as one batch."""
    import pyarrow as pa

    from tridentflow.engines.dataframes import typed_batch

    schema = how.schema
    if f.way == ROWS:
        rows = list(_record_rows(how, f, None))
        return len(rows), [typed_batch(schema, "FileSource", rows)]
    only = list(schema.names) if how.reader.format == "parquet" else None
    table = how.reader.table(f.entry["path"], only)
    arrow = schema.to_arrow()
    columns = [table.column(n).cast(t.type) for n, t in zip(schema.names, arrow, strict=True)]
    return table.num_rows, pa.Table.from_arrays(columns, schema=arrow).to_batches()
