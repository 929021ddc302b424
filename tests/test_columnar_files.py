"""A FileSource's files read in columns for DataFrame steps (tridentflow.engines.columnar)
give exactly what the record stage gives - the state's partials, the counts and every bad
record - over generated files of every kind a landing directory sees: clean ones, types that
need a look at each value, non-finite floats in any column, missing fields, nulls, invalid
UTF-8, nested and extra columns, corrupt and empty files, Parquet and CSV."""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from tests.test_file_source import runtime_of
from tridentflow import FileSource, Pipeline
from tridentflow.aggregators import Count, Max, Sum
from tridentflow.engines import columnar
from tridentflow.nodes import StateSpec
from tridentflow.schemas import parse_schema
from tridentflow.sources.specs import SourceMode
from tridentflow_state.maps import StateKind

SCHEMA = "user string, amount bigint, score double, flag boolean, small int"
FIELDS = ("user", "amount", "score", "flag", "small")


def pipeline(landing: Path, fmt: str = "parquet", **source: Any) -> Pipeline:
    """A FileSource read by one SQL step, its states aggregated by Spark (Count, Sum and Max
    of integers) and by Python (a Sum of doubles)."""
    spec = FileSource(fields=FIELDS, schema=SCHEMA, uri=str(landing), format=fmt, min_age_s=0.0,
                      batch_size=1000, **source)  # fmt: skip
    built = Pipeline(f"cols-{uuid.uuid4().hex[:6]}", spec)
    step = built.stream.sql(f"SELECT {', '.join(FIELDS)} FROM batch", schema=SCHEMA)
    for name, key, aggregator, args in (
        ("rows", "user", Count(), ()),
        ("amounts", "user", Sum(), ("amount", "total")),
        ("smallest", "flag", Max(), ("small", "top")),
        ("scores", "flag", Sum(), ("score", "total")),
    ):
        opaque = source.get("mode") is SourceMode.OPAQUE  # an opaque source's states are too
        state = StateSpec(name, StateKind.OPAQUE if opaque else StateKind.TRANSACTIONAL)
        step.group_by(key).persistent_aggregate(state, aggregator, *args)
    return built.validate()


Column = Callable[[random.Random, int], pa.Array]


def _ints(t: pa.DataType, low: int, high: int, nulls: bool = False) -> Column:
    def make(rng: random.Random, n: int) -> pa.Array:
        values = [rng.randint(low, high) for _ in range(n)]
        return pa.array([None if nulls and rng.random() < 0.2 else v for v in values], t)

    return make


def _floats(t: pa.DataType, specials: tuple[float, ...] = ()) -> Column:
    def make(rng: random.Random, n: int) -> pa.Array:
        pool = [rng.uniform(-50, 50) for _ in range(n)]
        values = [rng.choice(specials) if specials and rng.random() < 0.3 else v for v in pool]
        return pa.array(values, t)

    return make


def _strings(t: pa.DataType, nulls: bool = False) -> Column:
    def make(rng: random.Random, n: int) -> pa.Array:
        values = [f"u{rng.randint(0, 5)}" for _ in range(n)]
        return pa.array([None if nulls and rng.random() < 0.2 else v for v in values], t)

    return make


def _bools(nulls: bool = False) -> Column:
    def make(rng: random.Random, n: int) -> pa.Array:
        return pa.array(
            [None if nulls and rng.random() < 0.2 else rng.random() < 0.5 for _ in range(n)]
        )

    return make


def _invalid_utf8(rng: random.Random, n: int) -> pa.Array:
    values = [b"ok" if rng.random() < 0.7 else b"\xff\xfe" for _ in range(n)]
    return pa.array(values, pa.binary()).view(pa.string())


def _dictionary(rng: random.Random, n: int) -> pa.Array:
    return _strings(pa.string())(rng, n).dictionary_encode()


def _nested_floats(rng: random.Random, n: int) -> pa.Array:
    return pa.array([[rng.uniform(0, 1), rng.choice([1.0, float("nan")])] for _ in range(n)])


def _timestamps(rng: random.Random, n: int) -> pa.Array:
    return pa.array([rng.randint(0, 10**12) for _ in range(n)], pa.timestamp("ms"))


