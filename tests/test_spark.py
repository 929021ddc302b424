"""Real Spark: the in-process engine, the CLI on Spark, and the spark-submit application."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, SEED_COUNTS, SEED_SENTENCES
from tests.helpers import produce, runtime, sentences, word_counts
from tridentflow.engines.batchops import StageReport
from tridentflow.engines.local import LocalEngine
from tridentflow.engines.spark import SparkEngine
from tridentflow.engines.tasks import split_ranges
from tridentflow.ops.audit import audit
from tridentflow.plan import compile_pipeline
from tridentflow.registry import load_pipeline
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.staging import InBlocks

pytestmark = pytest.mark.spark


def test_spark_engine_matches_the_local_reference(spark, tmp_path):
    from tridentflow.sources.filelog import FileLog

    log = FileLog(tmp_path / "log", segment_records=300)
    log.ensure(5)
    rng = random.Random(11)
    for p in range(5):
        log.append(p, sentences(rng.randint(0, 700), seed=p))
        log.append_lines(p, ['"a BOOM"', "{undecodable", "42"])  # quarantined by both
        log.append(p, sentences(50, seed=p + 10))
    plan = compile_pipeline(load_pipeline("tests.pipelines:poison"))
    ranges = {p: (rng.randint(0, h // 2), h) for p, h in log.heads().items()}
    ranges[4] = (log.heads()[4], log.heads()[4])  # an empty range
    local = LocalEngine().compute(plan, str(log.root), ranges)
    on_spark = SparkEngine(spark).compute(plan, str(log.root), ranges)
    assert on_spark.counts == local.counts
    assert dict(on_spark.partials["counts"]) == dict(local.partials["counts"])
    assert on_spark.bad == local.bad
    assert len(local.bad) >= 8


def test_spark_reads_redis_streams_like_the_local_engine(
    spark, redis_url, redis_client, home, monkeypatch
):
    """Spark's read tasks open the stream log from its locator (their own Redis connection);
    a range split over several tasks skips inside the batch by ordinal."""
    from tridentflow.engines import spark as spark_engine

    rt = runtime("wordcount-stream", redis_url, home)
    rt.ledger.reset(force=True)
    for p in range(4):
        redis_client.delete(f"tridentflow:wordcount-stream:p{p}")
    lines = sentences(320, seed=12)
    rt.log.append_fields_spread([{"sentence": s} for s in lines])
    ranges = {p: (3, h) for p, h in rt.log.scan().heads.items()}
    local = LocalEngine().compute(rt.plan, rt.log.locator, ranges)
    monkeypatch.setattr(spark_engine, "task_records", lambda plan: 17)  # ranges split in tasks
    on_spark = SparkEngine(spark).compute(rt.plan, rt.log.locator, ranges)
    assert on_spark.counts == local.counts
    assert dict(on_spark.partials["counts"]) == dict(local.partials["counts"])
    assert sum(c.n for c in local.counts.values()) == len(lines) - 12


def test_spark_reads_a_file_sources_files_on_its_executors_like_the_local_engine(
    spark, redis_url, tmp_path, monkeypatch
):
    """A FileSource's txid on Spark: the read tasks open the files log from its locator
    (their own Redis connection for the manifest) and read Parquet files on the executors,
    a range of files split over several tasks; partials equal the local engine's and a
    recount of the files."""
    from tests.test_file_source import batch, expected, pipeline, runtime_of, write
    from tridentflow.engines import spark as spark_engine

    landing = tmp_path / "landing"
    files = [batch(i, n=40) for i in range(9)]
    for i, rows in enumerate(files):
        write(landing, f"d{i % 3}/part-{i}.parquet", rows)
    rt = runtime_of(pipeline(landing, partitions=2), redis_url, tmp_path / "h")
    ranges = {p: (0, h) for p, h in rt.log.scan().heads.items()}
    assert sum(h for _, h in ranges.values()) == len(files)
    local = LocalEngine().compute(rt.plan, rt.log.root, ranges)
    monkeypatch.setattr(spark_engine, "task_records", lambda plan: 2)  # files split in tasks
    on_spark = SparkEngine(spark).compute(rt.plan, rt.log.root, ranges)
    assert on_spark.counts == local.counts
    assert dict(on_spark.partials["rows"]) == dict(local.partials["rows"])
    rows = {json.loads(k)[0]: v for k, v in dict(local.partials["rows"]).items()}
    assert rows == expected(files)[1]


def test_spark_reads_a_delta_sources_versions_on_its_executors_like_the_local_engine(
    spark, redis_url, tmp_path, monkeypatch
):
    """A DeltaSource's txid on Spark: the read tasks open the table from its locator and
    read its versions (appends, then change-feed versions) on the executors, a range split
    over several tasks; partials equal the local engine's."""
    from deltalake import DeltaTable, write_deltalake

    from tests.test_delta_source import pipeline, rows, runtime_of
    from tridentflow.engines import spark as spark_engine

    uri = tmp_path / "events"
    for seed in range(3):
        write_deltalake(uri, rows(seed, n=30), mode="append", partition_by=["day"])
    DeltaTable(uri).alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    DeltaTable(uri).update(updates={"amount": "amount + 1"}, predicate="user = 'u1'")
    rt = runtime_of(pipeline(uri), redis_url, tmp_path / "h")
    ranges = {p: (0, h) for p, h in rt.log.scan().heads.items()}
    local = LocalEngine().compute(rt.plan, rt.log.root, ranges)
    monkeypatch.setattr(spark_engine, "task_records", lambda plan: 2)  # versions split
    on_spark = SparkEngine(spark).compute(rt.plan, rt.log.root, ranges)
    assert on_spark.counts == local.counts
    assert dict(on_spark.partials["totals"]) == dict(local.partials["totals"])
    assert local.counts


