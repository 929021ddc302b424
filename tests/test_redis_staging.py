"""Staging in Redis (TRIDENTFLOW_STAGING=redis): the same committed values as staging in files
for every state kind and both commit paths, through faults and replays, sharded or not; emit
and commit on two "hosts" that share no directory; a torn, overwritten or expired block is
never committed; attempts never mix; nothing is left behind once a txid commits."""

from __future__ import annotations

import random

import pytest

from tests.helpers import drain_retrying, produce, sentences
from tests.test_state_shards import _runtime, _states
from tridentflow.devtools.chaos import WORDS
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import IncompleteBatchError, TridentflowError
from tridentflow.faults import FaultPlan
from tridentflow.ops.audit import audit
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.emitter import emit
from tridentflow.steps.staging import RedisStagedBatch, RedisStagingArea
from tridentflow_state.staged import BLOCK_LINES, BlockRef

ENGINE = LocalEngine()


def _staged_keys(rt) -> list[bytes]:
    """Every staged manifest hash and block of the pipeline left in Redis."""
    found = []
    for pattern in (rt.keyspace.pattern, rt.keyspace.shard_pattern):
        found += [
            k
            for k in rt.client.scan_iter(match=pattern, count=1000)
            if b":staged:" in k or b":block:" in k
        ]
    return found


@pytest.mark.parametrize(
    "pipeline", ["wordcount", "wordcount-opaque", "mutating-opaque", "wordcount-drpc"]
)
def test_redis_staging_commits_what_file_staging_commits(
    pipeline, redis_url, tmp_path, monkeypatch
):
    """Count and Sum in Redis straight from the staged blocks (transactional, opaque), every
    aggregator kind through the Python path with typed keys (mutating-opaque), a state query
    from the batch (wordcount-drpc); 3 shards; a commit attempt fails half-way and another
    before the mark, and both replay."""
    lines: list = sentences(150, seed=5)
    if pipeline == "wordcount-drpc":
        lines = [["sentence", s] for s in lines[:100]] + [["query", s] for s in lines[100:]]
    elif pipeline.startswith("mutating"):
        rng = random.Random(5)
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 5))) for _ in lines]
    results = {}
    for kind in ("files", "redis"):
        monkeypatch.setenv("TRIDENTFLOW_STAGING", kind)
        rt = _runtime(pipeline, redis_url, tmp_path / kind, 3, f"st-{kind}")
        rt.ledger.reset(force=True)
        produce(rt, lines)
        rt = rt.with_(faults=FaultPlan.parse("mid-commit@2=raise,before-ledger@3=raise"))
        drain_retrying(rt, batch_size=11)
        assert rt.ledger.committed_txid() > 3
        assert audit(rt).ok
        if kind == "redis":
            assert not (tmp_path / kind / "staging").exists()  # nothing staged on disk
            assert _staged_keys(rt) == []  # every attempt's blocks gone with its commit
        results[kind] = _states(rt)
    assert results["redis"] == results["files"]


def test_emit_and_commit_on_hosts_that_share_no_directory(redis_url, tmp_path, monkeypatch):
    """The emit's home holds the source; the commit's is an empty directory elsewhere."""
    monkeypatch.setenv("TRIDENTFLOW_STAGING", "redis")
    emitter = _runtime("wordcount", redis_url, tmp_path / "emit-host", 2, "hosts")
    emitter.ledger.reset(force=True)
    lines = sentences(300, seed=8)
    produce(emitter, lines)
    assert isinstance(emitter.staging, RedisStagingArea)  # this process's setting, read once
    committer = _runtime("wordcount", redis_url, tmp_path / "commit-host", 2, "hosts")
    monkeypatch.setenv("TRIDENTFLOW_STAGING", "files")  # the commit finds it in Redis anyway
    for txid in (1, 2, 3):  # 4 partitions of 75 records: 30, 30 and 15 each
        coordinate(emitter, txid, batch_size=30)
        staged = emit(emitter, txid, ENGINE)
        assert isinstance(staged, RedisStagedBatch)
        assert commit(committer, txid).status == "committed"
    assert not (tmp_path / "commit-host" / "staging").exists()
    expected: dict[str, int] = {}
    for sentence in lines:
        for word in sentence.split():
            expected[word] = expected.get(word, 0) + 1
    counts = {k: v for k, v in _states(committer)["counts"].items()}
    assert counts == {f'["{w}"]': n for w, n in expected.items()}