NON_FINITE = _floats(pa.float64(), (float("nan"), float("inf"), -0.0))
NAN = _floats(pa.float64(), (float("nan"),))

WAYS: dict[str, list[Column | None]] = {
    # None: the column is missing. The first of each is what a clean file holds.
    "user": [_strings(pa.string()), _strings(pa.large_string(), nulls=True), _dictionary,
             _ints(pa.int64(), 0, 3), None],
    "amount": [_ints(pa.int64(), -100, 100), _ints(pa.int32(), 0, 9), _ints(pa.uint64(), 0, 99),
               _ints(pa.uint64(), 2**63, 2**64 - 1), _floats(pa.float64()), _strings(pa.string()),
               None],
    "score": [_floats(pa.float64()), _floats(pa.float32()), _ints(pa.int64(), -3, 3),
              NON_FINITE, None],
    "flag": [_bools(), _bools(nulls=True), _ints(pa.int8(), 0, 1), None],
    "small": [_ints(pa.int32(), -5, 5), _ints(pa.int8(), -5, 5, nulls=True),
              _ints(pa.int64(), -(2**31), 2**31 - 1), _ints(pa.int64(), 2**31, 2**40), None],
    "extra": [None, _strings(pa.string()), NAN,
              _nested_floats, _timestamps, _invalid_utf8],
}  # fmt: skip
NOT_IN_CSV = {_nested_floats, _invalid_utf8, _dictionary, NON_FINITE, NAN}
"""CSV has no nested values, no dictionaries, no invalid UTF-8 (its reader refuses the file),
and reads "nan" as null (a null score fails the emit's Python Sum, in both ways alike)."""


def generate(landing: Path, seed: int, mixed: int, fmt: str) -> list[str]:
    """One file per family - every field clean but one, that one each way it can come -
    then ``mixed`` files of random ways (each field clean in 8 of 10), some corrupt; what
    each holds, for a failure's message."""
    rng = random.Random(seed)
    clean = {name: ways[0] for name, ways in WAYS.items()}
    plans = [
        {**clean, name: way}
        for name, ways in WAYS.items()
        for way in ways[1:]
        if fmt == "parquet" or way not in NOT_IN_CSV
    ]
    for _ in range(mixed):
        plans.append({
            name: ways[0] if rng.random() < 0.8 else rng.choice(
                [w for w in ways if fmt == "parquet" or w not in NOT_IN_CSV])
            for name, ways in WAYS.items()
        })  # fmt: skip
    kinds = []
    for i, plan in enumerate(plans):
        n = rng.choice([0, 1, 7, 40]) if i >= len(plans) - mixed else 40
        columns = {name: way(rng, n) for name, way in plan.items() if way is not None}
        picked = [f"{name}={getattr(way, '__qualname__', way)}" for name, way in plan.items()]
        path = landing / f"f{i:03d}.{fmt}"
        path.parent.mkdir(parents=True, exist_ok=True)
        table = pa.table(columns or {"other": pa.array([1] * n)})
        if i >= len(plans) - mixed and rng.random() < 0.1:
            path.write_bytes(b"PAR1 not a file" if fmt == "parquet" else b'"unclosed\n1,2')
            picked = ["corrupt"]
        elif fmt == "parquet":
            pq.write_table(table, path)
        else:
            pacsv.write_csv(table, path)
        kinds.append(f"{path.name}: {', '.join(picked)}")
    return kinds


def compute(
    spark: Any, rt: Any, read: str, monkeypatch: pytest.MonkeyPatch, ranges: Any = None
) -> Any:
    from tridentflow.engines.spark import SparkEngine

    monkeypatch.setenv(columnar.FILE_READ_ENV, read)
    if ranges is None:
        ranges = {p: (0, h) for p, h in rt.log.scan().heads.items()}
    try:
        return SparkEngine(spark).compute(rt.plan, rt.log.root, ranges)
    except Exception as exc:  # the two ways must fail alike too
        return f"{type(exc).__name__}: {_cause(str(exc))}"


