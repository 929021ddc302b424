"""The lakehouse sinks (DeltaSink on delta-rs, IcebergSink on pyiceberg) against real tables on
disk and on an S3 API (moto's server): each exported txid is one table commit stamped with it
by the format's own protocol (a Delta ``txn``, an Iceberg snapshot summary); replays, kills at
every point, racing exporters, a reset and a rewind leave each table equal to the state, one
version per txid; a column of another type is one line; orphaned files are listed and
removed; a table is read as of any retained txid."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import moto_s3, produce, runtime
from tridentflow.engines.local import LocalEngine
from tridentflow.faults import Fault, FaultPlan, SimulatedCrash
from tridentflow.ops.reset import reset_pipeline
from tridentflow.ops.rewind import rewind_pipeline
from tridentflow.sinks import DeltaSink, IcebergSink, SinkError
from tridentflow.steps.driver import run_batches
from tridentflow.steps.export import context, export, sink_status
from tridentflow.steps.query import list_state, list_state_as_of

LINES = ["a bb ccc", "set x 1", "bb ccc dddd", "set y 2", "ccc", "del x", "set y 3", "eeee a",
          "set z 9", "a a"]  # fmt: skip
UPSERT = {
    "delta-counts": "counts",
    "delta-kv": "kv",
    "iceberg-counts": "counts",
    "iceberg-kv": "kv",
}
APPEND = {"delta-kv-log": "kv", "iceberg-kv-log": "kv"}


@pytest.fixture
def rt(lake, redis_url, redis_client, home):
    rt = runtime("tests.pipelines:lakehoused", redis_url, home)
    reset_pipeline(rt, force=True, source=True)
    produce(rt, LINES)
    return rt


def feed(rt, name):
    return next(f for f in rt.pipeline.feeds if f.name == name)


def table_rows(rt, name: str, version=None) -> list[dict]:
    """A sink's table as rows (at a Delta version / Iceberg snapshot id), sorted."""
    sink = feed(rt, name).sink
    if isinstance(sink, DeltaSink):
        from deltalake import DeltaTable

        table = DeltaTable(sink.table_uri, version=None if version is None else int(version),
                           storage_options=sink.storage_options or None)  # fmt: skip
        rows = table.to_pyarrow_table().to_pylist()
    else:
        table = sink.catalog().load_table(sink.identifier)
        scan = table.scan(snapshot_id=int(version)) if version is not None else table.scan()
        rows = scan.to_arrow().to_pylist()
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def state_of(rt, state: str, as_of: int | None = None) -> dict:
    persist = rt.pipeline.states[state]
    page = (
        list_state(rt, persist, 10_000) if as_of is None else list_state_as_of(rt, persist, as_of)
    )
    return {key[0]: value for key, value in page.items}


def keyed(rows: list[dict], key: str, value: str) -> dict:
    return {r[key]: r[value] for r in rows}


def check_upserts(rt) -> None:
    for name, state in UPSERT.items():
        rows = table_rows(rt, name)
        key, value = ("word", "count") if state == "counts" else ("key", "value")
        assert keyed(rows, key, value) == state_of(rt, state), name
        assert len(rows) == len(state_of(rt, state)), name  # one row per key


def stamps(rt, name: str) -> list[int]:
    """The txid stamped on each commit of a sink's table, oldest first."""
    sink = feed(rt, name).sink
    if isinstance(sink, DeltaSink):
        from deltalake import DeltaTable

        history = DeltaTable(sink.table_uri).history()
        return [int(h["tridentflow.txid"]) for h in reversed(history) if "tridentflow.txid" in h]
    table = sink.catalog().load_table(sink.identifier)
    return [int(s.summary.additional_properties["tridentflow.txid"]) for s in table.snapshots()]


def drain(rt, exports: bool = True) -> None:
    for _ in range(len(LINES) + 2):
        records = run_batches(rt, LocalEngine(), max_batches=1).records
        if exports:
            export(rt)
        if not records:
            break


