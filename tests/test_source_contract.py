"""The source interface (tridentflow.sources.base), one suite every source log passes: the file
log, Redis Streams and Kafka. What the coordinator, the engines' read tasks and the audit rely
on, and nothing more - a new source runs this suite first (README: Writing your own source)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tridentflow.sources import open_log
from tridentflow.sources.base import SourceLog
from tridentflow_state.keys import KeySpace

PARTITIONS = 4
RECORDS = [{"sentence": f"record {i}"} for i in range(203)]


@pytest.fixture(
    params=[
        "file",
        "redis-stream",
        pytest.param("kafka", marks=pytest.mark.servers),
        "sqlite (a source of your own)",
    ]
)
def log(request, tmp_path, redis_client, redis_url) -> Iterator[SourceLog]:
    """An empty log of 4 partitions, of each kind."""
    if request.param == "file":
        from tridentflow.sources.filelog import FileLog

        made = FileLog(tmp_path / "log")
        made.ensure(PARTITIONS)
        yield made
    elif request.param == "redis-stream":
        from tridentflow.sources.redisstream import RedisStreamLog

        keys = [f"contract:p{p}" for p in range(PARTITIONS)]
        yield RedisStreamLog(redis_client, redis_url, KeySpace("contract"), keys, ("sentence",))
    elif request.param.startswith("sqlite"):
        from tridentflow.examples.sqlite_source import SqliteLog

        yield SqliteLog(str(tmp_path / "source.db"), PARTITIONS)
    else:
        from tridentflow.devtools.devkafka import LocalKafka
        from tridentflow.sources.kafka import KafkaLog

        with LocalKafka() as broker:
            made = KafkaLog("contract", {"bootstrap.servers": broker.bootstrap}, "contract")
            made.create(PARTITIONS)
            yield made
            made.close()


def read_all(log: SourceLog, heads: dict[int, int]) -> dict[int, list[tuple[int, bytes]]]:
    return {p: list(log.read_raw(p, 0, head)) for p, head in heads.items()}


def test_heads_cover_every_record_appended(log):
    assert sum(log.scan().heads.values()) == 0
    log.append_spread(RECORDS[:100])
    log.append_spread(RECORDS[100:])
    scan = log.scan()
    assert sorted(scan.heads) == list(range(PARTITIONS)) and scan.unavailable == {}
    assert sum(scan.heads.values()) >= len(RECORDS)  # Kafka: markers may take offsets too
    if getattr(log, "dense", True):
        assert sum(scan.heads.values()) == len(RECORDS)
    assert log.scan(dict(scan.heads)).unavailable == {}  # committed up to the heads: readable


def test_a_range_reads_its_records_in_order_and_the_same_on_every_read(log):
    import json

    log.append_spread(RECORDS)
    heads = log.scan().heads
    first = read_all(log, heads)
    assert read_all(log, heads) == first  # a transactional replay reads the same bytes
    seen = []
    for p, items in first.items():
        offsets = [offset for offset, _ in items]
        assert offsets == sorted(set(offsets)) and all(0 <= o < heads[p] for o in offsets)
        if getattr(log, "dense", True):
            assert offsets == list(range(heads[p]))
        indexes = [int(json.loads(raw)["sentence"].split()[1]) for _, raw in items]
        assert indexes == sorted(indexes)  # a partition keeps its records' order
        seen += indexes
    assert sorted(seen) == list(range(len(RECORDS)))  # every record in exactly one partition


def test_ranges_split_anywhere_read_the_same_records(log):
    """What read tasks do: a partition's range split into sub-ranges, read separately."""
    log.append_spread(RECORDS)
    heads = log.scan().heads
    whole = read_all(log, heads)
    for p, head in heads.items():
        for cut in (1, head // 3, head - 1):
            assert list(log.read_raw(p, 0, cut)) + list(log.read_raw(p, cut, head)) == whole[p]
        assert list(log.read_raw(p, head, head)) == []


def test_probe_passes_every_readable_range(log):
    """``probe`` fails only for a partition that cannot be read now (each log's own tests
    make its partitions unreadable: a dark file partition, a trimmed stream, a stopped
    broker); the emitter compares ranges with the heads itself."""
    log.append_spread(RECORDS)
    heads = log.scan().heads
    assert sum(heads.values()) == len(RECORDS)
    for p, head in heads.items():
        assert head > 0, f"partition {p} got none of the records"
        for start, end in ((0, head), (head // 2, head), (head, head)):
            assert log.probe(p, start, end) is None  # returns, raises nothing
        assert list(log.read_raw(p, 0, head)), "a probed range reads"


def test_a_log_opened_from_its_locator_reads_the_same(log):
    """Spark executors open the log from ``root`` (a path or a locator string)."""
    log.append_spread(RECORDS)
    heads = log.scan().heads
    other = open_log(str(log.root))
    try:
        assert read_all(other, heads) == read_all(log, heads)
    finally:
        close = getattr(other, "close", None)
        if close is not None:
            close()


def test_acknowledge_leaves_everything_readable(log):
    log.append_spread(RECORDS)
    heads = log.scan().heads
    before = read_all(log, heads)
    log.acknowledge({p: head // 2 for p, head in heads.items()})
    log.acknowledge(dict(heads))
    assert read_all(log, heads) == before
    log.append_spread(RECORDS[:8])
    assert sum(log.scan().heads.values()) >= sum(heads.values()) + 8


def test_a_source_of_your_own_runs_like_the_bundled_ones(tf, tmp_path):
    """``wordcount-sqlite`` (tridentflow/examples/sqlite_source.py): a CustomSource naming
    its log function; produce, run on the local engine, audit - no tridentflow code changed."""
    from tests.helpers import sentences, word_counts

    env = {"TRIDENTFLOW_SQLITE_SOURCE": str(tmp_path / "words.db")}
    lines = sentences(150, seed=21)
    made = tf("produce", "wordcount-sqlite", "-", input="\n".join(lines) + "\n", env=env)
    assert made.returncode == 0, made.stderr
    ran = tf("run", "wordcount-sqlite", "--engine", "local", "--batch-size", "9", env=env)
    assert ran.returncode == 0, ran.stderr
    expected = word_counts(lines)
    words = sorted(expected)[:20]
    shown = tf("query", "wordcount-sqlite", *words, env=env).stdout.splitlines()
    assert shown == [f"{w}\t{expected[w]}" for w in words]
    assert tf("audit", "wordcount-sqlite", env=env).stdout.strip() == "lost=0 doubled=0"
    # rows the source lost for good (deleted under it): audit says which partition, and what
    # it holds of the committed range, instead of failing on the read
    import sqlite3

    with sqlite3.connect(env["TRIDENTFLOW_SQLITE_SOURCE"]) as db:
        (head,) = db.execute("SELECT MAX(seq) + 1 FROM records WHERE part = 2").fetchone()
        db.execute("DELETE FROM records WHERE part = 2 AND seq < 4")
    gone = tf("audit", "wordcount-sqlite", env=env)
    assert gone.returncode != 0, gone.stdout
    assert gone.stdout.strip().startswith("cannot audit: partition 2 cannot be read: "), gone
    assert f"partition 2 holds {head - 4} of the rows [0, {head})" in gone.stdout, gone.stdout