def test_spark_reads_an_iceberg_sources_snapshots_like_the_local_engine(
    spark, redis_url, tmp_path, monkeypatch
):
    """An IcebergSource's txid on Spark: the read tasks open the table through its catalog
    from the locator and read its append snapshots on the executors, split over tasks."""
    from tests.test_iceberg_source import catalog_of, events_table, pipeline, rows, runtime_of
    from tridentflow.engines import spark as spark_engine

    catalog = catalog_of(tmp_path / "lake")
    table = events_table(catalog)
    for seed in range(4):
        table.append(rows(seed, n=25))
    rt = runtime_of(pipeline(catalog), redis_url, tmp_path / "h")
    ranges = {p: (0, h) for p, h in rt.log.scan().heads.items()}
    local = LocalEngine().compute(rt.plan, rt.log.root, ranges)
    monkeypatch.setattr(spark_engine, "task_records", lambda plan: 2)
    on_spark = SparkEngine(spark).compute(rt.plan, rt.log.root, ranges)
    assert on_spark.counts == local.counts and local.counts
    assert dict(on_spark.partials["totals"]) == dict(local.partials["totals"])


def test_spark_reads_kafka_like_the_local_engine(spark, redis_url, home, monkeypatch):
    """Spark's read tasks open the Kafka log from its locator (their own consumer); offsets
    with transaction markers split over several tasks give the local engine's partials and
    account for every offset."""
    from tests.test_kafka_source import pipeline, runtime_of, transactional_producer
    from tridentflow.devtools.devkafka import LocalKafka
    from tridentflow.engines import spark as spark_engine

    with LocalKafka() as broker:
        rt = runtime_of(pipeline(broker), redis_url, home)
        rt.log.create(4)
        lines = sentences(320, seed=12)
        transactional_producer(broker, "words", lines)
        ranges = {p: (3, h) for p, h in rt.log.scan().heads.items()}
        local = LocalEngine().compute(rt.plan, rt.log.locator, ranges)
        monkeypatch.setattr(spark_engine, "task_records", lambda plan: 17)
        on_spark = SparkEngine(spark).compute(rt.plan, rt.log.locator, ranges)
    assert on_spark.counts == local.counts
    assert {p: (c.n, c.first, c.last) for p, c in local.counts.items()} == {
        p: (end - start, start, end - 1) for p, (start, end) in ranges.items()
    }
    assert dict(on_spark.partials["counts"]) == dict(local.partials["counts"])