def test_each_table_equals_the_state_after_every_commit_one_version_per_txid(rt):
    changes: list[tuple[str, object, int]] = []
    for _ in range(len(LINES) + 2):
        if not run_batches(rt, LocalEngine(), max_batches=1).records:
            break
        txid = rt.ledger.committed_txid()
        before = state_of(rt, "kv", txid - 1) if txid > 1 else {}
        after = state_of(rt, "kv")
        changes += [(k, after.get(k), txid) for k in sorted(set(before) | set(after))
                    if before.get(k) != after.get(k)]  # fmt: skip
        export(rt)
        check_upserts(rt)
        for name in APPEND:  # the change log: every change of every txid, removals as null
            log = {(r["key"], r["value"], r["txid"]) for r in table_rows(rt, name)}
            assert log == set(changes), name
    export(rt)  # the last, empty txid too
    committed = rt.ledger.committed_txid()
    assert committed >= 5
    for name in (*UPSERT, *APPEND):
        assert stamps(rt, name) == list(range(1, committed + 1)), name  # one commit a txid
    from deltalake import DeltaTable

    delta = DeltaTable(feed(rt, "delta-kv").sink.table_uri)
    app = f"tridentflow:lakehoused:delta-kv:{rt.ledger.generation}"
    assert delta.transaction_version(app) == committed  # any Delta reader sees how far it is


def test_the_change_log_read_as_columns_equals_the_rows_the_stream_gives(rt):
    """A sink that takes Arrow reads a stream with no operations straight into columns: the
    same rows, in the same order, as the tuples every other sink gets (removals as nulls)."""
    from tridentflow.plan import compile_chain
    from tridentflow.steps.export import change_table, changes_of, stream_rows

    drain(rt, exports=False)
    committed = rt.ledger.committed_txid()
    compared = 0
    for name in ("delta-counts", "delta-kv"):
        f = feed(rt, name)
        for txid in range(max(1, committed - 2), committed + 1):
            table = change_table(rt, f, txid)
            rows = stream_rows(changes_of(rt, f, txid), compile_chain(f.node))
            assert table is not None and table.column_names == list(f.node.fields)
            assert [tuple(r.values()) for r in table.to_pylist()] == rows, (name, txid)
            compared += len(rows)
    assert compared >= 4
    assert change_table(rt, feed(rt, "delta-kv"), committed + 1) is None  # no log: None


@pytest.mark.parametrize("schema_type", [None, "large_string"])
def test_a_batch_from_arrow_equals_the_batch_from_rows(schema_type):
    """LakehouseRows.batch takes the rows as tuples or as one Arrow table alike: the same
    typed columns, the same split into set and removed keys; the same refusals."""
    import pyarrow as pa

    from tridentflow.sinks.lakehouse import LakehouseRows

    shape = LakehouseRows("s", ("key", "value", "note"), ("key",))
    rows = [("a", 1, "x"), ("b", None, None), ("c", 3, None), ("d", None, "y")]
    schema = None
    if schema_type:
        schema = pa.schema([("key", pa.large_string()), ("value", pa.int64()),
                            ("note", pa.large_string()), ("txid", pa.int64())])  # fmt: skip
    arrow = pa.table({"key": ["a", "b", "c", "d"], "value": [1, None, 3, None],
                      "note": ["x", None, None, "y"]})  # fmt: skip
    from_rows, from_arrow = shape.batch(rows, 7, schema), shape.batch(arrow, 7, schema)
    for part in ("every", "live", "removed"):
        assert getattr(from_rows, part).equals(getattr(from_arrow, part)), part
    assert from_arrow.removed.column("key").to_pylist() == ["b"]
    assert set(from_arrow.every.column("txid").to_pylist()) == {7}
    if schema is not None:
        assert from_arrow.every.schema.field("key").type == pa.large_string()
    with pytest.raises(SinkError, match=r"columns .* the stream the fields"):
        shape.batch(arrow.select(["value", "key", "note"]), 7)
    with pytest.raises(SinkError, match="column value is string in the table"):
        shape.batch(arrow, 7, pa.schema([("value", pa.string())]))
    nan = arrow.set_column(1, "value", pa.array([1.0, None, float("nan"), None]))
    with pytest.raises(SinkError, match="column value gets nan"):
        shape.batch(nan, 7)


