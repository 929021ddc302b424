"""DeltaSource (tridentflow.sources.delta): a Delta table's versions as the offsets of one
partition - appends without the change feed, updates and deletes with it - each version read
by exactly one committed txid, through every fault point, on the production steps; and two
pipelines chained through a table (one's DeltaSink, the other's DeltaSource), exact under
faults and a rewind of the first."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.helpers import drain_retrying
from tridentflow import DeltaSink, DeltaSource, FileSource, Pipeline
from tridentflow.aggregators import Sum
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import PipelineError, SourceError
from tridentflow.faults import STEP_POINTS as POINTS
from tridentflow.faults import Fault, FaultPlan
from tridentflow.nodes import StateSpec
from tridentflow.ops.audit import audit
from tridentflow.steps.driver import run_batches
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime, connect
from tridentflow_state.maps import StateKind

ENGINE = LocalEngine()
SIGN = {"insert": 1, "update_postimage": 1, "update_preimage": -1, "delete": -1}


def signed(change: str, amount: float) -> list[tuple[float]]:
    """A change row's contribution to a sum: +amount inserted or after, -amount before or
    deleted."""
    return [(SIGN[change] * amount,)]


def pipeline(uri: Path | str, name: str | None = None, **source: object) -> Pipeline:
    """Sums of ``amount`` per user over the table's changes (signed by ``_change_type``)."""
    spec = DeltaSource(fields=("user", "amount", "_change_type"), uri=str(uri), **source)  # type: ignore[arg-type]
    built = Pipeline(name or f"delta-{uuid.uuid4().hex[:6]}", spec)
    built.stream.each(("_change_type", "amount"), signed, "signed").group_by(
        "user"
    ).persistent_aggregate(StateSpec("totals", StateKind.TRANSACTIONAL), Sum(), "signed", "total")
    return built.validate()


def runtime_of(built: Pipeline, redis_url: str, home: Path) -> Runtime:
    return Runtime(built, connect(redis_url), home, FaultPlan.parse(""))


def state(rt: Runtime) -> dict[str, float]:
    page = list_state(rt, rt.pipeline.states["totals"], limit=100_000)
    return {k[0]: v for k, v in page.items if v}


def table_sums(uri: Path | str) -> dict[str, float]:
    sums: dict[str, float] = {}
    for row in DeltaTable(str(uri)).to_pyarrow_table().to_pylist():
        sums[row["user"]] = sums.get(row["user"], 0) + row["amount"]
    return {k: v for k, v in sums.items() if v}


def rows(seed: int, n: int = 4) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"user": f"u{(seed + i) % 3}", "day": f"d{seed % 2}", "amount": seed * 10 + i}
            for i in range(n)
        ]
    )


@pytest.mark.parametrize("action", ["raise", "crash"])
def test_appends_are_read_once_through_every_fault_point(action, redis_url, tmp_path):
    """An append-only table (partitioned, no change feed): every version's added rows are
    counted once, an OPTIMIZE gives nothing, a fault at every point replays the same
    versions, and later appends are read by later txids."""
    uri = tmp_path / "events"
    for seed in range(3):
        write_deltalake(uri, rows(seed), mode="append", partition_by=["day"])
    DeltaTable(uri).optimize.compact()  # no data change: a version of nothing
    faults = FaultPlan(tuple(Fault(p, txid, 1, action) for txid, p in enumerate(POINTS, 2)))
    rt = runtime_of(pipeline(uri), redis_url, tmp_path / "h").with_(faults=faults)
    drain_retrying(rt, 1)
    for seed in range(3, len(POINTS) + 3):
        write_deltalake(uri, rows(seed), mode="append", partition_by=["day"])
    drain_retrying(rt, 1)
    assert rt.ledger.committed_txid() >= 1 + len(POINTS)
    assert state(rt) == table_sums(uri)
    assert run_batches(rt, ENGINE).results == []
    assert audit(rt).ok