def test_spark_gives_records_the_positions_the_local_engine_does(spark, tmp_path, monkeypatch):
    """Count windows key on record positions: Spark's read tasks - a range split over
    several - give every record the position the local engine does, from the batch's base."""
    from tridentflow.engines import spark as spark_engine
    from tridentflow.engines.base import ExecContext
    from tridentflow.sources.filelog import FileLog

    log = FileLog(tmp_path / "log")
    log.ensure(3)
    for p in range(3):
        log.append(p, sentences(40, seed=p))
    plan = compile_pipeline(load_pipeline("wordcount-windowed"))
    ranges, ctx = {0: (2, 40), 1: (0, 35), 2: (5, 5)}, ExecContext(0, "", position_base=100)
    local = LocalEngine().compute(plan, str(log.root), ranges, ctx)
    monkeypatch.setattr(spark_engine, "task_records", lambda plan: 7)
    on_spark = SparkEngine(spark).compute(plan, str(log.root), ranges, ctx)
    for state in ("per_window", "sliding", "counts"):
        assert dict(on_spark.partials[state]) == dict(local.partials[state]), state
    windows = dict(local.partials["per_window"])
    assert min(windows) == "[100]" and sum(windows.values()) == 38 + 35


def test_the_direct_and_exchange_paths_stage_what_the_local_engine_does(
    spark, tmp_path, monkeypatch
):
    """States fed straight by the source take one Spark job and combine on the driver; past
    DIRECT_PAIRS they take the exchange. Both equal the local engine bit for bit (float sums
    included: every engine groups a batch into the same read tasks)."""
    import tridentflow.engines.spark
    import tridentflow.engines.tasks
    from tridentflow.sources.filelog import FileLog

    monkeypatch.setattr(tridentflow.engines.tasks, "FOLD_TASK_RECORDS", 97)  # several tasks each
    log = FileLog(tmp_path / "log", segment_records=300)
    log.ensure(3)
    for p in range(3):
        log.append(p, sentences(400, seed=p))
        log.append_lines(p, ['"a BOOM"', "{undecodable"])
        log.append(p, sentences(30, seed=p + 10))
    plan = compile_pipeline(load_pipeline("tests.pipelines:folds"))
    ranges = {p: (7 * p, h) for p, h in log.heads().items()}
    local = LocalEngine().compute(plan, str(log.root), ranges)
    direct = SparkEngine(spark).compute(plan, str(log.root), ranges)
    monkeypatch.setattr(tridentflow.engines.spark, "DIRECT_PAIRS", 10)
    exchanged = SparkEngine(spark).compute(plan, str(log.root), ranges)
    assert not direct.stages and exchanged.stages  # each path was taken
    for result in (direct, exchanged):
        assert result.counts == local.counts
        assert result.bad == local.bad
        for state, items in local.partials.items():
            assert dict(result.partials[state]) == dict(items), state
    assert len(local.bad) == 6
    weights = dict(local.partials["weights"])
    assert any(w != round(w, 6) for w in weights.values())  # the float sums are inexact


def test_a_read_one_state_consumes_is_not_cached_and_its_counts_still_arrive(
    spark, tmp_path, monkeypatch
):
    """On the exchange path (RDDs) a read task's record count and bad records reach the driver
    in an accumulator, so the word count's read output - one consumer, its one state - is
    not cached (every partial would be pickled into Spark's block store and back once more):
    the only cached RDD is the states'. A pipeline with several consumers (folds: four states)
    still reads once, into one cached copy. Counts, bad records and partials equal the local
    engine's either way."""
    import tridentflow.engines.spark
    import tridentflow.engines.tasks
    from tridentflow.engines import rdds
    from tridentflow.sources.filelog import FileLog

    monkeypatch.setattr(tridentflow.engines.tasks, "FOLD_TASK_RECORDS", 97)  # several tasks each
    monkeypatch.setattr(tridentflow.engines.spark, "DIRECT_PAIRS", 10)  # the exchange path
    cached: list[str] = []
    real_cache = rdds.RddBackend.cache

    def spy(self, rdd):
        cached.append(pipeline)
        return real_cache(self, rdd)

    monkeypatch.setattr(rdds.RddBackend, "cache", spy)
    log = FileLog(tmp_path / "log", segment_records=300)
    log.ensure(3)
    for p in range(3):
        log.append(p, sentences(400, seed=p))
        log.append_lines(p, ["{undecodable"])
        log.append(p, sentences(30, seed=p + 10))
    ranges = {p: (7 * p, h) for p, h in log.heads().items()}
    for pipeline in ("wordcount", "tests.pipelines:folds"):
        plan = compile_pipeline(load_pipeline(pipeline))
        local = LocalEngine().compute(plan, str(log.root), ranges)
        on_spark = SparkEngine(spark).compute(plan, str(log.root), ranges)
        assert on_spark.stages and on_spark.counts == local.counts
        assert on_spark.bad == local.bad and len(local.bad) == 3
        for state, items in local.partials.items():
            assert dict(on_spark.partials[state]) == dict(items), state
    assert cached == ["wordcount", "tests.pipelines:folds", "tests.pipelines:folds"]


