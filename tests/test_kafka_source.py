"""Kafka as a source, against a real Kafka-protocol broker (Tansu, tests start it on a free
port): offsets with gaps (transaction markers), faults at every point, producers writing while
txids run, a broker that stops answering (opaque skips, transactional waits), a topic deleted
and recreated, missing brokers, the CLI's produce/status/run/audit."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.helpers import drain_retrying, sentences, word_counts
from tridentflow.aggregators import Count
from tridentflow.devtools.devkafka import LocalKafka
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import PartitionUnavailableError, SourceError, TridentflowError
from tridentflow.examples.wordcount import split
from tridentflow.faults import STEP_POINTS as POINTS
from tridentflow.faults import Fault, FaultPlan
from tridentflow.nodes import StateSpec
from tridentflow.ops.audit import audit
from tridentflow.ops.reset import reset_pipeline
from tridentflow.ops.status import status
from tridentflow.pipeline import Pipeline
from tridentflow.sources.kafka import KafkaLog
from tridentflow.sources.specs import KafkaSource, SourceMode
from tridentflow.steps.driver import run_batches
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime, connect
from tridentflow_state.maps import StateKind

pytestmark = pytest.mark.servers

ENGINE = LocalEngine()


@pytest.fixture
def broker() -> Iterator[LocalKafka]:
    """A broker of this test's own (it starts in milliseconds)."""
    with LocalKafka() as server:
        yield server


