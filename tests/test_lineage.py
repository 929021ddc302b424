"""What each step of a txid reports as read and written (tridentflow.steps.lineage, the data
behind the operators' OpenLineage events), on real Redis and PostgreSQL through the steps the
Airflow tasks call: the txid's ranges from the step's result, the batch metadata or the commit
record; a replay says so; every kind of source and sink names itself as OpenLineage names
datasets (tridentflow.datasets)."""

from __future__ import annotations

import pytest

from tests.helpers import produce, runtime, sentences
from tridentflow.datasets import (
    DEFAULT_NAMESPACE,
    LineageDataset,
    kafka_namespace,
    postgres_dataset,
    redis_namespace,
)
from tridentflow.engines.local import LocalEngine
from tridentflow.steps.export import export
from tridentflow.steps.lineage import step_lineage
from tridentflow.steps.runs import commit_run, coordinate_run, emit_run, emit_summary


def run_txid(rt, run_id: str) -> dict[str, dict]:
    """coordinate -> emit -> commit of ``run_id`` as the Airflow tasks run them: each result."""
    coordinated = coordinate_run(rt, run_id)
    emitted = emit_summary(rt, coordinated["txid"], emit_run(rt, run_id, LocalEngine()))
    return {"coordinate": coordinated, "emit": emitted, "commit": commit_run(rt, run_id)}


def test_each_step_reports_the_source_with_the_txids_ranges_and_the_commit_its_states(
    redis_url, redis_client, home
):
    rt = runtime("wordcount", redis_url, home)
    produce(rt, sentences(40, seed=1))
    results = run_txid(rt, "run-1")
    ranges = {int(p): tuple(r) for p, r in results["coordinate"]["ranges"].items()}
    assert sum(end - start for start, end in ranges.values()) == 40
    source = LineageDataset("file", str(home / "sources" / "wordcount"))
    state = LineageDataset(redis_namespace(redis_url), rt.keyspace.state("counts"))
    assert redis_namespace(redis_url) == redis_url.removesuffix("/0")
    for step, result in results.items():
        got = step_lineage(rt, step, "run-1", result)
        assert (got.txid, got.replayed, got.inputs) == (1, False, (source,)), step
        assert got.ranges == ranges, step
        assert got.outputs == ((state,) if step == "commit" else ()), step
        assert got.guarantee == rt.pipeline.guarantee.value
    assert step_lineage(rt, "emit", "run-1", results["emit"]).records == 40

    # the run replayed (a cleared task): every step says so, and still names the txid's ranges
    # though the txid's own metadata is gone once later txids move on
    produce(rt, sentences(10, seed=2))
    run_txid(rt, "run-2")
    replay = {
        "coordinate": coordinate_run(rt, "run-1"),
        "emit": emit_summary(rt, 1, None),
        "commit": commit_run(rt, "run-1"),
    }
    for step, result in replay.items():
        got = step_lineage(rt, step, "run-1", result)
        assert (got.txid, got.replayed, got.ranges) == (1, True, ranges), step
        assert got.records == 40, step  # what the txid committed, not the replay's nothing
    # before a step finished (the start of a task) or after it failed, no result to go by:
    # the ledger says whether it replays a committed txid, as its COMPLETE will
    for step in ("coordinate", "emit", "commit"):
        started = step_lineage(rt, step, "run-2", None)
        assert (started.txid, started.replayed) == (2, True), step
    produce(rt, sentences(5, seed=3))
    coordinate_run(rt, "run-3")
    started = step_lineage(rt, "commit", "run-3", None)
    assert (started.txid, started.replayed, started.records) == (3, False, None)
    assert step_lineage(rt, "coordinate", "never-bound", None).txid is None


def test_a_sharded_states_datasets_are_its_shards_hashes(redis_url, redis_client, home):
    """Each dataset a commit reports names a key that exists (a sharded state has no hash of
    its own: each shard holds one)."""
    rt = runtime("wordcount", redis_url, home)
    rt = rt.with_(shards=3)
    rt.ledger.reset(force=True)
    produce(rt, sentences(30, seed=4))
    results = run_txid(rt, "run-1")
    outputs = step_lineage(rt, "commit", "run-1", results["commit"]).outputs
    assert len(outputs) == 3
    assert all(redis_client.exists(d.name) for d in outputs), outputs


def test_an_opaque_commits_start_names_the_ranges_its_emit_read(redis_url, redis_client, home):
    rt = runtime("wordcount-opaque", redis_url, home)
    produce(rt, sentences(12, seed=5))
    coordinate_run(rt, "run-1")
    staged = emit_summary(rt, 1, emit_run(rt, "run-1", LocalEngine()))
    started = step_lineage(rt, "commit", "run-1", None)  # the commit task's START, and FAIL
    assert started.ranges and started.ranges == {
        int(p): tuple(r) for p, r in staged["ranges"].items()
    }


def test_an_opaque_txids_ranges_come_from_its_emit_then_its_commit_record(
    redis_url, redis_client, home
):
    rt = runtime("wordcount-opaque", redis_url, home)
    produce(rt, sentences(25, seed=3))
    coordinated = coordinate_run(rt, "run-1")
    assert "ranges" not in coordinated  # the emit decides an opaque txid's ranges
    assert step_lineage(rt, "coordinate", "run-1", coordinated).ranges == {}
    staged = emit_summary(rt, 1, emit_run(rt, "run-1", LocalEngine()))
    emitted = step_lineage(rt, "emit", "run-1", staged).ranges
    assert sum(end - start for start, end in emitted.values()) == 25
    assert step_lineage(rt, "commit", "run-1", commit_run(rt, "run-1")).ranges == emitted
    assert step_lineage(rt, "commit", "run-1", None).ranges == emitted  # the commit record