def test_staging_in_redis_the_executors_write_big_states_and_the_commit_is_exact(
    spark, redis_url, tmp_path, monkeypatch
):
    """TRIDENTFLOW_STAGING=redis on Spark: a batch past EXECUTOR_STAGING_KEYS records has its
    states written as blocks by the executors themselves (the driver gets refs only), next to
    their 3 shards; the commit applies them (Count and Sum in Redis, the rest in Python) to
    exactly what the local engine staged in files commits; a small batch takes the direct path
    and the driver stages it."""
    import tridentflow.engines.spark
    from tests.test_state_shards import _runtime, _states
    from tridentflow.devtools.chaos import staging_left

    lines = [*sentences(900, seed=21), "a BOOM"]
    results = {}
    for kind, engine in (("files", LocalEngine()), ("redis", SparkEngine(spark))):
        monkeypatch.setenv("TRIDENTFLOW_STAGING", kind)
        rt = _runtime("tests.pipelines:folds", redis_url, tmp_path / kind, 3, f"sx-{kind}")
        rt.ledger.reset(force=True)
        produce(rt, lines)
        prefixes = set()
        # txid 1 and 3 big (executors stage), txid 2 small (the direct path, the driver)
        for txid, size, executors in ((1, 40, 5), (2, 10, 10**9), (3, 100_000, 5)):
            monkeypatch.setattr(tridentflow.engines.spark, "EXECUTOR_STAGING_KEYS", executors)
            coordinate(rt, txid, batch_size=size)
            staged = emit(rt, txid, engine)
            if kind == "redis" and txid == 3:
                staged = emit(rt, txid, engine)  # a retried emit: attempt 2 stages anew
                assert staged.attempt == 2
            for name in rt.pipeline.states if isinstance(staged, InBlocks) else ():
                for ref in staged.blocks(name):
                    prefixes.add(ref.name.split(".")[1])
            assert commit(rt, txid).status == "committed"
        results[kind] = _states(rt)
        if kind == "redis":  # "d": staged by the driver; a Spark partition: by an executor
            assert "d" in prefixes and any(p.isdigit() for p in prefixes), prefixes
        assert staging_left(rt) == []  # attempt 1 of txid 3 too, and any task attempt's
    assert results["redis"] == results["files"]


def test_split_ranges_bounds_task_size():
    # (partition, start, end, position shift): positions 8.. for the records before (5 + 3)
    assert split_ranges({0: (5, 12), 1: (3, 3)}, task_records=3) == [
        (0, 5, 8, 3),
        (0, 8, 11, 3),
        (0, 11, 12, 3),
        (1, 3, 3, 12),  # an empty task: every partition read is a partition of the source stage
    ]
    assert split_ranges({0: (5, 7), 2: (1, 4)}, 10, position_base=9) == [
        (0, 5, 7, 4),
        (2, 1, 4, 10),
    ]


@pytest.mark.soak  # the soak lane, CI runs it after the suite (README)
def test_seed_word_count_on_spark_with_a_kill_inside_the_emit(tf):
    tf("produce", "wordcount", "-", input="\n".join(SEED_SENTENCES) + "\n")
    killed = tf("run", "wordcount", "--faults", "in-emit@1=kill")
    assert killed.returncode in (-9, 137), killed.stderr
    run = tf("run", "wordcount")
    assert run.returncode == 0, run.stderr
    out = tf("query", "wordcount", *SEED_COUNTS)
    assert out.stdout.splitlines() == [f"{w}\t{n}" for w, n in SEED_COUNTS.items()]
    assert tf("audit", "wordcount").stdout.strip() == "lost=0 doubled=0"