def as_compared(result: Any) -> Any:
    if isinstance(result, str):
        return result
    return {
        "counts": result.counts,
        "states": {name: sorted(pairs) for name, pairs in result.partials.items()},
        "bad": [dataclasses.astuple(b) for b in result.bad],
    }


@pytest.mark.spark
@pytest.mark.parametrize(("fmt", "seed"), [("parquet", 1), ("csv", 3)])
def test_files_read_in_columns_give_what_the_record_stage_gives(
    spark, redis_url, tmp_path, monkeypatch, fmt, seed
):
    read = both_ways(spark, redis_url, tmp_path, monkeypatch, fmt, seed)
    assert not isinstance(read.rows, str), read.rows  # the record stage read the landing
    for survey, columns in read.columns.items():
        assert columns == read.rows, f"surveyed on the {survey}:\n{read.kinds}"
    assert read.rows["bad"] and any(read.rows["states"].values()), "generate the families"
    assert read.ways[columnar.COLUMNS] >= 3 and read.ways[columnar.ROWS] >= 1, read.ways


@pytest.mark.spark
def test_files_read_in_columns_over_spark_connect_give_what_the_record_stage_gives(
    connect_url, redis_url, tmp_path, monkeypatch
):
    from tridentflow.engines.spark import spark_session

    session = spark_session(remote=connect_url)
    try:
        read = both_ways(session, redis_url, tmp_path, monkeypatch, "parquet", 4, mixed=4)
    finally:
        session.stop()
    assert not isinstance(read.rows, str), read.rows
    for survey, columns in read.columns.items():
        assert columns == read.rows, f"surveyed on the {survey}:\n{read.kinds}"
    assert read.ways[columnar.COLUMNS] >= 3 and read.ways[columnar.ROWS] >= 1, read.ways


@dataclasses.dataclass
class BothWays:
    """A generated landing read through the record stage (``rows``) and in columns, surveyed
    on the driver and on the executors (``columns``); how many files took each way."""

    rows: Any
    columns: dict[str, Any]
    ways: dict[str, int]
    kinds: str


def both_ways(
    spark: Any,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: Any,
    fmt: str,
    seed: int,
    mixed: int = 16,
) -> BothWays:
    """Generate a landing of every family and read it both ways (BothWays)."""
    landing = tmp_path / "landing"
    kinds = "\n".join(generate(landing, seed, mixed=mixed, fmt=fmt))
    rt = runtime_of(pipeline(landing, fmt, partitions=2), redis_url, tmp_path / "h")
    schema = columnar.columnar_input(rt.plan)
    assert schema == parse_schema(SCHEMA)  # the plan lets the files be read in columns
    rows = as_compared(compute(spark, rt, "rows", monkeypatch))
    columns = {}
    for survey, most in (("driver", 1 << 40), ("executors", -1)):  # where its bytes send it
        monkeypatch.setattr(columnar, "DRIVER_SURVEY_BYTES", most)
        columns[survey] = as_compared(compute(spark, rt, "columns", monkeypatch))
    ranges = {p: (0, h) for p, h in rt.log.scan().heads.items()}
    read = columnar.read_columns(spark, rt.plan, rt.log.root, ranges, schema)
    assert read is not None
    return BothWays(rows, columns, read.ways, kinds)


def test_what_reads_in_columns_is_decided_by_the_whole_file(tmp_path):
    """The rule (same_as_records), family by family, without a JVM."""
    schema = parse_schema(SCHEMA)
    clean = {
        "user": pa.array(["a", None]),
        "amount": pa.array([1, 2], pa.int32()),
        "score": pa.array([0.5, None], pa.float32()),
        "flag": pa.array([True, None]),
        "small": pa.array([1, 2**31 - 1], pa.int64()),
        "extra": pa.array(["x", "y"]),
    }
    assert columnar.same_as_records(pa.table(clean), schema)
    changes: dict[str, Any] = {
        "a field missing": ("user", None),
        "a float past its type": ("small", pa.array([1, 2**31], pa.int64())),
        "NaN in a field": ("score", pa.array([float("nan"), 1.0])),
        "infinity in an extra column": ("extra", pa.array([float("inf"), 1.0])),
        "floats inside a list": ("extra", pa.array([[1.0], [2.0]])),
        "invalid UTF-8 in an extra column": ("extra", pa.array([b"\xff", b"a"]).view(pa.string())),
        "a double as bigint": ("amount", pa.array([1.0, 2.0])),
        "a string as a boolean": ("flag", pa.array(["true", "false"])),
        "a uint64 past bigint": ("amount", pa.array([1, 2**63], pa.uint64())),
    }
    for what, (name, column) in changes.items():
        table = dict(clean)
        if column is None:
            del table[name]
        else:
            table[name] = column
        assert not columnar.same_as_records(pa.table(table), schema), what
    twice = pa.table([clean["user"], clean["user"]], names=["user", "user"])
    assert not columnar.same_as_records(twice, parse_schema("user string"))