def test_a_stream_source_is_one_dataset_per_partition_each_with_its_own_range(
    redis_url, redis_client, home
):
    rt = runtime("wordcount-stream", redis_url, home)
    produce(rt, sentences(30, seed=4))
    results = run_txid(rt, "run-1")
    got = step_lineage(rt, "commit", "run-1", results["commit"])
    keys = rt.pipeline.source.stream_keys("wordcount-stream")
    assert [(d.namespace, d.name, d.partitions) for d in got.inputs] == [
        (redis_namespace(redis_url), key, (p,)) for p, key in enumerate(keys)
    ]
    per_stream = [got.ranges_of(d) for d in got.inputs]
    assert [list(r) for r in per_stream] == [[p] for p in range(4)]
    assert sum(end - start for r in per_stream for start, end in r.values()) == 30


def test_the_export_reads_the_fed_states_and_writes_the_postgres_table(
    redis_url, redis_client, home, pg_dsn, monkeypatch
):
    monkeypatch.setenv("TRIDENTFLOW_POSTGRES_DSN", pg_dsn)
    rt = runtime("wordcount-postgres", redis_url, home)
    produce(rt, sentences(20, seed=5))
    run_txid(rt, "run-1")
    result = {"txid": 1, "sinks": [r.to_json() for r in export(rt, upto=1)]}
    got = step_lineage(rt, "export", "run-1", result)
    database = pg_dsn.rsplit("/", 1)[-1]
    assert got.outputs == (
        LineageDataset("postgres://127.0.0.1:5432", f"{database}.public.wordcount_counts"),
    )
    assert got.inputs == (LineageDataset(redis_namespace(redis_url), rt.keyspace.state("counts")),)
    assert (got.replayed, got.ranges) == (False, {})
    again = {"txid": 1, "sinks": [r.to_json() for r in export(rt, upto=1)]}
    assert step_lineage(rt, "export", "run-1", again).replayed  # nothing left to apply


def test_an_unknown_step_is_refused_in_one_line(redis_url, redis_client, home):
    rt = runtime("wordcount", redis_url, home)
    with pytest.raises(ValueError, match="step must be one of coordinate, emit, commit, export"):
        step_lineage(rt, "publish", "run-1")


@pytest.mark.parametrize(
    ("url", "namespace"),
    [
        ("redis://127.0.0.1:6380/0", "redis://127.0.0.1:6380"),
        ("redis://:secret@db.example:6379/3", "redis://db.example:6379/3"),
        ("rediss://user:pw@db.example/0", "redis://db.example:6379"),
        ("redis://localhost?db=2", "redis://localhost:6379/2"),
        ("unix:///run/redis.sock?db=1", "redis+unix:///run/redis.sock/1"),
    ],
)
def test_redis_namespaces_name_the_server_and_database_never_the_credentials(url, namespace):
    assert redis_namespace(url) == namespace


def test_kafka_and_postgres_names_follow_openlineages_naming():
    assert kafka_namespace("b1.example:9093,b2.example:9093") == "kafka://b1.example:9093"
    assert kafka_namespace("SASL_SSL://b1.example:9094") == "kafka://b1.example:9094"
    assert kafka_namespace("b1.example") == "kafka://b1.example:9092"
    uri = postgres_dataset("postgresql://u:pw@pg.example:5433/sales", ("wc",))
    assert (uri.namespace, uri.name) == ("postgres://pg.example:5433", "sales.public.wc")
    kv = postgres_dataset("host=pg.example dbname=sales user=u", ("marts", "wc"))
    assert (kv.namespace, kv.name) == ("postgres://pg.example:5432", "sales.marts.wc")
    assert DEFAULT_NAMESPACE == "tridentflow"


def test_the_export_names_lakehouse_tables_where_they_are(
    redis_url, redis_client, home, tmp_path, monkeypatch
):
    """Delta's and Iceberg's outputs are the tables' real locations (Iceberg's as the catalog
    placed it), each as OpenLineage names a file-system table."""
    pytest.importorskip("deltalake")
    pytest.importorskip("pyiceberg")
    from tridentflow import DeltaSink, IcebergSink

    monkeypatch.setenv("TF_TEST_LAKE", str(tmp_path))
    rt = runtime("tests.pipelines:lakehoused", redis_url, home)
    produce(rt, ["a b", "set k 1", "b c"])
    run_txid(rt, "run-1")
    result = {"txid": 1, "sinks": [r.to_json() for r in export(rt, upto=1)]}
    assert all(s["applied"] for s in result["sinks"]), result
    got = step_lineage(rt, "export", "run-1", result)
    expected = []
    for feed in rt.pipeline.feeds:
        sink = feed.sink
        if isinstance(sink, DeltaSink):
            table = str(tmp_path / sink.table_uri.rsplit("/", 1)[-1])
            expected.append(LineageDataset("file", table))
        elif isinstance(sink, IcebergSink):
            location = sink.catalog().load_table(sink.identifier).location()
            expected.append(LineageDataset("file", location.removeprefix("file://")))
    assert len(expected) == 6 and got.outputs == tuple(expected)
    fresh = runtime("tests.pipelines:lakehoused", redis_url, home)  # has loaded no table
    assert step_lineage(fresh, "export", "run-1", result).outputs == tuple(expected)