def test_files_staged_on_another_host_are_refused_in_one_line_naming_the_fix(
    redis_url, tmp_path, monkeypatch
):
    """Staging in files, the emit on one host and the commit on another that does not share
    its home (a Celery worker each): one line saying so and what to set; nothing committed."""
    monkeypatch.setenv("TRIDENTFLOW_STAGING", "files")
    emitter = _runtime("wordcount", redis_url, tmp_path / "emit-host", 1, "hosts-files")
    emitter.ledger.reset(force=True)
    produce(emitter, sentences(8, seed=3))
    coordinate(emitter, 1)
    emit(emitter, 1, ENGINE)
    committer = _runtime("wordcount", redis_url, tmp_path / "commit-host", 1, "hosts-files")
    with pytest.raises(IncompleteBatchError) as refused:
        commit(committer, 1)
    line = str(refused.value)
    assert "\n" not in line and "emit ran on another host" in line, line
    assert "TRIDENTFLOW_STAGING=redis" in line and committer.ledger.committed_txid() == 0
    assert commit(emitter, 1).status == "committed"  # where the files are, it commits


def _emitted(rt, txid: int) -> RedisStagedBatch:
    coordinate(rt, txid, batch_size=10_000)
    staged = emit(rt, txid, ENGINE)
    assert isinstance(staged, RedisStagedBatch)
    return staged


def _many_keys(rt, n: int) -> None:
    produce(rt, [f"w{i} w{i + 1}" for i in range(0, 2 * n, 2)])