def test_a_replayed_export_writes_nothing_even_with_its_record_lost(rt):
    drain(rt)
    counted = {name: len(stamps(rt, name)) for name in (*UPSERT, *APPEND)}
    assert all(r.applied == () for r in export(rt))
    rt.client.delete(rt.keyspace.sinks)  # killed after the table commit, before recording it
    assert all(r.applied == () for r in export(rt))
    assert {name: len(stamps(rt, name)) for name in counted} == counted
    check_upserts(rt)


def test_kills_at_every_point_of_an_export_leave_one_version_per_txid(rt):
    """Killed before the write (Delta: before its commit), after the data files and before
    the table commit (Iceberg), and after the table commit before tridentflow recorded it:
    the next export finishes the job - one version per txid, tables equal to the state - and
    the killed writes' files are orphans that vacuum lists and removes."""
    crashes = tuple(Fault("mid-export", txid, 1, "crash") for txid in (2, 3, 5))
    rt = rt.with_(faults=FaultPlan(crashes))
    for _ in range(len(LINES) + 2):
        if not run_batches(rt, LocalEngine(), max_batches=1).records:
            break
        for _attempt in range(8):
            try:
                export(rt)
                break
            except SimulatedCrash:
                continue
    rt = rt.with_(faults=FaultPlan())
    export(rt)
    check_upserts(rt)
    committed = rt.ledger.committed_txid()
    for name in (*UPSERT, *APPEND):
        assert stamps(rt, name) == list(range(1, committed + 1)), name
    iceberg = feed(rt, "iceberg-kv").sink
    orphans = iceberg.vacuum(retention_hours=0, dry_run=True)
    assert orphans, "the crashed writes left their data files"
    before = table_rows(rt, "iceberg-kv")
    assert iceberg.vacuum(retention_hours=0, dry_run=False) == orphans
    assert iceberg.vacuum(retention_hours=0) == [] and table_rows(rt, "iceberg-kv") == before
    delta = feed(rt, "delta-kv").sink
    stray = Path(delta.table_uri) / "part-00000-killed-writer.parquet"
    stray.write_bytes(b"PAR1 a writer killed before its commit")
    assert str(stray.name) in " ".join(delta.vacuum(retention_hours=0, dry_run=True))
    delta.vacuum(retention_hours=0, dry_run=False)
    assert not stray.exists() and table_rows(rt, "delta-kv") == before


