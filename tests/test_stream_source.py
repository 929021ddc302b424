"""The Redis Streams source against a real redis-server: producers XADDing while txids run,
faults at every point, a stream deleted and recreated, entries trimmed beyond what is
committed, the trim command, audit."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from tests.helpers import drain_retrying, sentences, word_counts
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import PartitionUnavailableError, SourceError
from tridentflow.faults import STEP_POINTS as POINTS
from tridentflow.faults import Fault, FaultPlan
from tridentflow.ops.audit import audit
from tridentflow.registry import load_pipeline
from tridentflow.sources.redisstream import RedisStreamLog
from tridentflow.steps.driver import run_batches
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime, connect

ENGINE = LocalEngine()
STREAMS = [f"tridentflow:wordcount-stream:p{p}" for p in range(4)]


def _rt(name: str, redis_url: str, home, faults: str = "") -> Runtime:
    rt = Runtime(load_pipeline(name), connect(redis_url), home, FaultPlan.parse(faults))
    return rt


@pytest.fixture
def streams(redis_client):
    """Fresh streams for both stream pipelines (the test Redis is shared)."""
    for name in ("wordcount-stream", "wordcount-stream-tx"):
        for p in range(4):
            redis_client.delete(f"tridentflow:{name}:p{p}")
    yield redis_client


def counts(rt: Runtime) -> dict[str, int]:
    page = list_state(rt, rt.pipeline.states["counts"], limit=100_000)
    return {k[0]: v for k, v in page.items}


def xadd(client, name: str, lines: list[str], start: int = 0) -> None:
    """An external producer: XADD straight to the streams, round robin from ``start``."""
    for i, line in enumerate(lines, start):
        client.xadd(f"tridentflow:{name}:p{i % 4}", {"sentence": line})


def drain(rt: Runtime, batch_size: int = 5) -> None:
    drain_retrying(rt, batch_size)


@pytest.mark.parametrize("name", ["wordcount-stream", "wordcount-stream-tx"])
def test_entries_added_while_txids_run_are_each_counted_once(name, redis_url, streams, tmp_path):
    rt = _rt(name, redis_url, tmp_path / "h")
    rt.ledger.reset(force=True)
    first = sentences(40, seed=1)
    rt.log.append_spread(first)  # what `tridentflow produce` does
    more = sentences(300, seed=2)
    producer = threading.Thread(target=xadd, args=(connect(redis_url), name, more))
    producer.start()
    while producer.is_alive():
        run_batches(rt, ENGINE, max_batches=1, batch_size=7)
    producer.join()
    run_batches(rt, ENGINE, batch_size=7)
    assert counts(rt) == word_counts(first + more)
    assert rt.ledger.committed_txid() > 3
    report = audit(rt)
    assert report.ok and report.records == len(first) + len(more)
    assert sum(rt.log.scan().heads.values()) == len(first) + len(more)
    for key in STREAMS if name == "wordcount-stream" else []:  # reading deletes nothing
        assert streams.xlen(key) > 0


@pytest.mark.parametrize("action", ["raise", "crash"])
@pytest.mark.parametrize("name", ["wordcount-stream", "wordcount-stream-tx"])
def test_a_fault_at_every_point_replays_exactly(name, action, redis_url, streams, tmp_path):
    lines = sentences(90, seed=5)
    rt = _rt(name, redis_url, tmp_path / "h")
    faults = (Fault(point, txid, 1, action) for txid, point in enumerate(POINTS, 2))
    rt = rt.with_(
        faults=FaultPlan(tuple(faults))
    )  # crash: nothing after the point runs (as SIGKILL)
    rt.ledger.reset(force=True)
    xadd(streams, name, lines[:45])
    drain(rt, batch_size=3)
    xadd(streams, name, lines[45:], start=45)
    drain(rt, batch_size=3)
    assert rt.ledger.committed_txid() >= 1 + len(POINTS)  # every fault's txid ran
    assert counts(rt) == word_counts(lines)
    assert audit(rt).ok


def test_a_stream_deleted_and_recreated_is_skipped_never_misread(redis_url, streams, tmp_path):
    rt = _rt("wordcount-stream", redis_url, tmp_path / "h")
    rt.ledger.reset(force=True)
    lines = sentences(40, seed=8)
    xadd(streams, "wordcount-stream", lines)
    run_batches(rt, ENGINE)
    before = counts(rt)
    streams.delete(STREAMS[1])  # its 10 entries were committed
    again = [f"fresh{i} words" for i in range(25)]
    for line in again:  # recreated: past its old position, so ordinals alone would not tell
        streams.xadd(STREAMS[1], {"sentence": line})
    xadd(streams, "wordcount-stream", ["late arrival"] * 4)
    run_batches(rt, ENGINE)
    scan = rt.log.scan()
    assert 1 not in scan.unavailable  # its head moved on: only a read can tell
    with pytest.raises(PartitionUnavailableError, match="deleted and recreated"):
        rt.log.probe(1, rt.ledger.committed_offsets()[1], scan.heads[1])
    after = counts(rt)
    assert after.get("fresh0") is None  # not one entry of the new stream read as an old one
    assert Counter(after) - Counter(before) == Counter({"late": 3, "arrival": 3})
    assert rt.ledger.history(1)[0]["skipped"] == [1]  # skipped like a dark partition
    assert rt.ledger.committed_offsets()[1] == 10


def test_entries_trimmed_beyond_the_committed_position_are_an_error(redis_url, streams, tmp_path):
    rt = _rt("wordcount-stream-tx", redis_url, tmp_path / "h")
    rt.ledger.reset(force=True)
    lines = sentences(40, seed=9)
    xadd(streams, "wordcount-stream-tx", lines, start=0)
    run_batches(rt, ENGINE, max_batches=1, batch_size=4)  # 4 of each stream's 10 committed
    key = "tridentflow:wordcount-stream-tx:p2"
    streams.xtrim(key, maxlen=3, approximate=False)  # someone trims uncommitted entries away
    with pytest.raises((PartitionUnavailableError, SourceError), match="trimmed to ordinal 7"):
        run_batches(rt, ENGINE, batch_size=4)
    assert rt.ledger.committed_offsets()[2] == 4  # nothing skipped silently


def test_trim_removes_only_committed_entries(redis_url, streams, tmp_path, tf):
    rt = _rt("wordcount-stream", redis_url, tmp_path / "h")
    rt.ledger.reset(force=True)
    lines = sentences(40, seed=10)
    xadd(streams, "wordcount-stream", lines)
    run_batches(rt, ENGINE, max_batches=1, batch_size=6)  # 6 of each stream's 10
    out = tf("trim", "wordcount-stream")
    assert out.returncode == 0, out.stderr
    assert "trimmed 24 committed entries" in out.stdout
    assert [streams.xlen(k) for k in STREAMS] == [4, 4, 4, 4]
    run_batches(rt, ENGINE)
    assert counts(rt) == word_counts(lines)  # the rest read after the trim, exactly
    unaudited = audit(rt)
    assert not unaudited.ok and "trimmed" in str(unaudited.unreadable)
    refused = tf("trim", "wordcount")
    assert refused.returncode == 1 and "trim applies to Redis Streams" in refused.stderr


def test_produce_and_reset_source_on_streams(tf, streams):
    out = tf("produce", "wordcount-stream", "-", input="a b\nb c\nc\n\n")
    assert out.returncode == 0 and "added 3 entries" in out.stdout, out.stderr
    assert [streams.xlen(k) for k in STREAMS] == [1, 1, 1, 0]
    assert streams.xrange(STREAMS[0])[0][1] == {b"sentence": b"a b"}
    json_in = '{"sentence": "d"}\n"e f"\n["g"]\n'
    assert tf("produce", "wordcount-stream", "-", "--json", input=json_in).returncode == 0
    bad = tf("produce", "wordcount-stream", "-", "--json", input='{"sentence": "x"}\n[1, 2]\n')
    assert bad.returncode == 1 and "record 2: expected the fields ['sentence']" in bad.stderr
    assert sum(streams.xlen(k) for k in STREAMS) == 6  # the bad file added nothing
    assert tf("run", "wordcount-stream", "--engine", "local").returncode == 0
    assert tf("query", "wordcount-stream", "b", "g").stdout == "b\t2\ng\t1\n"
    assert tf("reset", "wordcount-stream", "--yes", "--source").returncode == 0
    assert [streams.exists(k) for k in STREAMS] == [0, 0, 0, 0]


def test_a_stream_log_reads_by_ordinal_from_inside_a_batch(redis_url, streams, tmp_path):
    """A read task that starts inside a batch (a range split over tasks) skips to its
    ordinal from the nearest indexed one, and indexes it."""
    rt = _rt("wordcount-stream", redis_url, tmp_path / "h")
    rt.ledger.reset(force=True)
    xadd(streams, "wordcount-stream", [f"s{i}" for i in range(40)])
    log = RedisStreamLog.open(rt.log.locator)
    assert [r["sentence"] for _o, r in log.read(0, 3, 6)] == ["s12", "s16", "s20"]
    assert [o for o, _r in log.read(0, 6, 8)] == [6, 7]  # 6 was indexed by the read above
    assert [r["sentence"] for _o, r in log.read(0, 0, 2)] == ["s0", "s4"]
