"""IcebergSource (tridentflow.sources.iceberg): the sequence numbers of an Iceberg table's
snapshots as the offsets of one partition - appends read once through every fault point, a
compaction read as nothing, an overwrite or delete refused in one line and skippable on
purpose - and two pipelines chained through a table (an append-mode IcebergSink read by an
IcebergSource), exact under faults."""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from tests.helpers import drain_retrying
from tridentflow import FileSource, IcebergSink, IcebergSource, Pipeline
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


def catalog_of(lake: Path) -> dict[str, str]:
    lake.mkdir(parents=True, exist_ok=True)
    return {"type": "sql", "uri": f"sqlite:///{lake}/catalog.db", "warehouse": f"file://{lake}"}


def events_table(catalog: dict[str, str], identifier: str = "raw.events"):
    from pyiceberg.catalog import load_catalog

    opened = load_catalog("tridentflow", **catalog)
    opened.create_namespace_if_not_exists(identifier.split(".")[0])
    return opened.create_table(identifier, schema=rows(0).schema)


def rows(seed: int, n: int = 4) -> pa.Table:
    return pa.Table.from_pylist(
        [{"user": f"u{(seed + i) % 3}", "amount": seed * 10 + i} for i in range(n)]
    )


def pipeline(catalog: dict[str, str], table: str = "raw.events", name: str | None = None,
             **source: object) -> Pipeline:  # fmt: skip
    spec = IcebergSource(fields=("user", "amount"), table=table, catalog=catalog, **source)  # type: ignore[arg-type]
    built = Pipeline(name or f"ice-{uuid.uuid4().hex[:6]}", spec)
    built.stream.group_by("user").persistent_aggregate(
        StateSpec("totals", StateKind.TRANSACTIONAL), Sum(), "amount", "total"
    )
    return built.validate()


def runtime_of(built: Pipeline, redis_url: str, home: Path) -> Runtime:
    return Runtime(built, connect(redis_url), home, FaultPlan.parse(""))


def state(rt: Runtime) -> dict[str, float]:
    page = list_state(rt, rt.pipeline.states["totals"], limit=100_000)
    return {k[0]: v for k, v in page.items if v}


def sums(*tables: pa.Table) -> dict[str, float]:
    want: dict[str, float] = {}
    for r in (r for t in tables for r in t.to_pylist()):
        want[r["user"]] = want.get(r["user"], 0) + r["amount"]
    return {k: v for k, v in want.items() if v}


@pytest.mark.parametrize("action", ["raise", "crash"])
def test_appends_are_read_once_through_every_fault_point(action, redis_url, tmp_path):
    """Every append snapshot's rows counted once; a fault at every point replays the same
    snapshots; later appends are read by later txids; nothing is read twice."""
    catalog = catalog_of(tmp_path / "lake")
    table = events_table(catalog)
    written = [rows(seed) for seed in range(len(POINTS) + 3)]
    for data in written[:3]:
        table.append(data)
    faults = FaultPlan(tuple(Fault(p, txid, 1, action) for txid, p in enumerate(POINTS, 2)))
    rt = runtime_of(pipeline(catalog), redis_url, tmp_path / "h").with_(faults=faults)
    drain_retrying(rt, 1)
    for data in written[3:]:
        table.append(data)
    drain_retrying(rt, 1)
    assert rt.ledger.committed_txid() >= 1 + len(POINTS)
    assert state(rt) == sums(*written)
    assert run_batches(rt, ENGINE).results == []
    assert audit(rt).ok