@pytest.mark.parametrize("damage", ["deleted", "overwritten", "one-line-more", "expired"])
def test_a_damaged_block_is_never_committed(damage, redis_url, tmp_path, monkeypatch):
    """A block deleted (a reset elsewhere, eviction), overwritten with other content (a late
    speculative writer), torn by one line, or expired: the commit refuses the whole batch
    before it writes anything; the next emit attempt stages it again and commits exactly."""
    monkeypatch.setenv("TRIDENTFLOW_STAGING", "redis")
    rt = _runtime("wordcount", redis_url, tmp_path / "h", 2, f"dmg-{damage}")
    rt.ledger.reset(force=True)
    _many_keys(rt, 2 * BLOCK_LINES)  # 20,000 distinct words: two blocks a shard
    staged = _emitted(rt, 1)
    refs = staged.blocks("counts")
    assert refs is not None and len(refs) >= 3
    victim = refs[len(refs) // 2]
    key = staged.space.key(victim)
    if damage == "deleted":
        rt.client.delete(key)
    elif damage == "expired":
        rt.client.pexpire(key, 1)
        while rt.client.exists(key):
            pass
    elif damage == "overwritten":
        text = rt.client.get(key)
        rt.client.set(key, text.replace(b"\t1", b"\t2", 1))
    else:
        rt.client.append(key, b'\n["extra"]\t1')
    with pytest.raises(IncompleteBatchError, match=r"staged block .* emit"):
        commit(rt, 1)
    assert rt.ledger.committed_txid() == 0
    assert all(
        rt.client.hlen(rt.keyspace.shard(i).state("counts")) == 0 for i in range(2)
    )  # refused before the first write
    emit(rt, 1, ENGINE)  # attempt 2, as an Airflow retry of the emit task
    assert commit(rt, 1).keys == 4 * BLOCK_LINES
    assert audit(rt).ok
    assert sum(rt.client.hlen(rt.keyspace.shard(i).state("counts")) for i in range(2)) == (
        4 * BLOCK_LINES
    )


def test_attempts_never_mix_and_only_the_newest_commits(redis_url, tmp_path, monkeypatch):
    """Two emit attempts of one txid write blocks of the same names under their own attempt;
    the commit takes the newest; the older one's blocks go with the commit too."""
    monkeypatch.setenv("TRIDENTFLOW_STAGING", "redis")
    rt = _runtime("wordcount", redis_url, tmp_path / "h", 1, "attempts")
    rt.ledger.reset(force=True)
    produce(rt, ["a b", "b c"])
    first = _emitted(rt, 1)
    second = emit(rt, 1, ENGINE)
    assert isinstance(second, RedisStagedBatch)
    assert (first.attempt, second.attempt) == (1, 2)
    one, two = first.blocks("counts")[0], second.blocks("counts")[0]
    assert one.name == two.name and first.space.key(one) != second.space.key(two)
    rt.client.set(first.space.key(one), b'["a"]\t100')  # the older attempt's, damaged
    assert commit(rt, 1).emit_attempt == 2
    assert _states(rt)["counts"] == {'["a"]': 1, '["b"]': 2, '["c"]': 1}
    assert _staged_keys(rt) == []


def test_bad_records_are_staged_in_redis_and_quarantined(redis_url, tmp_path, monkeypatch):
    monkeypatch.setenv("TRIDENTFLOW_STAGING", "redis")
    rt = _runtime("tests.pipelines:poison", redis_url, tmp_path / "h", 1, "bad")
    rt.ledger.reset(force=True)
    produce(rt, ["a b", "BOOM", "c", "BOOM BOOM"])
    staged = _emitted(rt, 1)
    bad = list(staged.bad_records())
    assert staged.bad_count == 2 and sorted(b["record"] for b in bad) == [
        '"BOOM BOOM"',  # the records as read
        '"BOOM"',
    ]
    result = commit(rt, 1)
    assert result.quarantined == 2
    assert rt.client.hlen(rt.keyspace.quarantine) == 2


def test_an_unknown_staging_kind_is_one_clear_error(redis_url, tmp_path, monkeypatch):
    monkeypatch.setenv("TRIDENTFLOW_STAGING", "s3")
    rt = _runtime("wordcount", redis_url, tmp_path / "h", 1, "kind")
    with pytest.raises(TridentflowError, match="TRIDENTFLOW_STAGING='s3' is not a staging kind"):
        _ = rt.staging


def test_the_block_ref_round_trips_and_the_area_names_its_place(redis_url, tmp_path):
    ref = BlockRef(2, "counts.d.2.0", 17, "ab" * 20)
    assert BlockRef.from_json(ref.to_json()) == ref
    rt = _runtime("wordcount", redis_url, tmp_path / "h", 1, "names")
    area = RedisStagingArea(rt.client, rt.keyspace, "g1")
    assert area.place(4, 2).startswith("redis:tf:names:{wordcount}:staged:g1:4")


def test_an_emit_of_a_committed_txid_deletes_what_a_zombie_of_it_left(
    redis_url, tmp_path, monkeypatch
):
    """A zombie emit of txid 1 whose staging lands after the commit (its own discard failed:
    Redis paused, say): the next emit of txid 1 - its retry - finds it committed and deletes
    every attempt of it, so the zombie's staging does not outlive it (found by the chaos
    harness's paused-Redis family)."""
    monkeypatch.setenv("TRIDENTFLOW_STAGING", "redis")
    rt = _runtime("wordcount", redis_url, tmp_path / "h", 1, "zombie")
    rt.ledger.reset(force=True)
    produce(rt, ["a b"])
    _emitted(rt, 1)
    commit(rt, 1)
    assert _staged_keys(rt) == []
    zombie = rt.staging.write(  # attempt 7, written late
        {"txid": 1, "attempt": 7, "pipeline": "wordcount"}, {}, {"counts": [('["a"]', 1)]}
    )
    assert zombie.blocks("counts") and _staged_keys(rt) != []
    assert emit(rt, 1, ENGINE) is None
    assert _staged_keys(rt) == []


def test_a_manifest_that_lands_after_its_writer_gave_up_carries_its_ttl(tmp_path, monkeypatch):
    """Redis stopped (SIGSTOP) just before an attempt's manifest is written, past the client's
    socket timeout: the write fails for its writer but runs once Redis goes on - with its
    TTL (one MULTI), so even where nothing deletes it, it expires like the blocks."""
    import os
    import signal
    import threading

    from tridentflow.devtools import devredis
    from tridentflow.redisconn import connect as connect_with
    from tridentflow.registry import load_pipeline
    from tridentflow.steps.runtime import Runtime

    monkeypatch.setenv("TRIDENTFLOW_STAGING", "redis")
    port = devredis.free_port()
    server = devredis.start(port, tmp_path / "redis")
    try:
        url = f"redis://127.0.0.1:{port}/0"
        rt = Runtime(load_pipeline("wordcount"), connect_with(url, 0.3), tmp_path / "h")
        key = rt.staging.manifests_key(1)

        def stop_redis() -> None:  # the writer's next command finds Redis stopped
            os.kill(server.pid, signal.SIGSTOP)
            threading.Timer(1.0, os.kill, (server.pid, signal.SIGCONT)).start()

        loaded = {"txid": 2, "attempt": 1, "pipeline": "wordcount"}  # the script loaded, as
        rt.staging.write(loaded, {}, {"counts": [('["a"]', 1)]})  # on a Redis that ran one
        header = {"txid": 1, "attempt": 1, "pipeline": "wordcount"}
        with pytest.raises(Exception, match="Timeout"):
            rt.staging.write(header, {}, {"counts": [('["a"]', 1)]}, before_manifest=stop_redis)
        admin = connect_with(url)
        for _ in range(50):
            if admin.exists(key):
                break
            threading.Event().wait(0.1)
        assert admin.exists(key) and 0 < admin.ttl(key) <= 7 * 24 * 3600
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait(timeout=10)
