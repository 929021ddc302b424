"""Bad input: quarantined with txid, partition, offset and error; never fails the batch unless
the pipeline's threshold is exceeded."""

from __future__ import annotations

import json

import pytest

from tests.helpers import runtime
from tridentflow.engines.local import LocalEngine
from tridentflow.errors import TooManyBadRecordsError
from tridentflow.ops.audit import audit
from tridentflow.ops.status import status
from tridentflow.steps.driver import run_batches
from tridentflow.steps.query import query

ENGINE = LocalEngine()


def plant(rt):
    rt.source_heads()
    rt.log.append(0, ["a b", "a BOOM c", "b"])
    rt.log.append_lines(1, ['"a"', "{not json", '"c c"'])


def test_bad_records_are_quarantined_and_the_batch_commits(redis_url, redis_client, home):
    rt = runtime("tests.pipelines:poison", redis_url, home)
    plant(rt)
    result = run_batches(rt, ENGINE).results[0]
    assert (result.status, result.records, result.quarantined) == ("committed", 6, 2)
    persist = rt.pipeline.states["counts"]
    assert query(rt, persist, [("a",), ("b",), ("c",)])[1] == [2, 2, 2]
    entries = {
        k.decode(): json.loads(v) for k, v in redis_client.hgetall(rt.keyspace.quarantine).items()
    }
    assert set(entries) == {"0:1", "1:1"}
    assert entries["0:1"]["txid"] == 1
    assert "poison word" in entries["0:1"]["error"]
    assert entries["1:1"]["record"] == "{not json"
    assert status(rt)["quarantined"] == 2
    assert audit(rt).ok


def test_quarantine_survives_replays_without_duplicates(redis_url, redis_client, home):
    rt = runtime("tests.pipelines:poison", redis_url, home, faults="before-ledger@1")
    plant(rt)
    with pytest.raises(Exception, match="injected"):
        run_batches(rt, ENGINE)
    run_batches(rt, ENGINE)
    assert redis_client.hlen(rt.keyspace.quarantine) == 2
    assert audit(rt).ok


def test_too_many_bad_records_fail_the_batch_visibly(redis_url, redis_client, home):
    rt = runtime("tests.pipelines:strict_poison", redis_url, home)
    plant(rt)
    with pytest.raises(TooManyBadRecordsError, match="2 of 6 records are bad"):
        run_batches(rt, ENGINE)
    assert rt.ledger.committed_txid() == 0
    assert redis_client.hlen(rt.keyspace.quarantine) == 0


def test_missing_fields_and_compound_keys(redis_url, redis_client, home):
    rt = runtime("tests.pipelines:scores", redis_url, home)
    rt.source_heads()
    rt.log.append(
        0,
        [
            {"user": "ann", "day": 1, "score": 5},
            {"user": "ann", "day": 1, "score": 2.5},
            ["bob", 2, 1],
            {"user": "bob", "day": 2},
            {"user": "ann", "day": 1.0, "score": 1},
        ],
    )
    run_batches(rt, ENGINE)
    by_day = rt.pipeline.states["by_day"]
    assert query(rt, by_day, [("ann", 1), ("ann", 1.0), ("bob", 2)])[1] == [7.5, 1, 1]
    assert query(rt, rt.pipeline.states["events"], [("ann",), ("bob",)])[1] == [3, 1]
    assert rt.ledger.quarantined() == 1
    assert audit(rt).ok


def test_quarantine_command(tf, redis_url):
    tf("produce", "tests.pipelines:poison", "-", input="x BOOM\ny\n")
    assert tf("run", "tests.pipelines:poison", "--engine", "local").returncode == 0
    out = tf("quarantine", "tests.pipelines:poison")
    assert out.returncode == 0, out.stderr
    assert "ValueError: poison word" in out.stdout
    assert out.stdout.strip().endswith("1 quarantined record(s)")
