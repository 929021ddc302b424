"""FileSource (tridentflow.sources.files): Parquet, CSV and JSON files in a directory, each
taken by exactly one committed txid - through every fault point, files landing late with old
mtimes, overwrites and deletions - on the local engine and the production steps."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from tests.helpers import drain_retrying, moto_s3
from tridentflow import FileSource, Pipeline
from tridentflow.aggregators import Count, Sum
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import PartitionUnavailableError, PipelineError, SourceError
from tridentflow.faults import STEP_POINTS as POINTS
from tridentflow.faults import Fault, FaultPlan
from tridentflow.nodes import StateSpec
from tridentflow.ops.audit import audit
from tridentflow.sources.specs import SourceMode
from tridentflow.steps.driver import run_batches, run_pipelined
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime, connect
from tridentflow_state.maps import StateKind

ENGINE = LocalEngine()


def pipeline(landing: Path | str, fmt: str = "parquet", **source: object) -> Pipeline:
    """A FileSource pipeline (its files written whole before a listing: ``min_age_s`` 0 unless
    given) summing ``amount`` (opaque) and counting rows (transactional) per user."""
    source.setdefault("min_age_s", 0.0)
    spec = FileSource(fields=("user", "amount"), uri=str(landing), format=fmt, **source)  # type: ignore[arg-type]
    built = Pipeline(f"files-{uuid.uuid4().hex[:6]}", spec)
    built.stream.group_by("user").persistent_aggregate(
        StateSpec("totals", StateKind.OPAQUE), Sum(), "amount", "total"
    )
    built.stream.group_by("user").persistent_aggregate(
        StateSpec("rows", StateKind.TRANSACTIONAL), Count(), out_field="rows"
    )
    return built.validate()


def runtime_of(built: Pipeline, redis_url: str, home: Path, faults: str = "") -> Runtime:
    return Runtime(built, connect(redis_url), home, FaultPlan.parse(faults))


def state(rt: Runtime, name: str) -> dict[str, object]:
    page = list_state(rt, rt.pipeline.states[name], limit=100_000)
    return {k[0]: v for k, v in page.items}


def write(
    landing: Path, name: str, rows: list[dict], fmt: str = "parquet", mtime: float | None = None
) -> Path:
    """One file of ``rows`` in ``landing`` (its mtime set when given)."""
    path = landing / name
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pylist(rows)
    if fmt == "parquet":
        pq.write_table(table, path)
    elif fmt == "csv":
        pacsv.write_csv(table, path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def expected(files: list[list[dict]]) -> tuple[dict[str, float], dict[str, int]]:
    totals: dict[str, float] = {}
    rows: dict[str, int] = {}
    for file in files:
        for r in file:
            totals[r["user"]] = totals.get(r["user"], 0) + r["amount"]
            rows[r["user"]] = rows.get(r["user"], 0) + 1
    return totals, rows


def batch(seed: int, n: int = 5) -> list[dict]:
    return [
        {"user": f"u{(seed * 7 + i) % 4}", "amount": seed * 10 + i, "extra": "x"} for i in range(n)
    ]


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_every_file_counts_once_across_txids_and_late_files_with_old_mtimes(
    fmt, redis_url, tmp_path
):
    """Files arrive between runs, one lands late with an mtime older than every file taken
    (an mtime cursor would skip it), hidden and marker files are never read; extra columns
    are ignored. The state equals a recount of every file exactly once."""
    landing = tmp_path / "landing"
    rt = runtime_of(pipeline(landing, fmt, batch_size=2), redis_url, tmp_path / "h")
    files = [batch(i) for i in range(5)]
    for i, rows in enumerate(files[:3]):
        write(landing, f"day1/part-{i}.{fmt}", rows, fmt, mtime=1_700_000_000 + i)
    write(landing, f"_SUCCESS.{fmt}", batch(99), fmt)
    write(landing, f".hidden.{fmt}", batch(98), fmt)
    run_batches(rt, ENGINE)
    assert state(rt, "totals"), "nothing read"
    write(landing, f"day2/part-0.{fmt}", files[3], fmt)
    write(landing, f"day0/late.{fmt}", files[4], fmt, mtime=1_600_000_000)  # older than all
    summary = run_batches(rt, ENGINE)
    totals, rows = expected(files)
    assert state(rt, "totals") == totals and state(rt, "rows") == rows
    assert summary.results, "the late files made no txid"
    assert run_batches(rt, ENGINE).results == []  # nothing new: nothing taken twice
    assert audit(rt).ok


@pytest.mark.parametrize("action", ["raise", "crash"])
def test_a_fault_at_every_point_replays_the_same_files(action, redis_url, tmp_path):
    landing = tmp_path / "landing"
    faults = FaultPlan(tuple(Fault(p, txid, 1, action) for txid, p in enumerate(POINTS, 2)))
    rt = runtime_of(pipeline(landing, batch_size=1), redis_url, tmp_path / "h").with_(faults=faults)
    files = [batch(i) for i in range(len(POINTS) + 3)]
    for i, rows in enumerate(files[:4]):
        write(landing, f"a-{i:02d}.parquet", rows)
    drain_retrying(rt, 1)
    for i, rows in enumerate(files[4:], 4):
        write(landing, f"b-{i:02d}.parquet", rows)
    drain_retrying(rt, 1)
    assert rt.ledger.committed_txid() >= 1 + len(POINTS)
    totals, rows = expected(files)
    assert state(rt, "totals") == totals and state(rt, "rows") == rows
    assert audit(rt).ok


def test_an_overwritten_file_is_refused_ignored_or_taken_again_as_asked(redis_url, tmp_path):
    landing = tmp_path / "landing"
    first, second = batch(1), batch(2, n=3)
    write(landing, "f.parquet", first)
    strict = runtime_of(pipeline(landing), redis_url, tmp_path / "h")
    run_batches(strict, ENGINE)
    write(landing, "f.parquet", second, mtime=1_800_000_000)  # overwritten
    with pytest.raises(SourceError) as refused:
        run_batches(strict, ENGINE)
    line = str(refused.value)
    assert "\n" not in line and "f.parquet" in line and "offset 0 of partition 0" in line
    assert "on_overwrite='reingest'" in line and not refused.value.retry_helps
    assert state(strict, "rows") == expected([first])[1]  # nothing committed was lost

    for mode, want in (("ignore", [first]), ("reingest", [first, second])):
        landing = tmp_path / mode
        write(landing, "f.parquet", first)
        rt = runtime_of(pipeline(landing, on_overwrite=mode), redis_url, tmp_path / f"h-{mode}")
        run_batches(rt, ENGINE)
        write(landing, "f.parquet", second, mtime=1_800_000_000)
        run_batches(rt, ENGINE)
        assert state(rt, "rows") == expected(want)[1], mode


def test_a_frozen_file_deleted_or_changed_before_its_emit_is_never_read_half(redis_url, tmp_path):
    """The txid froze the file; it is changed before the emit read it: the emit fails in one
    line naming the file and its partition waits (rewritten, or deleted; the emit lists
    nothing: the read checks the file it froze); the original put back, the same txid reads
    it whole."""
    from tridentflow.steps.coordinator import coordinate
    from tridentflow.steps.emitter import emit

    landing = tmp_path / "landing"
    rows = batch(3)
    path = write(landing, "f.parquet", rows, mtime=1_700_000_000)
    original = path.read_bytes()
    rt = runtime_of(pipeline(landing), redis_url, tmp_path / "h")
    txid = rt.ledger.bind_run("run-1").txid
    coordinate(rt, txid)
    path.write_bytes(original[: len(original) // 2])  # truncated
    with pytest.raises(PartitionUnavailableError, match=r"f\.parquet changed since it was taken"):
        emit(rt, txid, ENGINE)
    path.unlink()
    with pytest.raises(PartitionUnavailableError, match=r"missing its file .*f\.parquet"):
        emit(rt, txid, ENGINE)
    path.write_bytes(original)
    os.utime(path, (1_700_000_000, 1_700_000_000))
    run_batches(rt, ENGINE)
    assert state(rt, "rows") == expected([rows])[1]
    assert rt.ledger.committed_txid() == txid


def test_a_corrupt_file_is_one_quarantined_record_naming_it(redis_url, tmp_path):
    landing = tmp_path / "landing"
    good = batch(4)
    write(landing, "good.parquet", good)
    (landing / "bad.parquet").write_bytes(b"PAR1 not really parquet")
    rt = runtime_of(pipeline(landing), redis_url, tmp_path / "h")
    run_batches(rt, ENGINE)
    assert state(rt, "rows") == expected([good])[1]
    quarantined = [json.loads(v) for v in rt.client.hvals(rt.keyspace.quarantine)]
    assert any("bad.parquet" in json.dumps(q) for q in quarantined), quarantined


def test_bad_settings_are_one_line_each(tmp_path):
    for kwargs, needle in (
        ({"uri": ""}, "needs uri="),
        ({"uri": "x", "format": "xml"}, "format must be one of parquet, csv, json"),
        ({"uri": "x", "on_overwrite": "replace"}, "on_overwrite must be one of"),
        ({"uri": "x", "position_field": "pos"}, "window on a field"),
    ):
        with pytest.raises(PipelineError, match=needle):
            FileSource(fields=("a",), **kwargs)  # type: ignore[arg-type]


def test_a_missing_directory_is_one_line(redis_url, tmp_path):
    rt = runtime_of(pipeline(tmp_path / "nowhere"), redis_url, tmp_path / "h")
    with pytest.raises(SourceError, match="no such directory or prefix"):
        run_batches(rt, ENGINE)


def test_an_opaque_file_source_needs_opaque_states(redis_url, tmp_path):
    """The guarantee table holds for files too: an opaque FileSource with a transactional
    state is refused before anything runs; with opaque states only it counts every file
    once."""
    landing = tmp_path / "landing"
    with pytest.raises(PipelineError, match="opaque source with a transactional state"):
        pipeline(landing, "json", mode=SourceMode.OPAQUE)
    spec = FileSource(fields=("user", "amount"), uri=str(landing), format="json",
                      mode=SourceMode.OPAQUE, min_age_s=0)  # fmt: skip
    built = Pipeline(f"files-{uuid.uuid4().hex[:6]}", spec)
    built.stream.group_by("user").persistent_aggregate(
        StateSpec("totals", StateKind.OPAQUE), Sum(), "amount", "total"
    )
    files = [batch(i) for i in range(3)]
    for i, rows in enumerate(files):
        write(landing, f"{i}.json", rows, "json")
    rt = runtime_of(built.validate(), redis_url, tmp_path / "h")
    run_batches(rt, ENGINE)
    assert state(rt, "totals") == expected(files)[0]
    # a file taken (an opaque txid picks its range at emit; any listing takes - here one
    # status would make) and gone before the emit reads it: skipped, and said
    write(landing, "3.json", batch(3), "json")
    gone = write(landing, "4.json", batch(4), "json")
    assert sum(rt.log.scan().heads.values()) == 5
    gone.unlink()
    run_batches(rt, ENGINE)
    assert state(rt, "totals") == expected([*files, batch(3)])[0]
    said = [json.loads(v) for v in rt.client.hvals(rt.keyspace.quarantine)]
    assert any("missing its file" in json.dumps(q) and "4.json" in json.dumps(q) for q in said), (
        said
    )


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    """A real S3 API on loopback (moto's server), a bucket in it; its endpoint."""
    with moto_s3("landing") as endpoint:
        yield endpoint


def test_files_in_a_bucket_through_deltas_storage_options(s3, redis_url, tmp_path):
    """The same rules on an S3 API: storage_options in delta-rs's keys (the dict a DeltaSink
    takes), files put between runs, one overwritten - refused in one line."""
    from pyarrow import fs

    from tridentflow.errors import FileOverwrittenError

    options = {"AWS_ENDPOINT_URL": s3, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
               "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}  # fmt: skip
    bucket = fs.S3FileSystem(endpoint_override=s3.split("://")[1], scheme="http",
                             access_key="k", secret_key="s", region="us-east-1")  # fmt: skip

    def put(name: str, rows: list[dict]) -> None:
        with bucket.open_output_stream(f"landing/in/{name}") as out:
            pq.write_table(pa.Table.from_pylist(rows), out)

    files = [batch(i) for i in range(4)]
    put("a.parquet", files[0])
    put("sub/b.parquet", files[1])
    rt = runtime_of(pipeline("s3://landing/in/", storage_options=options), redis_url,
                    tmp_path / "h")  # fmt: skip
    run_batches(rt, ENGINE)
    put("c.parquet", files[2])
    put("d.parquet", files[3])
    run_batches(rt, ENGINE)
    totals, rows = expected(files)
    assert state(rt, "totals") == totals and state(rt, "rows") == rows
    put("a.parquet", files[3])  # overwritten
    with pytest.raises(FileOverwrittenError, match=r"landing/in/a\.parquet was taken"):
        run_batches(rt, ENGINE)
    assert state(rt, "rows") == rows


def test_listings_racing_each_other_and_writers_take_every_file_exactly_once(redis_url, tmp_path):
    """Coordinators, status calls and watchers list at once while files are written in place:
    TAKE_FILES is atomic, so the manifest holds each file once, in one partition, whatever
    the interleaving - and with ``min_age_s`` a file being written is not taken half-written
    (with 0, the first run of this test had a listing take one mid-write and its completion
    refused as an overwrite: the reason the default is 2 s)."""
    import threading
    import time

    min_age_s = 0.5
    landing = tmp_path / "landing"
    built = pipeline(landing, partitions=3, min_age_s=min_age_s)
    rt = runtime_of(built, redis_url, tmp_path / "h")
    landing.mkdir()
    stop = threading.Event()
    errors: list[BaseException] = []

    def lister() -> None:
        log = runtime_of(rt.pipeline, redis_url, tmp_path / "h").log
        while not stop.is_set():
            try:
                log.scan()
            except BaseException as exc:  # reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=lister) for _ in range(4)]
    for thread in threads:
        thread.start()
    for i in range(60):
        write(landing, f"f-{i:03d}.parquet", batch(i, n=200))
    stop.set()
    for thread in threads:
        thread.join()
    assert not errors, errors
    time.sleep(min_age_s + 0.1)
    rt.log.scan()
    entries = [json.loads(e)["path"] for p in range(3)
               for e in rt.client.lrange(rt.keyspace.files_manifest(p), 0, -1)]  # fmt: skip
    assert sorted(entries) == sorted(str(landing / f"f-{i:03d}.parquet") for i in range(60))
    run_batches(rt, ENGINE)
    assert state(rt, "rows") == expected([batch(i, n=200) for i in range(60)])[1]


def frozen_batches(rt: Runtime) -> list[list[str]]:
    """Every committed txid's files, oldest txid first: its history's ranges in the manifest."""
    manifests = [
        [json.loads(e)["path"] for e in rt.client.lrange(rt.keyspace.files_manifest(p), 0, -1)]
        for p in range(rt.pipeline.source.partitions)
    ]
    return [
        sorted(
            path
            for p, (start, end) in entry["ranges"].items()
            for path in manifests[int(p)][start:end]
        )
        for entry in reversed(rt.ledger.history(10_000))
    ]


@pytest.mark.parametrize("partitions", [1, 2])
def test_one_listing_serves_a_backlog_and_its_txids_take_the_same_files(
    partitions, redis_url, tmp_path, monkeypatch
):
    """A listing takes every file it finds, so the coordinators of a backlog's txids read the
    manifest instead of listing again (Runtime.batch_scan): 12 files in batches of 2, then
    2 more landing mid-backlog (one with an old mtime), are 7 txids and 4 listings on one
    partition (a listing every txid and every drained check was 15). The batches are the
    ones a coordinator listing at every txid freezes; an overwrite is refused at the next
    listing."""
    from tridentflow.sources.files import FilesLog

    listings: list[int] = []
    real = FilesLog.list_files
    monkeypatch.setattr(FilesLog, "list_files", lambda self: listings.append(1) or real(self))
    # files in partitions by their number, not a hash of tmp_path: the listing counts below
    # depend on how many files each partition holds (an uneven hash made them vary by run)
    monkeypatch.setattr(
        FilesLog, "partition_of", lambda self, path: int(path[-10:-8]) % self._partitions
    )
    landing = tmp_path / "landing"
    files = [batch(i) for i in range(14)]
    for i, rows in enumerate(files[:12]):
        write(landing, f"f-{i:02d}.parquet", rows, mtime=1_700_000_000 + i)
    rt = runtime_of(
        pipeline(landing, batch_size=2, partitions=partitions), redis_url, tmp_path / "h"
    )
    assert len(run_batches(rt, ENGINE, max_batches=3).results) == 3
    assert len(listings) == (1 if partitions == 1 else 2)  # the first took all 12
    write(landing, "g-12.parquet", files[12], mtime=1_600_000_000)  # late, an old mtime
    write(landing, "g-13.parquet", files[13])
    run_batches(rt, ENGINE)
    if partitions == 1:
        assert (rt.ledger.committed_txid(), len(listings)) == (7, 4)
    totals, rows = expected(files)
    assert state(rt, "totals") == totals and state(rt, "rows") == rows
    assert audit(rt).ok

    # the same 14 files from the start: the batches a listing at every txid would freeze
    fewer = runtime_of(
        pipeline(landing, batch_size=2, partitions=partitions), redis_url, tmp_path / "a"
    )
    listings.clear()
    run_batches(fewer, ENGINE)
    listed_fewer = len(listings)
    pipelined = runtime_of(
        pipeline(landing, batch_size=2, partitions=partitions), redis_url, tmp_path / "p"
    )
    run_pipelined(pipelined, ENGINE, depth=2)  # its look-ahead reads the manifest too
    monkeypatch.setattr(Runtime, "batch_scan", lambda self, starts, size: self.source_scan())
    listings.clear()
    each = runtime_of(
        pipeline(landing, batch_size=2, partitions=partitions), redis_url, tmp_path / "b"
    )
    run_batches(each, ENGINE)
    assert frozen_batches(fewer) == frozen_batches(each) == frozen_batches(pipelined)
    assert state(pipelined, "rows") == rows
    assert listed_fewer < len(listings), (listed_fewer, len(listings))
    assert len(frozen_batches(each)) >= 7 // partitions

    write(landing, "f-00.parquet", batch(50), mtime=1_800_000_000)  # overwritten
    with pytest.raises(SourceError, match=r"f-00\.parquet"):
        run_batches(rt, ENGINE)


def test_a_batch_is_small_by_its_records_not_its_files(redis_url, tmp_path, monkeypatch):
    """The emit runs a small batch on the local engine in the task's process: for files the
    limit counts their rows (Parquet footers, lines), not the files - two files of 3,000 rows
    are past a limit of 5,000, and a batch past COUNTED_BYTES is big without reading it."""
    from tridentflow.sources import files
    from tridentflow.steps.runs import coordinate_run, emit_plan

    landing = tmp_path / "landing"
    for i in range(2):
        write(landing, f"f{i}.parquet", batch(i, n=3000))
    write(landing, "g.json", batch(5, n=10), "json")
    rt = runtime_of(pipeline(landing, pattern="*.parquet"), redis_url, tmp_path / "h")
    coordinate_run(rt, "run-1")
    assert emit_plan(rt, "run-1", local_limit=5000) == (1, "work")
    assert emit_plan(rt, "run-1", local_limit=6000) == (1, "small")
    small = runtime_of(pipeline(landing, "json"), redis_url, tmp_path / "h2")
    coordinate_run(small, "run-1")
    assert emit_plan(small, "run-1", local_limit=10) == (1, "small")
    assert emit_plan(small, "run-1", local_limit=9) == (1, "work")
    monkeypatch.setattr(files, "COUNTED_BYTES", 100)
    assert emit_plan(rt, "run-1", local_limit=10**9) == (1, "work")


def test_files_meet_rewind_reset_a_delta_sink_and_audit(redis_url, tmp_path):
    """Every old feature on the new source: a rewind to txid 1 re-reads the files of the
    txids after it from the manifest (their rows once), a reset takes every file again from
    scratch (``reset --source`` refused: the bucket is the user's), a Delta sink follows
    the state through both, and audit recounts the files."""
    from deltalake import DeltaTable

    from tridentflow.ops.reset import reset_pipeline
    from tridentflow.ops.rewind import rewind_pipeline
    from tridentflow.sinks import DeltaSink
    from tridentflow.steps.export import export

    landing = tmp_path / "landing"
    spec = FileSource(fields=("user", "amount"), uri=str(landing), batch_size=1, min_age_s=0)
    built = Pipeline(f"files-{uuid.uuid4().hex[:6]}", spec, retain_txids=10)
    totals = built.stream.group_by("user").persistent_aggregate(
        StateSpec("totals", StateKind.TRANSACTIONAL), Sum(), "amount", "total"
    )
    totals.new_values_stream().sink(DeltaSink(tmp_path / "delta", key=["user"]))
    rt = runtime_of(built.validate(), redis_url, tmp_path / "h")
    files = [batch(i) for i in range(4)]
    for i, rows in enumerate(files):
        write(landing, f"{i}.parquet", rows, mtime=1_700_000_000 + i)

    def table() -> dict[str, float]:
        return {
            r["user"]: r["total"]
            for r in DeltaTable(tmp_path / "delta").to_pyarrow_table().to_pylist()
        }

    run_batches(rt, ENGINE)
    export(rt)
    want = expected(files)[0]
    assert rt.ledger.committed_txid() == 4 and state(rt, "totals") == want == table()
    rewind_pipeline(rt, 1)
    assert state(rt, "totals") == expected(files[:1])[0]
    run_batches(rt, ENGINE)
    export(rt)
    assert state(rt, "totals") == want == table()
    assert audit(rt).ok
    with pytest.raises(SourceError, match=r"are yours, and tridentflow never deletes them"):
        reset_pipeline(rt, source=True)
    reset_pipeline(rt)
    run_batches(rt, ENGINE)
    export(rt)
    assert state(rt, "totals") == want == table()
    assert audit(rt).ok


def test_status_counts_its_lag_in_files_and_names_those_waiting(redis_url, tmp_path):
    from tridentflow.ops.status import format_status, status

    landing = tmp_path / "landing"
    for i in range(3):
        write(landing, f"{i}.parquet", batch(i), mtime=1_700_000_000 + i)
    rt = runtime_of(pipeline(landing, batch_size=2), redis_url, tmp_path / "h")
    info = status(rt)
    assert (info["lag"], info["lag_unit"]) == (3, "files")
    assert info["waiting"] == [str(landing / f"{i}.parquet") for i in range(3)]
    text = format_status(info)
    assert "total lag      3 files" in text and f"waiting: {landing / '0.parquet'}" in text
    run_batches(rt, ENGINE)
    info = status(rt)
    assert (info["lag"], info["waiting"]) == (0, [])
    # each commit names the files it took (newest first)
    took = [(e["txid"], e["took"], e["took_more"]) for e in info["history"]]
    assert took == [(2, [str(landing / "2.parquet")], 0),
                    (1, [str(landing / f"{i}.parquet") for i in range(2)], 0)]  # fmt: skip
    assert f"  took: {landing / '0.parquet'}, {landing / '1.parquet'}" in format_status(info)


def test_forget_after_keeps_what_the_source_remembers_bounded_and_says_its_price(
    redis_url, tmp_path
):
    """With ``forget_after``, files far enough behind the newest taken are forgotten (neither
    compared nor taken again) and the manifest is trimmed of what committed txids and the
    rewind retention no longer need: after 40 files a minute apart, with 150 s, a handful are
    remembered - and every file still counted exactly once. A late file older than the
    watermark is left out (the rule's price, counted for status); one newer than it but older
    than the frontier is still taken. A rewind within the retention re-reads its files."""
    from tridentflow.ops.rewind import rewind_pipeline

    landing = tmp_path / "landing"
    spec = FileSource(fields=("user", "amount"), uri=str(landing), batch_size=3, min_age_s=0,
                      forget_after=150)  # fmt: skip
    built = Pipeline(f"files-{uuid.uuid4().hex[:6]}", spec, retain_txids=2)
    built.stream.group_by("user").persistent_aggregate(
        StateSpec("totals", StateKind.TRANSACTIONAL), Sum(), "amount", "total"
    )
    rt = runtime_of(built.validate(), redis_url, tmp_path / "h")
    t0 = 1_700_000_000
    files = [batch(i) for i in range(40)]
    for i, rows in enumerate(files):
        write(landing, f"{i:02}.parquet", rows, mtime=t0 + 60 * i)
        if i % 10 == 9:
            run_batches(rt, ENGINE)
    assert state(rt, "totals") == expected(files)[0]
    log = rt.log
    held = log.remembered()  # type: ignore[attr-defined]
    # the frontier is file 39's mtime; the watermark 150 s behind it: files 37..39 remembered
    assert held["watermark_ms"] == (t0 + 60 * 39 - 150) * 1000
    assert held["taken"] == 3 and held["forgotten"] == 37
    # the manifest keeps what a rewind to the oldest retained txid reads (2 txids of 3 files)
    assert held["manifest"] <= 2 * 3, held
    assert run_batches(rt, ENGINE).results == []  # nothing taken twice, forgotten or not
    assert log.remembered()["below_watermark"] == 37  # type: ignore[attr-defined]
    from tridentflow.ops.status import format_status, status

    text = format_status(status(rt))
    assert "remembers      3 files taken" in text, text
    assert "37 forgotten: files modified before 2023-11-14T22:49:50+00:00 are not taken" in text

    # late files: one older than the watermark is left out; one newer than it is taken
    write(landing, "late-old.parquet", batch(50), mtime=t0)
    write(landing, "late-new.parquet", batch(51), mtime=t0 + 60 * 39 - 100)
    run_batches(rt, ENGINE)
    want = expected([*files, batch(51)])[0]
    assert state(rt, "totals") == want
    assert log.remembered()["below_watermark"] == 38  # type: ignore[attr-defined]

    # a rewind within the retention re-reads its txids' files from the trimmed manifest
    committed = rt.ledger.committed_txid()
    rewind_pipeline(rt, committed - 1)
    run_batches(rt, ENGINE)
    assert state(rt, "totals") == want
    # audit cannot recount from the start: it says so, it does not guess
    assert not audit(rt).ok


def test_trim_keeps_what_a_rewind_needs_and_a_trimmed_range_is_one_line(redis_url, tmp_path):
    """``tridentflow trim`` on a FileSource: the manifest's committed entries go, up to what
    the rewind retention needs (a rewind within it still works); what was trimmed is named in
    one line by a read of it (the files are untouched, the state too)."""
    from tridentflow.ops.rewind import rewind_pipeline
    from tridentflow_state.errors import RewindError

    landing = tmp_path / "landing"
    spec = FileSource(fields=("user", "amount"), uri=str(landing), batch_size=1, min_age_s=0)
    built = Pipeline(f"files-{uuid.uuid4().hex[:6]}", spec, retain_txids=3)
    built.stream.group_by("user").persistent_aggregate(
        StateSpec("totals", StateKind.TRANSACTIONAL), Sum(), "amount", "total"
    )
    rt = runtime_of(built.validate(), redis_url, tmp_path / "h")
    files = [batch(i) for i in range(6)]
    for i, rows in enumerate(files):
        write(landing, f"{i}.parquet", rows, mtime=1_700_000_000 + i)
    run_batches(rt, ENGINE)
    assert rt.ledger.committed_txid() == 6
    removed = rt.log.trim(rt.ledger.committed_offsets())  # type: ignore[attr-defined]
    # retention keeps txids 3..6 rewindable: a rewind to 3 reads offsets 3.. (kept)
    assert removed == {0: (3, "rewind retention")}
    assert rt.log.trim(rt.ledger.committed_offsets()) == {0: (0, "rewind retention")}  # type: ignore[attr-defined]
    rewind_pipeline(rt, 3)
    run_batches(rt, ENGINE)
    assert state(rt, "totals") == expected(files)[0]
    with pytest.raises(RewindError, match="outside what the undo logs retain"):
        rewind_pipeline(rt, 2)  # the retention refuses first: the trim kept what it allows
    # what was trimmed is named in one line by whoever asks for it (audit, a replay)
    with pytest.raises(SourceError, match=r"offsets 0..2 were trimmed from the manifest"):
        rt.log.probe(0, 0, 6)
    assert not audit(rt).ok
    assert state(rt, "totals") == expected(files)[0]


def test_forget_after_is_seconds_or_a_timedelta(tmp_path):
    from datetime import timedelta

    assert FileSource(fields=("a",), uri="x", forget_after=timedelta(days=7)).forget_after == (
        7 * 86400
    )
    for bad in (0, -5, "7d", True):
        with pytest.raises(PipelineError, match="forget_after is seconds"):
            FileSource(fields=("a",), uri="x", forget_after=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["parquet", "csv", "json"])
def test_produce_writes_one_whole_file_of_the_sources_format(redis_url, tmp_path, fmt):
    """``tridentflow produce`` into a FileSource: one new file in its format (a column per
    field), renamed in whole; its records come back through the source, every one once."""
    landing = tmp_path / "landing"
    rt = runtime_of(pipeline(landing, fmt), redis_url, tmp_path / "h")
    lines = [json.dumps({"user": f"u{i % 3}", "amount": i}) for i in range(10)]
    said = rt.log.produce(rt.pipeline.name, lines, None, 1)
    assert said.records == 10 and str(said).startswith("wrote")
    (written,) = [p for p in landing.iterdir()]
    assert written.suffix == {"parquet": ".parquet", "csv": ".csv", "json": ".jsonl"}[fmt]
    run_batches(rt, ENGINE, 1)
    assert state(rt, "rows") == {"u0": 4, "u1": 3, "u2": 3}
    assert state(rt, "totals") == {"u0": 18, "u1": 12, "u2": 15}
    if fmt != "json":
        with pytest.raises(SourceError, match="takes JSON objects"):
            rt.log.produce(rt.pipeline.name, ["[1, 2]"], None, 1)
