"""Redis out of memory (``maxmemory`` with ``noeviction``, issue 55): a txid's emit (staging
its batch in Redis) or its commit (writing the state) refused by Redis part-way is one line
naming the limit and the way out; the txid stays uncommitted, and once memory is freed its
retry commits it exactly - against a real redis-server squeezed below what the txid needs."""

from __future__ import annotations

from collections import Counter

import pytest

from tridentflow.devtools import devredis
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import one_line
from tridentflow.ops.audit import audit
from tridentflow.registry import load_pipeline
from tridentflow.steps.committer import commit
from tridentflow.steps.coordinator import coordinate
from tridentflow.steps.driver import run_batches
from tridentflow.steps.emitter import emit
from tridentflow.steps.query import list_state
from tridentflow.steps.runtime import Runtime

FIRST = ["a bb", "bb ccc"]
BIG = [f"w{i} v{i} a" for i in range(15_000)]
"""30,001 keys: megabytes of state and staging, well over the squeeze's margin."""
MARGIN = 1024 * 1024
"""Room for part of the txid's writes: the commit is refused part-way, not at its start."""


@pytest.fixture
def squeezable(tmp_path):
    """A private redis-server (its maxmemory is this test's to change)."""
    port = devredis.free_port()
    server = devredis.start(port, tmp_path / "redis", appendonly=False)
    yield f"redis://127.0.0.1:{port}/0"
    server.terminate()
    server.wait(timeout=10)


def _squeeze(rt: Runtime) -> None:
    """maxmemory a little above what Redis holds now, with noeviction (the default policy)."""
    used = int(rt.client.info("memory")["used_memory"])
    rt.client.config_set("maxmemory-policy", "noeviction")
    rt.client.config_set("maxmemory", used + MARGIN)


@pytest.mark.parametrize("pipeline", ["wordcount", "tests.pipelines:scores"])
@pytest.mark.parametrize("point", ["emit", "commit"])
def test_out_of_memory_is_one_line_and_the_txid_commits_exactly_once_memory_is_freed(
    squeezable, tmp_path, pipeline, point
):
    rt = Runtime.open(load_pipeline(pipeline), squeezable, tmp_path / "home")
    rt.ledger.reset(force=True)
    rt.source_heads()
    first, big = _records(pipeline, FIRST), _records(pipeline, BIG)
    rt.log.append_spread(first)
    run_batches(rt, LocalEngine(), batch_size=100)
    rt.log.append_spread(big)
    txid = rt.ledger.bind_run("squeezed").txid
    coordinate(rt, txid, batch_size=len(big))
    if point == "emit":
        _squeeze(rt)
    with pytest.raises(Exception) as refused:
        emit(rt, txid, LocalEngine())
        _squeeze(rt)
        commit(rt, txid)
    state = "by_day" if "by_day" in rt.pipeline.states else "counts"
    if point == "commit":  # refused part-way: some keys of the txid were written already
        assert 0 < rt.backing(state).count_written_in(txid) < len(_expected(pipeline, big))
    line = one_line(refused.value)
    assert line.startswith("Redis is out of memory") and "maxmemory" in line, line
    assert "\n" not in line
    assert rt.ledger.committed_txid() == txid - 1  # nothing of the txid is committed
    rt.client.config_set("maxmemory", 0)  # the operator frees memory; the task retries
    if point == "emit":
        emit(rt, txid, LocalEngine())
    assert commit(rt, txid).status == "committed"
    assert _stored(rt) == _expected(pipeline, first + big)
    report = audit(rt)
    assert report.ok, report.line()


def _records(pipeline: str, lines: list[str]) -> list:
    if pipeline == "wordcount":
        return lines
    return [[line.split()[0], len(line) % 3, len(line)] for line in lines]  # (user, day, score)


def _expected(pipeline: str, records: list) -> dict:
    """The state a correct run holds: word counts (opaque), or sums per (user, day)
    (transactional)."""
    if pipeline == "wordcount":
        return dict(Counter((w,) for line in records for w in line.split()))
    totals: Counter = Counter()
    for user, day, score in records:
        totals[(user, day)] += score
    return dict(totals)


def _stored(rt: Runtime) -> dict:
    state = "by_day" if "by_day" in rt.pipeline.states else next(iter(rt.pipeline.states))
    page = list_state(rt, rt.pipeline.states[state], 100_000)
    return {tuple(key): value for key, value in page.items}