def test_racing_exporters_commit_each_txid_once(rt):
    for _ in range(3):  # within the change logs kept (change_log_limit=3)
        run_batches(rt, LocalEngine(), max_batches=1)
    failures: list[BaseException] = []

    def exporter() -> None:
        for _ in range(20):
            try:
                export(rt)
                return
            except SinkError as exc:  # a commit that lost the race and could not tell yet
                failures.append(exc)

    threads = [threading.Thread(target=exporter) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    export(rt)
    committed = rt.ledger.committed_txid()
    for name in (*UPSERT, *APPEND):
        assert stamps(rt, name) == list(range(1, committed + 1)), name
    check_upserts(rt)
    # reloading at once (their change logs gone): one reload commit, the racers' others lost
    for _ in range(5):
        run_batches(rt, LocalEngine(), max_batches=1)
    threads = [threading.Thread(target=exporter) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check_upserts(rt)
    last = rt.ledger.committed_txid()
    for name in UPSERT:
        assert stamps(rt, name)[committed:] == [last], name


def test_a_rewind_carries_each_table_back_as_a_new_version_and_exports_go_on(rt):
    drain(rt)
    committed = rt.ledger.committed_txid()
    versions = {s["sink"]: s["table_versions"] for s in sink_status(rt)}
    assert set(versions["delta-kv"]) == set(range(1, committed + 1))
    report = rewind_pipeline(rt, 4, force=True)
    assert set(report.tables_rewound) == {*UPSERT, *APPEND}
    for status in sink_status(rt):  # the rewound txids' versions are forgotten
        assert set(status["table_versions"]) == {1, 2, 3, 4}, status["sink"]
    for name, state in UPSERT.items():  # as of txid 4, at once: no export needed
        key, value = ("word", "count") if state == "counts" else ("key", "value")
        assert keyed(table_rows(rt, name), key, value) == state_of(rt, state), name
    for name in (*UPSERT, *APPEND):  # one new version stamped 4, the history kept
        assert stamps(rt, name) == [*range(1, committed + 1), 4], name
    # time travel: the version the mirror names for txid 2 holds the state as of txid 2
    for name in ("delta-counts", "iceberg-counts"):
        old = versions[name][2]
        assert keyed(table_rows(rt, name, old), "word", "count") == state_of(rt, "counts", 2), name
    drain(rt)  # the rewound txids again, exported from 5 on
    check_upserts(rt)
    assert rewind_pipeline(rt, rt.ledger.committed_txid(), force=True).result  # idempotent


def test_a_rewind_killed_between_tables_finishes_when_run_again(rt, monkeypatch):
    """Killed before the first table (the fault point) and, run again, killed right after a
    table's own rewind commit, before the next table: run again, every table is as of the
    target with exactly one rewind version - none carried back twice - and exports go on."""
    drain(rt)
    committed = rt.ledger.committed_txid()
    rt = rt.with_(faults=FaultPlan((Fault("mid-rewind", 4, 1, "crash"),)))
    with pytest.raises(SimulatedCrash):
        rewind_pipeline(rt, 4, force=True)
    rt = rt.with_(faults=FaultPlan())
    victim = feed(rt, "iceberg-counts").sink
    original = type(victim).rewind_to

    def rewound_then_killed(self, ctx, old_generation, target, known=None):
        original(self, ctx, old_generation, target, known)
        raise SimulatedCrash(f"killed after {self.name}'s rewind commit")

    monkeypatch.setattr(type(victim), "rewind_to", rewound_then_killed)
    with pytest.raises(SimulatedCrash):
        rewind_pipeline(rt, 4, force=True)
    monkeypatch.setattr(type(victim), "rewind_to", original)
    report = rewind_pipeline(rt, 4, force=True)
    assert set(report.tables_rewound) == {*UPSERT, *APPEND}
    for name, state in UPSERT.items():
        key, value = ("word", "count") if state == "counts" else ("key", "value")
        assert keyed(table_rows(rt, name), key, value) == state_of(rt, state), name
    for name in (*UPSERT, *APPEND):
        assert stamps(rt, name) == [*range(1, committed + 1), 4], name
    drain(rt)
    check_upserts(rt)


def test_a_second_rewind_below_the_first_carries_the_tables_back_too(rt):
    """After a rewind to 4 (the tables stamped 4 in its generation), a rewind to 2 finds
    txid 2's version through the txid -> version mirror (the new generation's stamps start
    at 4) and carries every table back again - none is left for a reload."""
    drain(rt)
    assert set(rewind_pipeline(rt, 4, force=True).tables_rewound) == {*UPSERT, *APPEND}
    report = rewind_pipeline(rt, 2, force=True)
    assert set(report.tables_rewound) == {*UPSERT, *APPEND}
    for name, state in UPSERT.items():
        key, value = ("word", "count") if state == "counts" else ("key", "value")
        assert keyed(table_rows(rt, name), key, value) == state_of(rt, state), name
    drain(rt)
    check_upserts(rt)


def test_an_older_generation_after_a_later_one_wrote_holds_no_txid(rt):
    """Redis went back to a snapshot from before a rewind (its last writes lost): the pipeline
    is in the older generation again, but the tables' newest commits are the later one's. The
    older generation's stamp further back is no position - an export from it would lay its
    next txids over the later timeline's rows - so the table starts over (0)."""
    drain(rt)
    older = {name: context(rt, feed(rt, name)) for name in UPSERT}
    reached = {name: feed(rt, name).sink.position(ctx) for name, ctx in older.items()}
    assert all(reached.values()), reached
    rewind_pipeline(rt, 4, force=True)  # the tables carried back, stamped by a new generation
    for name, ctx in older.items():
        assert feed(rt, name).sink.position(ctx) == 0, name
    fresh = runtime("tests.pipelines:lakehoused", rt.redis_url, rt.home)
    for name in UPSERT:  # the rewind's own generation holds txid 4
        assert feed(fresh, name).sink.position(context(fresh, feed(fresh, name))) == 4, name


def test_a_reset_replaces_what_the_old_generation_wrote(rt):
    drain(rt)
    reset_pipeline(rt, force=True, source=True)
    produce(rt, ["zzz", "set q 7"])
    drain(rt)
    check_upserts(rt)
    assert keyed(table_rows(rt, "delta-counts"), "word", "count") == {"zzz": 1}


def test_a_column_of_another_type_is_refused_in_one_line(lake, redis_url, redis_client, home):
    import pyarrow as pa
    from deltalake import write_deltalake

    other = pa.table({"word": ["q"], "count": ["many"], "txid": pa.array([0], pa.int64())})
    write_deltalake(lake / "delta-counts", other.slice(0, 0))  # made beforehand, no rows
    rt = runtime("tests.pipelines:lakehoused", redis_url, home)
    reset_pipeline(rt, force=True, source=True)
    produce(rt, LINES[:1])
    run_batches(rt, LocalEngine(), max_batches=1)
    with pytest.raises(SinkError) as exc:
        export(rt, sinks=["delta-counts"])
    line = str(exc.value)
    assert "column count is string in the table" in line and "int64" in line and "\n" not in line
    assert "delta-counts" in line and "txid 1" in line


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """A real S3 API on loopback (moto's server), a bucket in it."""
    with moto_s3("lake") as endpoint:
        yield endpoint


def test_object_storage_not_a_shared_disk(s3, lake, redis_url, redis_client, home):
    """Delta through storage_options and Iceberg through a PyArrow S3 FileIO, on an S3 API."""
    from tridentflow import Count, LogSource, Pipeline, SourceMode, StateKind, StateSpec

    options = {"AWS_ENDPOINT_URL": s3, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
               "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
               "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}  # fmt: skip
    catalog = {"type": "sql", "uri": f"sqlite:///{lake}/s3-catalog.db",
               "warehouse": "s3://lake/wh", "s3.endpoint": s3, "s3.access-key-id": "k",
               "s3.secret-access-key": "s", "s3.region": "us-east-1"}  # fmt: skip
    pipeline = Pipeline(
        "lake-s3", LogSource(fields=("line",), mode=SourceMode.OPAQUE, batch_size=2)
    )
    counts = (
        pipeline.stream.each("line", lambda line: ((w,) for w in line.split()), "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    counts.new_values_stream().sink(DeltaSink("s3://lake/delta/counts", storage_options=options))
    counts.new_values_stream().sink(IcebergSink("s3lake.counts", catalog=catalog))
    from tridentflow.steps.runtime import Runtime, connect

    rt = Runtime(pipeline, connect(redis_url), home, namespace="s3")
    rt.ledger.reset(force=True)
    produce(rt, LINES)
    drain(rt)
    want = state_of(rt, "counts")
    assert keyed(table_rows(rt, "delta-counts"), "word", "count") == want
    assert keyed(table_rows(rt, "iceberg-s3lake.counts"), "word", "count") == want
    assert export(rt) and all(r.applied == () for r in export(rt))
    iceberg = next(f.sink for f in rt.pipeline.feeds if isinstance(f.sink, IcebergSink))
    assert iceberg.vacuum(retention_hours=0, dry_run=True) == []  # the catalog's s3.endpoint


def test_a_refused_rewind_leaves_nothing_owed_and_the_next_rewind_runs(rt):
    """A rewind refused before it changed anything (here a txid not committed: a typo; a live
    lease without --force is refused at the same step) owes no table: a later rewind to
    another txid runs and carries every table back."""
    from tridentflow.errors import TridentflowError
    from tridentflow_state.errors import StateError

    drain(rt)
    committed = rt.ledger.committed_txid()
    for refused in (committed + 100, committed + 1):
        with pytest.raises((TridentflowError, StateError)):
            rewind_pipeline(rt, refused, force=True)
    report = rewind_pipeline(rt, 4, force=True)
    assert set(report.tables_rewound) == {*UPSERT, *APPEND}
    for name, state in UPSERT.items():
        key, value = ("word", "count") if state == "counts" else ("key", "value")
        assert keyed(table_rows(rt, name), key, value) == state_of(rt, state), name


@pytest.mark.parametrize("hours", ["-1", "nan", "inf"])
def test_a_vacuum_retention_that_is_no_number_of_hours_is_one_line(rt, capsys, hours):
    """`tables vacuum --retention-hours -1` (or NaN, inf) is refused in one line before any
    table is touched - Delta's and Iceberg's alike; the sinks' own vacuum refuses it too."""
    from tridentflow.ops.cli import main

    drain(rt)
    args = ["tables", "vacuum", "tests.pipelines:lakehoused", "--retention-hours", hours, "--yes",
            "--redis-url", rt.redis_url, "--home", str(rt.home)]  # fmt: skip
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "number of hours >= 0" in err and "--retention-hours 168" in err
    for name in ("delta-kv", "iceberg-kv"):
        with pytest.raises(SinkError, match="number of hours >= 0"):
            feed(rt, name).sink.vacuum(retention_hours=float(hours), dry_run=True)


def test_a_failure_inside_table_maintenance_is_one_line(rt, capsys, monkeypatch):
    """An error the table library raises in `tables compact` (a racing export's conflict, a
    store's error) is one line naming the sink, never a traceback."""
    from tridentflow.ops.cli import main

    drain(rt)

    def conflict(self):
        raise RuntimeError("CommitFailedError: a concurrent transaction\n  deep frame")

    monkeypatch.setattr(DeltaSink, "compact", conflict)
    args = ["tables", "compact", "tests.pipelines:lakehoused", "--sink", "delta-kv",
            "--redis-url", rt.redis_url, "--home", str(rt.home)]  # fmt: skip
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "sink delta-kv" in err and "tables compact failed" in err, err
    assert "run it again" in err


def test_status_after_a_rewind_says_the_tables_stand_at_its_txid_with_the_stamp_to_read(rt):
    """The rewind carried each table back to txid 4 in a new generation: status says each
    lakehouse sink stands at 4 (not 0 until the next export), and names the stamp a reader
    looks the table's txid up by - Delta's transaction_version(stamp) answers 4."""
    from deltalake import DeltaTable

    drain(rt)
    rewind_pipeline(rt, 4, force=True)
    for entry in sink_status(rt):
        if entry["sink"] in UPSERT:
            assert entry["position"] == 4, entry
    delta = next(e for e in sink_status(rt) if e["sink"] == "delta-counts")
    assert delta["stamp"].startswith("tridentflow:lakehoused:delta-counts:")
    table = DeltaTable(feed(rt, "delta-counts").sink.table_uri)
    assert table.transaction_version(delta["stamp"]) == 4


def test_a_rewind_to_a_txid_whose_files_a_vacuum_took_reloads_at_the_next_export(rt):
    """A VACUUM of the whole table's history (delta-rs's own, no versions kept) took txid 4's
    files: the rewind to 4 runs (the other tables are carried back), and the next export
    reloads that table from the state - as docs/sinks.md promises; never a rewind failing
    on every rerun ("missing file")."""
    from deltalake import DeltaTable

    drain(rt)
    sink = feed(rt, "delta-counts").sink
    DeltaTable(sink.table_uri).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False, full=True
    )
    report = rewind_pipeline(rt, 4, force=True)
    assert "delta-counts" not in report.tables_rewound and "iceberg-counts" in report.tables_rewound
    drain(rt)
    export(rt)
    assert keyed(table_rows(rt, "delta-counts"), "word", "count") == state_of(rt, "counts")
