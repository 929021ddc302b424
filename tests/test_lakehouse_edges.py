"""The lakehouse sinks at the edges of tables (issues 65 and 66): a table another writer made,
or wrote to after the sink, is never written over silently; value types - None in a key, a
column that is all None in the first txid, integers beside floats, keys 1 and 1.0 - leave each
table equal to the state, or are refused in one line before anything is written."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tests.helpers import produce, runtime
from tridentflow import LogSource, Pipeline, SourceMode, StateSpec, Sum
from tridentflow.engines.local import LocalEngine
from tridentflow.ops.reset import reset_pipeline
from tridentflow.sinks import DeltaSink, IcebergSink, PostgresSink, SinkError
from tridentflow.sinks.base import ExportContext
from tridentflow.steps.driver import run_batches
from tridentflow.steps.export import export
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime

SUMS = "tests.pipelines:lake_sums"


def sums_runtime(redis_url, home):
    rt = runtime(SUMS, redis_url, home)
    reset_pipeline(rt, force=True, source=True)
    return rt


def events(*items: dict[str, Any]) -> list[str]:
    return [json.dumps(item) for item in items]


def state(rt) -> dict[str, Any]:
    page = list_state(rt, rt.pipeline.states["totals"], 10_000)
    return {json.dumps(list(key)): value for key, value in page.items}


def sink_of(rt, name):
    return next(f for f in rt.pipeline.feeds if f.name == name).sink


def table(rt, name: str) -> dict[str, Any]:
    """A sums table as {json [user, region]: total}; AssertionError on a key held twice."""
    sink = sink_of(rt, name)
    if isinstance(sink, DeltaSink):
        from deltalake import DeltaTable

        rows = DeltaTable(sink.table_uri).to_pyarrow_table().to_pylist()
    else:
        rows = sink.catalog().load_table(sink.identifier).scan().to_arrow().to_pylist()
    keyed = {json.dumps([r["user"], r["region"]]): r["total"] for r in rows}
    assert len(keyed) == len(rows), f"{name}: a key has two rows: {rows}"
    return keyed


def drain(rt) -> None:
    run_batches(rt, LocalEngine())


# -- value types through the whole pipeline ---------------------------------------------------
def test_a_first_txid_whose_key_column_is_all_none_loses_no_key(lake, redis_url, home):
    """Txid 1 types no region (all None): no table can be made of it. Exported with txid 2 in
    one export, both keys are in both tables; a None key field changed again is one row
    (Delta's MERGE and Iceberg's compound-key rewrite match None with None)."""
    rt = sums_runtime(redis_url, home)
    produce(rt, events({"user": "a", "amount": 3}, {"user": "b", "region": "eu", "amount": 1}))
    drain(rt)
    export(rt)
    want = {'["a", null]': 3, '["b", "eu"]': 1}
    assert state(rt) == want
    assert table(rt, "delta-sums") == want and table(rt, "iceberg-sums") == want
    produce(rt, events({"user": "a", "amount": 2}, {"user": "c", "amount": 1}))
    for _ in range(2):  # each txid exported on its own: the MERGE path
        run_batches(rt, LocalEngine(), max_batches=1)
        export(rt)
    want = {'["a", null]': 5, '["b", "eu"]': 1, '["c", null]': 1}
    assert state(rt) == want
    assert table(rt, "delta-sums") == want and table(rt, "iceberg-sums") == want


def test_integers_into_a_float_column_widen_and_floats_into_an_integer_one_reload_both(
    lake, redis_url, home
):
    """JSON amounts are ints or floats as the data has them. A txid of ints after the column
    became double is written as doubles (both sinks); a float after the column became int64
    rewrites each table with the column widened (one reload; Iceberg, which has no long to
    double promotion, retypes the column in the snapshot that replaces every file, and its
    earlier snapshot still reads as it was written)."""
    rt = sums_runtime(redis_url, home)
    produce(rt, events({"user": "a", "region": "eu", "amount": 12.5}))
    drain(rt)
    export(rt)
    produce(rt, events({"user": "b", "amount": 3}))
    drain(rt)
    export(rt)  # int totals into the double column
    want = {'["a", "eu"]': 12.5, '["b", null]': 3}
    assert table(rt, "delta-sums") == want and table(rt, "iceberg-sums") == want

    fresh = sums_runtime(redis_url, home)  # the other order: ints first
    for name in ("delta-sums", "iceberg-sums"):
        _drop(sink_of(fresh, name))
    produce(fresh, events({"user": "a", "region": "eu", "amount": 3}))
    drain(fresh)
    export(fresh)
    produce(fresh, events({"user": "a", "region": "eu", "amount": 0.5}))
    drain(fresh)
    for name in ("delta-sums", "iceberg-sums"):
        (result,) = export(fresh, sinks=[name])
        assert result.reloaded_at == 2
        assert table(fresh, name) == state(fresh) == {'["a", "eu"]': 3.5}
    iceberg = sink_of(fresh, "iceberg-sums").catalog().load_table("lake.sums")
    first = next(s for s in iceberg.snapshots() if s.summary["tridentflow.txid"] == "1")
    assert iceberg.scan(snapshot_id=first.snapshot_id).to_arrow()["total"].to_pylist() == [3]
    assert str(iceberg.schema().find_field("total").field_type) == "double"
    produce(fresh, events({"user": "b", "amount": 1}))  # ints again, into the double column
    drain(fresh)
    for result in export(fresh):
        assert result.reloaded_at is None
    want = {'["a", "eu"]': 3.5, '["b", null]': 1}
    assert table(fresh, "delta-sums") == table(fresh, "iceberg-sums") == state(fresh) == want


def _drop(sink) -> None:
    import shutil

    if isinstance(sink, DeltaSink):
        shutil.rmtree(sink.table_uri, ignore_errors=True)
    else:
        sink.catalog().drop_table(sink.identifier)


# -- whose table it is ------------------------------------------------------------------------
def _foreign_delta(path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(path, pa.table({"user": ["q"], "region": ["x"], "total": [7]}))


def _foreign_iceberg(lake: Path) -> None:
    import pyarrow as pa
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("tridentflow", type="sql", uri=f"sqlite:///{lake}/catalog.db",
                           warehouse=f"file://{lake}/wh")  # fmt: skip
    catalog.create_namespace("lake")
    data = pa.table({"user": ["q"], "region": ["x"], "total": [7]})
    catalog.create_table("lake.sums", schema=data.schema).append(data)


@pytest.mark.parametrize("name", ["delta-sums", "iceberg-sums"])
def test_a_table_another_writer_made_is_refused_and_kept_unless_adopted(
    lake, redis_url, home, monkeypatch, name
):
    """A table with rows that no generation of the sink wrote (another tool made it) is never
    written over: the export is refused in one line naming the writer and the two ways out,
    the rows stay; with ``adopt=True`` the first export replaces them with the state."""
    _foreign_delta(lake / "sums") if name == "delta-sums" else _foreign_iceberg(lake)
    rt = sums_runtime(redis_url, home)
    before = table(rt, name)
    produce(rt, events({"user": "a", "region": "eu", "amount": 1}))
    drain(rt)
    with pytest.raises(SinkError) as refused:
        export(rt, sinks=[name])
    line = str(refused.value)
    assert "\n" not in line and "did not write" in line and "adopt=True" in line, line
    assert "another table" in line and not refused.value.retry_helps
    assert table(rt, name) == before == {'["q", "x"]': 7}
    monkeypatch.setenv("TF_TEST_ADOPT", "1")
    adopted = runtime(SUMS, redis_url, home)
    export(adopted, sinks=[name])
    assert table(adopted, name) == state(adopted) == {'["a", "eu"]': 1}


def test_an_empty_table_made_beforehand_with_the_columns_is_taken(lake, redis_url, home):
    """A table created beforehand (a schema, no rows: nothing to lose) is written to."""
    import pyarrow as pa
    from deltalake import write_deltalake

    schema = pa.schema([("user", pa.string()), ("region", pa.string()), ("total", pa.int64()),
                        ("txid", pa.int64())])  # fmt: skip
    write_deltalake(lake / "sums", schema.empty_table())
    rt = sums_runtime(redis_url, home)
    produce(rt, events({"user": "a", "region": "eu", "amount": 1}))
    drain(rt)
    export(rt, sinks=["delta-sums"])
    assert table(rt, "delta-sums") == state(rt)


@pytest.mark.parametrize("name", ["delta-sums", "iceberg-sums"])
def test_another_writers_rows_after_the_sink_are_found_at_the_next_export(
    lake, redis_url, home, name
):
    """A row appended by hand after the sink's txid: the next export refuses in one line (the
    table no longer equals the state) naming the reload; ``--resync`` reloads it and exports
    go on. The sink's own compaction between two exports is no other writer."""
    import pyarrow as pa

    rt = sums_runtime(redis_url, home)
    produce(rt, events({"user": "a", "region": "eu", "amount": 1}))
    drain(rt)
    export(rt)
    sink = sink_of(rt, name)
    sink.compact()
    produce(rt, events({"user": "b", "amount": 2}))
    drain(rt)
    export(rt, sinks=[name])  # the compaction changed no row: not another writer
    assert table(rt, name) == state(rt)
    hand = pa.table({"user": ["z"], "region": pa.array([None], pa.string()),
                     "total": [9], "txid": [99]})  # fmt: skip
    if isinstance(sink, DeltaSink):
        from deltalake import write_deltalake

        write_deltalake(sink.table_uri, hand, mode="append")
    else:
        iceberg = sink.catalog().load_table(sink.identifier)
        iceberg.append(hand.cast(iceberg.schema().as_arrow()))
    produce(rt, events({"user": "a", "amount": 1}))
    drain(rt)
    with pytest.raises(SinkError) as refused:
        export(rt, sinks=[name])
    line = str(refused.value)
    assert "\n" not in line and "no longer equals the state" in line and "--resync" in line
    assert not refused.value.retry_helps  # a retry is refused the same way: fail at once
    export(rt, sinks=[name], resync=True)
    assert table(rt, name) == state(rt)
    produce(rt, events({"user": "c", "amount": 4}))
    drain(rt)
    export(rt, sinks=[name])
    assert table(rt, name) == state(rt)


