"""Redis Streams as other clients use them: the family of external mutations - XDEL behind
and ahead of the reader, XTRIM MAXLEN by another producer, DEL, DEL and recreate, bytes that
are not UTF-8 - either keeps counting exactly or is reported with its reason in status and
audit, and a reset then counts what the streams hold. And sharing: namespaces never see each
other's streams; several readers of one stream each count it all, trim keeps what any reader
(a foreign consumer group too) still needs, and one reader's reset never deletes the stream."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.helpers import sentences
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import SourceError
from tridentflow.ops.audit import audit
from tridentflow.ops.reset import reset_pipeline
from tridentflow.ops.status import status
from tridentflow.registry import load_pipeline
from tridentflow.steps.driver import run_batches
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime, connect

NAME = "wordcount-stream"


def rt_of(name: str, redis_url: str, home, namespace: str = "") -> Runtime:
    return Runtime(load_pipeline(name), connect(redis_url), home, namespace=namespace)


def counts(rt: Runtime) -> dict[str, int]:
    page = list_state(rt, rt.pipeline.states["counts"], limit=100_000)
    return {k[0]: v for k, v in page.items}


def words(lines) -> dict[str, int]:
    return dict(Counter(w for line in lines for w in line.split()))


def held(client, keys: list[str]) -> list[str]:
    """The sentences the streams hold now."""
    return [f[b"sentence"].decode() for k in keys for _id, f in client.xrange(k)]


@pytest.fixture
def fresh(redis_client):
    for key in redis_client.scan_iter(match="tridentflow:*"):
        redis_client.delete(key)
    for key in redis_client.scan_iter(match="shared-events:*"):
        redis_client.delete(key)
    yield redis_client


def _produced(rt: Runtime, lines: list[str]) -> None:
    rt.log.append_spread(lines)


def _ids(client, key: str) -> list[bytes]:
    return [entry_id for entry_id, _f in client.xrange(key)]


# mutation -> (what it does, given the client, the stream keys, and the ordinals read)
def xdel_last_read(c, keys):
    c.xdel(keys[0], _ids(c, keys[0])[4])  # p0's 5th entry: the last one read (10 read per p)


def xdel_all_read(c, keys):
    for key in keys:
        c.xdel(key, *_ids(c, key)[:5])


def xdel_unread(c, keys):
    c.xdel(keys[1], _ids(c, keys[1])[6])


def maxlen_unread(c, keys):
    c.xtrim(keys[2], maxlen=2, approximate=False)


def maxlen_read_only(c, keys):
    c.xtrim(keys[2], maxlen=5, approximate=False)  # exactly the unread ones stay


def deleted(c, keys):
    c.delete(keys[3])


def recreated(c, keys):
    c.delete(keys[3])
    for i in range(9):
        c.xadd(keys[3], {"sentence": f"again {i}"})


def odd_bytes(c, keys):
    c.xadd(keys[0], {b"sent\xffence": b"x"})
    c.xadd(keys[0], {"sentence": b"caf\xe9 latin-1"})


KEEPS_COUNTING = [xdel_last_read, xdel_all_read, maxlen_read_only, odd_bytes]
REPORTED = {
    xdel_unread: "deleted (XDEL) before this reader read them",
    maxlen_unread: "were removed before this reader read them",
    deleted: "is missing",
    recreated: "was deleted and recreated",
}


@pytest.mark.parametrize("mutate", [*KEEPS_COUNTING, *REPORTED], ids=lambda f: f.__name__)
def test_every_external_mutation_keeps_counting_or_is_reported(mutate, fresh, redis_url, tmp_path):
    rt = rt_of(NAME, redis_url, tmp_path / "h")
    keys = rt.log.stream_keys
    first, later = sentences(20, seed=3), sentences(20, seed=4)
    _produced(rt, first)
    run_batches(rt, LocalEngine())
    _produced(rt, later)  # five entries per stream read, five not yet
    mutate(fresh, keys)
    if mutate in KEEPS_COUNTING:
        run_batches(rt, LocalEngine())
        assert not status(rt)["unavailable_partitions"]
        expected = words(first + later)
        if mutate is odd_bytes:  # the two odd entries are quarantined, never a crash
            assert rt.ledger.quarantined() == 2
        assert counts(rt) == expected
        return
    reason = REPORTED[mutate]
    info = status(rt)
    assert info["unavailable_partitions"], info
    assert any(reason in (p["unavailable"] or "") for p in info["partitions"]), info
    report = audit(rt)
    assert not report.ok and any(reason in why for why in report.unreadable.values())
    if mutate is deleted:  # producing would recreate it unnoticed: refused
        with pytest.raises(SourceError, match="no longer exists"):
            _produced(rt, ["more"])
    reset_pipeline(rt)  # the operator's way out: count what the streams hold now
    rt = rt_of(NAME, redis_url, tmp_path / "h")
    run_batches(rt, LocalEngine())
    assert counts(rt) == words(held(fresh, keys))
    assert not status(rt)["unavailable_partitions"]
    assert audit(rt).ok, audit(rt).line()


def test_trim_then_reset_without_source_counts_what_is_held(fresh, redis_url, tmp_path):
    """Was a wedge: the reset reader started at ordinal 0, trimmed away."""
    rt = rt_of(NAME, redis_url, tmp_path / "h")
    _produced(rt, sentences(40, seed=5))
    run_batches(rt, LocalEngine())
    rt.log.trim(rt.ledger.committed_offsets())
    later = sentences(12, seed=6)
    _produced(rt, later)
    reset_pipeline(rt)
    rt = rt_of(NAME, redis_url, tmp_path / "h")
    run_batches(rt, LocalEngine())
    assert counts(rt) == words(later)
    assert audit(rt).line() == "lost=0 doubled=0"


def test_namespaces_never_share_a_default_stream(fresh, redis_url, tmp_path):
    a = rt_of(NAME, redis_url, tmp_path / "a", namespace="team-a")
    b = rt_of(NAME, redis_url, tmp_path / "b", namespace="team-b")
    assert a.log.stream_keys[0] == "tridentflow:team-a:wordcount-stream:p0"
    assert set(a.log.stream_keys).isdisjoint(b.log.stream_keys)
    _produced(a, ["only team a"])
    _produced(b, ["only team b here"])
    run_batches(a, LocalEngine())
    run_batches(b, LocalEngine())
    assert counts(a) == words(["only team a"])
    assert counts(b) == words(["only team b here"])
    reset_pipeline(a, source=True)
    assert held(fresh, b.log.stream_keys) == ["only team b here"]


def test_readers_sharing_a_stream_each_count_it_all_and_trim_keeps_what_any_needs(
    fresh, redis_url, tmp_path
):
    a = rt_of("tests.pipelines:shared_a", redis_url, tmp_path / "a")
    b = rt_of("tests.pipelines:shared_b", redis_url, tmp_path / "b")
    first = sentences(10, seed=7)
    _produced(a, first)
    run_batches(b, LocalEngine())  # b registers (and reads all there is)
    later = sentences(10, seed=8)
    _produced(a, later)
    run_batches(a, LocalEngine())
    trimmed = a.log.trim(a.ledger.committed_offsets())
    assert sum(n for n, _ in trimmed.values()) == len(first)  # b has not read `later` yet
    assert {holder for _n, holder in trimmed.values()} == {"tridentflow:shared-b"}
    # a foreign consumer group holding an entry it has not acknowledged keeps it too
    key = a.log.stream_keys[0]
    fresh.xgroup_create(key, "workers", id="0")
    fresh.xreadgroup("workers", "w1", {key: ">"}, count=1)
    run_batches(b, LocalEngine())
    assert counts(a) == counts(b) == words(first + later)
    a.log.trim(a.ledger.committed_offsets())
    assert len(fresh.xrange(key)) >= 1  # the worker's pending entry and what follows stay
    # one reader's reset never deletes the shared streams
    with pytest.raises(SourceError, match=r"is read by .*shared-b.* too"):
        reset_pipeline(a, source=True)
    assert a.ledger.committed_txid() > 0  # refused before anything was reset
    reset_pipeline(a)  # without --source: a alone starts again, at what is held
    a = rt_of("tests.pipelines:shared_a", redis_url, tmp_path / "a")
    run_batches(a, LocalEngine())
    assert counts(a) == words(held(fresh, a.log.stream_keys))
    assert counts(b) == words(first + later)