def pipeline(
    broker: LocalKafka,
    mode: SourceMode = SourceMode.TRANSACTIONAL,
    topic: str = "words",
    timeout_s: float = 2.0,
    **source: object,
) -> Pipeline:
    spec = KafkaSource(
        fields=("sentence",),
        mode=mode,
        partitions=4,
        batch_size=25,
        topic=topic,
        config={"bootstrap.servers": broker.bootstrap},
        timeout_s=timeout_s,
        **source,  # type: ignore[arg-type]
    )
    built = Pipeline(f"kafka-{mode.value}-{uuid.uuid4().hex[:6]}", spec)
    (
        built.stream.each("sentence", split, "word")
        .group_by("word")
        .persistent_aggregate(StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count")
    )
    return built.validate()


def runtime_of(built: Pipeline, redis_url: str, home, faults: str = "") -> Runtime:
    return Runtime(built, connect(redis_url), home, FaultPlan.parse(faults))


def counts(rt: Runtime) -> dict[str, int]:
    page = list_state(rt, rt.pipeline.states["counts"], limit=100_000)
    return {k[0]: v for k, v in page.items}


def transactional_producer(broker: LocalKafka, topic: str, lines: list[str]) -> None:
    """An exactly-once Kafka producer: every record in transactions, each leaving a commit
    marker (an offset that holds no record) in every partition it wrote."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "tx-1"})
    producer.init_transactions(10)
    for chunk in range(0, len(lines), 10):
        producer.begin_transaction()
        for i, line in enumerate(lines[chunk : chunk + 10], chunk):
            producer.produce(topic, json.dumps(line).encode(), partition=i % 4)
        producer.commit_transaction(10)


def test_offsets_with_transaction_markers_count_every_record_once(broker, redis_url, tmp_path):
    """A transactional producer leaves markers between records: batches end on them, start
    after them, and the completeness check still accounts for every offset."""
    built = pipeline(broker)
    rt = runtime_of(built, redis_url, tmp_path / "h")
    rt.log.create(4)
    lines = sentences(230, seed=3)
    transactional_producer(broker, "words", lines)
    heads = rt.log.scan().heads
    assert sum(heads.values()) > len(lines)  # the markers take offsets
    summary = run_batches(rt, ENGINE, batch_size=7)
    assert counts(rt) == word_counts(lines)
    assert rt.ledger.committed_offsets() == heads
    assert len(summary.results) > 8
    report = audit(rt)
    assert report.ok, report


@pytest.mark.parametrize("action", ["raise", "crash"])
def test_a_fault_at_every_point_replays_exactly(action, broker, redis_url, tmp_path):
    built = pipeline(broker)
    rt = runtime_of(built, redis_url, tmp_path / "h")
    rt = rt.with_(
        faults=FaultPlan(tuple(Fault(p, txid, 1, action) for txid, p in enumerate(POINTS, 2)))
    )
    rt.log.create(4)
    lines = sentences(300, seed=5)
    rt.log.append_spread(lines[:120])
    drain_retrying(rt, 6)
    rt.log.append_spread(lines[120:])
    drain_retrying(rt, 6)
    assert rt.ledger.committed_txid() >= 1 + len(POINTS)  # every fault's txid ran
    assert counts(rt) == word_counts(lines)
    assert audit(rt).ok


@pytest.mark.parametrize("mode", [SourceMode.TRANSACTIONAL, SourceMode.OPAQUE])
def test_records_produced_while_txids_run_are_each_counted_once(mode, broker, redis_url, tmp_path):
    built = pipeline(broker, mode)
    rt = runtime_of(built, redis_url, tmp_path / "h")
    rt.log.create(4)
    first, more = sentences(60, seed=1), sentences(400, seed=2)
    rt.log.append_spread(first)
    other = KafkaLog("words", {"bootstrap.servers": broker.bootstrap}, "producer")

    def produce() -> None:
        for chunk in range(0, len(more), 40):
            other.append_spread(more[chunk : chunk + 40])

    producer = threading.Thread(target=produce)
    producer.start()
    while producer.is_alive():
        run_batches(rt, ENGINE, max_batches=1, batch_size=9)
    producer.join()
    run_batches(rt, ENGINE, batch_size=9)
    assert counts(rt) == word_counts(first + more)
    assert audit(rt).ok


def test_a_stopped_broker_is_skipped_by_opaque_and_waited_for_by_transactional(
    broker, redis_url, tmp_path
):
    """The broker stops answering (frozen, nothing lost). Opaque: the next txid skips every
    partition within the bound and commits nothing of them. Transactional: a txid whose
    ranges were fixed before fails its emit, and its retry after the broker is back reads
    exactly those ranges."""
    from tridentflow.steps.committer import commit
    from tridentflow.steps.coordinator import coordinate
    from tridentflow.steps.emitter import emit

    opaque = runtime_of(pipeline(broker, SourceMode.OPAQUE, timeout_s=1), redis_url, tmp_path / "o")
    txnal = runtime_of(pipeline(broker, timeout_s=1), redis_url, tmp_path / "t")
    opaque.log.create(4)
    lines = sentences(80, seed=4)
    opaque.log.append_spread(lines[:40])
    run_batches(opaque, ENGINE, max_batches=1, batch_size=5)
    txid = txnal.ledger.bind_run("run-a", adopt_live=True).txid
    meta = coordinate(txnal, txid, 5)
    broker.pause()
    try:
        started = time.monotonic()
        skipped = run_batches(opaque, ENGINE, max_batches=1, batch_size=5).results[0]
        assert skipped.records == 0 and time.monotonic() - started < 30
        assert opaque.ledger.history(1)[0]["skipped"] == [0, 1, 2, 3]
        assert status(opaque)["unavailable_partitions"] == [0, 1, 2, 3]
        with pytest.raises(PartitionUnavailableError, match=r"not answering at 127\.0\.0\.1"):
            emit(txnal, txid, ENGINE)
    finally:
        broker.resume()
    assert coordinate(txnal, txid, 5) == meta  # the retry reads what was fixed
    emit(txnal, txid, ENGINE)
    assert commit(txnal, txid).records == 20
    opaque.log.append_spread(lines[40:])
    run_batches(opaque, ENGINE, batch_size=5)
    drain_retrying(txnal, 5)
    assert counts(opaque) == counts(txnal) == word_counts(lines)
    assert audit(opaque).ok and audit(txnal).ok


def test_a_topic_deleted_and_recreated_is_refused_in_one_line_until_reset(
    broker, redis_url, tmp_path
):
    from confluent_kafka.admin import AdminClient

    rt = runtime_of(pipeline(broker), redis_url, tmp_path / "h")
    rt.log.create(4)
    rt.log.append_spread(sentences(40, seed=6))
    run_batches(rt, ENGINE)
    before = counts(rt)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics(["words"])["words"].result(10)
    time.sleep(0.2)
    rt.log.create(4)
    fresh = [f"fresh{i} words" for i in range(200)]  # past the old offsets: only its id tells
    rt.log.append_spread(fresh)
    with pytest.raises(SourceError, match="deleted and created again") as caught:
        run_batches(rt, ENGINE)
    assert "\n" not in str(caught.value) and "tridentflow reset" in str(caught.value)
    assert counts(rt) == before  # not one record of the new topic read as the old one's
    reset_pipeline(rt, force=True)  # starts at what the topic holds now
    run_batches(rt, ENGINE)
    assert counts(rt) == word_counts(fresh)
    with pytest.raises(TridentflowError, match="Kafka topic words, which is its producers'"):
        reset_pipeline(rt, force=True, source=True)


def test_a_partition_behind_what_was_committed_is_unavailable_with_the_fix(
    broker, redis_url, tmp_path
):
    """The broker itself lost records (here: restarted with in-memory storage, the topic made
    again with fewer records): the partitions' ends are behind the committed offsets."""
    rt = runtime_of(pipeline(broker, SourceMode.OPAQUE), redis_url, tmp_path / "h")
    rt.log.create(4)
    rt.log.append_spread(sentences(40, seed=7))
    run_batches(rt, ENGINE)
    broker.stop()
    broker.start()
    rt.log.close()
    rt.log.topic_ids.client.delete(rt.log.topic_ids.key)  # no id to compare: only ends tell
    rt.log.create(4)
    rt.log.append_spread(["short"] * 8)
    scan = rt.log.scan(rt.ledger.committed_offsets())
    assert scan.heads == {}
    assert "behind the committed offset 10" in scan.unavailable[0]
    assert status(rt)["unavailable_partitions"] == [0, 1, 2, 3]


def test_bad_input_is_one_line(broker, redis_url, tmp_path, monkeypatch):
    from tridentflow.errors import PipelineError

    monkeypatch.delenv("TRIDENTFLOW_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.delenv("TRIDENTFLOW_KAFKA_CONFIG", raising=False)
    no_brokers = KafkaSource(fields=("sentence",), topic="t")
    built = Pipeline("kafka-nowhere", no_brokers)
    built.stream.each("sentence", split, "word").group_by("word").persistent_aggregate(
        StateSpec("counts", StateKind.OPAQUE), Count(), out_field="count"
    )
    rt = runtime_of(built.validate(), redis_url, tmp_path / "h")
    with pytest.raises(SourceError, match="set TRIDENTFLOW_KAFKA_BOOTSTRAP=host:port"):
        rt.log  # noqa: B018 (the property builds the log)
    missing = runtime_of(pipeline(broker, topic="nope"), redis_url, tmp_path / "m")
    with pytest.raises(SourceError, match=r"Kafka topic nope at 127\.0\.0\.1:.*no such topic"):
        run_batches(missing, ENGINE)
    with pytest.raises(PipelineError, match="position_field needs dense offsets"):
        KafkaSource(fields=("a",), position_field="pos")
    with pytest.raises(PipelineError, match="value_format 'text' gives one field"):
        KafkaSource(fields=("a", "b"), value_format="text")
    secret = KafkaLog("t", {"bootstrap.servers": "b:1", "sasl.password": "hunter2"}, "p")
    assert "hunter2" not in repr(secret)


def test_text_records_and_bad_records_are_quarantined_not_counted(broker, redis_url, tmp_path):
    from confluent_kafka import Producer

    rt = runtime_of(pipeline(broker, value_format="text"), redis_url, tmp_path / "h")
    rt.log.create(4)
    rt.log.append_spread(["plain text words", "more words"])
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    producer.produce("words", b"\xff\xfe not utf-8", partition=2)
    producer.flush(10)
    run_batches(rt, ENGINE)
    assert counts(rt) == {"plain": 1, "text": 1, "words": 2, "more": 1}
    assert rt.ledger.quarantined() == 1
    entry = next(iter(rt.client.hvals(rt.keyspace.quarantine)))
    assert b"not UTF-8" in entry


def test_the_cli_produces_runs_and_shows_kafka_partitions(broker, tf, tmp_path):
    env = {"TRIDENTFLOW_KAFKA_BOOTSTRAP": broker.bootstrap}
    lines = sentences(120, seed=12)
    data = tmp_path / "lines.txt"
    data.write_text("\n".join(lines) + "\n")
    made = tf("produce", "wordcount-kafka", str(data), env=env)
    assert made.returncode == 0, made.stderr
    assert "produced 120 records to Kafka topic wordcount (4 of 4 partitions; topic created)" in (
        made.stdout
    )
    ran = tf("run", "wordcount-kafka", "--engine", "local", "--no-progress", env=env)
    assert ran.returncode == 0, ran.stderr
    shown = tf("status", "wordcount-kafka", "--json", env=env)
    info = json.loads(shown.stdout)
    assert [p["committed"] == p["head"] and p["lag"] == 0 for p in info["partitions"]] == [True] * 4
    checked = tf("audit", "wordcount-kafka", env=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    nowhere = tf(
        "run", "wordcount-kafka", "--engine", "local", env={"TRIDENTFLOW_KAFKA_BOOTSTRAP": ""}
    )
    assert nowhere.returncode != 0
    assert nowhere.stderr.strip().count("\n") == 0, nowhere.stderr
    assert "a KafkaSource needs brokers" in nowhere.stderr