# -- value types at the sink: a property over generated keys and values ------------------------
NUMBERS = {
    "int": st.integers(-(2**62), 2**62),
    "float": st.floats(allow_nan=False, allow_infinity=False),
}
KEY_KINDS = {
    **NUMBERS,
    "text": st.text(max_size=4),  # unicode
    "bool": st.booleans(),
    "number": st.one_of(st.integers(-3, 3), st.integers(-3, 3).map(float)),  # 1 and 1.0
    "mixed": st.one_of(st.booleans(), *NUMBERS.values(), st.text(max_size=2)),
}
VALUE_KINDS = {
    "int": st.integers(-(2**40), 2**40),
    "float": st.floats(-1e6, 1e6),
    "mixed": st.one_of(st.integers(-(2**40), 2**40), st.floats(-1e6, 1e6)),  # JSON's 3, 12.5
}


@st.composite
def typed_txids(draw: Any) -> tuple[bool, list[list[tuple[Any, ...]]]]:
    """Whether the key is compound, and up to four txids of rows (key fields, value): each
    column of one kind (None among them; a "mixed" column mixes), a None value a removal, a
    txid of no rows one that changed no key (its stamp alone)."""
    compound = draw(st.booleans())
    k1 = st.one_of(st.none(), draw(st.sampled_from(list(KEY_KINDS.values()))))
    k2 = st.one_of(st.none(), draw(st.sampled_from(list(KEY_KINDS.values()))))
    value = st.one_of(st.none(), draw(st.sampled_from(list(VALUE_KINDS.values()))))
    row = st.tuples(k1, k2, value)
    return compound, draw(st.lists(st.lists(row, min_size=0, max_size=6), min_size=1, max_size=4))


