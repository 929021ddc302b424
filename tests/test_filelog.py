from __future__ import annotations

import json

import pytest

from tridentflow.errors import SourceError
from tridentflow.sources.filelog import INDEX_EVERY, FileLog


@pytest.fixture
def log(tmp_path):
    log = FileLog(tmp_path / "log", segment_records=1000)
    log.ensure(3)
    return log


def test_append_and_read_ranges_across_segments(log):
    records = [{"i": i} for i in range(2500)]
    assert log.append(1, records) == (0, 2500)
    assert log.heads() == {0: 0, 1: 2500, 2: 0}
    for start, end in [(0, 10), (999, 1001), (1500, 2500), (7, 7), (INDEX_EVERY + 3, 2049)]:
        got = list(log.read(1, start, end))
        assert got == [(o, {"i": o}) for o in range(start, end)]
    assert log.append(1, [{"i": 2500}]) == (2500, 2501)


def test_reading_past_the_head_is_refused(log):
    log.append(0, ["a"])
    with pytest.raises(SourceError, match="past the head"):
        list(log.read(0, 0, 2))


def test_a_torn_append_is_invisible_and_cut_on_the_next_append(log):
    log.append(2, ["a", "b"])
    seg = log.root / "p-0002" / "seg-000000000000.jsonl"
    with open(seg, "ab") as fh:  # a crash after writing data, before HEAD moved
        fh.write(b'"torn"\n"partial')
    assert [r for _, r in log.read(2, 0, 2)] == ["a", "b"]
    log.append(2, ["c"])
    assert [r for _, r in log.read(2, 0, 3)] == ["a", "b", "c"]


def test_a_stale_index_from_a_torn_append_is_dropped(tmp_path):
    log = FileLog(tmp_path / "log")
    log.ensure(1)
    log.append(0, ["x"] * (INDEX_EVERY + 1))
    head = json.loads((log.root / "p-0000" / "HEAD").read_text())
    # a torn append of long records wrote index entries, then died before HEAD moved
    log.append(0, ["y" * 50] * (3 * INDEX_EVERY))
    (log.root / "p-0000" / "HEAD").write_text(json.dumps(head))
    log.append(0, ["z"] * (3 * INDEX_EVERY))
    assert [r for _, r in log.read(0, 2 * INDEX_EVERY, 2 * INDEX_EVERY + 2)] == ["z", "z"]


def test_partitions_grow_but_never_shrink(log):
    assert log.ensure(5) == 5
    with pytest.raises(SourceError, match="cannot shrink"):
        log.ensure(2)


def test_append_spread_is_round_robin(log):
    log.append_spread(range(7))
    assert log.heads() == {0: 3, 1: 2, 2: 2}
    log.append_spread(range(2))
    assert log.heads() == {0: 3, 1: 3, 2: 3}