def test_an_overwrite_is_one_line_and_can_be_skipped_on_purpose(redis_url, tmp_path):
    """An overwrite snapshot removed rows pyiceberg cannot read as changes: the emit fails in
    one line naming it and the way out, every time; ``starting_sequence`` past it skips it
    on purpose."""
    catalog = catalog_of(tmp_path / "lake")
    table = events_table(catalog)
    table.append(rows(0))
    name = f"ice-{uuid.uuid4().hex[:6]}"
    rt = runtime_of(pipeline(catalog, name=name), redis_url, tmp_path / "h")
    run_batches(rt, ENGINE)
    table.overwrite(rows(1))  # a delete snapshot (sequence 2), then an append (3)
    table.append(rows(2))
    overwrite_seq = max(
        s.sequence_number for s in table.refresh().metadata.snapshots
        if s.summary.operation.value in ("overwrite", "delete")
    )  # fmt: skip
    for _ in range(2):
        with pytest.raises(SourceError, match=r"is an? (overwrite|delete), which removed rows"):
            run_batches(rt, ENGINE)
    assert state(rt) == sums(rows(0))
    skipped = runtime_of(
        pipeline(catalog, name=name, starting_sequence=overwrite_seq + 1), redis_url,
        tmp_path / "h",
    )  # fmt: skip
    run_batches(skipped, ENGINE)
    # pyiceberg's overwrite is a delete snapshot, then an append one: the delete skipped,
    # the overwrite's rows and the append after them are read
    assert state(skipped) == sums(rows(0), rows(1), rows(2))


def test_bad_settings_and_a_missing_table_are_one_line_each(redis_url, tmp_path):
    for kwargs, needle in (
        ({"table": "events"}, "namespace.table"),
        ({"table": "a.b", "partitions": 2}, "one partition"),
        ({"table": "a.b", "starting_sequence": -1}, "starting_sequence is a whole number"),
    ):
        with pytest.raises(PipelineError, match=needle):
            IcebergSource(fields=("a",), **kwargs)  # type: ignore[arg-type]
    catalog = catalog_of(tmp_path / "lake")
    rt = runtime_of(pipeline(catalog, "raw.nowhere"), redis_url, tmp_path / "h")
    with pytest.raises(SourceError, match="no such table in its catalog"):
        run_batches(rt, ENGINE)


def test_two_pipelines_chained_through_an_appended_table_stay_exact_under_faults(
    redis_url, tmp_path
):
    """Pipeline A sums files per user and appends each txid's new values to an Iceberg table
    (an append-mode IcebergSink: one snapshot per txid); pipeline B reads that table as an
    IcebergSource and keeps each user's last total (Max of the growing sums): B equals A after
    faults at every point in both."""
    import pyarrow.parquet as pq

    from tridentflow.aggregators import Max
    from tridentflow.steps.export import export

    landing = tmp_path / "landing"
    catalog = catalog_of(tmp_path / "lake")
    upstream = Pipeline(
        f"up-{uuid.uuid4().hex[:6]}",
        FileSource(fields=("user", "amount"), uri=str(landing), batch_size=1, min_age_s=0),
    )
    totals = upstream.stream.group_by("user").persistent_aggregate(
        StateSpec("totals", StateKind.TRANSACTIONAL), Sum(), "amount", "total"
    )
    totals.new_values_stream().sink(IcebergSink("chain.totals", catalog=catalog, mode="append"))
    faults = FaultPlan(tuple(Fault(p, txid, 1, "raise") for txid, p in enumerate(POINTS, 2)))
    a = runtime_of(upstream.validate(), redis_url, tmp_path / "a").with_(faults=faults)
    downstream = Pipeline(
        f"down-{uuid.uuid4().hex[:6]}",
        IcebergSource(
            fields=("user", "total"), table="chain.totals", catalog=catalog, batch_size=3
        ),
    )
    downstream.stream.group_by("user").persistent_aggregate(
        StateSpec("last", StateKind.TRANSACTIONAL), Max(), "total", "last"
    )
    b = runtime_of(downstream.validate(), redis_url, tmp_path / "b").with_(faults=faults)
    landing.mkdir()
    for i in range(len(POINTS) + 2):
        pq.write_table(rows(i + 1), landing / f"{i:02}.parquet")
        drain_retrying(a, 1)
        for _ in range(5):
            try:
                export(a)
                break
            except Exception:  # an injected fault in the export: retried
                continue
        drain_retrying(b, 3)
    want = {k[0]: v for k, v in list_state(a, a.pipeline.states["totals"], limit=1000).items}
    got = {k[0]: v for k, v in list_state(b, b.pipeline.states["last"], limit=1000).items}
    assert got == want and want
    assert audit(b).ok