def _context(pipeline: str) -> ExportContext:
    """A sink's view of pipeline ``pipeline`` (one per example: PostgreSQL's progress table is
    shared by the examples' database)."""
    return ExportContext(pipeline, "g1", None, "")  # type: ignore[arg-type]


def _sinks(folder: Path, compound: bool, dsn: str) -> list[Any]:
    fields = ("k1", "k2", "v") if compound else ("k1", "v")
    keys = fields[:-1]
    catalog = {"type": "sql", "uri": f"sqlite:///{folder}/catalog.db",
               "warehouse": f"file://{folder}/wh"}  # fmt: skip
    table = f"typed_{folder.name.replace('-', '_')}"  # one per example: the database is shared
    return [
        DeltaSink(folder / "delta", name="delta").bind(fields, keys),
        IcebergSink("typed.t", catalog=catalog, name="iceberg").bind(fields, keys),
        PostgresSink(table, dsn=dsn, name="postgres").bind(fields, keys),
    ]


def _table_of(sink: Any, compound: bool) -> dict[str, Any]:
    if isinstance(sink, DeltaSink):
        from deltalake import DeltaTable

        try:
            rows = DeltaTable(sink.table_uri).to_pyarrow_table().to_pylist()
        except Exception:
            rows = []
    elif isinstance(sink, IcebergSink):
        loaded = sink._table()
        rows = [] if loaded is None else loaded.scan().to_arrow().to_pylist()
    else:
        rows = _postgres_rows(sink)
    key = (lambda r: [r["k1"], r["k2"]]) if compound else (lambda r: [r["k1"]])
    out = {json.dumps(key(r)): r["v"] for r in rows}
    assert len(out) == len(rows), f"{sink.name}: a key has two rows: {rows}"
    return out


