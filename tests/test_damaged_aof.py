"""A damaged AOF (issue 55): Redis SIGKILLed, its append-only file then cut or changed, and
started again - what tridentflow does with the ledger it finds.

* **Cut** anywhere (a disk that lost the file's tail): Redis loads the commands before the cut
  (``aof-load-truncated``, an unfinished MULTI/EXEC dropped whole). Every txid's mark is one
  script, so the ledger, the offsets and the states are those of one instant: an earlier
  committed txid, maybe a commit part-way - which the next commit finishes or rolls back like
  any crash. Runs go on and recompute the lost txids exactly.
* **A byte of the framing changed**: Redis refuses to start and names ``redis-check-aof
  --fix``, which cuts the file at the damage: the case above.
* **A byte of a value changed** (the AOF has no checksums): Redis loads it and cannot know;
  tridentflow's ``audit`` (which recounts the committed txids from the source) finds the
  difference - it is what to run after any repair (docs/redis.md).
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.helpers import sentences, word_counts
from tridentflow.devtools.chaos import RedisServer
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import TridentflowError
from tridentflow.ops.audit import audit
from tridentflow.registry import load_pipeline
from tridentflow.steps.driver import run_batches
from tridentflow.steps.query import query
from tridentflow.steps.runtime import Runtime, connect

ENGINE = LocalEngine()
TXIDS = 4


@pytest.fixture
def crashed(tmp_path):
    """(the server, SIGKILLed after TXIDS txids of a word count; the lines; the home)."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    home = tmp_path / "home"
    rt = Runtime(load_pipeline("wordcount"), connect(server.url), home)
    lines = sentences(80)  # four txids of records (batch_size counts per partition)
    rt.source_heads()
    rt.log.append_spread(lines)
    results = run_batches(rt, ENGINE, max_batches=TXIDS, batch_size=5).results
    assert all(r.records for r in results)
    assert rt.ledger.committed_txid() == TXIDS
    rt.client.close()
    server.kill()
    yield server, lines, home
    server.kill()


def _incr(server: RedisServer):
    """The AOF's incremental file (Redis 7's multi-part AOF: a base, then the commands)."""
    (path,) = (server.directory / "appendonlydir").glob("*.incr.aof")
    return path


def _goes_on_exactly(server: RedisServer, lines: list[str], home) -> int:
    """Resume on the restarted server: the committed txid found, then every line counted
    once (audit clean)."""
    rt = Runtime(load_pipeline("wordcount"), connect(server.url), home)
    found = rt.ledger.committed_txid()
    run_batches(rt, ENGINE, batch_size=5)
    report = audit(rt)
    assert report.ok, report.line()
    expected = word_counts(lines)
    persist = rt.pipeline.states["counts"]
    assert dict(zip(expected, query(rt, persist, [(w,) for w in expected])[1], strict=True)) == (
        expected
    )
    return found


@pytest.mark.parametrize("keep", [0.3, 0.55, 0.8, 0.97])
def test_an_aof_cut_anywhere_resumes_from_an_earlier_instant_and_recomputes(crashed, keep):
    server, lines, home = crashed
    aof = _incr(server)
    data = aof.read_bytes()
    aof.write_bytes(data[: int(len(data) * keep)])
    server.start()
    found = _goes_on_exactly(server, lines, home)
    assert found < TXIDS or keep > 0.9  # the cut took commits with it


def test_a_damaged_frame_is_refused_by_redis_then_cut_by_redis_check_aof(crashed):
    server, lines, home = crashed
    aof = _incr(server)
    data = aof.read_bytes()
    at = data.index(b"\r\n*", len(data) // 2) + 2  # a command's header: '*<args>'
    aof.write_bytes(data[:at] + b"x" + data[at + 1 :])
    with pytest.raises(TridentflowError, match="exited"):
        server.start()
    assert "redis-check-aof --fix" in (server.directory / "redis.log").read_text()
    manifest = next((server.directory / "appendonlydir").glob("*.manifest"))
    fixed = subprocess.run(["redis-check-aof", "--fix", str(manifest)], input="y\n",
                           capture_output=True, text=True, timeout=60)  # fmt: skip
    assert fixed.returncode == 0, fixed.stdout[-500:]
    server.start()
    assert _goes_on_exactly(server, lines, home) < TXIDS


def test_a_changed_value_loads_silently_and_audit_finds_it(crashed):
    server, _lines, home = crashed
    aof = _incr(server)
    data = aof.read_bytes()
    last_write = data.rindex(b":state:counts\r\n")  # the last HSET of the counts
    stamp = re.compile(rb"\r\n\[\d+,(\d)").search(data, last_write)  # its first [txid,count
    assert stamp is not None
    digit = stamp.start(1)
    other = b"8" if data[digit : digit + 1] != b"8" else b"7"
    aof.write_bytes(data[:digit] + other + data[digit + 1 :])
    server.start()
    rt = Runtime(load_pipeline("wordcount"), connect(server.url), home)
    assert rt.ledger.committed_txid() == TXIDS  # Redis could not tell: nothing was lost
    report = audit(rt)
    assert not report.ok and (report.lost or report.doubled), report.line()