def test_spark_task_failures_are_one_line_and_workers_use_this_interpreter(tf, cli_env):
    """`.venv/bin/tridentflow run` with the venv off PATH and PYSPARK_PYTHON unset: workers
    run this interpreter (they import redis); a Python exception inside a Spark task is the
    one line the CLI prints."""
    env = {k: v for k, v in cli_env.items() if not k.startswith("PYSPARK_")}
    env["PATH"] = "/usr/bin:/bin"
    tf("produce", "tests.pipelines:explodes", "-", input="a\nb\nBOOM\n", env=env)
    out = subprocess.run(
        [str(Path(sys.executable).with_name("tridentflow")), "run", "tests.pipelines:explodes"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert lines[-1] == "tridentflow: error: Spark task failed: ValueError: cannot aggregate 'BOOM'"
    ours = [ln for ln in lines if ln.startswith("tridentflow:")]
    assert len(ours) == 1  # (Spark's own loggers may still print a trace under load)


def test_emit_through_real_spark_submit(redis_url, redis_client, home, cli_env):
    rt = runtime("wordcount-opaque", redis_url, home)
    lines = sentences(200)
    produce(rt, lines)
    coordinate(rt, 1)
    spark_submit = Path(sys.executable).with_name("spark-submit")
    proc = subprocess.run(
        [
            str(spark_submit),
            "--master",
            "local[2]",
            str(ROOT / "spark_jobs" / "emit_batch.py"),
            "--pipeline",
            "wordcount-opaque",
            "--txid",
            "1",
        ],
        capture_output=True,
        text=True,
        env={**cli_env, **dict(os.environ, **cli_env)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (result["status"], result["records"]) == ("staged", 200)
    assert commit(rt, 1).records == 200
    assert audit(rt).ok
    persist = rt.pipeline.states["counts"]
    from tridentflow.steps.query import query

    expected = word_counts(lines)
    assert query(rt, persist, [(w,) for w in expected])[1] == list(expected.values())


def test_spark_runs_every_operation_like_the_local_reference(spark, tmp_path):
    from tests.test_operations import pipeline
    from tridentflow.sources.filelog import FileLog

    log = FileLog(tmp_path / "log")
    log.ensure(3)
    rng = random.Random(5)
    log.append_spread(
        {
            "user": rng.choice("abcd"),
            "score": rng.randint(-9, 9),
            "tags": rng.choice(["x y", "y", ""]),
        }
        for _ in range(500)
    )
    plan = compile_pipeline(pipeline())
    ranges = {p: (0, h) for p, h in log.heads().items()}
    local = LocalEngine().compute(plan, str(log.root), ranges)
    on_spark = SparkEngine(spark).compute(plan, str(log.root), ranges)
    for name in local.partials:
        assert dict(on_spark.partials[name]) == dict(local.partials[name]), name


def test_every_batch_operation_matches_the_local_engine_exactly(
    spark, redis_url, redis_client, home, monkeypatch
):
    """Same staged values, in the same order, from Spark's graph on RDDs (classic Spark's) and
    the local reference: exchanges, partition/global/grouped/chained aggregates, merge, join,
    broadcast and a state query that reads what txid 1 committed; the same count reports, and
    a tuple lost in the first exchange fails the batch's check. Its states are read back as big
    ones are (each on its own, streamed past COLLECT_KEYS). (The DataFrame graph: the same
    pipeline over Spark Connect below, and the one-pass test.)"""
    from tridentflow.engines import rdds
    from tridentflow.engines.base import ExecContext, check_stages
    from tridentflow.errors import IncompleteBatchError

    monkeypatch.setattr(rdds, "COLLECT_KEYS", 20)  # most states here are bigger

    rt = runtime("tests.pipelines:everything", redis_url, home)
    rt.source_heads()
    rt.log.append_spread(sentences(120, seed=3))
    coordinate(rt, 1)
    emit(rt, 1, LocalEngine())
    commit(rt, 1)
    rt.log.append_spread(sentences(900, seed=4))
    meta = coordinate(rt, 2)
    ranges = {int(p): tuple(r) for p, r in meta["ranges"].items()}
    ctx = ExecContext(2, redis_url)
    local = LocalEngine().compute(rt.plan, str(rt.log.root), ranges, ctx)
    on_spark = SparkEngine(spark).compute(rt.plan, str(rt.log.root), ranges, ctx)
    local_states = {name: sorted(pairs) for name, pairs in local.partials.items()}
    spark_states = {name: sorted(pairs) for name, pairs in on_spark.partials.items()}
    assert spark_states == local_states
    assert sorted(r.to_json() for r in on_spark.stages) == sorted(r.to_json() for r in local.stages)
    assert all(r.ok for r in on_spark.stages) and len(on_spark.stages) >= 8
    joined = local_states["joined"][0][1]
    assert len(joined) == 2 and joined[0] == joined[1]  # broadcast: both partitions see all
    answers = local_states["answers"][0][1]
    committed = word_counts(sentences(120, seed=3))  # what txid 1 committed, not txid 2
    assert answers and all(before == committed.get(w) for w, before in answers)
    lossy = ExecContext(2, redis_url, lose_tuple=True)
    lost = SparkEngine(spark).compute(rt.plan, str(rt.log.root), ranges, lossy)
    with pytest.raises(IncompleteBatchError, match=r"stage 1:.* of \d+ announced tuples"):
        check_stages(2, lost.stages)


def test_a_target_that_never_reported_fails_the_batch(spark):
    """On RDDs each target's count report travels in an accumulator: a target whose receive
    never ran (no job computed it) counts as one that got no report, not as a clean one."""
    from tridentflow.engines.base import check_stages
    from tridentflow.engines.batchops import Exchange
    from tridentflow.engines.rdds import RddBackend
    from tridentflow.errors import IncompleteBatchError
    from tridentflow.nodes import Repartition

    backend = RddBackend(spark.sparkContext)
    data = spark.sparkContext.parallelize([("a", 1), ("b", 2), ("c", 3)], 3)
    exchange = Exchange("1:partition_by(w)", Repartition.PARTITION_BY, 2, key_idx=(0,))
    moved = backend.exchange(data, exchange)
    assert backend.reports() == [
        StageReport("1:partition_by(w)", target, 3, 0, 0, 0) for target in (0, 1)
    ]
    with pytest.raises(IncompleteBatchError, match=r"0 of 3 sender reports"):
        check_stages(1, backend.reports())
    assert sorted(moved.collect()) == [("a", 1), ("b", 2), ("c", 3)]  # once computed: clean
    reports = backend.reports()
    assert [(r.partition, r.reports, r.ok) for r in reports] == [(0, 3, True), (1, 3, True)]
    assert sum(r.received for r in reports) == 3


def test_spark_connect_runs_every_pipeline_like_the_local_engine(connect_url, tf, cli_env):
    """`tridentflow run --remote sc://...` against a real local Connect server: the word count
    exact, every fast-path state (float sums included) equal to the local engine's, and a
    pipeline with every batch operation equal to it too."""
    tf("produce", "wordcount", "-", input="\n".join(SEED_SENTENCES) + "\n")
    run = tf("run", "wordcount", "--remote", connect_url, "--batch-size", "2")
    assert run.returncode == 0, run.stderr
    assert tf("query", "wordcount", *SEED_COUNTS).stdout.splitlines() == [
        f"{w}\t{n}" for w, n in SEED_COUNTS.items()
    ]
    assert tf("audit", "wordcount").stdout.strip() == "lost=0 doubled=0"
    # Redis Streams read by the Connect server's Python workers
    tf("produce", "wordcount-stream", "-", input="\n".join(SEED_SENTENCES) + "\n")
    run = tf("run", "wordcount-stream", "--remote", connect_url, "--batch-size", "2")
    assert run.returncode == 0, run.stderr
    assert tf("query", "wordcount-stream", *SEED_COUNTS).stdout.splitlines() == [
        f"{w}\t{n}" for w, n in SEED_COUNTS.items()
    ]

    # Kafka read by the Connect server's Python workers (their own consumers)
    from tridentflow.devtools.devkafka import LocalKafka

    with LocalKafka() as broker:
        kafka = {"TRIDENTFLOW_KAFKA_BOOTSTRAP": broker.bootstrap}
        tf("produce", "wordcount-kafka", "-", input="\n".join(SEED_SENTENCES) + "\n", env=kafka)
        run = tf("run", "wordcount-kafka", "--remote", connect_url, "--batch-size", "2", env=kafka)
        assert run.returncode == 0, run.stderr
        assert tf("query", "wordcount-kafka", *SEED_COUNTS, env=kafka).stdout.splitlines() == [
            f"{w}\t{n}" for w, n in SEED_COUNTS.items()
        ]

    lines = [*sentences(300, seed=3), "a BOOM b", *sentences(40, seed=4)]
    tf("produce", "tests.pipelines:folds", "-", input="\n".join(lines) + "\n")
    local_env = {**cli_env, "TRIDENTFLOW_REDIS_URL": cli_env["TRIDENTFLOW_REDIS_URL"][:-1] + "1"}
    assert tf("run", "tests.pipelines:folds", "--remote", connect_url).returncode == 0
    local = tf("run", "tests.pipelines:folds", "--engine", "local", env=local_env)
    assert local.returncode == 0, local.stderr
    for state in ("counts", "weights", "objects", "total"):
        listing = ["query", "tests.pipelines:folds", "--state", state, "--all", "--json"]
        over_connect = json.loads(tf(*listing, "--limit", "100000").stdout)
        on_local = json.loads(tf(*listing, "--limit", "100000", env=local_env).stdout)
        assert sorted(map(str, over_connect["values"])) == sorted(map(str, on_local["values"]))
    assert "1 bad record" in tf("status", "tests.pipelines:folds").stdout

    # every batch operation (exchanges, joins, broadcast, state queries) over Connect, two
    # txids, state for state what the local engine commits
    from tridentflow.registry import load_pipeline

    tf("produce", "tests.pipelines:everything", "-", input="\n".join(sentences(150)) + "\n")
    for env in (cli_env, local_env):
        engine = ["--remote", connect_url] if env is cli_env else ["--engine", "local"]
        run = tf("run", "tests.pipelines:everything", *engine, "--batch-size", "30", env=env)
        assert run.returncode == 0, run.stderr
    states = load_pipeline("tests.pipelines:everything").states
    assert len(states) >= 9
    for state in states:
        listing = ["query", "tests.pipelines:everything", "--state", state, "--all", "--json"]
        over_connect = json.loads(tf(*listing, "--limit", "100000").stdout)
        on_local = json.loads(tf(*listing, "--limit", "100000", env=local_env).stdout)
        assert over_connect["values"], state
        for listed in (over_connect, on_local):  # listed in each Redis's own scan order
            listed["values"].sort(key=lambda row: json.dumps(row["key"]))
        assert over_connect == on_local, state


@pytest.mark.soak
def test_chaos_seeds_over_spark_connect_are_exact(connect_url, tf):
    """The chaos harness with every emit a Spark Connect client (`tridentflow chaos
    --remote`): faults at every step, dark partitions, Redis restarts, resets, and the counts
    exact, batch operations and mutating aggregators included. (Seeds 1148-1150: one schedule
    per pipeline, crashes and a Redis restart among them, the fewest txids of any such three
    consecutive seeds from 1000 to 1180 - a batch-operation txid costs seconds over Connect.)"""
    pipelines = ("wordcount-opaque", "partitioned-count", "mutating-opaque")
    out = tf(
        "chaos", "--schedules", "3", "--seed", "1148", "--pipelines", ",".join(pipelines),
        "--remote", connect_url, "--verbose", timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("seed=")]
    assert len(lines) == 3 and all(line.endswith("lost=0 doubled=0") for line in lines), lines
    assert {line.split()[1] for line in lines} == {f"pipeline={p}" for p in pipelines}
    assert "=crash" in out.stdout and "redis-restart" in out.stdout
    assert f"over Spark Connect {connect_url}: lost=0 doubled=0" in out.stdout


def test_exchange_routes_put_each_target_in_its_own_spark_partition(spark):
    """frames.route_values inverts Spark's hash partitioning: murmur3_int is Spark's hash() of
    an int, and a repartition by the route puts target t, alone, in Spark partition t."""
    from pyspark.sql import functions as F

    from tridentflow.engines.frames import murmur3_int, route_values

    values = [0, 1, -1, 7, 42, 2**31 - 1, -(2**31), 123456]
    df = spark.createDataFrame([(v,) for v in values], "v int")
    assert [r["h"] for r in df.select(F.hash("v").alias("h")).collect()] == [
        murmur3_int(v) for v in values
    ]
    for n in (1, 3, 4, 7, 16):
        routes = route_values(n)
        rows = spark.createDataFrame([(r, t) for t, r in enumerate(routes)], "route int, t int")
        placed = rows.repartition(n, "route").select("t", F.spark_partition_id().alias("p"))
        assert sorted((r["t"], r["p"]) for r in placed.collect()) == [(t, t) for t in range(n)]


def test_a_run_of_partition_operations_is_one_python_pass(spark):
    """FrameBackend fuses consecutive partition functions into the next pass over the data:
    two maps before an exchange run in its send, two after it in one pass - three
    ``MapInArrow`` in the plan instead of six - and the result is the local engine's, count
    reports included; a tuple lost in the exchange (the lose-tuple fault) shows in them."""
    from tridentflow.engines.batchops import Exchange
    from tridentflow.engines.frames import (
        SCHEMA,
        Frame,
        FrameBackend,
        chunk_rows,
        items_of,
        materialized,
    )
    from tridentflow.engines.local import LocalBackend
    from tridentflow.nodes import Repartition

    def times(k):
        return lambda part, items: [(w, n * k) for w, n in items]

    def keep_even(part, items):
        return [(w, n) for w, n in items if n % 2 == 0]

    parts = [[(f"w{i % 7}", i) for i in range(p, 60, 3)] for p in range(3)]
    rows = [row for p, items in enumerate(parts) for row in chunk_rows(p, items)]
    exchange = Exchange("1:partition_by(w)", Repartition.PARTITION_BY, 2, key_idx=(0,))

    def graph(backend, data):
        data = backend.map_partitions(backend.map_partitions(data, times(3)), keep_even)
        moved = backend.exchange(data, exchange)
        return backend.map_partitions(backend.map_partitions(moved, times(5)), keep_even)

    df = spark.createDataFrame(rows, SCHEMA).repartition(1).sortWithinPartitions("part", "seq")
    frame = Frame(df, 3)  # the invariant: each partition's chunks contiguous, in order
    local = LocalBackend()
    expected = sorted(item for part in graph(local, parts) for item in part)
    for lose in (False, True):
        backend = FrameBackend(lose_tuple=lose)
        try:
            done = materialized(graph(backend, frame))
            plan = done.df._jdf.queryExecution().executedPlan().toString()
            assert plan.count("MapInArrow") == 3, plan
            got = sorted(items_of(done.df.where("n > 0").collect()))
            reports = sorted(r.to_json() for r in backend.reports())
        finally:
            backend.release()
        if not lose:
            assert got == expected
            assert reports == sorted(r.to_json() for r in local.reports)
        else:  # each target's first tuple lost in transit, and its report says so
            assert len(got) < len(expected)
            assert [(r[0], r[1], r[5] + 1 == r[4]) for r in reports] == [
                ("1:partition_by(w)", 0, True),
                ("1:partition_by(w)", 1, True),
            ]


SESSION_PROBE = """
import sys
from tridentflow.engines.spark import spark_session
spark = spark_session("probe", remote=sys.argv[1], share=sys.argv[2])
assert spark.range(5).count() == 5
print(spark.session_id)
if sys.argv[3] == "release":
    spark.stop()
"""


def test_connect_clients_of_one_pipeline_share_a_server_session(connect_url, cli_env):
    """Task processes one after another attach to one server-side session (its Python workers
    stay warm); one released by its owner (the server refuses a closed session's id) falls
    back to a fresh session instead of failing."""

    def probe(key: str, then: str) -> str:
        out = subprocess.run(
            [sys.executable, "-c", SESSION_PROBE, connect_url, key, then],
            capture_output=True, text=True, env=cli_env, cwd=ROOT, timeout=120,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.strip().splitlines()[-1]

    first = probe("ns/pipeline-a", "keep")
    assert probe("ns/pipeline-a", "keep") == first
    assert probe("ns/pipeline-b", "keep") != first
    released = probe("ns/pipeline-c", "release")
    fresh = probe("ns/pipeline-c", "keep")
    assert fresh != released