def test_the_change_feed_gives_updates_deletes_and_merges(redis_url, tmp_path):
    """With the change feed on, a version's records are its change rows: a pipeline summing
    them signed by ``_change_type`` follows the table through updates, deletes and a MERGE,
    several versions per txid."""
    uri = tmp_path / "accounts"
    write_deltalake(uri, rows(0), configuration={"delta.enableChangeDataFeed": "true"})
    rt = runtime_of(pipeline(uri, batch_size=2), redis_url, tmp_path / "h")
    run_batches(rt, ENGINE)
    write_deltalake(uri, rows(1), mode="append")
    DeltaTable(uri).update(updates={"amount": "amount + 100"}, predicate="user = 'u1'")
    DeltaTable(uri).delete("user = 'u2'")
    source = pa.Table.from_pylist([{"user": "u0", "day": "d0", "amount": 7},
                                   {"user": "u9", "day": "d1", "amount": 9}])  # fmt: skip
    (
        DeltaTable(uri)
        .merge(source, "t.user = s.user AND t.amount = 0", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    run_batches(rt, ENGINE)
    assert state(rt) == table_sums(uri)
    assert audit(rt).ok
    from tridentflow.ops.status import format_status, status

    text = format_status(status(rt))  # each commit names its versions; none wait
    assert "  took: version 3, version 4" in text and "total lag      0 versions" in text, text
    assert ": 2 versions, 3 keys;" in text  # a txid's count is of its offsets: versions


def test_a_version_that_cannot_be_read_exactly_is_one_line_and_can_be_skipped(redis_url, tmp_path):
    """Without the change feed, a DELETE cannot be read exactly: the emit fails in one line
    naming the version and the way out, every time (never skipped); a deploy with
    ``starting_version`` past it skips it on purpose and the pipeline goes on."""
    uri = tmp_path / "events"
    write_deltalake(uri, rows(0))
    name = f"delta-{uuid.uuid4().hex[:6]}"
    rt = runtime_of(pipeline(uri, name), redis_url, tmp_path / "h")
    run_batches(rt, ENGINE)
    DeltaTable(uri).delete("user = 'u0'")  # version 1
    write_deltalake(uri, rows(5), mode="append")  # version 2
    for _ in range(2):
        with pytest.raises(SourceError, match=r"version 1 \(DELETE\) removed rows.*"
                           r"starting_version=2"):  # fmt: skip
            run_batches(rt, ENGINE)

    def sums(*tables: pa.Table) -> dict[str, float]:
        want: dict[str, float] = {}
        for r in (r for t in tables for r in t.to_pylist()):
            want[r["user"]] = want.get(r["user"], 0) + r["amount"]
        return want

    assert state(rt) == sums(rows(0))  # nothing committed past version 0
    skipped = runtime_of(pipeline(uri, name, starting_version=2), redis_url, tmp_path / "h")
    run_batches(skipped, ENGINE)
    assert state(skipped) == sums(rows(0), rows(5))


def test_bad_settings_and_a_missing_table_are_one_line_each(redis_url, tmp_path):
    for kwargs, needle in (
        ({"uri": ""}, "needs uri="),
        ({"uri": "x", "partitions": 2}, "one partition"),
        ({"uri": "x", "starting_version": -1}, "starting_version is a whole number"),
        ({"uri": "x", "position_field": "pos"}, "window on a field"),
    ):
        with pytest.raises(PipelineError, match=needle):
            DeltaSource(fields=("a",), **kwargs)  # type: ignore[arg-type]
    rt = runtime_of(pipeline(tmp_path / "nowhere"), redis_url, tmp_path / "h")
    with pytest.raises(SourceError, match="no Delta table there"):
        run_batches(rt, ENGINE)


def test_two_pipelines_chained_through_a_table_stay_exact_under_faults_and_a_rewind(
    redis_url, tmp_path
):
    """Pipeline A sums files per user into a DeltaSink with the change feed on; pipeline B
    reads that table as a DeltaSource and sums its changes: B's totals equal A's state after
    faults in both (every fault point, retried as Airflow retries) and a rewind of A (its
    table goes back: B reads the rewind's version as changes too)."""
    import pyarrow.parquet as pq

    from tridentflow.ops.rewind import rewind_pipeline
    from tridentflow.steps.export import export

    landing, table = tmp_path / "landing", tmp_path / "sums"
    upstream = Pipeline(
        f"up-{uuid.uuid4().hex[:6]}",
        FileSource(fields=("user", "amount"), uri=str(landing), batch_size=1, min_age_s=0),
        retain_txids=10,
    )
    sums = upstream.stream.group_by("user").persistent_aggregate(
        StateSpec("totals", StateKind.TRANSACTIONAL), Sum(), "amount", "amount"
    )
    sums.new_values_stream().sink(DeltaSink(table, key=["user"], change_data_feed=True))
    faults = FaultPlan(tuple(Fault(p, txid, 1, "raise") for txid, p in enumerate(POINTS, 2)))
    a = runtime_of(upstream.validate(), redis_url, tmp_path / "a").with_(faults=faults)
    b = runtime_of(pipeline(table), redis_url, tmp_path / "b").with_(faults=faults)

    def land(i: int) -> None:
        landing.mkdir(exist_ok=True)
        pq.write_table(rows(i).drop_columns(["day"]), landing / f"{i:02}.parquet")

    def a_state() -> dict[str, float]:
        page = list_state(a, a.pipeline.states["totals"], limit=100_000)
        return {k[0]: v for k, v in page.items if v}

    for i in range(len(POINTS) + 2):
        land(i)
        drain_retrying(a, 1)
        for _ in range(5):
            try:
                export(a)
                break
            except Exception:  # an injected fault in the export: retried
                continue
        drain_retrying(b, 3)
    assert a_state() == table_sums(table) == state(b)
    rewind_pipeline(a, 2)
    export(a)
    drain_retrying(b, 3)
    assert a_state() == table_sums(table) == state(b)
    land(99)
    drain_retrying(a, 1)
    export(a)
    drain_retrying(b, 3)
    assert a_state() == table_sums(table) == state(b)
    assert audit(b).ok


def test_a_sinks_table_and_a_sources_table_have_one_lineage_name(tmp_path):
    """OpenLineage links a chain of pipelines only if a DeltaSink's output and a
    DeltaSource's input name the table alike (an IcebergSink's and an IcebergSource's too)."""
    from tridentflow import IcebergSink, IcebergSource
    from tridentflow.sinks.base import LineageContext
    from tridentflow.sources.base import SourceContext

    ctx = SourceContext("p", tmp_path)
    sink_ctx = LineageContext("p", "redis://x")
    for uri in (str(tmp_path / "t"), f"file://{tmp_path}/t", "s3://bucket/lake/t"):
        source = DeltaSource(fields=("a",), uri=uri).lineage_datasets(ctx)
        assert source == DeltaSink(uri).lineage_datasets(sink_ctx), uri
    catalog = {"type": "sql", "uri": "sqlite:///x.db", "warehouse": "s3://lake/wh"}
    source = IcebergSource(fields=("a",), table="ns.t", catalog=catalog).lineage_datasets(ctx)
    assert source == IcebergSink("ns.t", catalog=catalog).lineage_datasets(sink_ctx)
    assert source[0].namespace == "s3://lake" and source[0].name == "/wh/ns/t"


def test_tables_in_a_bucket_are_read_through_the_sinks_storage_options(redis_url, tmp_path):
    """Both table sources on an S3 API (moto's server): a Delta table written with
    storage_options in delta-rs's keys and read by a DeltaSource given the same dict (its
    change feed included), an Iceberg table in a bucket warehouse read through the catalog an
    IcebergSink takes; appends between runs each counted once."""
    from pyiceberg.catalog import load_catalog

    from tests.helpers import moto_s3
    from tests.test_iceberg_source import pipeline as iceberg_pipeline
    from tests.test_iceberg_source import rows as iceberg_rows
    from tests.test_iceberg_source import state as iceberg_state
    from tests.test_iceberg_source import sums

    with moto_s3("lake", process=True) as s3:
        options = {"AWS_ENDPOINT_URL": s3, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                   "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                   "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}  # fmt: skip
        uri = "s3://lake/delta/events"
        write_deltalake(uri, rows(0), storage_options=options,
                        configuration={"delta.enableChangeDataFeed": "true"})  # fmt: skip
        rt = runtime_of(pipeline(uri, storage_options=options), redis_url, tmp_path / "d")
        run_batches(rt, ENGINE)
        write_deltalake(uri, rows(1), mode="append", storage_options=options)
        DeltaTable(uri, storage_options=options).delete("user = 'u1'")
        run_batches(rt, ENGINE)
        current = DeltaTable(uri, storage_options=options).to_pyarrow_table().to_pylist()
        want: dict[str, float] = {}
        for r in current:
            want[r["user"]] = want.get(r["user"], 0) + r["amount"]
        assert state(rt) == {k: v for k, v in want.items() if v}

        catalog = {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                   "warehouse": "s3://lake/wh", "s3.endpoint": s3, "s3.access-key-id": "k",
                   "s3.secret-access-key": "s", "s3.region": "us-east-1"}  # fmt: skip
        opened = load_catalog("tridentflow", **catalog)
        opened.create_namespace("raw")
        table = opened.create_table("raw.events", schema=iceberg_rows(0).schema)
        table.append(iceberg_rows(0))
        ice = runtime_of(iceberg_pipeline(catalog), redis_url, tmp_path / "i")
        run_batches(ice, ENGINE)
        table.append(iceberg_rows(1))
        run_batches(ice, ENGINE)
        assert iceberg_state(ice) == sums(iceberg_rows(0), iceberg_rows(1))
