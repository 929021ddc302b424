"""The DataFrame backend's pure parts: chunks and runs (no Spark)."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest

from tridentflow.engines import frames
from tridentflow.engines.frames import chunk_rows, runs, to_batch


def test_chunks_cover_every_item_in_order_and_an_empty_partition_has_one(monkeypatch):
    monkeypatch.setattr(frames, "CHUNK", 3)
    rows = list(chunk_rows(5, range(7)))
    assert [(p, seq, n) for p, seq, n, _ in rows] == [(5, 0, 3), (5, 1, 3), (5, 2, 1)]
    assert [x for *_head, data in rows for x in pickle.loads(data)] == list(range(7))
    assert [(p, seq, n, pickle.loads(d)) for p, seq, n, d in chunk_rows(2, [])] == [(2, 0, 0, [])]
    exact = list(chunk_rows(0, range(6)))
    assert [n for _p, _s, n, _d in exact] == [3, 3]  # no trailing empty chunk


def test_runs_join_a_partition_across_batches_and_refuse_a_split_one():
    names = ("part", "seq", "n", "data")
    first = to_batch([(0, 0, 1, pickle.dumps([1])), (1, 0, 1, pickle.dumps([2]))], names)
    second = to_batch([(1, 1, 2, pickle.dumps([3, 4])), (2, 0, 0, pickle.dumps([]))], names)
    assert first.schema.field("part").type == pa.int32()
    assert list(runs(iter([first, second]), "part")) == [(0, [1]), (1, [2, 3, 4]), (2, [])]
    split = to_batch([(0, 0, 1, pickle.dumps([1])), (1, 0, 0, pickle.dumps([]))], names)
    again = to_batch([(0, 1, 1, pickle.dumps([9]))], names)
    with pytest.raises(RuntimeError, match="logical partition 0 is split"):
        list(runs(iter([split, again]), "part"))


def test_shared_session_urls():
    from tridentflow.engines.spark import SESSION_WINDOW_S, shared_session_url

    now = 1_000 * SESSION_WINDOW_S + 5
    a = shared_session_url("sc://h:15002", "ns/wc", now)
    assert a.startswith("sc://h:15002/;session_id=") and len(a.split("=")[1]) == 36
    assert shared_session_url("sc://h:15002/", "ns/wc", now + 100) == a  # same window
    assert shared_session_url("sc://h:15002", "ns/wc", now + SESSION_WINDOW_S) != a
    assert shared_session_url("sc://h:15002", "other/wc", now) != a
    with_token = shared_session_url("sc://h:15002/;token=t", "ns/wc", now)
    assert with_token == "sc://h:15002/;token=t;session_id=" + a.split("=")[1]
    named = "sc://h:1/;session_id=00000000-0000-0000-0000-000000000001"
    assert shared_session_url(named, "ns/wc", now) == named