def test_the_groups_split_files_by_bytes_in_their_frozen_order():
    files = [columnar.FrozenFile(0, i, {"size": size}) for i, size in enumerate([5, 5, 90, 5, 5])]
    groups = columnar.file_groups(files, 3)
    assert [f.offset for g in groups for f in g] == [0, 1, 2, 3, 4]
    assert 1 < len(groups) <= 3
    assert columnar.file_groups(files[:1], 4) == [files[:1]]
    assert columnar.file_groups([], 4) == []


def test_a_setting_that_is_no_way_of_reading_is_one_line(monkeypatch):
    from tridentflow.errors import TridentflowError

    monkeypatch.setenv(columnar.FILE_READ_ENV, "arrow")
    with pytest.raises(TridentflowError, match=r"^TRIDENTFLOW_FILE_READ='arrow': expected"):
        columnar.file_read()


def test_only_a_source_read_by_dataframe_steps_alone_reads_in_columns(redis_url, tmp_path):
    """A Python step or a state fed straight by the source keeps the record stage."""
    landing = tmp_path / "l"
    landing.mkdir()
    rt = runtime_of(pipeline(landing, partitions=1), redis_url, tmp_path / "h")
    assert columnar.columnar_input(rt.plan) is not None
    mixed = pipeline(landing)
    mixed.stream.group_by("user").persistent_aggregate(
        StateSpec("direct", StateKind.TRANSACTIONAL), Count(), out_field="n"
    )
    rt = runtime_of(mixed.validate(), redis_url, tmp_path / "h2")
    assert columnar.columnar_input(rt.plan) is None
    json_source = runtime_of(pipeline(landing, "json"), redis_url, tmp_path / "h3")
    assert not json_source.log.tables() and runtime_of(pipeline(landing), redis_url,
                                                       tmp_path / "h4").log.tables()  # fmt: skip


def _cause(text: str) -> str:
    """A failed job's message: its last line that names an error (Spark wraps the worker's)."""
    lines = [line.strip() for line in text.splitlines() if "Error" in line or "Exception" in line]
    return (lines[-1] if lines else text.splitlines()[0])[:300]


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["transactional", "opaque"])
def test_a_frozen_file_gone_before_the_read_is_skipped_or_waited_for_alike(
    spark, redis_url, tmp_path, monkeypatch, mode
):
    """A file taken, then deleted before its txid read it: a transactional source's read fails
    both ways (the txid waits for it); an opaque one skips it both ways - the same one bad
    record naming it, the same partials from the files left."""
    landing = tmp_path / "landing"
    generate(landing, 5, mixed=4, fmt="parquet")
    rt = runtime_of(
        pipeline(landing, mode=SourceMode(mode), partitions=2), redis_url, tmp_path / "h"
    )
    ranges = {p: (0, h) for p, h in rt.log.scan().heads.items()}
    gone = sorted(landing.iterdir())[3]
    gone.unlink()
    for survey in (1 << 40, -1):
        monkeypatch.setattr(columnar, "DRIVER_SURVEY_BYTES", survey)
        results = [
            as_compared(compute(spark, rt, read, monkeypatch, ranges))
            for read in ("rows", "columns")
        ]
        if mode == "transactional":
            assert all(isinstance(r, str) and gone.name in r for r in results), results
        else:
            rows, columns = results
            assert columns == rows and any(gone.name in b[3] for b in rows["bad"]), rows