def _postgres_rows(sink: Any) -> list[dict[str, Any]]:
    import psycopg

    with psycopg.connect(sink.dsn) as conn:
        if conn.execute("SELECT to_regclass(%s)", (sink.table,)).fetchone()[0] is None:
            return []
        cursor = conn.execute(f'SELECT * FROM "{sink.table}"')
        names = [d.name for d in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


REFUSED_WITH_A_WAY_OUT = re.compile(r"map the|export to a|declare columns|write to a new table")
LIBRARY_ERROR = re.compile(r"\b[A-Z]\w*(Error|Invalid|Exception)\b:")


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(typed_txids())
@example(generated_txids=(True, [[(None, None, None)], [(0, 1e16, 0)]]))  # found: PG's jsonb key
@example(generated_txids=(True, [[("a", None, 1)], []]))  # found: Iceberg's null-typed join
@example(generated_txids=(False, [[(1, None, 3)], [(1, None, 0.5)]]))  # long to double
@example(generated_txids=(False, [[(1, None, 2**60)], [(2, None, 0.5)]]))  # not exact: refused
@example(generated_txids=(False, [[(0, None, 0)], [(None, None, None)], []]))  # MERGE of nothing
def test_generated_key_and_value_types_leave_each_table_equal_to_the_state_or_refused(
    tmp_path_factory, pg_dsn, generated_txids
):
    """Txid after txid of generated rows (one per changed key; a None value removes the key):
    after each, every table holds exactly the model state's keys and values (keys compared as
    the state tells them apart: 1, 1.0 and True are three), or the txid is refused in one line
    and the table is as it was, the line naming the way out (never a library's error) - never
    a silent cast, a lost key or a key held twice. A txid
    whose rows type no column yet writes nothing and is caught up by the next one (the export
    reloads from the state: here, the model's rows)."""
    compound, txids = generated_txids
    folder = tmp_path_factory.mktemp("typed")
    ctx = _context(f"typed-{folder.name}")
    for sink in _sinks(folder, compound, pg_dsn):
        model: dict[str, Any] = {}
        for txid, generated in enumerate(txids, start=1):
            rows, seen = [], set()
            for k1, k2, value in generated:
                key = [k1, k2] if compound else [k1]
                if json.dumps(key) in seen:
                    continue
                seen.add(json.dumps(key))
                rows.append((*key, value))
            after = dict(model)
            for *key, value in rows:
                after.pop(json.dumps(key), None) if value is None else after.update(
                    {json.dumps(key): value}
                )
            before = _table_of(sink, compound)
            try:
                try:
                    sink.apply(ctx, txid, rows)
                except SinkError as behind:
                    if type(behind).__name__ != "ReloadNeededError":
                        raise
                    snapshot = [(*json.loads(k), v) for k, v in after.items()]
                    sink.apply(ctx, txid, snapshot, replace_all=True)
            except SinkError as refused:
                line = str(refused)
                assert "\n" not in line and REFUSED_WITH_A_WAY_OUT.search(line), line
                assert not LIBRARY_ERROR.search(line), line  # a decided refusal, not a crash
                assert not refused.retry_helps, line  # failed at once, not retried for minutes
                assert _table_of(sink, compound) == before
                event(f"{sink.name}: refused at txid {txid}: {str(refused)[-90:]}")
                break
            model = after
            got = _table_of(sink, compound)
            event(f"{sink.name}: {'written' if got else 'nothing yet'}")
            assert got == model or (not got and _untyped(model)), (sink.name, txid, got, model)


def _untyped(model: dict[str, Any]) -> bool:
    """Whether no table could be made of the model yet (a column with no non-None value)."""
    if not model:
        return True
    columns = list(zip(*[[*json.loads(k), v] for k, v in model.items()], strict=True))
    return any(all(v is None for v in column) for column in columns)


# -- one exporter at a time: a lease, not a two-minute lock ------------------------------------
def test_a_dead_exporters_lock_costs_one_lease_and_a_live_one_is_renewed(
    lake, redis_url, home, monkeypatch, capsys
):
    """A killed exporter's lease (taken as an export takes it, then never renewed nor
    released) stops the next export for one lease, and the waiting export says on stderr what
    it waits for; a live holder renews its lease, so a write three leases long is never
    overtaken (the lease is 1 s here; 15 s in production)."""
    import threading
    import time

    import tridentflow.steps.export as export_step

    monkeypatch.setattr(export_step, "SINK_LOCK_S", 1.0)
    rt = sums_runtime(redis_url, home)
    produce(rt, events({"user": "a", "region": "eu", "amount": 1}))
    drain(rt)
    feed = next(f for f in rt.pipeline.feeds if f.name == "delta-sums")
    name = f"{rt.keyspace.sinks}:lock:{feed.name}"
    dead = export_step.sink_lock(rt, feed).__enter__()
    dead._stop.set()  # the holder dies: its renewer stops, nothing releases the lock
    dead._renewer.join()
    assert rt.client.exists(name)
    started = time.monotonic()
    export(rt, sinks=["delta-sums"])
    assert time.monotonic() - started < 5
    assert "waiting for another exporter's lock" in capsys.readouterr().err
    assert table(rt, "delta-sums") == state(rt)

    held = threading.Event()

    def long_writer() -> None:
        with export_step.sink_lock(rt, feed):
            held.set()
            time.sleep(3.0)  # three leases

    writer = threading.Thread(target=long_writer)
    writer.start()
    held.wait(5)
    started = time.monotonic()
    with export_step.sink_lock(rt, feed):
        waited = time.monotonic() - started
    writer.join()
    assert waited > 2.0, waited  # it waited for the release, not for one lease


def test_a_none_key_field_is_one_line_naming_the_way_out_in_postgresql(pg_dsn):
    """PostgreSQL's primary key holds no NULL: a None key field is refused in one line that
    says so and names the way out, the table as it was (the lakehouse sinks keep it a key)."""
    sink = PostgresSink("sums", dsn=pg_dsn, name="pg").bind(("user", "region", "total"),
                                                            ("user", "region"))  # fmt: skip
    ctx = _context("none-keys")
    assert sink.apply(ctx, 1, [("a", "eu", 1)])
    with pytest.raises(SinkError) as refused:
        sink.apply(ctx, 2, [("b", None, 2)])
    line = str(refused.value)
    assert "\n" not in line and "key column region gets None" in line and "DeltaSink" in line
    assert not refused.value.retry_helps
    assert _postgres_rows(sink) == [{"user": "a", "region": "eu", "total": 1}]


# -- a migration meets the tables -------------------------------------------------------------
class Doubled(Sum.__base__):  # a Combiner storing twice what Sum stored, and presenting it
    pure = True

    def init(self, *values):
        return 2 * values[0]

    def combine(self, a, b):
        return a + b

    def zero(self):
        return 0


def as_doubled(value):
    """The migration from Sum's stored values to Doubled's."""
    return 2 * value


def _word_lengths(line: str):
    return ((word, len(word)) for word in line.split())


def lengths_to_delta(aggregator=None) -> Pipeline:
    """Word lengths summed per word (Sum, or ``aggregator``), exported to a Delta table."""
    import os

    pipeline = Pipeline("lengths-lake", LogSource(fields=("line",), mode=SourceMode.OPAQUE))
    lengths = (
        pipeline.stream.each(
            "line", lambda line: ((w, len(w)) for w in line.split()), ["word", "n"]
        )
        .group_by("word")
        .persistent_aggregate(StateSpec("lengths"), aggregator or Sum(), "n", "length")
    )
    lake = os.environ["TF_TEST_LAKE"]
    lengths.new_values_stream().sink(DeltaSink(f"{lake}/lengths", name="delta-lengths"))
    return pipeline


def test_rows_exported_before_a_migration_are_reloaded_in_the_new_form(lake, redis_url, home):
    """`evolve --migrate` rewrites the state's values; the Delta rows exported before it hold
    the old form, so the migration owes the sink a reload: the next export writes the whole
    state as migrated, and the table equals the state again."""
    from tridentflow.ops.evolve import migrate_state

    old = Runtime.open(lengths_to_delta(), redis_url, home)
    old.ledger.reset(force=True)
    produce(old, ["a bb", "bb ccc"])
    run_batches(old, LocalEngine())
    export(old)
    new = Runtime.open(lengths_to_delta(Doubled()), redis_url, home)
    result = migrate_state(new, "lengths", "tests.test_lakehouse_edges:as_doubled")
    assert result.kept_as_written == ()
    (exported,) = export(new)
    assert exported.reloaded_at == new.ledger.committed_txid()
    page = list_state(new, new.pipeline.states["lengths"], 100)
    want = {key[0]: value for key, value in page.items}
    assert want == {"a": 2, "bb": 8, "ccc": 6}
    from deltalake import DeltaTable

    rows = DeltaTable(str(lake / "lengths")).to_pyarrow_table().to_pylist()
    assert {r["word"]: r["length"] for r in rows} == want
    (again,) = export(new)  # owed once: the next export has nothing to do
    assert again.reloaded_at is None and again.applied == ()


@pytest.mark.parametrize("error", ["table iceberg_tables already exists", "disk I/O error"])
def test_an_iceberg_sink_opens_a_sql_catalog_another_process_was_creating(
    tmp_path, monkeypatch, error
):
    """The family 'two processes open a new SQL catalog at once' (an exporter and the chaos
    tables family's ``tables compact``: the loser's CREATE TABLE failed with "already
    exists", a SinkError that ended the harness): the sink opens it again and finds the
    winner's tables. Any other failure is one line at the first try."""
    import pyiceberg.catalog
    from sqlalchemy.exc import OperationalError

    real, calls = pyiceberg.catalog.load_catalog, []

    def racing(name, **props):
        calls.append(name)
        if len(calls) == 1:
            real(name, **props)  # the other process's tables land first...
            raise OperationalError("CREATE TABLE iceberg_tables", {}, Exception(error))
        return real(name, **props)

    monkeypatch.setattr(pyiceberg.catalog, "load_catalog", racing)
    catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
               "warehouse": f"file://{tmp_path}/warehouse"}  # fmt: skip
    sink = IcebergSink("raced.t", catalog=catalog, name="iceberg")
    if "already exists" in error:
        assert sink.catalog() is not None and len(calls) == 2
    else:
        with pytest.raises(SinkError, match="cannot open its catalog") as caught:
            sink.catalog()
        assert len(calls) == 1 and "\n" not in str(caught.value)
